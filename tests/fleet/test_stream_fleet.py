"""Streaming jobs through a real fleet (in process, on the test's redis-server): the worker records the
batch with the data, refuses a covered batch as an abort the driver can read, and a restarted driver's
cancel of a dead run aborts it at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest
import redis.asyncio

from shared.commit import read_stream_records
from shared.events import (
    Aborted,
    JobCancelled,
    JobStarted,
    QueueEvent,
    StreamBatch,
    staging_prefix,
)
from shared.queue import read_outcome
from shared.spark import JobNotCommitted
from shared.spark._outcome import wait_for_outcome
from shared.storage import ObjectStore
from tests._support.commit import keys
from tests._support.fleet import fleet_settings, inprocess_fleet, producer_config
from tests._support.fleet_checks import admin_events
from tests._support.fleet_jobs import good_job, stage_task
from tests._support.wait import wait_for

SHARDS = 4
QUERY = "2d7e0c4a-8f51-4b3a-9c6d-1e2f3a4b5c6d"


def streaming(evs: list[QueueEvent], batch: int) -> list[QueueEvent]:
    """``evs`` with the job's start naming the micro-batch it commits."""
    stream = StreamBatch(app_id="ingest", batch=batch, query=QUERY)
    return [msgspec.structs.replace(e, stream=stream) if isinstance(e, JobStarted) else e for e in evs]


async def test_a_replayed_batch_is_refused_as_an_abort_and_the_record_follows_the_data(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    cfg = producer_config(settings, job_timeout=60.0)
    async with inprocess_fleet(redis_client, settings) as fleet:
        store = fleet.store
        first = "ingest-b3-aaaaaaaa"
        await fleet.publisher.publish_many(streaming(await good_job(store, first, ["a", "b"], tasks=2), 3))
        results = await asyncio.to_thread(wait_for_outcome, cfg, first, ["a", "b"], 30.0)
        assert {r.status for r in results.values()} == {"committed"}
        records = await read_stream_records(store, "ingest")
        assert {d: (r.batch, r.job) for d, r in records.items()} == {"a": (3, first), "b": (3, first)}

        again = "ingest-b3-bbbbbbbb"
        await fleet.publisher.publish_many(streaming(await good_job(store, again, ["a", "b"], tasks=2), 3))
        with pytest.raises(JobNotCommitted) as info:
            await asyncio.to_thread(wait_for_outcome, cfg, again, ["a", "b"], 30.0)
        for ds in ("a", "b"):
            failed = info.value.failed[ds]
            assert failed.status == "aborted" and failed.reason.startswith("stream: "), failed
            assert await keys(store, staging_prefix(again, ds)) == []
        aborted = [e for e in await admin_events(redis_client, fleet_name) if isinstance(e, Aborted)]
        assert sorted(e.dataset for e in aborted if e.job == again) == ["a", "b"]
        assert not [k for k in await keys(store, "a/") if again in k]
        assert (await read_stream_records(store, "ingest"))["a"].job == first


async def test_a_dead_runs_cancel_aborts_it_at_once_even_unknown_to_the_fleet(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    """The cancel a restarted driver sends for a run it found by its staged files (Redis lost the run)."""
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=SHARDS)
    cfg = producer_config(settings, job_timeout=600.0)
    async with inprocess_fleet(redis_client, settings) as fleet:
        store = fleet.store
        dead = "ingest-b5-cccccccc"
        # Staged, never announced to the fleet (its events were flushed with Redis).
        await stage_task(store, dead, "a", 0, 0)
        started = time.monotonic()
        cancel = JobCancelled(job=dead, datasets=["a"], reason="superseded", cancelled_at=time.time())
        await fleet.publisher.publish_many([cancel])
        with pytest.raises(JobNotCommitted):
            await asyncio.to_thread(wait_for_outcome, cfg, dead, ["a"], 30.0)
        assert time.monotonic() - started < 30.0  # not the job's 600 s liveness timeout
        await wait_for(lambda: _empty(store, staging_prefix(dead, "a")), timeout=10, what="staging gone")
        outcome = await read_outcome(redis_client, fleet.keys, SHARDS, dead, ["a"])
        assert outcome.results["a"].status == "aborted"


async def _empty(store: ObjectStore, prefix: str) -> bool:
    return await keys(store, prefix) == []
