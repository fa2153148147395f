"""Nothing stays in flight forever: a commit whose lock ran out while its task carried a leaked
cancellation request is retried (it used to end silently, the dataset `committing` for good on a live
worker), and every work item is visible on the shard's in-flight board while it runs.

Deterministic: the commit path's probe (``workers._probe``) makes the first attempt do what
Python 3.11's TaskGroup does when a child fails after the body ended (one cancel request stays on the
task), then starves the event loop past the lock's validity (as a loaded CPU or a SIGSTOP would), so the
heartbeat finds the lease run out and cancels the block.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from coordinator.admin import OpenWorkFilter, fleet_summary, open_work_page
from shared.commit import CommitRequest, WinningAttempt, encode_sequence, plan_commit
from shared.events import Committed, JobFailed, JobStarted, wal_key
from shared.queue import Keys, shard_of
from tests._support.checkpoints import pause_first_at
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_wal_left
from tests._support.fleet_jobs import good_job, stage_task
from tests._support.wait import wait_for
from workers import read_in_flight

LOCK = {"validity": 1.2, "renew_interval": 0.3, "max_drift": 0.1, "poll_min": 0.02, "poll_max": 0.2}


async def _leak_a_cancel_request() -> None:
    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("a child failed after the body ended")

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fail())
    except* ValueError:
        pass


class _StarveOnce:
    """At ``commit.locked``: the first attempt leaks a cancel request and starves the loop past the lease;
    the second waits until the test has seen it on the board."""

    def __init__(self) -> None:
        self.calls = 0
        self.second = asyncio.Event()
        self.seen = asyncio.Event()

    async def __call__(self, point: str) -> None:
        if point != "commit.locked":
            return
        self.calls += 1
        if self.calls == 1:
            await _leak_a_cancel_request()
            time.sleep(LOCK["validity"] + 0.3)  # starved: no heartbeat, no renewal
            await asyncio.sleep(30)  # the lease is lost now; the block is cancelled here
        elif self.calls == 2:
            self.second.set()
            await self.seen.wait()


async def test_a_commit_whose_lock_ran_out_is_retried_and_shown_in_flight(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, lock=LOCK, worker={"lease": 6.0})
    hook = _StarveOnce()
    keys = Keys(fleet_name)
    async with inprocess_fleet(redis_client, settings, probe=hook) as fleet:
        store = fleet.store
        pub = fleet.publisher
        await pub.publish_many(await good_job(store, "job-1", ["ds-1"], 2))
        await asyncio.wait_for(hook.second.wait(), 30)  # retried (it used to stop here for good)

        async def board() -> list[dict[str, Any]]:
            return await read_in_flight(redis_client, keys, settings.fleet.shards)

        async def second_attempt_shown() -> list[dict[str, Any]] | None:
            # The board is written behind (workers._inflight): wait for the second attempt.
            rows = await board()
            return rows if rows and rows[0].get("attempts") == 2 else None

        rows = await wait_for(second_attempt_shown, timeout=10, what="the second attempt on the board")
        assert len(rows) == 1, rows
        row = rows[0]
        assert (row["work"], row["dataset"], row["job"]) == ("commit", "ds-1", "job-1")
        assert (row["state"], row["attempts"], row["worker"]) == ("running", 2, "w1")
        assert row["last_error"].startswith("LockLost"), row["last_error"]
        doc = await fleet_summary(redis_client, keys, settings)
        assert [r["label"] for r in doc["in_flight"]] == [row["label"]]
        hook.seen.set()

        await wait_for(lambda: committed(store, ["ds-1"], "job-1"), timeout=30, what="the commit")
        await wait_for(lambda: no_wal_left(store), timeout=30, what="the sequence finished")

        async def board_empty() -> bool:
            return not await board()

        await wait_for(board_empty, timeout=30, what="the board emptied once the work was done")
        evs = await admin_events(redis_client, fleet_name)
        assert sum(isinstance(e, Committed) for e in evs) == 1
        report = await clean_audit(store)
        assert report.ok, report.violations


async def test_an_abort_that_finds_a_commit_without_winners_in_the_job_state_finishes_it(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    """The job state has no winners for a dataset whose WAL exists (an abort found the commit under way).

    It used to log "commit scheduled without a complete set of winners" and leave the dataset
    `committing` for good; now the WAL is recovered and the commit announced once.
    """
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name)
    async with inprocess_fleet(redis_client, settings) as fleet:
        store = fleet.store
        pub = fleet.publisher
        # A first job committed: every shard's session is past its start-up recovery.
        await pub.publish_many(await good_job(store, "job-0", ["ds-w"], 1))
        await wait_for(lambda: committed(store, ["ds-w"], "job-0"), timeout=30, what="a first commit")
        started = JobStarted(job="job-w", datasets=["ds-w"], timeout_s=600, started_at=time.time())
        staged = [await stage_task(store, "job-w", "ds-w", t, 0) for t in range(2)]
        req = CommitRequest(
            dataset="ds-w",
            job="job-w",
            winners=[WinningAttempt(task=a.task, attempt=a.attempt, files=a.files) for a in staged],
            expected_tasks=2,
        )
        # A commit sequence of the job, written before anything ran (a holder died after writing it).
        await store.write(wal_key("ds-w", "job-w"), encode_sequence(plan_commit(req, 1, now=time.time())))
        failed = JobFailed(job="job-w", datasets=["ds-w"], reason="driver lost", failed_at=time.time())
        await pub.publish_many([started, *staged, failed])
        await wait_for(lambda: committed(store, ["ds-w"], "job-w"), timeout=30, what="the WAL's commit")
        await wait_for(
            lambda: _no_open_job(redis_client, fleet_name, settings.fleet.shards),
            timeout=30,
            what="the dataset's status settled (job ended)",
        )
        evs = await admin_events(redis_client, fleet_name)
        assert [(e.dataset, e.job) for e in evs if isinstance(e, Committed)] == [
            ("ds-w", "job-0"),
            ("ds-w", "job-w"),
        ]


async def _no_open_job(r: redis.asyncio.Redis, fleet: str, shards: int) -> bool:
    keys = Keys(fleet)
    for s in range(shards):
        if await r.hlen(keys.shard_state(s, "jobs")):
            return False
    return True


class _OutliveOnce:
    """At ``commit.saved`` (the block's last step), once: starve the loop past the lease; no await after."""

    def __init__(self) -> None:
        self.frozen = False

    async def __call__(self, point: str) -> None:
        if point == "commit.saved" and not self.frozen:
            self.frozen = True
            time.sleep(LOCK["validity"] + 0.3)


async def test_a_commit_block_that_outlived_its_lease_is_rechecked_not_lost_nor_doubled(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The block ends normally after its lease ran out: LockLost; the retry finds the work done and stops."""
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, lock=LOCK, worker={"lease": 6.0})
    hook = _OutliveOnce()
    async with inprocess_fleet(redis_client, settings, probe=hook) as fleet:
        store = fleet.store
        pub = fleet.publisher
        await pub.publish_many(await good_job(store, "job-o", ["ds-o"], 2))
        await wait_for(lambda: committed(store, ["ds-o"], "job-o"), timeout=30, what="the commit")
        await wait_for(
            lambda: _no_open_job(redis_client, fleet_name, settings.fleet.shards),
            timeout=30,
            what="job ended",
        )

        async def board_empty() -> bool:
            return not await read_in_flight(redis_client, Keys(fleet_name), settings.fleet.shards)

        await wait_for(board_empty, timeout=30, what="the retried work finished")
    assert hook.frozen
    assert any("outlived its lease" in r.getMessage() for r in caplog.records), (
        "no LockLost at the block's end"
    )
    evs = await admin_events(redis_client, fleet_name)
    assert [(e.dataset, e.job) for e in evs if isinstance(e, Committed)] == [("ds-o", "job-o")]
    assert await redis_client.hgetall(Keys(fleet_name).outcome_counts) == {b"committed": b"1"}


async def test_work_waiting_for_a_slot_or_for_its_dataset_shows_as_queued(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    """One in-flight slot, held by a commit paused at ``commit.locked``: the other commit shows `queued`
    (in the open work's pages; the in-flight board holds only the running one).

    Both datasets are in one shard, so one intake batch queues both.
    """
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, worker={"max_inflight_datasets": 1})
    paused, go, probe = pause_first_at("commit.locked")
    first = shard_of("ds-q0", settings.fleet.shards)
    names = [
        "ds-q0",
        next(f"ds-q{i}" for i in range(1, 1000) if shard_of(f"ds-q{i}", settings.fleet.shards) == first),
    ]
    keys = Keys(fleet_name)
    async with inprocess_fleet(redis_client, settings, probe=probe) as fleet:
        store = fleet.store
        try:
            pub = fleet.publisher
            await pub.publish_many(await good_job(store, "job-q", names, 1))
            await asyncio.wait_for(paused.wait(), 30)

            async def states() -> dict[str, str] | None:
                page = await open_work_page(redis_client, keys, settings, OpenWorkFilter(job="job-q"), None)
                got = {r["dataset"]: r["state"] for r in page.items}
                return got if sorted(got.values()) == ["queued", "running"] else None

            got = await wait_for(states, timeout=30, what="one running, one queued")
            # The board holds the running one only: queued work is not written (bounded by the slots).
            rows = await read_in_flight(redis_client, keys, settings.fleet.shards)
            assert [(r["dataset"], r["state"]) for r in rows] == [
                (d, st) for d, st in got.items() if st == "running"
            ]
            go.set()
            await wait_for(lambda: committed(store, names, "job-q"), timeout=30, what="both")

            async def board_empty() -> bool:
                return not await read_in_flight(redis_client, keys, settings.fleet.shards)

            await wait_for(board_empty, timeout=30, what="the board emptied")
        finally:
            go.set()
