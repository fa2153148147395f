"""Real PySpark jobs through a real fleet: a job lives as long as its driver, which learns the outcome.

One local SparkSession (``local[2]``) and one fleet of processes (a
coordinator and a worker) for the module, on a local store and the session's
redis-server. The producer's ``job_timeout`` is 1.5 s, so every job here runs
longer than the old hard timeout.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio

from shared.commit import read_manifest
from shared.events import Committed, JobFailed, JobTimedOut, staged_key
from shared.fleet import FleetRegistry
from shared.queue import Keys, ensure_fleet_sync
from shared.spark import JobNotCommitted, ProducerConfig, commit_job
from shared.spark._publishing import publisher_for
from shared.storage import ObjectStore, open_store
from tests._support.fleet import fleet_settings
from tests._support.fleet_checks import admin_events
from tests._support.processes import FleetProcess, fleet_processes, write_config
from tests._support.redis_server import RedisHandle
from tests._support.spark import spark_session_fixture
from tests._support.wait import wait_for

pytestmark = pytest.mark.spark

spark = spark_session_fixture("test-spark-outcome", master="local[2]")

SHARDS = 4
JOB_TIMEOUT = 1.5


class Fleet(msgspec.Struct):
    name: str
    url: str
    store_url: str
    producer: ProducerConfig
    procs: list[FleetProcess]


@pytest.fixture(scope="module")
def e2e(redis_server: RedisHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("outcome-fleet")
    (base / "store").mkdir()
    logs = base / "logs"
    logs.mkdir()
    settings = fleet_settings(
        redis_server.url,
        base / "store",
        "oc" + secrets.token_hex(4),
        shards=SHARDS,
    )
    config = write_config(settings, base / "fleet.toml")
    client = redis.Redis.from_url(settings.redis.url)
    try:
        ensure_fleet_sync(client, settings.fleet.name, SHARDS)
    finally:
        client.close()
    producer = ProducerConfig.from_settings(settings, job_timeout=JOB_TIMEOUT, app="outcome")
    producer = msgspec.structs.replace(producer, wait_timeout=60.0)
    with fleet_processes(logs) as procs:
        procs.append(FleetProcess("coordinator", "c1", config, logs))
        procs.append(FleetProcess("worker", "w1", config, logs))
        yield Fleet(settings.fleet.name, settings.redis.url, settings.store.url, producer, procs)


@pytest.fixture
async def r(e2e: Fleet) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(e2e.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def store(e2e: Fleet) -> AsyncIterator[ObjectStore]:
    async with open_store(e2e.store_url, e2e.producer.store) as s:
        yield s


@pytest.fixture
async def fleet(e2e: Fleet, r: redis.asyncio.Redis) -> Fleet:
    reg = FleetRegistry(r, Keys(e2e.name))

    async def settled() -> bool:
        for p in e2e.procs:
            assert p.proc.poll() is None, f"{p.name} exited: {p.output()[-3000:]}"
        a = await reg.assignment(SHARDS)
        return set(a.owners()) == {"w1"} and all(s.owner == "w1" and not s.moving_to for s in a.slots)

    await wait_for(settled, timeout=60, what="the worker to own every shard")
    return e2e


def slow_rows(spark: Any, seconds: float, rows: int = 40) -> Any:
    """Return rows made inside the writing tasks, each task taking ``seconds`` (a long-running job)."""

    def make(part: Iterable[int]) -> Iterator[tuple[int, str]]:
        time.sleep(seconds)  # the job's work, not a synchronisation
        for i in part:
            yield (i, f"n{i}")

    rdd = spark.sparkContext.parallelize(range(rows), 2).mapPartitions(make)
    return spark.createDataFrame(rdd, "id long, name string")


async def test_a_job_longer_than_its_timeout_commits_and_commit_job_returns_the_results(
    spark: Any, fleet: Fleet, r: redis.asyncio.Redis, store: ObjectStore
) -> None:
    started = time.monotonic()
    with commit_job(spark, datasets=["long_a", "long_b"], config=fleet.producer) as job:
        job.write_dataset(slow_rows(spark, 2.0), "long_a")  # two tasks of 2 s, in parallel
        job.write_dataset(slow_rows(spark, 2.0), "long_b")
        finished_at = time.monotonic()
    returned = time.monotonic() - finished_at
    assert finished_at - started > 2 * JOB_TIMEOUT  # the old hard timeout would have aborted it
    evs = [e for e in await admin_events(r, fleet.name) if getattr(e, "job", "") == job.job_id]
    assert not [e for e in evs if isinstance(e, JobTimedOut)]
    committed = {e.dataset: e for e in evs if isinstance(e, Committed)}
    assert sorted(committed) == ["long_a", "long_b"]
    for ds, result in job.results.items():
        manifest = await read_manifest(store, ds, job.job_id)
        assert manifest is not None
        assert result.status == "committed"
        assert result.manifest == f"{ds}/_commits/{job.job_id}.json"
        assert result.files == len(manifest.files) == 2
        assert result.bytes == sum(f.size for f in manifest.files)
    latency = max(e.duration_s for e in committed.values())
    print(
        f"\nFIGURE spark: job_finished -> commit_job returned {returned:.3f}s; slowest commit {latency:.3f}s"
    )
    assert returned <= latency + 2.0


async def test_a_quarantined_dataset_makes_commit_job_raise_naming_it(
    spark: Any, fleet: Fleet, store: ObjectStore
) -> None:
    df = spark.createDataFrame([(i, f"n{i}") for i in range(20)], "id long, name string").repartition(2)
    with (  # noqa: PT012 (the block is the job: its exit publishes, waits and raises)
        pytest.raises(JobNotCommitted) as info,
        commit_job(spark, datasets=["fine", "spoiled"], config=fleet.producer) as job,
    ):
        job.write_dataset(df, "fine")
        (first, *_rest) = job.write_dataset(df, "spoiled")
        # The staged bytes change after the task reported them: the commit must refuse them.
        key = staged_key(job.job_id, "spoiled", first.task, first.attempt, first.files[0].path)
        await store.write(key, b"not what the task wrote")
    assert sorted(info.value.failed) == ["spoiled"]
    assert info.value.failed["spoiled"].status == "quarantined"
    assert "spoiled: quarantined (" in str(info.value)
    assert info.value.results["fine"].status == "committed"


async def test_the_heartbeat_stops_a_job_the_fleet_ended_while_it_runs(
    spark: Any, fleet: Fleet, r: redis.asyncio.Redis
) -> None:
    started = time.monotonic()
    caught: Exception | None = None
    try:
        with commit_job(spark, datasets=["doomed"], config=fleet.producer) as job:
            # The job ends in the fleet while its driver computes (here the test ends it, standing
            # in for a timeout the driver did not see coming): the heartbeat notices and cancels.
            ended = JobFailed(
                job=job.job_id, datasets=["doomed"], reason="ended elsewhere", failed_at=time.time()
            )
            publisher_for(job.config).publish(ended)
            job.write_dataset(slow_rows(spark, 60.0), "doomed")
    except Exception as exc:  # noqa: BLE001 (Spark's cancellation error, or JobCancelledError if first)
        caught = exc
    assert caught is not None, "a job the fleet ended must not end well"
    assert time.monotonic() - started < 30, "cancelled long before the 60 s tasks ended"
    notes = getattr(caught, "__notes__", [])
    assert any(
        "the fleet ended the job while it ran: doomed: aborted (failed: ended elsewhere)" in n for n in notes
    )
    assert not [
        e for e in await admin_events(r, fleet.name) if isinstance(e, Committed) and e.job == job.job_id
    ]
