"""A coordinator and two workers in one process: commits, aborts, dedupe, audit.

The separate-process fleet tests (tests/fleet/test_fleet_processes.py) cover
kills, freezes and scaling; this one is the quick functional check.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from pathlib import Path

import redis.asyncio

from shared.events import (
    Aborted,
    AdminEvent,
    Committed,
    JobStarted,
    JobTimedOut,
    ShardsAssigned,
    WorkerJoined,
)
from shared.queue import Keys, ensure_fleet, shard_of
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_staging_left, no_wal_left
from tests._support.fleet_jobs import failed_job, good_job, stage_task
from tests._support.wait import wait_for


async def test_inprocess_fleet_commits_and_aborts(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name)
    async with inprocess_fleet(redis_client, settings, workers=("w1", "w2"), ensure=False) as fleet:
        store = fleet.store
        await ensure_fleet(redis_client, fleet_name, settings.fleet.shards)
        pub = fleet.publisher
        datasets = [f"ds{i}" for i in range(6)]
        await pub.publish_many(await good_job(store, "job-ok", datasets, tasks=3))
        await pub.publish_many(await failed_job(store, "job-bad", datasets[:3], tasks=2))
        await wait_for(lambda: committed(store, datasets, "job-ok"), timeout=60, what="commits")
        await wait_for(lambda: no_staging_left(store, "job-bad"), timeout=60, what="rollback")
        await wait_for(lambda: no_staging_left(store, "job-ok"), timeout=60, what="cleanup")

        async def all_events() -> bool:
            evs = await admin_events(redis_client, fleet_name)
            n_commit = sum(isinstance(e, Committed) and e.job == "job-ok" for e in evs)
            n_abort = sum(isinstance(e, Aborted) and e.job == "job-bad" for e in evs)
            return n_commit == 6 and n_abort == 3

        await wait_for(all_events, timeout=30, what="admin events")
        await wait_for(lambda: no_wal_left(store), timeout=30, what="every commit sequence finished")
        report = await clean_audit(store)
        assert report.ok, report.violations
        assert report.manifests == 6
        # task 0: a duplicate delivery and a retried winning attempt; still one file per task
        assert report.files == 18
        evs = await admin_events(redis_client, fleet_name)
        assert any(isinstance(e, ShardsAssigned) for e in evs)
        assert {e.worker for e in evs if isinstance(e, WorkerJoined)} >= {"w1", "w2"}
        committed_ev = [e for e in evs if isinstance(e, Committed)]
        assert len(committed_ev) == 6  # exactly once, despite the duplicate delivery
    keys = Keys(fleet_name)
    assert await redis_client.scard(keys.workers) == 0


async def test_job_that_never_ends_is_aborted_at_its_timeout(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name)
    async with inprocess_fleet(redis_client, settings, ensure=False) as fleet:
        store = fleet.store
        pub = fleet.publisher
        started = JobStarted(job="stuck", datasets=["ds1", "ds2"], timeout_s=1.0, started_at=time.time())
        await pub.publish_many(
            [
                started,
                await stage_task(store, "stuck", "ds1", 0, 0),
                await stage_task(store, "stuck", "ds2", 0, 0),
            ]
        )
        # The driver died: no JobFinished, no JobFailed. The fleet aborts at the timeout.
        await wait_for(lambda: no_staging_left(store, "stuck"), timeout=30, what="timed-out job cleaned up")

        async def timed_out() -> list[AdminEvent]:
            evs = await admin_events(redis_client, fleet_name)
            return [e for e in evs if isinstance(e, JobTimedOut | Aborted) and e.job == "stuck"]

        evs = await wait_for(lambda: _at_least(timed_out(), 4), timeout=30, what="timeout events")
        # one job_timed_out per shard of the job (ds1 and ds2 live on two shards), with the timeout,
        # each naming its shard and that shard's datasets
        shards = settings.fleet.shards
        assert shard_of("ds1", shards) != shard_of("ds2", shards)
        timed = sorted((e.shard, e.datasets) for e in evs if isinstance(e, JobTimedOut))
        assert timed == sorted((shard_of(d, shards), [d]) for d in ("ds1", "ds2"))
        assert {e.timeout_s for e in evs if isinstance(e, JobTimedOut)} == {1.0}
        why = "timed out: no sign of life from its driver for 1s"
        assert {(e.dataset, e.reason) for e in evs if isinstance(e, Aborted)} == {
            ("ds1", why),
            ("ds2", why),
        }
        assert not await committed(store, ["ds1"], "stuck")


async def _at_least(evs: Awaitable[list[AdminEvent]], n: int) -> list[AdminEvent] | None:
    got = await evs
    return got if len(got) >= n else None
