"""Intake CPU per event, counted in instructions (a script, not a test): repeatable on a noisy machine.

The worker's intake is CPU-bound (``commitfleet bench``: its wall time per
event is within a fifth of its CPU time), and on a shared virtual machine its
rate moves by half from one run to the next. This counts what one event costs
instead: it feeds ``--events`` TaskFinished entries (as ``entries_from_raw``
builds them from a stream reply, 500 a batch) through the shard's judging
(``Intake._judge_all``: decode, validate, route, decide, apply) and the
encoding of their save (``ShardStateStore.prepare``), with no Redis, under
``valgrind --tool=callgrind``; and once more building the same entries without
judging them. The difference over the events is the instructions per event,
the same from run to run for the same code (valgrind counts instructions,
whatever else the machine does)::

    .venv/bin/python -m tests.bench.intake_instructions --events 5000
    # before/after: another checkout measured the same way
    git worktree add /tmp/before HEAD~1
    .venv/bin/python -m tests.bench.intake_instructions --compare /tmp/before

Without valgrind on the PATH, ``--cpu`` times the judging in process instead
(CPU seconds, as noisy as the machine). Measured on the development machine
(stop 14, against the code before that stop's changes): 68,037 -> 60,454 instructions per event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

BATCH = 500


def _entries(n: int) -> list[list[Any]]:
    from shared.events import JobStarted, StagedFile, TaskFinished, entry_fields

    now = time.time()
    files = [
        StagedFile(path="part-00000-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-c000.snappy.parquet", size=123456),
        StagedFile(path="part-00001-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901-c000.snappy.parquet", size=654321),
    ]
    start = JobStarted(job="bench", datasets=["ds"], timeout_s=3600, started_at=now)
    raw: list[list[Any]] = [[b"1-0", [b"data", entry_fields(start)["data"]]]]
    for i in range(n):
        ev = TaskFinished(
            job="bench", dataset="ds", task=i, attempt=0, files=files, watermarks={"p": i}, finished_at=now
        )
        raw.append([f"2-{i}".encode(), [b"data", entry_fields(ev)["data"]]])
    return raw


def run(n: int, *, judge: bool) -> float:
    """Build ``n`` entries, judge them and encode their saves when ``judge``; return the CPU seconds
    of the judging (0 without)."""
    import redis.asyncio

    from shared.events._validation import ValidationLimits
    from shared.queue import Keys, entries_from_raw
    from workers._heap import tune_gc
    from workers._intake import Intake
    from workers._ledger import ShardLedger
    from workers._state_store import ShardStateStore

    raw = _entries(n)
    tune_gc()  # as a worker process does
    if not judge:
        return 0.0
    settings = types.SimpleNamespace(
        fleet=types.SimpleNamespace(shards=1), worker=types.SimpleNamespace(job_timeout=3600.0)
    )
    ctx: Any = types.SimpleNamespace(settings=settings, limits=ValidationLimits(), probe=None)
    consumer: Any = types.SimpleNamespace(stream="bench")
    ledger = ShardLedger()
    runner = Intake(
        ctx,
        0,
        consumer=consumer,
        ledger=ledger,
        schedule=lambda action: None,
        has_room=lambda: True,
        stopping=asyncio.Event(),
    )
    store = ShardStateStore(redis.asyncio.Redis(), Keys("bench"), 0, b"token")  # never connects

    async def judge_all() -> float:
        started = time.process_time()
        for k in range(0, len(raw), BATCH):
            batch, _todo, rejected, _dups = await runner._judge_all(entries_from_raw(raw[k : k + BATCH]))
            if rejected:
                raise SystemExit(f"{rejected} entries rejected: the bench's events must all pass")
            store.prepare(batch, ledger.state)
        return time.process_time() - started

    return asyncio.run(judge_all())


def instructions(checkout: Path, n: int, judge: bool) -> int:
    """Return the instructions valgrind counted for one run of this script in ``checkout``."""
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    argv += ["-m", "tests.bench.intake_instructions", "--events", str(n), "--child"]
    argv += ["judge" if judge else "build"]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_event(checkout: Path, n: int) -> int:
    return (instructions(checkout, n, True) - instructions(checkout, n, False)) // n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=5000)
    p.add_argument("--compare", type=Path, help="another checkout, measured the same way")
    p.add_argument("--cpu", action="store_true", help="time in process (no valgrind)")
    p.add_argument("--child", choices=["judge", "build"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run(args.events, judge=args.child == "judge")
        return
    if args.cpu or shutil.which("valgrind") is None:
        seconds = run(args.events, judge=True)
        us = seconds / args.events * 1e6
        print(f"{args.events} events: {us:.2f} us of CPU per event (judge + prepare)")
        return
    here = Path(__file__).resolve().parents[2]
    mine = per_event(here, args.events)
    print(f"{here}: {mine:,} instructions per event (judge + prepare, {args.events} events)")
    if args.compare is not None:
        theirs = per_event(args.compare.resolve(), args.events)
        print(f"{args.compare}: {theirs:,} instructions per event; this checkout {mine / theirs:.3f}x")


if __name__ == "__main__":
    main()
