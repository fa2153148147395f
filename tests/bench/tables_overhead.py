"""Added latency of the table step per commit (a script, not a test).

Commits the same kind of dataset (``--tasks`` Parquet files) again and again,
in one run and in turned order:

- ``unbound``: files and a manifest;
- ``iceberg-footer``: the same, bound to an Iceberg table in ``append`` mode,
  the files sent without statistics, so the table step reads each file's
  footer (pyiceberg ``add_files``: what every bound commit did before issue 31);
- ``iceberg-stats``: the same, the files sent with their statistics, from
  which the table step builds the data files without a read;
- ``delta-footer`` and ``delta-stats``: the same two for a Delta table in the
  dataset's own folder (footer: each file read whole through the store port).

pyiceberg's SQL catalog on SQLite. Stores (``--stores``): ``local`` (local
files), ``latency`` (local files under /dev/shm when there is one, every
store request delayed by the lognormal model of ``--latency-ms`` /
``--latency-p99-ms``, the fleet's requests through ``store.model_latency_ms``
and the table's through pyiceberg's file IO with the same model,
:mod:`tests._support.latency_iceberg`; the catalog's SQLite calls are not
delayed), ``s3`` (the moto emulator). Prints the median commit time of each
kind and the ratios to ``unbound``::

    .venv/bin/python -m tests.bench.tables_overhead --commits 20 --tasks 4

A table format plugs in through :data:`FORMATS`: a name and a function that
returns the step of a staged job (its bound kinds are then ``<format>-footer``
and ``<format>-stats``); ``--formats`` picks some.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from shared.commit import CommitStep, commit_dataset
from shared.events import TableBinding
from shared.settings import Settings, StoreSettings, TablesSettings
from shared.storage import open_store
from tests._support.commit import ManualLease, fast_settings
from tests._support.emulators import DUMMY_AWS_ENV, StoreTarget, create_bucket, start_emulator
from tests._support.latency_iceberg import LATENCY_MS, LATENCY_P99_MS
from tests._support.tables import ParquetJob, stage_parquet_job

TABLE = "bench.orders"

StepOf = Callable[[ParquetJob, bool], CommitStep]
"""``step_of(job, first)``: the table step of a staged job (``first``: the commit that creates the table)."""


def iceberg_step(job: ParquetJob, first: bool) -> CommitStep:
    step: CommitStep = job.step(TableBinding(table=TABLE, mode="create" if first else "append"))
    return step


def delta_step(job: ParquetJob, first: bool) -> CommitStep:
    """The Delta step of the job (``<dataset>/_delta_log/``; the first commit creates the table)."""
    step: CommitStep = job.step(TableBinding(delta=True, mode="append"))
    return step


HOW = ("footer", "stats")
"""How the bound kinds describe their files (``--footer-only``: the code before statistics travelled)."""

FORMATS: dict[str, StepOf] = {"iceberg": iceberg_step, "delta": delta_step}
"""Table formats measured, by name (``--formats`` picks some)."""


def bench_settings(target: StoreTarget, tmp: Path, latency_ms: float, p99_ms: float) -> Settings:
    """Fast commit settings on ``target``; with latency, pyiceberg's IO delayed by the same model."""
    uri = "" if target.backend == "local" else f"sqlite:///{tmp}/catalog-{target.backend}.db"
    props: dict[str, str] = {}
    if latency_ms > 0:
        props = {
            "py-io-impl": "tests._support.latency_iceberg.LatencyFileIO",
            LATENCY_MS: str(latency_ms),
            LATENCY_P99_MS: str(p99_ms),
        }
    return msgspec.structs.replace(
        fast_settings(), store=target.settings, tables=TablesSettings(uri=uri, properties=props)
    )


async def bench(target: StoreTarget, settings: Settings, commits: int, tasks: int) -> dict[str, float]:
    """Return the median seconds of a commit of each kind on ``target``."""
    kinds = ["unbound"] + [f"{name}-{how}" for name in FORMATS for how in HOW]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    async with open_store(target.url, settings.store) as store:
        for name, step_of in FORMATS.items():
            # The table exists before timing, as it does for every commit but the first (an Iceberg
            # table is shared by the kinds' datasets; a Delta table is the dataset's own folder).
            for n, how in enumerate(HOW):
                first = await stage_parquet_job(store, f"{name}-{how}", "job-init", tasks=tasks)
                lease = ManualLease(f"{name}-{how}", 1)
                step = step_of(first, n == 0)
                res = await commit_dataset(store, first.req, lease, settings, extra_steps=[step])
                assert res.ok, res
        for i in range(commits):
            order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
            for kind in order if i % 2 else reversed(order):
                name, _, how = kind.partition("-")
                job = await stage_parquet_job(store, kind, f"job-{i}", tasks=tasks, stats=how == "stats")
                extra = [FORMATS[name](job, False)] if how else []
                start = time.perf_counter()
                res = await commit_dataset(store, job.req, ManualLease(kind, 2), settings, extra_steps=extra)
                times[kind].append(time.perf_counter() - start)
                assert res.ok, res
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--stores", default="local,latency", help="comma-separated: local, latency, s3")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--latency-p99-ms", type=float, default=100.0)
    ap.add_argument("--footer-only", action="store_true", help="no stats kind (to run on an older checkout)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: iceberg, delta")
    args = ap.parse_args()
    for name in set(FORMATS) - set(args.formats.split(",")):
        del FORMATS[name]
    if args.footer_only:
        global HOW
        HOW = ("footer",)
    os.environ.update(DUMMY_AWS_ENV)
    stores = args.stores.split(",")
    shm = Path("/dev/shm")
    with (
        tempfile.TemporaryDirectory() as d,
        tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as fast,
    ):
        tmp = Path(d)
        emu = None
        try:
            for kind in stores:
                latency = (args.latency_ms, args.latency_p99_ms) if kind == "latency" else (0.0, 0.0)
                if kind == "s3":
                    emu = start_emulator("s3", tmp / "moto")
                    create_bucket(emu, "bench")
                    target = StoreTarget("s3", "s3://bench/tables", emu.settings())
                elif kind == "latency":
                    model = StoreSettings(model_latency_ms=latency[0], model_latency_p99_ms=latency[1])
                    target = StoreTarget("local", (Path(fast) / "store").as_uri(), model)
                else:
                    target = StoreTarget("local", (tmp / "store").as_uri(), Settings().store)
                settings = bench_settings(target, tmp, *latency)
                got = asyncio.run(bench(target, settings, args.commits, args.tasks))
                line = f"{kind:8} unbound {got['unbound'] * 1000:7.1f} ms"
                for k, v in got.items():
                    if k != "unbound":
                        line += f"  {k} {v * 1000:7.1f} ms ({v / got['unbound']:.2f}x)"
                print(line, flush=True)
        finally:
            if emu is not None:
                emu.stop()


if __name__ == "__main__":
    main()
