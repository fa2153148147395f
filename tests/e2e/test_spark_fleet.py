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

import hashlib
import io
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import redis.asyncio

from shared import Settings
from shared.commit import ManifestFile, audit, read_manifest, read_watermarks
from shared.events import (
    Aborted,
    Committed,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    TableBinding,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    manifest_key,
    published_key,
    staged_key,
    staging_prefix,
)
from shared.fleet import FleetRegistry
from shared.queue import Keys, ensure_fleet_sync, shard_of
from shared.spark import ProducerConfig, TaskResult, commit_job, max_watermark
from shared.storage import ObjectStore, open_store
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_server import RedisHandle
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for, wait_for_sync
from tests.fleet._helpers import admin_events, fleet_settings

pytestmark = pytest.mark.spark

spark = spark_session_fixture("test-e2e-spark-fleet", master="local[2,2]")

SHARDS = 4
SECRET = "e2e-secret"
WORKERS = {"w1", "w2"}
ROWS = 240  # small on purpose: the point is the protocol, not the volume
SCHEMA = "id long, name string, attempt int"


@dataclass
class E2EFleet:
    """The module's running fleet: its settings, the producer config for it, its processes."""

    settings: Settings
    producer: ProducerConfig
    procs: list[FleetProcess]

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    def logs(self) -> str:
        return "".join(f"\n===== {p.name} ({p.kind}) =====\n{p.output()[-6000:]}" for p in self.procs)


@pytest.fixture(scope="module")
def e2e(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EFleet]:
    """Start a coordinator and two workers (not waiting for them: Spark starts meanwhile)."""
    base = tmp_path_factory.mktemp("e2e-fleet")
    (base / "store").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = fleet_settings(
        redis_server.url,
        base / "store",
        "e2e" + secrets.token_hex(4),
        shards=SHARDS,
        security={"hmac_secret": SECRET},
        # Keep acknowledged entries: tests read the events of their jobs back from the streams.
        queue={"trim_interval": 0.0},
    )
    config = write_config(settings, base / "fleet.toml")
    client = redis.Redis.from_url(settings.redis.url)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    producer = ProducerConfig.from_settings(settings, job_timeout=120.0, app="e2e")
    with fleet_processes(logs) as procs:
        procs.append(FleetProcess("coordinator", "c1", config, logs))
        procs.extend(FleetProcess("worker", w, config, logs) for w in sorted(WORKERS))
        yield E2EFleet(settings, producer, procs)


@pytest.fixture
async def r(e2e: E2EFleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(e2e.settings.redis.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def store(e2e: E2EFleet) -> AsyncIterator[ObjectStore]:
    async with open_store(e2e.settings.store.url, e2e.settings.store) as s:
        yield s


@pytest.fixture
async def fleet(
    request: pytest.FixtureRequest, e2e: E2EFleet, r: redis.asyncio.Redis
) -> AsyncIterator[E2EFleet]:
    """The module's fleet once every shard has a settled owner; its logs go to stderr if the test failed."""
    failed_before = request.session.testsfailed
    registry = FleetRegistry(r, e2e.keys)

    async def settled() -> bool:
        for p in e2e.procs:
            assert p.proc.poll() is None, f"{p.name} exited with {p.proc.returncode}"
        a = await registry.assignment(SHARDS)
        if set(a.owners()) != WORKERS or any(s.owner not in WORKERS or s.moving_to for s in a.slots):
            return False
        tokens = await registry.owner_tokens(SHARDS)
        return all(
            t is not None and t.decode().split("@")[0] == s.owner
            for s, t in zip(a.slots, tokens, strict=True)
        )

    await wait_for(settled, timeout=60, what="both workers to own every shard")
    yield e2e
    if request.session.testsfailed > failed_before:
        sys.stderr.write(e2e.logs())


# -- helpers ---------------------------------------------------------------------


def tagged_rows(spark: Any, partitions: int) -> Any:
    """Return ``ROWS`` rows ``(id, name, attempt)``; ``attempt`` is the Spark attempt that produced the row.

    The rows are made inside the writing task itself (one stage), so a file
    staged by attempt N holds ``attempt == N``: the published bytes show which
    attempt they came from.
    """

    def tag(rows: Iterable[int]) -> Iterator[tuple[int, str, int]]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        attempt = ctx.attemptNumber()
        for i in rows:
            yield (i, f"n{i}", attempt)

    rdd = spark.sparkContext.parallelize(range(ROWS), partitions).mapPartitions(tag)
    return spark.createDataFrame(rdd, SCHEMA)


async def keys_under(store: ObjectStore, prefix: str) -> list[str]:
    return [i.key async for i in store.list(prefix)]


async def events_of(r: redis.asyncio.Redis, fleet: E2EFleet, job: str) -> list[QueueEvent]:
    """Every event of ``job`` in the fleet's shard streams, decoded with the fleet's validation."""
    limits = ValidationLimits.from_settings(fleet.settings.security, fleet=fleet.settings.fleet.name)
    out: list[QueueEvent] = []
    for shard in range(SHARDS):
        stream = fleet.keys.events(shard)
        for entry_id, fields in await r.xrange(stream):
            ev = decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)
            if ev.job == job:
                out.append(ev)
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


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
    df = tagged_rows(spark, 3)
    subsets = {
        "orders": (df, lambda i: True),
        "customers": (df.where("id % 3 = 0"), lambda i: i % 3 == 0),
        "clicks": (df.where("id % 5 = 1"), lambda i: i % 5 == 1),
    }
    names = list(subsets)
    won: dict[str, list[TaskResult]] = {}
    started = time.monotonic()
    with commit_job(spark, datasets=names, config=fleet.producer) as job:
        won["orders"] = job.write_dataset(
            subsets["orders"][0], "orders", watermarks=max_watermark("id"), fail_once_tasks={1}
        )
        won["customers"] = job.write_dataset(
            subsets["customers"][0], "customers", watermarks=max_watermark("id", "cust_id")
        )
        won["clicks"] = job.write_dataset(subsets["clicks"][0], "clicks", watermarks=max_watermark("id"))
    job_id = job.job_id
    spark_done = time.monotonic()

    # The retried task: attempt 0 staged and published, then failed; attempt 1 won.
    assert [(w.task, w.attempt) for w in won["orders"]] == [(0, 0), (1, 1), (2, 0)]
    assert all(w.attempt == 0 for ds in ("customers", "clicks") for w in won[ds])
    events = await events_of(r, fleet, job_id)
    loser = [
        e
        for e in events
        if isinstance(e, TaskFinished) and e.dataset == "orders" and (e.task, e.attempt) == (1, 0)
    ]
    assert len(loser) == 1 and loser[0].files, "the losing attempt published its staged files"
    finished = {d: exp for e in events if isinstance(e, JobFinished) for d, exp in e.datasets.items()}
    assert finished["orders"].winners == [0, 1, 0]

    async def all_committed() -> bool:
        # The manifest is written before the staging clean-up and the WAL removal: wait for all three.
        for ds in names:
            if await read_manifest(store, ds, job_id) is None or await keys_under(store, f"_wal/{ds}/"):
                return False
        return await keys_under(store, f"_staging/{job_id}/") == []

    await wait_for(all_committed, timeout=60, what="every dataset to be committed and staging cleaned")
    sys.stderr.write(
        f"[figure] spark job {spark_done - started:.1f}s, fleet commit after it "
        f"{time.monotonic() - spark_done:.1f}s\n"
    )

    rows: list[dict[str, Any]] = []
    published_md5: set[str | None] = set()
    for ds in names:
        # Exactly one manifest, and it lists exactly the winners' files under their published keys.
        assert await keys_under(store, f"{ds}/_commits/") == [manifest_key(ds, job_id)]
        manifest = await read_manifest(store, ds, job_id)
        assert manifest is not None
        expected_files = [
            ManifestFile(key=published_key(ds, job_id, w.task, f.path), size=f.size, md5=f.md5)
            for w in won[ds]
            for f in w.files
        ]
        assert sorted(manifest.files, key=lambda f: f.key) == sorted(expected_files, key=lambda f: f.key)
        assert manifest.files, f"{ds}: something was published"
        published_md5 |= {f.md5 for f in manifest.files}
        published = sorted(k for k in await keys_under(store, f"{ds}/") if "/_commits/" not in k)
        assert published == sorted(f.key for f in manifest.files), f"{ds}: published files = manifest's"

        # The published bytes are the winners' (MD5 and the attempt column both say so).
        winner_of = {published_key(ds, job_id, w.task, f.path): w.attempt for w in won[ds] for f in w.files}
        ds_rows: list[dict[str, Any]] = []
        for f in manifest.files:
            data = (await store.read(f.key)).data
            assert (len(data), md5(data)) == (f.size, f.md5)
            table = pq.read_table(io.BytesIO(data))
            assert table.schema.names == ["id", "name", "attempt"]
            assert table.schema.field("id").type == pa.int64()
            assert set(table.column("attempt").to_pylist()) == {winner_of[f.key]}
            ds_rows += table.to_pylist()

        # Watermarks: the maximum id the dataset holds, in the manifest and in the dataset's document.
        mark = "cust_id" if ds == "customers" else "id"
        top = max(i for i in range(ROWS) if subsets[ds][1](i))
        assert manifest.watermarks == {mark: top}
        assert await read_watermarks(store, ds) == {mark: top}

        # Read back: exactly the input rows (count, checksum of ids, and the rows themselves).
        want = [i for i in range(ROWS) if subsets[ds][1](i)]
        ids = sorted(row["id"] for row in ds_rows)
        assert (len(ids), sum(ids), md5(repr(ids).encode())) == (
            len(want),
            sum(want),
            md5(repr(want).encode()),
        )
        assert sorted((row["id"], row["name"]) for row in ds_rows) == [(i, f"n{i}") for i in want]
        rows += ds_rows

    # The losing attempt's staged files are gone, and none of its bytes were published.
    for f in loser[0].files:
        assert await keys_under(store, staged_key(job_id, "orders", 1, 0, f.path)) == []
    assert not {f.md5 for f in loser[0].files} & published_md5

    # One Committed admin event per dataset, no abort; the whole store audits clean.
    admin = await admin_events(r, fleet.settings.fleet.name)
    commits = sorted(e.dataset for e in admin if isinstance(e, Committed) and e.job == job_id)
    assert commits == sorted(names)
    assert not [e for e in admin if isinstance(e, Aborted) and e.job == job_id]
    report = await audit(store, ended_jobs=[job_id])
    assert report.ok, report.violations
    assert len(rows) == ROWS + ROWS // 3 + ROWS // 5


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
