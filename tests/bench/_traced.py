"""``CF_TRACEMALLOC_DIR=D python -m tests.bench._traced worker ...``: the real CLI under tracemalloc.

A benchmark's way to see what a fleet process keeps (issue 9: memory follows
open work, not history), without any hook in the product: this launcher starts
``tracemalloc`` (``CF_TRACEMALLOC_FRAMES`` frames, default 8) and a daemon
thread that dumps a snapshot into ``D`` every ``CF_TRACEMALLOC_EVERY`` seconds
(default 60), named ``<pid>-<seconds since start>.snap``, then runs the
``commitfleet`` CLI as usual. Diff two of them with
``python -m tests.bench.heapdiff OLD NEW``.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path


def _dumper(folder: Path, every: float) -> None:
    t0 = time.monotonic()
    while True:
        time.sleep(every)
        snap = tracemalloc.take_snapshot()
        path = folder / f"{os.getpid()}-{time.monotonic() - t0:06.0f}.snap"
        snap.dump(str(path.with_suffix(".tmp")))
        os.replace(path.with_suffix(".tmp"), path)


def main() -> None:
    folder = Path(os.environ["CF_TRACEMALLOC_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get("CF_TRACEMALLOC_FRAMES", "8")))
    every = float(os.environ.get("CF_TRACEMALLOC_EVERY", "60"))
    threading.Thread(target=_dumper, args=(folder, every), daemon=True, name="tracemalloc-dump").start()
    from coordinator._cli import main as cli

    cli()


if __name__ == "__main__":
    main()
