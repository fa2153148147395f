"""Every change of the shard's job state is applied and saved under the shard's save lock:
no save ever writes a change (a batch's decisions, a dataset's new status) before
the records that change comes with are durable.

An action's save writes the metadata of the jobs it names as the in-memory
state has it. Had intake applied a batch's decisions and then waited for the
lock, a save queued before it would write them (a dataset marked committing,
say) without the attempt records and acknowledgements they came from; after
a crash the re-read entries would be judged against that state.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio

from shared import TransientError
from shared.events import JobStarted, StagedFile, TaskFinished
from shared.queue import DEFAULT_GROUP, AsyncPublisher, ensure_fleet
from tests._support.fleet import InProcessFleet, fleet_settings, inprocess_fleet
from tests._support.wait import wait_for
from workers._shard import ShardRunner
from workers._state_store import Batch


async def _true(condition: bool) -> bool:
    return condition


async def _session_runner(fleet: InProcessFleet) -> ShardRunner:
    """Return shard 0's runner once its session has started."""
    await wait_for(lambda: _true(0 in fleet.worker.running_shards), timeout=30, what="shard 0 running")
    runner = fleet.worker._runners[0][0]
    await wait_for(lambda: _true(runner.ledger.store is not None), timeout=30, what="session started")
    return runner


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
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=1)
    ) as fleet:
        runner = await _session_runner(fleet)
        lock = _WatchedLock()
        runner.ledger.save_lock = lock
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
            assert "j" not in runner.ledger.state.jobs
            assert not runner.ledger.state.attempts
        await wait_for(lambda: _true(("j", "ds") in runner.ledger.state.attempts), what="attempt recorded")

        async def acknowledged() -> bool:
            return (await redis_client.xpending(fleet.keys.events(0), "workers"))["pending"] == 0

        await wait_for(acknowledged, timeout=30, what="the batch saved and acknowledged")


async def _open_job(fleet: InProcessFleet, runner: ShardRunner, job: str) -> None:
    # A job that waits for its tasks: open, nothing commits it meanwhile.
    await fleet.publisher.publish(JobStarted(job=job, datasets=["ds"], timeout_s=600, started_at=0))
    await wait_for(lambda: _true(job in runner.ledger.state.jobs), timeout=30, what="job open")


async def test_a_status_change_is_applied_only_once_the_save_lock_is_held(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=1)
    ) as fleet:
        runner = await _session_runner(fleet)
        await _open_job(fleet, runner, "j")
        lock = _WatchedLock()
        runner.ledger.save_lock = lock
        async with lock:  # another save in flight: it must not find the new status in the state
            lock.asked.clear()
            change = asyncio.create_task(runner.ledger.set_status("j", "ds", "aborted", "test"))
            await asyncio.wait_for(lock.asked.wait(), timeout=30)
            assert runner.ledger.state.jobs["j"].datasets["ds"].status == "open"
            assert "j" not in runner.ledger.state.ended
        await change
        assert "j" in runner.ledger.state.ended
        ended = fleet.keys.shard_state(0, "ended")
        assert await redis_client.hexists(ended, "j")
        assert await redis_client.hexists(fleet.keys.job_result(0, "j"), "ds")


async def test_a_status_change_whose_save_fails_is_put_back_and_made_again(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=1)
    ) as fleet:
        runner = await _session_runner(fleet)
        await _open_job(fleet, runner, "j")
        before = runner.ledger.state.jobs["j"]
        store = runner.ledger.store
        assert store is not None
        real_save = store.save

        async def failing_save(*args: object, **kwargs: object) -> list[object]:
            raise TransientError("Redis went away")

        monkeypatch.setattr(store, "save", failing_save)
        with pytest.raises(TransientError):
            await runner.ledger.set_status("j", "ds", "aborted", "test")
        # Nothing of the change is left in memory: the job is open as before.
        assert runner.ledger.state.jobs["j"] is before
        assert "j" not in runner.ledger.state.ended
        monkeypatch.setattr(store, "save", real_save)
        await runner.ledger.set_status("j", "ds", "aborted", "test")  # the retry makes the change again
        assert "j" not in runner.ledger.state.jobs and "j" in runner.ledger.state.ended
        assert await redis_client.hexists(fleet.keys.shard_state(0, "ended"), "j")
        assert not await redis_client.hexists(fleet.keys.shard_state(0, "jobs"), "j")
        assert (await redis_client.xpending(fleet.keys.events(0), DEFAULT_GROUP))["pending"] == 0


async def test_a_run_of_saves_sent_ahead_gives_way_to_a_waiting_save(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    """Under a backlog intake holds the save lock for a run of batches (workers._save_pipe);
    an action that waits to save ends the run at its next batch instead of its 16th."""
    size = 10
    await ensure_fleet(redis_client, fleet_name, 1)
    pub = AsyncPublisher(redis_client, fleet_name, 1)
    await pub.publish(JobStarted(job="j", datasets=["ds"], timeout_s=600, started_at=0))
    files = [StagedFile(path="part-0", size=1)]
    await pub.publish_many(
        TaskFinished(job="j", dataset="ds", task=i, attempt=0, files=files, finished_at=0)
        for i in range(20_000)
    )
    judged = 0
    run_started = asyncio.Event()

    async def probe(point: str) -> None:
        nonlocal judged
        if point == "intake.judge":  # a batch of a run of saves sent ahead is judged
            judged += 1
        elif point == "intake.run":
            run_started.set()  # a run's first save: the run goes on for up to 16 batches

    async with inprocess_fleet(
        redis_client,
        fleet_settings(redis_url, tmp_path / "store", fleet_name, shards=1, worker={"read_batch": size}),
        probe=probe,
    ) as fleet:
        await asyncio.wait_for(run_started.wait(), timeout=30)
        runner = fleet.worker._runners[0][0]
        before = judged
        await runner.ledger.save_change("j", lambda: Batch(jobs={"j"}))
        assert judged - before <= 3
        lag = (await redis_client.xinfo_groups(fleet.keys.events(0)))[0]["lag"]
        assert lag and lag > 0  # the backlog was still there: the save did not wait for it
