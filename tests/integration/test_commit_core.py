"""The commit core end to end on every storage backend: commit, crash and recover, fencing, unknown
outcomes, quarantine with retry and skip, abort. Every check reads the real store back."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from shared import BadInput, Fenced, LockLost, NotFound
from shared.commit import (
    abort_dataset,
    audit,
    cleanup_staged_attempt,
    commit_dataset,
    list_unfinished,
    read_sequence,
    read_watermarks,
    recover_dataset,
    retry_quarantined,
    skip_quarantined,
)
from shared.commit._abort import _exists
from shared.events import manifest_key, staged_key, staging_prefix, wal_key
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, StagedJob, assert_exactly_once, fast_settings, keys, stage_job
from tests._support.emulators import StoreTarget
from tests._support.fault_store import FaultStore, expect_crash

SETTINGS = fast_settings()


def _sample(n: int, backend: str) -> list[int]:
    """Every boundary on the local store; a spread of them on the emulators (keeps runs small)."""
    if backend == "local":
        return list(range(1, n + 1))
    return sorted({1, n // 2, n - 2, n})


async def _mutations_of_a_clean_commit(store: ObjectStore) -> int:
    job = await stage_job(store, "probe", "job-1")
    counting = FaultStore(store)
    assert (await commit_dataset(counting, job.req, ManualLease("probe", 1), SETTINGS)).ok
    return len(counting.calls)


async def test_commit_then_replay_is_idempotent(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "sales", "job-1")
    res = await commit_dataset(any_store, job.req, ManualLease("sales", 1), SETTINGS)
    assert res.ok and not res.recovered and not res.already_committed
    assert (res.files, res.bytes) == (4, sum(len(b) for b in job.winners.values()))
    assert res.steps == res.steps_redone == 7
    await assert_exactly_once(any_store, job)

    again = await commit_dataset(any_store, job.req, ManualLease("sales", 2), SETTINGS)
    assert again.ok and again.already_committed
    assert (again.files, again.bytes) == (res.files, res.bytes)
    await assert_exactly_once(any_store, job)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_crash_at_every_step_boundary_then_recovery_commits_exactly_once(
    any_store: ObjectStore, store_target: StoreTarget, when: str
) -> None:
    n = await _mutations_of_a_clean_commit(any_store)
    assert (
        n >= 14
    )  # WAL create, 4 x (copy, delete), 3 progress writes, watermarks, manifest, cleanup, WAL delete
    jobs: list[StagedJob] = []
    for k in _sample(n, store_target.backend):
        dataset = f"ds{k}"
        job = await stage_job(any_store, dataset, "job-1", seed=k)
        jobs.append(job)
        crashing = FaultStore(any_store, crash_at=k, crash_when=when)
        await expect_crash(commit_dataset(crashing, job.req, ManualLease(dataset, 1), SETTINGS))
        res = await commit_dataset(any_store, job.req, ManualLease(dataset, 2), SETTINGS)
        assert res.ok, res
        # Once the log is written, the next holder recovers it; before, it plans afresh.
        if k > 1 or when == "after":
            assert res.recovered or res.already_committed, (k, res)
    await assert_exactly_once(any_store, *jobs)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_unknown_outcomes_are_reread_and_the_commit_still_finishes(
    any_store: ObjectStore, store_target: StoreTarget, when: str
) -> None:
    n = await _mutations_of_a_clean_commit(any_store)
    jobs = []
    for k in _sample(n, store_target.backend):
        dataset = f"u{k}"
        job = await stage_job(any_store, dataset, "job-1", seed=k)
        jobs.append(job)
        flaky = FaultStore(any_store, unknown_at=k, unknown_when=when)
        res = await commit_dataset(flaky, job.req, ManualLease(dataset, 1), SETTINGS)
        assert res.ok and not res.recovered, (k, res)
    await assert_exactly_once(any_store, *jobs)


async def test_crash_while_recovering_is_recovered_again(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    for epoch, crash_at in ((1, 6), (2, 3), (3, 2)):
        crashing = FaultStore(any_store, crash_at=crash_at, crash_when="after")
        await expect_crash(commit_dataset(crashing, job.req, ManualLease("ds", epoch), SETTINGS))
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 4), SETTINGS)
    assert res.ok and res.recovered
    await assert_exactly_once(any_store, job)


async def test_an_older_unfinished_sequence_is_finished_before_a_new_commit(any_store: ObjectStore) -> None:
    first = await stage_job(any_store, "ds", "job-1", seed=1)
    crashing = FaultStore(any_store, crash_at=4, crash_when="after")
    await expect_crash(commit_dataset(crashing, first.req, ManualLease("ds", 1), SETTINGS))
    unfinished = await list_unfinished(any_store)
    assert [(u.dataset, u.job) for u in unfinished] == [("ds", "job-1")]
    second = await stage_job(any_store, "ds", "job-2", seed=2)
    res = await commit_dataset(any_store, second.req, ManualLease("ds", 2), SETTINGS)
    assert res.ok and not res.recovered
    assert res.recovered_jobs == ["job-1"] and res.earlier[0].recovered
    await assert_exactly_once(any_store, first, second)


async def test_recover_dataset_finishes_each_unfinished_sequence_oldest_first(any_store: ObjectStore) -> None:
    jobs = []
    for n, dataset in enumerate(("a", "b")):
        job = await stage_job(any_store, dataset, "job-1", seed=n)
        jobs.append(job)
        # Call 10 is the log write after the publish phase (1 create + 4 x (copy, delete) + 1).
        crashing = FaultStore(any_store, crash_at=10, crash_when="after")
        await expect_crash(commit_dataset(crashing, job.req, ManualLease(dataset, 1), SETTINGS))
        assert crashing.calls[-1] == ("write_if_match", f"_wal/{dataset}/job-1.json")
    assert [u.dataset for u in await list_unfinished(any_store)] == ["a", "b"]
    assert [u.job for u in await list_unfinished(any_store, "b")] == ["job-1"]
    for dataset, job in zip(("a", "b"), jobs, strict=True):
        # The fence (call 10) runs beside the source deletes: one still in flight when the
        # crash came was cancelled, and its source is still there (slow store, loaded machine).
        left = [key for key in job.winners if await _exists(any_store, key)]
        rec = await recover_dataset(any_store, dataset, ManualLease(dataset, 2), SETTINGS)
        assert rec.ok and [r.job for r in rec.results] == ["job-1"] and rec.results[0].recovered
        # Every publish whose source is gone is verified done, not redone: watermarks,
        # manifest and clean-up are (and the publishes whose sources were left).
        assert (rec.results[0].steps, rec.results[0].steps_redone) == (7, 3 + len(left))
    await assert_exactly_once(any_store, *jobs)


async def test_a_stale_holder_is_fenced_at_its_next_log_write(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    # Park the old holder on its 3rd mutation (a publish, after the log is written).
    stale = FaultStore(any_store, gate_at=3)
    old_lease = ManualLease("ds", 1)  # a frozen process: its lease still looks valid to it
    old = asyncio.create_task(commit_dataset(stale, job.req, old_lease, SETTINGS))
    await stale.parked.wait()
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 2), SETTINGS)
    assert res.ok and res.recovered
    # A newer job moves the watermarks further; the stale holder must not bring them back.
    newer = await stage_job(any_store, "ds", "job-2", seed=5, marks={"p0": 9000, "p1": 9000})
    assert (await commit_dataset(any_store, newer.req, ManualLease("ds", 3), SETTINGS)).ok
    stale.gate.set()
    with pytest.raises(Fenced):
        await old
    assert await read_watermarks(any_store, "ds") == {"p0": 9000, "p1": 9000}
    await assert_exactly_once(any_store, job, newer)


async def test_a_log_held_by_a_higher_epoch_is_never_touched(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")  # log written with epoch 5, then crash
    await expect_crash(commit_dataset(crashing, job.req, ManualLease("ds", 5), SETTINGS))
    before = await any_store.read(wal_key("ds", "job-1"))
    with pytest.raises(Fenced):
        await commit_dataset(any_store, job.req, ManualLease("ds", 4), SETTINGS)
    after = await any_store.read(wal_key("ds", "job-1"))
    assert after.info.version == before.info.version
    assert sorted(await keys(any_store, "_staging/")) == sorted([*job.winners, *job.losers])


async def test_losing_the_lease_stops_the_work_and_the_next_holder_finishes(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    gated = FaultStore(any_store, gate_at=4)
    lease = ManualLease("ds", 1)
    task = asyncio.create_task(commit_dataset(gated, job.req, lease, SETTINGS))
    await gated.parked.wait()
    lease.lose()
    gated.gate.set()
    with pytest.raises(LockLost):
        await task
    assert (await read_sequence(any_store, "ds", "job-1")) is not None
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 2), SETTINGS)
    assert res.ok and res.recovered
    await assert_exactly_once(any_store, job)


async def test_quarantine_sets_one_dataset_aside_while_others_commit_then_retry(
    any_store: ObjectStore,
) -> None:
    settings = fast_settings(attempts=3)
    bad1 = await stage_job(any_store, "bad", "job-1", seed=1)
    goods = [await stage_job(any_store, f"good{n}", "job-1", seed=n) for n in range(3)]
    throttled = FaultStore(any_store, throttle=lambda key, op: op == "copy" and key.startswith("bad/"))
    async with asyncio.TaskGroup() as tg:
        bad_task = tg.create_task(commit_dataset(throttled, bad1.req, ManualLease("bad", 1), settings))
        good_tasks = [
            tg.create_task(commit_dataset(throttled, g.req, ManualLease(g.req.dataset, 1), settings))
            for g in goods
        ]
    res = bad_task.result()
    assert res.status == "quarantined" and not res.ok
    assert (
        res.quarantined is not None
        and "retry budget spent" in res.quarantined
        and "Throttled" in res.quarantined
    )
    assert all(t.result().ok for t in good_tasks)
    seq = await read_sequence(any_store, "bad", "job-1")
    assert seq is not None and seq.quarantined == res.quarantined and seq.attempts == 1

    # Delivered again, the same job reports "blocked" (it was reported quarantined once) and runs nothing.
    replay = await commit_dataset(any_store, bad1.req, ManualLease("bad", 2), settings)
    assert (replay.status, replay.blocked_by, replay.quarantined) == ("blocked", "job-1", res.quarantined)
    assert (await read_sequence(any_store, "bad", "job-1")) == seq

    # A later job of the quarantined dataset waits; the sequence is not run again by itself.
    bad2 = await stage_job(any_store, "bad", "job-2", seed=2)
    blocked = await commit_dataset(any_store, bad2.req, ManualLease("bad", 2), settings)
    assert blocked.status == "blocked" and blocked.blocked_by == "job-1"
    assert await manifest_missing(any_store, "bad", "job-2")
    report = await audit(any_store)
    assert [v.key for v in report.of_kind("quarantined_sequence")] == [wal_key("bad", "job-1")]
    again = await recover_dataset(any_store, "bad", ManualLease("bad", 3), settings)
    assert again.blocked_by == "job-1" and again.results == []

    # The operator fixes the cause (here: the throttling stops) and retries.
    res = await retry_quarantined(any_store, "bad", "job-1", ManualLease("bad", 4), settings)
    assert res.ok and res.recovered
    assert (await commit_dataset(any_store, bad2.req, ManualLease("bad", 5), settings)).ok
    await assert_exactly_once(any_store, bad1, bad2, *goods)


async def manifest_missing(store: ObjectStore, dataset: str, job: str) -> bool:
    try:
        await store.head(manifest_key(dataset, job))
    except NotFound:
        return True
    return False


async def test_lost_staged_file_quarantines_and_skip_rolls_the_job_back(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1", tasks=3)
    lost = next(iter(sorted(job.winners)))
    await any_store.delete(lost)
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 1), SETTINGS)
    assert res.status == "quarantined" and res.quarantined is not None and "data lost" in res.quarantined
    skipped = await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 2), SETTINGS)
    assert skipped.outcome == "rolled_back"
    assert skipped.published_deleted + skipped.staged_deleted == len(job.winners) - 1 + len(job.losers)
    assert await keys(any_store, "ds/") == [] and await keys(any_store, "_staging/") == []
    assert await read_sequence(any_store, "ds", "job-1") is None
    assert (await audit(any_store)).ok
    later = await stage_job(any_store, "ds", "job-2", seed=3)
    assert (await commit_dataset(any_store, later.req, ManualLease("ds", 3), SETTINGS)).ok
    await assert_exactly_once(any_store, later)


async def test_skip_refuses_to_roll_back_data_whose_watermarks_are_in_place(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    # A different manifest of the same job is there already: the manifest step conflicts,
    # after the watermarks have advanced.
    await any_store.write(
        manifest_key("ds", "job-1"),
        msgspec.json.encode(
            {"dataset": "ds", "job": "job-1", "files": [], "watermarks": {}, "epoch": 0, "committed_at": 0}
        ),
    )
    # The manifest exists, so a commit call answers "already committed"; recovery of the log is
    # what meets the conflict. Write the log by crashing just after it is created.
    await any_store.delete(manifest_key("ds", "job-1"))
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(commit_dataset(crashing, job.req, ManualLease("ds", 1), SETTINGS))
    await any_store.write(
        manifest_key("ds", "job-1"),
        msgspec.json.encode(
            {"dataset": "ds", "job": "job-1", "files": [], "watermarks": {}, "epoch": 0, "committed_at": 0}
        ),
    )
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 2), SETTINGS)
    assert res.status == "quarantined" and res.quarantined is not None and "other content" in res.quarantined
    with pytest.raises(BadInput, match="watermarks"):
        await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 3), SETTINGS)
    # The operator removes the bogus manifest and rolls forward instead.
    await any_store.delete(manifest_key("ds", "job-1"))
    assert (await retry_quarantined(any_store, "ds", "job-1", ManualLease("ds", 4), SETTINGS)).ok
    await assert_exactly_once(any_store, job)


async def test_skip_after_the_manifest_only_forgets_the_log(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    loser = next(iter(job.losers))
    stuck = FaultStore(any_store, throttle=lambda key, op: op == "delete" and key == loser)
    res = await commit_dataset(stuck, job.req, ManualLease("ds", 1), fast_settings(attempts=2))
    assert res.status == "quarantined" and res.quarantined is not None and "cleanup" in res.quarantined
    skipped = await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 2), SETTINGS)
    assert skipped.outcome == "forgotten"
    report = await audit(any_store)
    assert [(v.kind, v.key) for v in report.violations] == [("staged_leftover", loser)]
    with pytest.raises(NotFound):
        await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 3), SETTINGS)


async def test_skip_refuses_a_sequence_that_is_not_quarantined(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(commit_dataset(crashing, job.req, ManualLease("ds", 1), SETTINGS))
    with pytest.raises(BadInput, match="not quarantined"):
        await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 2), SETTINGS)
    assert (await commit_dataset(any_store, job.req, ManualLease("ds", 3), SETTINGS)).ok
    await assert_exactly_once(any_store, job)


async def test_abort_deletes_staged_output_unless_a_commit_won(any_store: ObjectStore) -> None:
    aborted = await stage_job(any_store, "a", "job-1")
    res = await abort_dataset(any_store, "a", "job-1", ManualLease("a", 1), SETTINGS)
    assert res.status == "aborted" and res.files_deleted == len(aborted.winners) + len(aborted.losers)
    assert await keys(any_store, "_staging/") == []

    # A commit that has written its log wins over a later abort.
    racing = await stage_job(any_store, "b", "job-1")
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(commit_dataset(crashing, racing.req, ManualLease("b", 1), SETTINGS))
    res = await abort_dataset(any_store, "b", "job-1", ManualLease("b", 2), SETTINGS)
    assert res.status == "commit_in_progress" and res.files_deleted == 0
    assert sorted(await keys(any_store, staging_prefix("job-1", "b"))) == sorted(
        [*racing.winners, *racing.losers]
    )
    assert (await commit_dataset(any_store, racing.req, ManualLease("b", 3), SETTINGS)).ok

    res = await abort_dataset(any_store, "b", "job-1", ManualLease("b", 4), SETTINGS)
    assert res.status == "already_committed" and res.files_deleted == 0
    await assert_exactly_once(any_store, racing)


async def test_cleanup_of_a_late_attempt_spares_a_running_commit(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    crashing = FaultStore(any_store, crash_at=1, crash_when="after")
    await expect_crash(commit_dataset(crashing, job.req, ManualLease("ds", 1), SETTINGS))
    # Task 1's winning attempt delivered again late: its files are being published, keep them.
    assert await cleanup_staged_attempt(any_store, "job-1", "ds", 1, 1, settings=SETTINGS) == 0
    assert (await commit_dataset(any_store, job.req, ManualLease("ds", 2), SETTINGS)).ok
    # A late losing attempt of the committed job: removed.
    late = staged_key("job-1", "ds", 1, 7, "late.parquet")
    await any_store.write(late, b"late")
    assert await cleanup_staged_attempt(any_store, "job-1", "ds", 1, 7, settings=SETTINGS) == 1
    await assert_exactly_once(any_store, job)
