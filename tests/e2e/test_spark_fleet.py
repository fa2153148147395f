"""End to end: real PySpark jobs through a real fleet (a coordinator and two worker processes).

One local SparkSession (``local[2,2]``: a task that fails once is retried) and
one fleet for the whole module, on a local-files store and the session's
redis-server (this module never asks for ``redis_url``, so nothing flushes
Redis under the running fleet; every job has its own id). Messages are signed
with an HMAC secret. Each test runs a job with the real producer
(``commit_job``), waits for the fleet to act on it (admin events, the store),
and checks the real outcome: manifests, published files and their bytes, the
watermarks, the staging area, the audit.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pyarrow as pa
import pytest
import redis
import redis.asyncio

from shared.commit import audit, read_manifest
from shared.events import (
    Aborted,
    Committed,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    TableBinding,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    staged_key,
    staging_prefix,
)
from shared.queue import shard_of
from shared.spark import commit_job
from shared.storage import ObjectStore
from tests._support.fleet_checks import admin_events
from tests._support.redis_server import RedisHandle
from tests._support.spark import spark_session_fixture
from tests._support.spark_fleet import (  # noqa: F401 - the store and fleet fixtures
    ROWS,
    SHARDS,
    WORKERS,
    E2EFleet,
    e2e_store,
    events_of,
    keys_under,
    run_e2e_fleet,
    settled_fleet,
    tagged_rows,
    three_datasets_commit_exactly_once,
)
from tests._support.wait import wait_for, wait_for_sync

pytestmark = pytest.mark.spark

spark = spark_session_fixture("test-e2e-spark-fleet", master="local[2,2]")


@pytest.fixture(scope="module")
def e2e(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    """Start a coordinator and two workers (not waiting for them: Spark starts meanwhile)."""
    with run_e2e_fleet(tmp_path_factory.mktemp("e2e-fleet"), redis_server.url, app="e2e") as fleet:
        yield fleet


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(e2e.settings.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


# -- helpers ---------------------------------------------------------------------


async def wait_rolled_back(
    r: redis.asyncio.Redis, store: ObjectStore, fleet: E2EFleet, job: str, datasets: list[str]
) -> list[Aborted]:
    """Wait until the fleet aborted ``job`` on every dataset; check that nothing of it is left."""

    async def aborted() -> list[Aborted] | None:
        evs = [
            e
            for e in await admin_events(r, fleet.settings.fleet.name)
            if isinstance(e, Aborted) and e.job == job
        ]
        return evs if {e.dataset for e in evs} >= set(datasets) else None

    evs = await wait_for(aborted, timeout=60, what=f"the fleet to abort {job}")
    assert sorted(e.dataset for e in evs) == sorted(datasets), "each dataset aborted exactly once"
    committed = [
        e
        for e in await admin_events(r, fleet.settings.fleet.name)
        if isinstance(e, Committed) and e.job == job
    ]
    assert not committed
    for ds in datasets:
        assert await read_manifest(store, ds, job) is None
        assert await keys_under(store, f"{ds}/") == [], f"{ds}: nothing published, no manifest"
        assert await keys_under(store, f"_wal/{ds}/") == []
    assert await keys_under(store, f"_staging/{job}/") == [], "the job's staged files are gone"
    return evs


# -- tests -------------------------------------------------------------------------


async def test_three_datasets_commit_exactly_once_with_a_retried_winner_and_watermarks(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    await three_datasets_commit_exactly_once(spark, fleet, r, store)


async def test_job_raising_in_the_driver_after_a_write_is_rolled_back(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    df = spark.range(0, 40, numPartitions=2)
    job_id = ""

    async def run() -> None:
        nonlocal job_id
        with commit_job(spark, datasets=["refunds", "returns"], config=fleet.producer) as job:
            job_id = job.job_id
            job.write_dataset(df, "refunds")
            staged = await keys_under(store, staging_prefix(job_id, "refunds"))
            assert len(staged) == 2, staged  # the fleet has something to roll back
            raise RuntimeError("boom after writing refunds")

    with pytest.raises(RuntimeError, match="boom"):
        await run()

    failed = [e for e in await events_of(r, fleet, job_id) if isinstance(e, JobFailed)]
    assert failed and all("boom" in e.reason for e in failed)
    evs = await wait_rolled_back(r, store, fleet, job_id, ["refunds", "returns"])
    assert all(e.reason.startswith("failed:") and "boom" in e.reason for e in evs)
    assert sum(e.files_deleted for e in evs) == 2
    report = await audit(store, ended_jobs=[job_id])
    assert report.ok, report.violations


async def test_job_cancelled_from_another_thread_during_an_action_is_rolled_back(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    def slow_task_1(task: int, table: pa.Table) -> dict[str, int]:
        if task == 1:
            time.sleep(120)  # far longer than the test allows: only the cancel ends it in time
        return {}

    sc = spark.sparkContext
    limits = ValidationLimits.from_settings(fleet.settings.security, fleet=fleet.settings.fleet.name)

    def reported(client: redis.Redis, job: str, dataset: str) -> set[int]:
        stream = fleet.keys.events(shard_of(dataset, SHARDS))
        evs = (
            decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)
            for entry_id, fields in client.xrange(stream)
        )
        return {e.task for e in evs if isinstance(e, TaskFinished) and (e.job, e.dataset) == (job, dataset)}

    def cancel_mid_action(job: Any) -> None:
        # Task 0 of 'slow' has staged and reported its file, task 1 still runs: cancel now.
        client = redis.Redis.from_url(fleet.settings.redis.url)
        try:
            wait_for_sync(
                lambda: (
                    reported(client, job.job_id, "slow") == {0} and sc.statusTracker().getActiveStageIds()
                ),
                timeout=60,
                what="task 0 of the slow action to report while task 1 runs",
            )
        finally:
            client.close()
        job.cancel("operator asked")

    df = spark.range(0, 40, numPartitions=2)
    job_id = ""
    staged: list[str] = []

    async def run() -> None:
        nonlocal job_id, staged
        with commit_job(spark, datasets=["quick", "slow"], config=fleet.producer) as job:
            job_id = job.job_id
            job.write_dataset(df, "quick")
            canceller = threading.Thread(target=cancel_mid_action, args=(job,))
            canceller.start()
            try:
                job.write_dataset(df, "slow", watermarks=slow_task_1)
            finally:
                canceller.join()
                staged = await keys_under(store, f"_staging/{job_id}/")

    cancel_started = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)cancel"):  # Spark's own exception type
        await run()
    sys.stderr.write(
        f"[figure] cancelled job: action ended {time.monotonic() - cancel_started:.1f}s after start\n"
    )
    # Something for the fleet to roll back: both tasks of 'quick', task 0 of 'slow'.
    assert sorted(staged) == sorted(
        [staged_key(job_id, "quick", t, 0, "part-0.parquet") for t in (0, 1)]
        + [staged_key(job_id, "slow", 0, 0, "part-0.parquet")]
    )

    # Task 1 of 'slow' was interrupted, not awaited: it never staged or reported anything.
    wait_for_sync(lambda: not sc.statusTracker().getActiveStageIds(), timeout=15, what="stages to stop")
    events = await events_of(r, fleet, job_id)
    tasks = sorted((e.dataset, e.task) for e in events if isinstance(e, TaskFinished))
    assert tasks == [("quick", 0), ("quick", 1), ("slow", 0)]
    cancelled = [e for e in events if isinstance(e, JobCancelled)]
    assert cancelled and all(e.reason == "operator asked" for e in cancelled)
    assert sorted(d for e in cancelled for d in e.datasets) == ["quick", "slow"]
    assert not [e for e in events if isinstance(e, JobFinished | JobFailed)]

    evs = await wait_rolled_back(r, store, fleet, job_id, ["quick", "slow"])
    assert all(e.reason == "cancelled: operator asked" for e in evs)
    assert {e.dataset: e.files_deleted for e in evs} == {"quick": 2, "slow": 1}
    assert {e.worker for e in evs} <= WORKERS
    report = await audit(store, ended_jobs=[job_id])
    assert report.ok, report.violations


# Run alone, this test pays for the module's Spark session and fleet: on a loaded 2-core machine that
# alone took over a minute.
@pytest.mark.timeout(360)
async def test_a_bound_and_an_unbound_dataset_the_table_scan_returns_each_row_once(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    from shared.commit import JOB_PROPERTY, load_table, open_catalog

    table = f"lake.e2e_{secrets.token_hex(4)}"
    df = tagged_rows(spark, 3)
    with commit_job(spark, datasets=["orders_tbl", "raw_tbl"], config=fleet.producer) as job:
        won = job.write_dataset(df, "orders_tbl", table=table, mode="create", fail_once_tasks={1})
        job.write_dataset(df.where("id % 2 = 0"), "raw_tbl")
    job_id = job.job_id
    assert [(w.task, w.attempt) for w in won] == [(0, 0), (1, 1), (2, 0)]
    starts = [e for e in await events_of(r, fleet, job_id) if isinstance(e, JobStarted)]
    assert any(e.tables.get("orders_tbl") == TableBinding(table=table, mode="create") for e in starts)

    async def committed() -> bool:
        for ds in ("orders_tbl", "raw_tbl"):
            if await read_manifest(store, ds, job_id) is None or await keys_under(store, f"_wal/{ds}/"):
                return False
        return True

    await wait_for(committed, timeout=60, what="both datasets committed")
    tbl = load_table(open_catalog(fleet.settings, fleet.settings.store.url), table)
    assert tbl is not None, "the bound dataset's table was created by its first commit"
    assert [s.summary.get(JOB_PROPERTY) for s in tbl.metadata.snapshots if s.summary] == [job_id]
    rows = tbl.scan().to_arrow().sort_by("id")
    assert rows.column("id").to_pylist() == list(range(ROWS)), "each row once, the loser's never"
    # Task 1's rows come from its retried attempt, the winner.
    assert {
        a
        for i, a in zip(rows.column("id").to_pylist(), rows.column("attempt").to_pylist(), strict=True)
        if 80 <= i < 160
    } == {1}
    report = await audit(store, settings=fleet.settings, tables={"orders_tbl": table})
    kinds = ("missing_snapshot", "duplicate_snapshot", "snapshot_without_manifest")
    assert not [v for v in report.violations if v.kind in kinds], report.violations
    # The unbound dataset is files and a manifest only.
    assert await read_manifest(store, "raw_tbl", job_id) is not None


@pytest.mark.timeout(360)
async def test_a_delta_bound_dataset_one_version_per_job_read_back_by_delta_rs(
    spark: Any, fleet: E2EFleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    from urllib.parse import unquote, urlsplit

    from deltalake import DeltaTable

    dataset = f"sales_delta_{secrets.token_hex(3)}"
    df = tagged_rows(spark, 3)
    jobs = []
    for mode, fail in (("append", {1}), ("append", set()), ("overwrite", set())):
        with commit_job(spark, datasets=[dataset], config=fleet.producer) as job:
            job.write_dataset(
                df, dataset, delta=True, mode=mode, partition_by=["attempt"], fail_once_tasks=fail
            )
        jobs.append(job.job_id)
        starts = [e for e in await events_of(r, fleet, job.job_id) if isinstance(e, JobStarted)]
        assert any(e.tables.get(dataset) == TableBinding(delta=True, mode=mode) for e in starts)  # type: ignore[arg-type]

        async def committed(job_id: str = job.job_id) -> bool:
            return await read_manifest(store, dataset, job_id) is not None and not await keys_under(
                store, f"_wal/{dataset}/"
            )

        await wait_for(committed, timeout=60, what=f"{dataset} committed by {job.job_id}")
    root = unquote(urlsplit(fleet.settings.store.url).path)
    dt = DeltaTable(f"{root}/{dataset}")
    fleet_versions = [(h["version"], h["commitfleet"]["job"]) for h in dt.history() if "commitfleet" in h]
    assert sorted(fleet_versions) == [(0, jobs[0]), (1, jobs[1]), (2, jobs[2])]
    assert dt.metadata().partition_columns == ["attempt"]
    rows = pa.table(dt.to_pyarrow_table()).sort_by("id")
    assert rows.column("id").to_pylist() == list(range(ROWS)), (
        "the overwrite left the last job's rows, each once"
    )
    report = await audit(store)
    assert report.ok, report.violations
