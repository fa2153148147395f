"""Diff two tracemalloc snapshots (a script): what grew between them, by traceback.

    .venv/bin/python -m tests.bench.heapdiff OLD.snap NEW.snap [--top 25] [--frames 8]
    .venv/bin/python -m tests.bench.heapdiff --counts OLD.counts NEW.counts

Prints the total traced size of each, then the ``--top`` tracebacks whose size
grew the most (size and count difference), each with its frames, innermost
last; tracemalloc's own and importlib's allocations are left out.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path


def counts_diff(old_path: str, new_path: str, top: int) -> None:
    """Print the RSS, allocated blocks and per-type object counts of two ``.counts`` files, and what grew."""
    old = json.loads(Path(old_path).read_text())
    new = json.loads(Path(new_path).read_text())
    print(f"rss: {old['rss_mb']:.1f} MB -> {new['rss_mb']:.1f} MB")
    print(f"python blocks: {old['blocks']} -> {new['blocks']} ({new['blocks'] - old['blocks']:+d})")
    diff = {t: n - old["objects"].get(t, 0) for t, n in new["objects"].items()}
    for t, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]:
        print(f"{d:+8d}  {t} (now {new['objects'][t]})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--key", default="traceback", choices=["traceback", "lineno", "filename"])
    p.add_argument("--counts", action="store_true", help="OLD and NEW are .counts files")
    args = p.parse_args()
    if args.counts:
        counts_diff(args.old, args.new, args.top)
        return
    filters = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    ]
    old = tracemalloc.Snapshot.load(args.old).filter_traces(filters)
    new = tracemalloc.Snapshot.load(args.new).filter_traces(filters)
    total_old = sum(s.size for s in old.statistics("filename"))
    total_new = sum(s.size for s in new.statistics("filename"))
    grew = (total_new - total_old) / 1e6
    print(f"traced: {total_old / 1e6:.2f} MB -> {total_new / 1e6:.2f} MB ({grew:+.2f} MB)")
    for stat in new.compare_to(old, args.key)[: args.top]:
        print(f"{stat.size_diff / 1e3:+9.1f} kB {stat.count_diff:+7d} blocks (now {stat.size / 1e3:.1f} kB)")
        for line in stat.traceback.format(limit=args.frames, most_recent_first=False):
            print("    " + line)


if __name__ == "__main__":
    main()
