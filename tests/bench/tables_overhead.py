"""Added latency of the table step per commit (a script, not a test).

Commits the same kind of dataset (``--tasks`` Parquet files) again and again,
alternating unbound (files and a manifest) and bound to an Iceberg table in
``append`` mode (the same plus one snapshot through pyiceberg's SQL catalog
on SQLite), on local files and on the S3 emulator (moto), all in one run, and
prints the median commit time of each and the ratio bound / unbound::

    .venv/bin/python -m tests.bench.tables_overhead --commits 20 --tasks 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from shared.commit import commit_dataset
from shared.events import TableBinding
from shared.settings import Settings, TablesSettings
from shared.storage import open_store
from tests._support.commit import ManualLease, fast_settings
from tests._support.emulators import DUMMY_AWS_ENV, StoreTarget, create_bucket, start_emulator
from tests._support.tables import stage_parquet_job


async def bench(target: StoreTarget, tmp: Path, commits: int, tasks: int) -> dict[str, float]:
    """Return the median seconds of an unbound and of a bound commit on ``target``."""
    uri = "" if target.backend == "local" else f"sqlite:///{tmp}/catalog-{target.backend}.db"
    settings: Settings = msgspec.structs.replace(
        fast_settings(), store=target.settings, tables=TablesSettings(uri=uri)
    )
    times: dict[str, list[float]] = {"unbound": [], "bound": []}
    async with open_store(target.url, target.settings) as store:
        # The table exists before timing (create once), as it does for every commit but the first.
        first = await stage_parquet_job(store, "bound", "job-init", tasks=tasks)
        step = first.step(TableBinding(table="bench.orders", mode="create"))
        assert (
            await commit_dataset(store, first.req, ManualLease("bound", 1), settings, extra_steps=[step])
        ).ok
        for i in range(commits):
            for kind in ("unbound", "bound") if i % 2 else ("bound", "unbound"):
                job = await stage_parquet_job(store, kind, f"job-{i}", tasks=tasks)
                extra = [job.step(TableBinding(table="bench.orders"))] if kind == "bound" else []
                start = time.perf_counter()
                res = await commit_dataset(store, job.req, ManualLease(kind, 1), settings, extra_steps=extra)
                times[kind].append(time.perf_counter() - start)
                assert res.ok, res
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=4)
    args = ap.parse_args()
    os.environ.update(DUMMY_AWS_ENV)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        emu = start_emulator("s3", tmp / "moto")
        try:
            create_bucket(emu, "bench")
            targets = [
                StoreTarget("local", (tmp / "store").as_uri(), Settings().store),
                StoreTarget("s3", "s3://bench/tables", emu.settings()),
            ]
            for target in targets:
                got = asyncio.run(bench(target, tmp, args.commits, args.tasks))
                print(
                    f"{target.backend:5}  unbound {got['unbound'] * 1000:7.1f} ms  "
                    f"bound {got['bound'] * 1000:7.1f} ms  ratio {got['bound'] / got['unbound']:.2f}"
                )
        finally:
            emu.stop()


if __name__ == "__main__":
    main()
