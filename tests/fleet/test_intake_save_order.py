"""Intake judges and saves a batch under the shard's save lock: another save (an action
recording a status) never writes decisions of a batch before that batch is durable.

An action's save writes the metadata of the jobs it names as the in-memory
state has it. Had intake applied a batch's decisions and then waited for the
lock, a save queued before it would write them (a dataset marked committing,
say) without the attempt records and acknowledgements they came from; after
a crash the re-read entries would be judged against that state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio

from shared.events import JobStarted, StagedFile, TaskFinished
from tests._support.wait import wait_for

from ._intake_fleet import inprocess_fleet


async def _true(condition: bool) -> bool:
    return condition


class _WatchedLock(asyncio.Lock):
    """An asyncio lock that tells when somebody starts waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def acquire(self) -> bool:
        self.asked.set()
        return await super().acquire()


async def test_intake_applies_nothing_while_another_save_holds_the_lock(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    async with inprocess_fleet(redis_url, redis_client, fleet_name, tmp_path / "store", shards=1) as fleet:
        await wait_for(lambda: _true(0 in fleet.worker.running_shards), timeout=30, what="shard 0 running")
        runner = fleet.worker._runners[0][0]
        await wait_for(lambda: _true(runner.store is not None), timeout=30, what="session started")
        lock = _WatchedLock()
        runner._save_lock = lock
        async with lock:  # another save in flight
            lock.asked.clear()
            await fleet.publisher.publish(JobStarted(job="j", datasets=["ds"], timeout_s=600, started_at=0))
            await fleet.publisher.publish(
                TaskFinished(
                    job="j",
                    dataset="ds",
                    task=0,
                    attempt=0,
                    files=[StagedFile(path="part-0", size=1)],
                    finished_at=0,
                )
            )
            await asyncio.wait_for(lock.asked.wait(), timeout=30)
            # Intake has read a batch and waits for the lock: nothing of it is applied yet.
            assert "j" not in runner.state.jobs
            assert not runner.state.attempts
        await wait_for(lambda: _true(("j", "ds") in runner.state.attempts), what="attempt recorded")

        async def acknowledged() -> bool:
            return (await redis_client.xpending(fleet.keys.events(0), "workers"))["pending"] == 0

        await wait_for(acknowledged, timeout=30, what="the batch saved and acknowledged")
