"""Job liveness and the driver's outcome, against an in-process fleet on a real redis-server.

The driver side is the real one without Spark: :class:`shared.spark._outcome.Heartbeat`
(the job context's heartbeat thread) and :func:`wait_for_outcome` (what
``commit_job`` runs after ``JobFinished``), run in threads beside the fleet's
event loop. Timeouts are short (1-2 s) so every test takes seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.exceptions

from shared.commit import read_manifest
from shared.events import (
    Aborted,
    Committed,
    DatasetExpectation,
    JobFinished,
    JobStarted,
    JobTimedOut,
    QueueEvent,
    manifest_key,
)
from shared.fleet import FleetRegistry
from shared.queue import AsyncPublisher, JobOutcome, Keys, ensure_fleet, shard_of
from shared.spark import JobNotCommitted
from shared.spark._outcome import Heartbeat, OutcomeTimeout, wait_for_outcome
from shared.storage import ObjectStore
from tests._support.fleet import fleet_settings, inprocess_fleet, producer_config
from tests._support.fleet_checks import admin_events
from tests._support.fleet_jobs import stage_task
from tests._support.redis_server import RedisServer
from tests._support.routing import datasets_on
from tests._support.wait import wait_for

SHARDS = 8


async def start_job(
    pub: AsyncPublisher,
    store: ObjectStore,
    job: str,
    datasets: Sequence[str],
    timeout_s: float,
    tasks: int = 2,
) -> JobFinished:
    """Publish JobStarted and every task's TaskFinished; return the JobFinished to send later."""
    evs: list[QueueEvent] = [
        JobStarted(job=job, datasets=list(datasets), timeout_s=timeout_s, started_at=time.time())
    ]
    for ds in datasets:
        for t in range(tasks):
            evs.append(await stage_task(store, job, ds, t, 0))
    await pub.publish_many(evs)
    expect = {ds: DatasetExpectation(tasks=tasks, winners=[0] * tasks) for ds in datasets}
    return JobFinished(job=job, datasets=expect, finished_at=time.time())


async def events_of(r: redis.asyncio.Redis, fleet: str, job: str, kind: type[Any]) -> list[Any]:
    return [e for e in await admin_events(r, fleet) if isinstance(e, kind) and getattr(e, "job", "") == job]


async def beats(hb: Heartbeat, n: int) -> bool:
    return hb.beats >= n


async def test_a_live_job_outlives_its_timeout_commits_and_the_driver_gets_its_results(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    cfg = producer_config(settings, job_timeout=1.0)
    datasets = ["orders", "clicks", "users"]
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, SHARDS)
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        hb = Heartbeat(cfg, "long", datasets)
        hb.start()
        try:
            finished = await start_job(pub, store, "long", datasets, timeout_s=1.0)
            # Alive for 4 timeouts (20 beats at 0.2 s): the old hard timeout would have aborted it.
            await wait_for(lambda: beats(hb, 20), timeout=30, what="20 heartbeats")
            assert await events_of(redis_client, fleet_name, "long", JobTimedOut) == []
            assert await events_of(redis_client, fleet_name, "long", Aborted) == []
            await pub.publish(finished)
            sent = time.monotonic()
            results = await asyncio.to_thread(wait_for_outcome, cfg, "long", datasets, 30.0)
            returned = time.monotonic() - sent
        finally:
            hb.stop()
        committed: list[Committed] = await events_of(redis_client, fleet_name, "long", Committed)
        assert sorted(e.dataset for e in committed) == sorted(datasets)
        for ds in datasets:
            manifest = await read_manifest(store, ds, "long")
            assert manifest is not None
            r = results[ds]
            assert (r.status, r.manifest) == ("committed", manifest_key(ds, "long"))
            assert r.files == len(manifest.files) == 2
            assert r.bytes == sum(f.size for f in manifest.files)
        # The driver learns the outcome within a second of the fleet's own commit latency.
        latency = max(e.duration_s for e in committed)
        print(f"\nFIGURE job_finished -> results {returned:.3f}s; slowest commit {latency:.3f}s")
        assert returned <= latency + 1.0 + 1.0  # + the intake and lock hand-off of one tick


async def test_a_silent_job_is_aborted_once_after_its_timeout_and_the_driver_is_told(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    cfg = producer_config(settings, job_timeout=1.0)
    datasets = datasets_on(3, SHARDS, 3)
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, SHARDS)
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        hb = Heartbeat(cfg, "dies", datasets)
        hb.start()
        await start_job(pub, store, "dies", datasets, timeout_s=1.0)
        await wait_for(lambda: beats(hb, 5), timeout=30, what="5 heartbeats")
        hb.stop()  # the driver dies
        died = time.time()

        async def all_aborted() -> list[Aborted] | None:
            got = await events_of(redis_client, fleet_name, "dies", Aborted)
            return got if len(got) == len(datasets) else None

        aborted = await wait_for(all_aborted, timeout=30, what="aborted events")
        (timed_out,) = await events_of(redis_client, fleet_name, "dies", JobTimedOut)
        assert timed_out.timeout_s == 1.0
        assert sorted(timed_out.datasets) == sorted(datasets)
        assert timed_out.shard == shard_of(datasets[0], SHARDS) == 3  # the shard whose owner decided
        assert timed_out.at >= died  # never while the driver was alive
        assert {e.reason for e in aborted} == {"timed out: no sign of life from its driver for 1s"}
        with pytest.raises(JobNotCommitted) as info:
            await asyncio.to_thread(wait_for_outcome, cfg, "dies", datasets, 30.0)
        assert sorted(info.value.failed) == sorted(datasets)
        for ds in datasets:
            assert f"{ds}: aborted (timed out: no sign of life" in str(info.value)
        # A driver that comes back and tries to finish learns it at once, and publishes nothing.
        assert await read_manifest(store, datasets[0], "dies") is None


async def test_max_job_duration_aborts_a_live_job_and_its_heartbeat_sees_it(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url, tmp_path / "store", fleet_name, shards=SHARDS, worker={"max_job_duration": 2.0}
    )
    cfg = producer_config(settings, job_timeout=1.0)
    datasets = datasets_on(3, SHARDS, 2)
    seen: list[JobOutcome] = []
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, SHARDS)
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        hb = Heartbeat(cfg, "endless", datasets, on_beat=lambda o: seen.append(o) if o.results else None)
        hb.start()
        try:
            await start_job(pub, store, "endless", datasets, timeout_s=1.0)

            async def told() -> bool:
                return bool(seen)

            await wait_for(told, timeout=30, what="the heartbeat to see the fleet end the job")
        finally:
            hb.stop()
        (timed_out,) = await events_of(redis_client, fleet_name, "endless", JobTimedOut)
        assert timed_out.timeout_s == 2.0
        assert timed_out.shard == shard_of(datasets[0], SHARDS)
        assert {r.status for r in seen[0].results.values()} <= {"aborted"}
        assert all("max_job_duration" in r.reason for r in seen[0].results.values())


async def test_a_live_job_survives_its_shard_changing_owner(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    """The shard's owner leaves mid-job; the next owner has never seen the job's key, and must
    not count the handoff as the driver's silence."""
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    cfg = producer_config(settings, job_timeout=1.0)
    datasets = datasets_on(3, SHARDS, 2)
    registry = FleetRegistry(redis_client, Keys(fleet_name))
    ids = ("w1", "w2")
    async with inprocess_fleet(redis_client, settings, workers=ids, ensure=False) as fleet:
        store = fleet.store
        workers = dict(zip(ids, fleet.workers, strict=True))
        runs = dict(zip(ids, fleet.worker_tasks, strict=True))
        await ensure_fleet(redis_client, fleet_name, SHARDS)

        async def owner_of_3(among: set[str]) -> str | None:
            a = await registry.assignment(SHARDS)
            token = (await registry.owner_tokens(SHARDS))[3]
            owner = a.slots[3].owner if a.slots else None
            settled = set(a.owners()) == among and not a.slots[3].moving_to
            ok = settled and token is not None and token.decode().startswith(f"{owner}@")
            return owner if ok else None

        first = await wait_for(lambda: owner_of_3({"w1", "w2"}), timeout=60, what="two owners")
        pub = AsyncPublisher(redis_client, fleet_name, SHARDS)
        hb = Heartbeat(cfg, "moving", datasets)
        hb.start()
        try:
            finished = await start_job(pub, store, "moving", datasets, timeout_s=1.0)
            await wait_for(lambda: beats(hb, 5), timeout=30, what="5 heartbeats")
            workers[first].shutdown()  # the owner leaves: the other one takes the shard over
            await runs[first]
            other = ({"w1", "w2"} - {first}).pop()
            await wait_for(lambda: owner_of_3({other}), timeout=60, what="the handoff")
            before = hb.beats
            await wait_for(lambda: beats(hb, before + 15), timeout=30, what="3 s on the new owner")
            assert await events_of(redis_client, fleet_name, "moving", JobTimedOut) == []
            await pub.publish(finished)
            results = await asyncio.to_thread(wait_for_outcome, cfg, "moving", datasets, 30.0)
        finally:
            hb.stop()
        assert {r.status for r in results.values()} == {"committed"}
        committed = await events_of(redis_client, fleet_name, "moving", Committed)
        assert {e.worker for e in committed} == {other}


@pytest.fixture
def private_redis(redis_factory: Any) -> RedisServer:
    server: RedisServer = redis_factory(persistent=True)
    return server


async def test_a_redis_restart_that_loses_the_liveness_keys_does_not_abort_a_live_job(
    private_redis: RedisServer, fleet_name: str, tmp_path: Path
) -> None:
    """Redis is down longer than the job's timeout, and comes back without the liveness keys.

    The worker gets back to the shard before the driver's next beat: it must
    give the driver a full timeout from then, not count the outage as silence.
    """
    # A membership lease longer than the outage: the same runner keeps the shard across it.
    settings = fleet_settings(
        private_redis.url, tmp_path / "store", fleet_name, shards=SHARDS, worker={"lease": 30.0}
    )
    cfg = producer_config(settings, job_timeout=2.0)
    datasets = datasets_on(3, SHARDS, 2)
    probe_ds = datasets_on(3, SHARDS, 3)[2]
    # The test's own client reconnects after the restart (the fleet's own clients do it their way).
    client = redis.asyncio.Redis.from_url(
        private_redis.url,
        retry=redis.asyncio.retry.Retry(redis.backoff.ExponentialBackoff(), 5),
        retry_on_error=[redis.exceptions.ConnectionError],
    )
    try:
        async with inprocess_fleet(client, settings, ensure=False) as fleet:
            store = fleet.store
            await ensure_fleet(client, fleet_name, SHARDS)
            pub = AsyncPublisher(client, fleet_name, SHARDS)
            hb = Heartbeat(cfg, "survivor", datasets)
            hb.start()
            finished = await start_job(pub, store, "survivor", datasets, timeout_s=2.0)
            await wait_for(lambda: beats(hb, 5), timeout=30, what="5 heartbeats")
            # Redis goes away for longer than the key's TTL (1.2 s) and the job's timeout (2 s).
            await asyncio.to_thread(private_redis.stop)
            failures = hb.failures

            async def outage_long_enough() -> bool:
                return hb.failures >= failures + 13  # 13 missed beats at 0.2 s: >= 2.6 s

            await wait_for(outage_long_enough, timeout=30, what="a 2.6 s outage")
            hb.stop()  # the driver's next beat comes only after the worker is back
            await asyncio.to_thread(private_redis.start)
            assert await client.exists(pub.keys.job_alive(3, "survivor")) == 0  # the keys are gone
            # The worker is back on the shard once it handles a probe job there.
            probe = await start_job(pub, store, "probe", [probe_ds], timeout_s=60.0, tasks=1)
            await pub.publish(probe)
            await wait_for(
                lambda: events_of(client, fleet_name, "probe", Committed), timeout=30, what="probe"
            )
            hb = Heartbeat(cfg, "survivor", datasets)  # the driver reaches Redis again
            hb.start()
            try:
                await wait_for(lambda: beats(hb, 15), timeout=30, what="3 s of heartbeats after")
                assert await events_of(client, fleet_name, "survivor", JobTimedOut) == []
                await pub.publish(finished)
                results = await asyncio.to_thread(wait_for_outcome, cfg, "survivor", datasets, 30.0)
            finally:
                hb.stop()
            assert {r.status for r in results.values()} == {"committed"}
    finally:
        await client.aclose()


async def test_waiting_without_an_outcome_ends_at_the_deadline(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    await ensure_fleet(redis_client, fleet_name, SHARDS)
    cfg = producer_config(settings, job_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(OutcomeTimeout) as info:
        await asyncio.to_thread(wait_for_outcome, cfg, "nobody", ["a", "b"], 0.5)
    assert 0.5 <= time.monotonic() - start < 2.0
    assert info.value.missing == ("a", "b")
    assert "commitfleet wait nobody a b" in str(info.value)
