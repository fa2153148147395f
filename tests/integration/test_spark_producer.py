"""The PySpark producer against a real local Spark, a real redis-server and a real local store.

One SparkSession for the whole module (``local[2,2]``: two slots, a failed task
is retried once). Events are read back from the fleet's shard streams and
decoded with the fleet's own validation (signed with a secret), staged files
from the store's folder.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from shared import BadInput, ConfigError, Secret
from shared.events import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    TaskFinished,
    ValidationLimits,
    decode_entry,
    staging_prefix,
)
from shared.queue import Keys, shard_of
from shared.spark import JobCancelledError, ProducerConfig, commit_job, max_watermark
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for_sync

pytestmark = pytest.mark.spark

spark = spark_session_fixture("test-spark-producer", master="local[2,2]")

SHARDS = 4
SECRET = "test-secret"


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    return root


@pytest.fixture
def config(redis_url: str, fleet_name: str, store_root: Path) -> ProducerConfig:
    return ProducerConfig(
        redis_url=redis_url,
        store_url=store_root.as_uri(),
        fleet=fleet_name,
        shards=SHARDS,
        hmac_secret=Secret(SECRET),
        job_timeout=120.0,
        app="tests",
        wait=False,  # no fleet here: these tests check what the producer publishes
    )


def read_events(cfg: ProducerConfig) -> list[tuple[int, QueueEvent]]:
    """Every event in the fleet's shard streams, decoded and validated (signature checked)."""
    limits = ValidationLimits(secret=SECRET.encode(), fleet=cfg.fleet)
    keys = Keys(cfg.fleet)
    client = redis.Redis.from_url(cfg.redis_url)
    try:
        out = []
        for shard in range(SHARDS):
            stream = keys.events(shard)
            for entry_id, fields in client.xrange(stream):
                out.append((shard, decode_entry(fields, limits=limits, stream=stream, entry_id=entry_id)))
        return out
    finally:
        client.close()


def of_type(events: list[tuple[int, QueueEvent]], cls: type[Any]) -> list[Any]:
    return [ev for _, ev in events if isinstance(ev, cls)]


def check_staged(root: Path, ev: TaskFinished) -> None:
    """The files an event names exist in the attempt's staging folder with its sizes and MD5s."""
    folder = root / staging_prefix(ev.job, ev.dataset, ev.task, ev.attempt)
    on_disk = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert on_disk == sorted(f.path for f in ev.files)
    for f in ev.files:
        data = (folder / f.path).read_bytes()
        assert len(data) == f.size
        assert hashlib.md5(data).hexdigest() == f.md5


def test_job_over_three_datasets_stages_parquet_and_publishes_the_contract(
    spark: Any, config: ProducerConfig, store_root: Path
) -> None:
    orders = spark.createDataFrame(
        [(i, f"o{i}", i * 1.5) for i in range(30)], "id long, name string, amount double"
    ).repartition(3)
    customers = spark.createDataFrame(
        [(i, f"c{i}", ["fr", "de", "us/east"][i % 3]) for i in range(12)],
        "id int, name string, country string",
    ).coalesce(2)
    empty = spark.createDataFrame([], "id long, note string").repartition(2)

    with commit_job(spark, "job-three", ["orders", "customers", "empty"], config=config) as job:
        won_orders = job.write_dataset(orders, "orders", watermarks=max_watermark("id", "orders_id"))
        job.write_dataset(customers, "customers", partition_by=["country"], watermarks={"batch": 7})
        job.write_dataset(empty, "empty")
        expectations = job.expectations

    events = read_events(config)
    # Every shard that holds one of the datasets saw JobStarted first and JobFinished last,
    # each copy naming only that shard's datasets.
    shards = {shard_of(d, SHARDS) for d in ("orders", "customers", "empty")}
    for shard in shards:
        mine = [ev for s, ev in events if s == shard]
        here = sorted(d for d in ("orders", "customers", "empty") if shard_of(d, SHARDS) == shard)
        assert isinstance(mine[0], JobStarted)
        assert sorted(mine[0].datasets) == here
        assert mine[0].timeout_s == 120.0
        assert mine[0].app == "tests"
        assert isinstance(mine[-1], JobFinished)
        assert sorted(mine[-1].datasets) == here
    assert not of_type(events, JobFailed)
    assert not of_type(events, JobCancelled)

    finished = {d: exp for ev in of_type(events, JobFinished) for d, exp in ev.datasets.items()}
    assert finished == expectations
    assert finished["orders"].tasks == 3
    assert finished["customers"].tasks == 2
    assert finished["empty"].tasks == 2
    assert all(exp.winners == [0] * exp.tasks for exp in finished.values())
    assert [(r.task, r.attempt) for r in won_orders] == [(0, 0), (1, 0), (2, 0)]

    tasks = of_type(events, TaskFinished)
    assert Counter((ev.dataset, ev.task) for ev in tasks) == Counter(
        [("orders", t) for t in range(3)]
        + [("customers", t) for t in range(2)]
        + [("empty", t) for t in range(2)]
    )
    for ev in tasks:
        assert ev.job == "job-three"
        assert ev.attempt == 0
        check_staged(store_root, ev)

    # Orders: one file per task, watermark = max id of the task's own rows.
    read_back = []
    for ev in (e for e in tasks if e.dataset == "orders"):
        assert [f.path for f in ev.files] == ["part-0.parquet"]
        table = pq.read_table(
            store_root / staging_prefix("job-three", "orders", ev.task, 0) / "part-0.parquet"
        )
        assert table.schema.names == ["id", "name", "amount"]
        assert table.schema.field("id").type == pa.int64()
        assert ev.watermarks == {"orders_id": max(table.column("id").to_pylist())}
        read_back += table.to_pylist()
    assert sorted(read_back, key=lambda r: r["id"]) == [
        {"id": i, "name": f"o{i}", "amount": i * 1.5} for i in range(30)
    ]

    # Customers: Hive folders per country (the '/' escaped), the column restored by hive partitioning.
    rows = []
    for ev in (e for e in tasks if e.dataset == "customers"):
        assert ev.watermarks == {"batch": 7}
        assert all(f.path.startswith("country=") for f in ev.files)
        folder = store_root / staging_prefix("job-three", "customers", ev.task, 0)
        rows += pq.read_table(folder, partitioning="hive").to_pylist()
    assert {f.path for ev in tasks if ev.dataset == "customers" for f in ev.files} <= {
        "country=fr/part-0.parquet",
        "country=de/part-0.parquet",
        "country=us%2Feast/part-0.parquet",
    }
    decoded = sorted((r["id"], r["name"], r["country"].replace("%2F", "/")) for r in rows)
    assert decoded == [(i, f"c{i}", ["fr", "de", "us/east"][i % 3]) for i in range(12)]

    # An empty partition stages nothing but still reports its task.
    assert all(ev.files == [] and ev.watermarks == {} for ev in tasks if ev.dataset == "empty")


def test_task_failing_once_after_publishing_leaves_two_attempts_and_the_second_wins(
    spark: Any, config: ProducerConfig, store_root: Path
) -> None:
    df = spark.range(0, 60, numPartitions=3)
    with commit_job(spark, "job-retry", ["events"], config=config) as job:
        won = job.write_dataset(df, "events", fail_once_tasks={1})

    events = read_events(config)
    tasks = of_type(events, TaskFinished)
    assert sorted((ev.task, ev.attempt) for ev in tasks) == [(0, 0), (1, 0), (1, 1), (2, 0)]
    for ev in tasks:
        check_staged(store_root, ev)  # the failed attempt's files are there too
    (finished,) = of_type(events, JobFinished)
    assert finished.datasets["events"].tasks == 3
    assert finished.datasets["events"].winners == [0, 1, 0]
    assert [(r.task, r.attempt) for r in won] == [(0, 0), (1, 1), (2, 0)]


def test_driver_code_raising_publishes_job_failed_and_leaves_staged_files(
    spark: Any, config: ProducerConfig, store_root: Path
) -> None:
    df = spark.range(0, 10, numPartitions=2)

    def run() -> None:
        with commit_job(spark, "job-raise", ["a", "b"], config=config) as job:
            job.write_dataset(df, "a")
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        run()

    events = read_events(config)
    failed = of_type(events, JobFailed)
    assert failed
    assert all("ValueError: boom" in ev.reason for ev in failed)
    assert sorted(d for ev in failed for d in ev.datasets) == ["a", "b"]
    assert not of_type(events, JobFinished)
    assert not of_type(events, JobCancelled)
    tasks = of_type(events, TaskFinished)
    assert len(tasks) == 2
    for ev in tasks:
        check_staged(store_root, ev)  # nobody cleaned up: that is the fleet's job


def test_task_that_keeps_failing_fails_the_job(spark: Any, config: ProducerConfig) -> None:
    def broken(task: int, table: pa.Table) -> dict[str, int]:
        raise RuntimeError(f"source unreadable in task {task}")

    df = spark.range(0, 10, numPartitions=2)

    def run() -> None:
        with commit_job(spark, "job-broken", ["ok", "bad"], config=config) as job:
            job.write_dataset(df, "ok")
            job.write_dataset(df, "bad", watermarks=broken)

    with pytest.raises(Exception, match="source unreadable"):
        run()

    events = read_events(config)
    failed = of_type(events, JobFailed)
    assert failed
    assert all("source unreadable" in ev.reason for ev in failed)
    assert not of_type(events, JobCancelled)
    assert not of_type(events, JobFinished)
    assert {ev.dataset for ev in of_type(events, TaskFinished)} == {"ok"}


def test_missing_dataset_fails_the_job(spark: Any, config: ProducerConfig) -> None:
    with (
        pytest.raises(Exception, match="without writing"),
        commit_job(spark, "job-missing", ["x", "y"], config=config) as job,
    ):
        job.write_dataset(spark.range(0, 4, numPartitions=1), "x")

    events = read_events(config)
    assert of_type(events, JobFailed)
    assert not of_type(events, JobFinished)


def test_cancel_from_another_thread_interrupts_the_action_and_publishes_job_cancelled(
    spark: Any, config: ProducerConfig
) -> None:
    def slow(task: int, table: pa.Table) -> dict[str, int]:
        time.sleep(120)  # far longer than the test allows: only a cancel ends it in time
        return {}

    sc = spark.sparkContext
    cancelled_at: list[float] = []

    def cancel_when_running(job: Any) -> None:
        wait_for_sync(
            lambda: (
                any(
                    (info := sc.statusTracker().getJobInfo(j)) is not None and info.status == "RUNNING"
                    for j in sc.statusTracker().getJobIdsForGroup(job.job_id)
                )
                and sc.statusTracker().getActiveStageIds()
            ),
            timeout=60,
            what="the slow action to run",
        )
        cancelled_at.append(time.monotonic())
        job.cancel("operator asked")

    df = spark.range(0, 4, numPartitions=2)
    raised_at: list[float] = []

    def run() -> None:
        with commit_job(spark, "job-cancel", ["quick", "slow"], config=config) as job:
            job.write_dataset(df, "quick")
            canceller = threading.Thread(target=cancel_when_running, args=(job,))
            canceller.start()
            try:
                job.write_dataset(df, "slow", watermarks=slow)
            finally:
                raised_at.append(time.monotonic())
                canceller.join()

    with pytest.raises(Exception, match=r"(?i)cancel"):
        run()

    assert cancelled_at
    assert raised_at[0] - cancelled_at[0] < 5.0
    events = read_events(config)
    cancelled = of_type(events, JobCancelled)
    assert cancelled
    assert all(ev.reason == "operator asked" for ev in cancelled)
    assert sorted(d for ev in cancelled for d in ev.datasets) == ["quick", "slow"]
    assert not of_type(events, JobFinished)
    assert not of_type(events, JobFailed)
    assert {ev.dataset for ev in of_type(events, TaskFinished)} == {"quick"}
    # The group's jobs are no longer running: the slow tasks were interrupted, not awaited.
    wait_for_sync(lambda: not sc.statusTracker().getActiveStageIds(), timeout=10, what="stages to stop")


def test_cancel_before_an_action_and_keyboard_interrupt_publish_job_cancelled(
    spark: Any, config: ProducerConfig
) -> None:
    def cancel_early() -> None:
        with commit_job(spark, "job-early", ["e"], config=config) as job:
            job.cancel("not needed today")
            job.write_dataset(spark.range(0, 4, numPartitions=1), "e")

    def ctrl_c() -> None:
        with commit_job(spark, "job-ctrl-c", ["k"], config=config):
            raise KeyboardInterrupt

    with pytest.raises(JobCancelledError):
        cancel_early()
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()

    cancelled = {ev.job: ev for ev in of_type(read_events(config), JobCancelled)}
    assert cancelled["job-early"].reason == "not needed today"
    assert "KeyboardInterrupt" in cancelled["job-ctrl-c"].reason
    assert not of_type(read_events(config), TaskFinished)


def test_shard_count_comes_from_redis_when_not_configured(spark: Any, config: ProducerConfig) -> None:
    unset = msgspec.structs.replace(config, shards=None)
    with (
        pytest.raises(ConfigError, match="does not exist"),
        commit_job(spark, "job-nofleet", ["n"], config=unset),
    ):
        pass
    wrong = msgspec.structs.replace(config, shards=SHARDS + 1)
    with commit_job(spark, "job-first", ["n"], config=config) as job:  # records N in Redis
        job.write_dataset(spark.range(0, 2, numPartitions=1), "n")
    with commit_job(spark, "job-later", ["n"], config=unset) as job:
        assert job.config.shards == SHARDS
        job.write_dataset(spark.range(0, 2, numPartitions=1), "n")
    with pytest.raises(ConfigError, match="shards"), commit_job(spark, "job-wrong", ["n"], config=wrong):
        pass
    finished = [ev.job for ev in of_type(read_events(config), JobFinished)]
    assert finished == ["job-first", "job-later"]


def test_datasets_written_from_two_threads_join_one_job(spark: Any, config: ProducerConfig) -> None:
    df = spark.range(0, 8, numPartitions=2)
    with (
        commit_job(spark, "job-threads", ["left", "right"], config=config) as job,
        ThreadPoolExecutor(2) as pool,
    ):
        futures = [pool.submit(job.write_dataset, df, name) for name in ("left", "right")]
        assert [len(f.result(timeout=120)) for f in futures] == [2, 2]
        with pytest.raises(BadInput, match="already written"):
            job.write_dataset(df, "left")
        with pytest.raises(BadInput, match="not declared"):
            job.write_dataset(df, "other")

    finished = {d: exp for ev in of_type(read_events(config), JobFinished) for d, exp in ev.datasets.items()}
    assert finished == {"left": job.expectations["left"], "right": job.expectations["right"]}
    assert all(exp.tasks == 2 and exp.winners == [0, 0] for exp in finished.values())
