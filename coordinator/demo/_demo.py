"""``commitfleet demo``: the whole system end to end on one machine.

1. Redis: ``REDIS_URL`` when set, else a throwaway ``redis-server`` on a free port.
2. Store: the local-files backend in a temporary (or ``--root``) folder.
3. Fleet: a coordinator and two workers, as separate processes.
4. Job 1, a real PySpark job (local mode, task retries on): three datasets;
   one task of ``orders`` fails once after it published, so a retried attempt
   exists and must win. ``orders`` is bound to the Iceberg table
   ``demo.orders`` (created by this commit; SQL catalog in the store);
   ``clicks`` to the Delta Lake table in its own folder.
5. Job 2 writes a dataset, then raises: it is rolled back.
6. Live: the admin events as they arrive; at the end an audit table proving
   each dataset was committed exactly once and the failed job left nothing;
   the tables' row counts and snapshot / version histories.

Every process the demo started is stopped on the way out. Exit code 0 only
when every check passed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from coordinator.admin import fleet_summary
from shared import Settings, load_settings
from shared.commit import audit, read_manifest, read_watermarks
from shared.events import AdminEvent
from shared.queue import Keys, connect, read_admin_range
from shared.settings import masked_url
from shared.storage import ObjectStore, open_store

from ._launcher import FleetProcess, ThrowawayRedis, write_config
from ._spark_log import quiet_spark_conf
from ._streaming import streaming_runs, verify_stream

DATASETS = ("orders", "customers", "clicks")
FAILED_DATASET = "refunds"
PARTITIONS = 4
ROWS = 4000
TABLE = "demo.orders"  # 'orders' is bound to this Iceberg table (created by its first commit)
DELTA_DATASET = "clicks"  # bound to the Delta Lake table in its own folder (one version per job)


def _settings(redis_url: str, root: Path) -> Settings:
    return load_settings(
        env={},
        overrides={
            "fleet": {"name": f"demo-{secrets.token_hex(3)}", "shards": 16},
            "redis": {"url": redis_url},
            "store": {"url": root.as_uri()},
            "lock": {"validity": 15.0, "renew_interval": 3.0, "poll_min": 0.02, "poll_max": 0.5},
            "worker": {"lease": 6.0, "heartbeat": 1.0, "read_block_ms": 200, "job_timeout": 600.0},
            "coordinator": {"tick": 0.3, "http_port": 0},
            # The audit reads the shard stream back to show which attempt of orders' task 1
            # won; a production fleet trims acknowledged entries, the demo keeps them.
            "queue": {"trim_interval": 0.0},
            "log": {"level": "INFO", "format": "json"},
        },
    )


def _describe(ev: AdminEvent) -> str:
    tag = str(type(ev).__struct_config__.tag)
    keep = ("worker", "dataset", "job", "files", "bytes", "reason", "epoch", "moved", "files_deleted")
    parts = [f"{k}={getattr(ev, k)}" for k in keep if getattr(ev, k, "") not in ("", None, 0)]
    return f"[cyan]{tag:<16}[/] " + " ".join(parts)


class _EventPrinter:
    def __init__(self, settings: Settings, console: Console) -> None:
        self.settings = settings
        self.console = console
        self.last = b"0-0"
        self.seen: list[AdminEvent] = []

    async def poll(self) -> None:
        r = connect(self.settings.redis)
        try:
            rows = await read_admin_range(r, Keys(self.settings.fleet.name), start=b"(" + self.last)
        finally:
            await r.aclose()
        for entry_id, ev in rows:
            self.last = entry_id
            self.seen.append(ev)
            self.console.print("  " + _describe(ev))


async def _wait(check: Any, printer: _EventPrinter, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        await printer.poll()
        if await check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.25)


async def _fleet_ready(settings: Settings) -> bool:
    r = connect(settings.redis)
    try:
        doc = await fleet_summary(r, Keys(settings.fleet.name), settings)
    finally:
        await r.aclose()
    rows = doc["shard_table"]
    # Settled: both workers own shards and nothing is moving.
    return (
        len(doc["workers"]) == 2
        and all(w["shards"] for w in doc["workers"])
        and all(row["owner"] and not row["moving_to"] for row in rows)
    )


def _spark_jobs(settings: Settings, console: Console, tmp: Path) -> tuple[str, str]:
    from pyspark.sql import functions as F

    from shared.spark import ProducerConfig, commit_job, local_spark_session, max_watermark

    config = ProducerConfig.from_settings(settings, app="demo")
    console.rule("[bold]Spark")
    console.print("starting a local Spark session (local[2,2]: task retries on) ...")
    quiet = quiet_spark_conf(tmp)
    spark = local_spark_session("commitfleet-demo", master="local[2,2]", extra_conf=quiet, tmp_dir=tmp)
    try:
        df = spark.range(0, ROWS, numPartitions=PARTITIONS).withColumn("amount", (F.col("id") % 97) * 1.5)
        console.print(
            f"job 1: writing {', '.join(DATASETS)} ({PARTITIONS} tasks each; "
            "task 1 of 'orders' fails once after publishing)"
        )
        with commit_job(spark, datasets=DATASETS, config=config) as job:
            job.write_dataset(
                df, "orders", watermarks=max_watermark("id"), fail_once_tasks={1}, table=TABLE, mode="create"
            )
            job.write_dataset(df.where("id % 3 = 0"), "customers", watermarks=max_watermark("id"))
            job.write_dataset(
                df.where("id % 5 = 0"), DELTA_DATASET, watermarks=max_watermark("id"), delta=True
            )
            good = job.job_id
        console.print(f"job 1 [green]finished[/]: {good}")
        console.print("job 2: writes 'refunds', then raises")
        bad = ""
        try:
            with commit_job(spark, datasets=(FAILED_DATASET,), config=config) as job2:
                bad = job2.job_id
                job2.write_dataset(df, FAILED_DATASET)
                raise RuntimeError("demo: the pipeline's last step failed")
        except RuntimeError as exc:
            console.print(f"job 2 [red]failed[/] as intended: {exc}")
        return good, bad
    finally:
        spark.stop()


async def _verify(settings: Settings, good: str, bad: str, printer: _EventPrinter, console: Console) -> bool:
    async with open_store(settings.store.url, settings.store) as store:
        console.rule("[bold]Fleet")
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("commits, rollback, clean-up", total=len(DATASETS) + 2)

            async def done() -> bool:
                steps = 0
                for ds in DATASETS:
                    steps += await read_manifest(store, ds, good) is not None
                steps += not [i async for i in store.list("_staging/")]
                # The manifest is written before the last step: wait for the WAL to go too.
                steps += not [i async for i in store.list("_wal/")]
                progress.update(bar, completed=steps)
                return steps == len(DATASETS) + 2

            await _wait(done, printer, 120, "the commits and the rollback")
        report = await audit(store, settings=settings)
        table = Table("dataset", "job", "files", "bytes", "watermark id", "exactly once", title="Audit")
        ok = report.ok
        for ds in DATASETS:
            m = await read_manifest(store, ds, good)
            marks = await read_watermarks(store, ds)
            own = ("/_commits/", "/_delta_log/")  # manifests; the Delta table's log
            published = [i async for i in store.list(f"{ds}/") if not any(o in i.key for o in own)]
            listed = {f.key for f in m.files} if m else set()
            once = m is not None and {p.key for p in published} == listed and len(m.files) == PARTITIONS
            ok = ok and once
            table.add_row(
                ds,
                good,
                str(len(m.files) if m else 0),
                str(m.bytes if m else 0),
                str(marks.get("id", "-")),
                "[green]yes[/]" if once else "[red]NO[/]",
            )
        leftovers = [i.key async for i in store.list(f"{FAILED_DATASET}/")]
        staged = [i.key async for i in store.list(f"_staging/{bad}/")] if bad else []
        rolled_back = not leftovers and not staged
        ok = ok and rolled_back
        table.add_row(
            FAILED_DATASET,
            bad,
            "0",
            "0",
            "-",
            "[green]rolled back[/]" if rolled_back else "[red]LEFT FILES[/]",
        )
        console.print(table)
        for v in report.violations:
            console.print(f"[red]violation[/] {v.kind} {v.key} {v.detail}")
        attempts, winner = await _orders_task1(settings, good)
        retried = attempts >= 2 and winner == 1
        console.print(
            f"orders task 1: {attempts} published attempts, winner attempt {winner} "
            + ("[green](the retried attempt won)[/]" if retried else "[red](expected a retried winner)[/]")
        )
        ok = ok and retried and await _show_table(settings, good, console)
        ok = await _show_delta(store, good, console) and ok
        console.print(
            f"audit: {report.manifests} manifests, {report.files} files, {report.bytes} bytes, "
            f"{len(report.violations)} violations"
        )
        return ok


async def _show_table(settings: Settings, job: str, console: Console) -> bool:
    """Print the Iceberg table 'orders' is bound to: row count and snapshot history; True when as expected."""
    from shared.commit import JOB_PROPERTY, load_table, open_catalog

    def read() -> tuple[int, list[tuple[int, str, str]]]:
        tbl = load_table(open_catalog(settings, settings.store.url), TABLE)
        if tbl is None:
            return 0, []
        history = [
            (
                s.snapshot_id,
                str(s.summary.operation.value if s.summary else ""),
                s.summary.get(JOB_PROPERTY, ""),
            )
            for s in tbl.metadata.snapshots
            if s.summary is not None
        ]
        return tbl.scan().to_arrow().num_rows, history

    rows, history = await asyncio.to_thread(read)
    for snap, op, by in history:
        console.print(f"table {TABLE}: snapshot {snap} {op} by job {by}")
    good = rows == ROWS and [by for _, _, by in history] == [job]
    console.print(
        f"table {TABLE}: {rows} rows, {len(history)} snapshot(s) "
        + (
            "[green](each row once, one snapshot)[/]"
            if good
            else "[red](expected one snapshot of every row)[/]"
        )
    )
    return good


async def _show_delta(store: ObjectStore, job: str, console: Console) -> bool:
    """Print the Delta table 'clicks' is bound to: its versions and rows (its log); True when as expected."""
    from shared.commit import read_state

    state = await read_state(store, DELTA_DATASET)
    if state is None:
        console.print(f"[red]delta table {DELTA_DATASET}: no log[/]")
        return False
    for version, (_, by) in sorted(state.fleet_commits.items()):
        console.print(f"delta table {DELTA_DATASET}: version {version} by job {by}")
    rows = 0
    for add in state.files.values():
        rows += int(msgspec.json.decode(add.get("stats") or "{}").get("numRecords", 0))
    want = len(range(0, ROWS, 5))
    good = rows == want and [by for _, (_, by) in sorted(state.fleet_commits.items())] == [job]
    console.print(
        f"delta table {DELTA_DATASET}: {rows} rows in {len(state.files)} files, "
        f"{len(state.fleet_commits)} version(s) "
        + ("[green](each row once, one version)[/]" if good else f"[red](expected {want} rows, 1 version)[/]")
    )
    return good


async def _orders_task1(settings: Settings, job: str) -> tuple[int, int | None]:
    """Return how many attempts of orders' task 1 were published, and the winner JobFinished named."""
    from shared.events import JobFinished, TaskFinished, ValidationLimits, decode_entry
    from shared.queue import shard_of

    keys = Keys(settings.fleet.name)
    limits = ValidationLimits.from_settings(settings.security, fleet=settings.fleet.name)
    stream = keys.events(shard_of("orders", settings.fleet.shards))
    r = connect(settings.redis)
    try:
        rows: Any = await r.xrange(stream)
    finally:
        await r.aclose()
    attempts: set[int] = set()
    winner: int | None = None
    for entry_id, fields in rows:
        ev = decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)
        if isinstance(ev, TaskFinished) and ev.job == job and ev.dataset == "orders" and ev.task == 1:
            attempts.add(ev.attempt)
        elif isinstance(ev, JobFinished) and ev.job == job and "orders" in ev.datasets:
            exp = ev.datasets["orders"]
            winner = exp.winners[1] if exp.winners else None
    return len(attempts), winner


def run_demo(*, root: Path | None, keep: bool, console: Console, streaming: bool = False) -> int:
    """Run the demo; return the process exit code (0 = every check passed, 2 = no pyspark installed).

    ``streaming``: the Structured Streaming demo (:mod:`._streaming`) instead of the batch jobs.
    """
    if importlib.util.find_spec("pyspark") is None:
        console.print("demo: it runs a real PySpark job: pip install 'commitfleet[spark]'", markup=False)
        return 2
    started = time.monotonic()
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="commitfleet-demo-"))
        if not keep:
            stack.callback(shutil.rmtree, work, True)
        store_root = (root or work / "store").resolve()
        store_root.mkdir(parents=True, exist_ok=True)
        redis_url = os.environ.get("REDIS_URL", "")
        if not redis_url:
            server = ThrowawayRedis(work)
            stack.callback(server.stop)
            redis_url = server.url
        settings = _settings(redis_url, store_root)
        console.rule("[bold]commitfleet demo")
        # REDIS_URL may carry a password: print it masked.
        console.print(
            f"redis {masked_url(redis_url)}  store {settings.store.url}  fleet {settings.fleet.name}"
        )
        config = write_config(settings, work / "fleet.toml")
        procs: list[FleetProcess] = []

        def stop_all() -> None:
            for p in procs:
                if p.proc.poll() is None:
                    try:
                        p.terminate(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                p.close()

        stack.callback(stop_all)
        procs.append(FleetProcess("coordinator", "coordinator-1", config, work))
        procs += [FleetProcess("worker", f"worker-{i}", config, work) for i in (1, 2)]
        printer = _EventPrinter(settings, console)
        try:
            asyncio.run(_wait(lambda: _fleet_ready(settings), printer, 60, "the fleet"))
            if streaming:
                rows, planned = streaming_runs(config, work, console)
                asyncio.run(printer.poll())
                ok = planned and asyncio.run(verify_stream(settings, rows, console))
            else:
                good, bad = _spark_jobs(settings, console, work)
                ok = asyncio.run(_verify(settings, good, bad, printer, console))
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            for p in procs:
                console.print(f"--- {p.name} log (tail) ---\n{p.output()[-3000:]}", markup=False)
            return 1
        elapsed = time.monotonic() - started
        if ok:
            what = (
                "every micro-batch committed exactly once across a driver kill and restart"
                if streaming
                else "every dataset committed exactly once, the failed job left nothing"
            )
            console.print(f"[bold green]demo passed[/] in {elapsed:.0f}s: {what}")
            if keep:
                console.print(f"store kept at {store_root}, logs in {work}")
            return 0
        console.print(f"[bold red]demo FAILED[/] after {elapsed:.0f}s")
        return 1
