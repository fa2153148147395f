"""``CF_TRACEMALLOC_DIR=D python -m tests.bench._traced worker ...``: the real CLI, its heap watched.

A benchmark's way to see what a fleet process keeps (issue 9: memory follows
open work, not history), without any hook in the product. This launcher starts
a daemon thread that every ``CF_TRACEMALLOC_EVERY`` seconds (default 60) writes
into ``D``, named ``<pid>-<seconds since start>``:

- ``.counts``: one JSON line with the RSS, ``sys.getallocatedblocks()`` and
  the number of live objects the garbage collector tracks, by type (cheap:
  a run at full speed; Python blocks that stay flat while the RSS grows point
  at the allocator or C code, not at a structure of ours);
- ``.snap`` (only with ``CF_TRACEMALLOC_FRAMES`` > 0): a tracemalloc snapshot
  with that many frames (slow: the worker runs several times slower).

then runs the ``commitfleet`` CLI as usual. Diff two snapshots with
``python -m tests.bench.heapdiff OLD NEW``, two counts files with
``python -m tests.bench.heapdiff --counts OLD NEW``.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from tests._support.memory import rss_mb


def _counts() -> dict[str, object]:
    by_type = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    return {
        "rss_mb": rss_mb(os.getpid()),
        "blocks": sys.getallocatedblocks(),
        "objects": dict(by_type.most_common(400)),
    }


def _dumper(folder: Path, every: float) -> None:
    t0 = time.monotonic()
    while True:
        time.sleep(every)
        stem = folder / f"{os.getpid()}-{time.monotonic() - t0:06.0f}"
        tmp = stem.with_suffix(".tmp")
        tmp.write_text(json.dumps(_counts()))
        os.replace(tmp, stem.with_suffix(".counts"))
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(tmp))
            os.replace(tmp, stem.with_suffix(".snap"))


def main() -> None:
    folder = Path(os.environ["CF_TRACEMALLOC_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get("CF_TRACEMALLOC_FRAMES", "0"))
    if frames > 0:
        tracemalloc.start(frames)
    every = float(os.environ.get("CF_TRACEMALLOC_EVERY", "60"))
    threading.Thread(target=_dumper, args=(folder, every), daemon=True, name="tracemalloc-dump").start()
    from coordinator.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
