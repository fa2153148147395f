"""Exactly one ``committed`` or ``aborted`` admin event per (dataset, job), whatever point a worker dies at.

Crash at every point: an in-process worker is stopped dead at one named point of
the commit or abort path (the worker's commit-path probe, ``workers._probe``, is the seam: the test
makes it freeze there, then shuts the worker down with a tiny drain grace, so its
work is cancelled exactly at that point, as a kill would leave it), and a second
worker takes the shard over and finishes. The admin stream must then hold exactly
one outcome event per (dataset, job), and the exact counters must match.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio

from coordinator.cli._ops_run import operator_request
from shared.events import Aborted, Committed, Quarantined
from shared.queue import AdminPublisher, Keys, read_admin_range
from tests._support.checkpoints import PauseFirst
from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_staging_left, no_wal_left
from tests._support.fleet_jobs import corrupted_job, failed_job, good_job
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for

DATASETS = ["ds-a", "ds-b", "ds-c"]

COMMIT_POINTS = ["commit.locked", "commit.done", "commit.announced", "commit.saved"]
ABORT_POINTS = ["abort.done", "abort.announced"]


@pytest.mark.parametrize("point", COMMIT_POINTS + ABORT_POINTS)
async def test_one_outcome_event_per_dataset_whatever_point_the_worker_dies_at(
    point: str,
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
) -> None:
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name, worker={"drain_grace": 0.1})
    freeze = PauseFirst(point)  # the first work to reach the point freezes there for good
    aborting = point.startswith("abort.")
    job = "job-x"
    async with inprocess_fleet(redis_client, settings, probe=freeze) as fleet:
        store = fleet.store
        first, first_task = fleet.worker, fleet.worker_task
        make = failed_job if aborting else good_job
        await fleet.publisher.publish_many(await make(store, job, DATASETS, 2))
        await asyncio.wait_for(freeze.paused.wait(), 30)
        # The first worker dies at the point: its work there is cancelled, nothing after it runs.
        first.shutdown()
        await asyncio.wait_for(first_task, 30)
        second, second_task = fleet.start_worker("w2")
        try:

            async def all_done() -> bool:
                if aborting:
                    return await no_staging_left(store, job) and await _outcomes_at_least(
                        redis_client, fleet_name, len(DATASETS)
                    )
                return (
                    await committed(store, DATASETS, job)
                    and await no_wal_left(store)
                    and await _outcomes_at_least(redis_client, fleet_name, len(DATASETS))
                )

            await wait_for(all_done, timeout=60, what="the second worker finished every dataset")
            await wait_for(
                lambda: _job_ended(redis_client, fleet_name, settings.fleet.shards, job),
                timeout=30,
                what="the job's state ended (every status saved)",
            )
        finally:
            second.shutdown()
        await asyncio.wait_for(second_task, 30)
        await asyncio.wait_for(fleet.stop(), 30)

        # Nothing runs any more: count.
        evs = await admin_events(redis_client, fleet_name)
        kind = Aborted if aborting else Committed
        per_dataset = Counter(e.dataset for e in evs if isinstance(e, Committed | Aborted) and e.job == job)
        assert per_dataset == Counter(dict.fromkeys(DATASETS, 1)), per_dataset
        assert all(isinstance(e, kind) for e in evs if isinstance(e, Committed | Aborted))
        counts = await redis_client.hgetall(Keys(fleet_name).outcome_counts)
        assert {k.decode(): int(v) for k, v in counts.items()} == {kind.__name__.lower(): len(DATASETS)}
        if not aborting:
            report = await clean_audit(store)
            assert report.ok, report.violations
            assert report.manifests == len(DATASETS)


async def _outcomes_at_least(r: redis.asyncio.Redis, fleet: str, n: int) -> bool:
    evs = await admin_events(r, fleet)
    return sum(isinstance(e, Committed | Aborted) for e in evs) >= n


async def _job_ended(r: redis.asyncio.Redis, fleet: str, shards: int, job: str) -> bool:
    keys = Keys(fleet)
    for s in range(shards):
        if await r.hexists(keys.shard_state(s, "jobs"), job):
            return False
    return True


async def test_an_outcome_retried_after_a_lost_answer_is_appended_once(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    admin = AdminPublisher(redis_client, keys)
    ev = Committed(at=1.0, worker="w", dataset="ds", job="j", files=1, bytes=2, duration_s=0.1, epoch=3)
    assert await admin.publish_outcome(ev, dataset="ds", job="j", outcome="committed") is True
    # The same announcement again (a retry, another owner, a replay): nothing more.
    assert await admin.publish_outcome(ev, dataset="ds", job="j", outcome="committed") is False
    aborted = Aborted(at=2.0, worker="w", dataset="ds", job="j", reason="late")
    assert await admin.publish_outcome(aborted, dataset="ds", job="j", outcome="aborted") is False
    # Another job of the same dataset is its own (dataset, job).
    other = Committed(at=1.0, worker="w", dataset="ds", job="k", files=0, bytes=0, duration_s=0.0, epoch=4)
    assert await admin.publish_outcome(other, dataset="ds", job="k", outcome="committed") is True
    rows = await read_admin_range(redis_client, keys)
    assert [(e.dataset, e.job) for _id, e in rows] == [("ds", "j"), ("ds", "k")]
    assert await redis_client.hgetall(keys.outcome_counts) == {b"committed": b"2"}
    # Markers are bounded (queue.outcome_markers_max, by age; see test_memory_bounded): one each.
    assert await redis_client.hgetall(keys.outcome_markers) == {
        b"ds/j": b"committed " + rows[0][0],
        b"ds/k": b"committed " + rows[1][0],
    }
    assert await redis_client.xlen(keys.outcome_order) == 2


async def test_operator_retry_and_skip_announce_one_outcome_each(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    """A quarantined sequence retried commits (one ``committed``); one skipped is aborted (one event)."""
    settings = fleet_settings(redis_url, tmp_path / "store", fleet_name)
    async with inprocess_fleet(redis_client, settings) as fleet:
        store = fleet.store
        pub = fleet.publisher
        fix_evs, fix_key, right = await corrupted_job(store, "j-fix", "qa")
        skip_evs, _key, _right = await corrupted_job(store, "j-skip", "qb")
        await pub.publish_many([*fix_evs, *skip_evs])

        async def both_quarantined() -> bool:
            evs = await admin_events(redis_client, fleet_name)
            return {(e.dataset, e.job) for e in evs if isinstance(e, Quarantined)} == {
                ("qa", "j-fix"),
                ("qb", "j-skip"),
            }

        await wait_for(both_quarantined, timeout=60, what="2 quarantined sequences")
        await store.write(fix_key, right)  # the operator fixes the cause of one
        await operator_request(settings, "qa", "j-fix", "retry", wait_s=60)
        await operator_request(settings, "qb", "j-skip", "skip", wait_s=60)
    evs = await admin_events(redis_client, fleet_name)
    outcomes = [(type(e).__name__, e.dataset, e.job) for e in evs if isinstance(e, Committed | Aborted)]
    assert sorted(outcomes) == [("Aborted", "qb", "j-skip"), ("Committed", "qa", "j-fix")]
    assert [e.reason for e in evs if isinstance(e, Aborted)] == ["skipped by operator"]
    counts = await redis_client.hgetall(Keys(fleet_name).outcome_counts)
    assert counts == {b"committed": b"1", b"aborted": b"1"}


async def test_sigkilled_worker_mid_commit_and_abort_loses_no_outcome_event(fleet: Fleet) -> None:
    """Real processes: a worker SIGKILLed while it commits and aborts; one event per (dataset, job)."""
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers")
    datasets = [f"k{i:03d}" for i in range(60)]
    events = await good_job(fleet.store, "killjob", datasets, 3)
    events += await failed_job(fleet.store, "killbad", datasets[:20], 2)
    await fleet.publisher.publish_many(events)
    name = fleet.settings.fleet.name

    async def w1_busy() -> bool:
        evs = await admin_events(fleet.redis, name)
        return sum(isinstance(e, Committed | Aborted) and e.worker == "w1" for e in evs) >= 3

    await wait_for(w1_busy, timeout=60, interval=0.01, what="w1 committing and aborting")
    fleet.names["w1"].kill()
    await wait_for(lambda: committed(fleet.store, datasets, "killjob"), timeout=120, what="all commits")
    await wait_for(lambda: no_staging_left(fleet.store, "killbad"), timeout=60, what="the abort")
    await wait_for(lambda: no_wal_left(fleet.store), timeout=60, what="every sequence finished")
    expected = {(ds, "killjob") for ds in datasets} | {(ds, "killbad") for ds in datasets[:20]}

    async def all_announced() -> bool:
        evs = await admin_events(fleet.redis, name)
        return {(e.dataset, e.job) for e in evs if isinstance(e, Committed | Aborted)} == expected

    await wait_for(all_announced, timeout=60, what="an outcome event for every (dataset, job)")
    await wait_for(
        lambda: _job_ended(fleet.redis, name, fleet.settings.fleet.shards, "killjob"),
        timeout=60,
        what="the job's state ended",
    )
    evs = await admin_events(fleet.redis, name)
    counts = Counter((e.dataset, e.job) for e in evs if isinstance(e, Committed | Aborted))
    assert set(counts) == expected
    assert max(counts.values()) == 1, {k: n for k, n in counts.items() if n > 1}
    outcome_counts = await fleet.redis.hgetall(fleet.keys.outcome_counts)
    assert outcome_counts == {b"committed": b"60", b"aborted": b"20"}
