"""Shard state v2 in Redis (issue 31 items 2 and 4): a field per dataset with its finish order, the
migration of a v1 shard on load, and a status change that writes one small field."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
import redis.asyncio

from shared.events import DatasetExpectation, JobFinished, JobStarted, QueueEvent, StagedFile, TaskFinished
from shared.queue import Keys
from tests._support.shard_state import SHARD
from tests._support.wait import wait_for
from workers._core import STATE_VERSION, Commit, ShardJobs, decide
from workers._ledger import ShardLedger
from workers._state_store import Batch, ShardStateStore, ShardStateUnreadable

_EXP = {"tasks": 1, "winners": None}


def _v1_job(job: str, opened_at: float, datasets: dict[str, str]) -> bytes:
    """A job record as a v1 worker wrote it: its datasets inside."""
    return json.dumps(
        {
            "v": 1,
            "job": job,
            "opened_at": opened_at,
            "deadline": opened_at + 600,
            "datasets": {
                name: {"status": status, "expected": _EXP if status != "open" else None, "reason": ""}
                for name, status in datasets.items()
            },
            "app": "",
            "tables": {},
            "stream": None,
        }
    ).encode()


def _v1_attempt(seq: int) -> bytes:
    return json.dumps(
        {"v": 1, "task": 0, "attempt": 0, "files": [{"path": "p", "size": 1}], "watermarks": {}, "seq": seq}
    ).encode()


async def _owned(r: redis.asyncio.Redis, keys: Keys) -> ShardStateStore:
    await r.set(keys.shard_state(SHARD, "owner"), b"w1@1")
    return ShardStateStore(r, keys, SHARD, b"w1@1")


async def test_a_v1_shard_is_migrated_on_load_in_the_order_its_jobs_opened(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store = await _owned(redis_client, keys)
    jobs, attempts = keys.shard_state(SHARD, "jobs"), keys.shard_state(SHARD, "attempts")
    # Written in the other order: the hash's order must not matter.
    await redis_client.hset(jobs, "late", _v1_job("late", 20.0, {"d": "committing", "e": "open"}))
    await redis_client.hset(jobs, "early", _v1_job("early", 10.0, {"d": "committing", "x": "aborted"}))
    for job, seq in (("late", 7), ("early", 3)):
        await redis_client.hset(attempts, f"{job}/d/0/0", _v1_attempt(seq))
    await redis_client.hset(
        keys.shard_state(SHARD, "ended"), "gone", b'{"v":1,"status":"committed","at":1.0}'
    )

    state = await store.load()

    assert list(state.lines["d"]) == ["early", "late"]
    assert state.resumed() == [Commit(job="early", dataset="d")]
    assert state.jobs["late"].datasets["e"].fin == 0, "open: not finished"
    assert state.ended["gone"].status == "committed"
    assert state.winners("early", "d") is not None
    # Written back as v2 by the load, fenced: the job records without their datasets, a field for each.
    raw = {k.decode(): json.loads(v) for k, v in (await redis_client.hgetall(jobs)).items()}
    assert {k: (v["v"], v["datasets"]) for k, v in raw.items()} == {"late": (2, {}), "early": (2, {})}
    fields = await redis_client.hgetall(keys.shard_state(SHARD, "datasets"))
    assert sorted(fields) == [b"early/d", b"early/x", b"late/d", b"late/e"]
    assert {json.loads(v)["v"] for v in fields.values()} == {STATE_VERSION}
    again = await store.load()
    assert again.jobs == state.jobs and again.lines == state.lines


@pytest.mark.parametrize("key", ["jobs", "datasets"])
async def test_a_record_of_a_newer_version_still_sets_the_shard_aside(
    redis_client: redis.asyncio.Redis, fleet_name: str, key: str
) -> None:
    keys = Keys(fleet_name)
    store = await _owned(redis_client, keys)
    await redis_client.hset(
        keys.shard_state(SHARD, "jobs"), "j", b'{"v":2,"job":"j","opened_at":1,"deadline":2}'
    )
    if key == "jobs":
        await redis_client.hset(
            keys.shard_state(SHARD, "jobs"), "k", b'{"v":3,"job":"k","opened_at":1,"deadline":2}'
        )
    else:
        await redis_client.hset(keys.shard_state(SHARD, "datasets"), "j/d", b'{"v":3,"status":"open"}')
    with pytest.raises(ShardStateUnreadable, match="record version 3") as info:
        await store.load()
    assert info.value.key == keys.shard_state(SHARD, key)


async def test_a_dataset_record_of_no_open_job_is_dropped_by_the_load(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store = await _owned(redis_client, keys)
    await redis_client.hset(
        keys.shard_state(SHARD, "datasets"), "deleted-by-hand/d", b'{"v":2,"status":"open"}'
    )
    state = await store.load()
    assert state.jobs == {} and state.lines == {}
    assert not await redis_client.exists(keys.shard_state(SHARD, "datasets"))


async def _big_job(store: ShardStateStore, n: int) -> ShardLedger:
    """A ledger whose saved state holds job j of ``n`` committing datasets d0..d<n-1>."""
    state = ShardJobs()
    names = [f"d{i}" for i in range(n)]
    events = [JobStarted(job="j", datasets=names, timeout_s=600, started_at=0.0)]
    events += [
        TaskFinished(
            job="j", dataset=d, task=0, attempt=0, files=[StagedFile(path="p", size=1)], finished_at=0
        )
        for d in names
    ]
    events.append(
        JobFinished(job="j", datasets=dict.fromkeys(names, DatasetExpectation(tasks=1)), finished_at=0)
    )
    batch = Batch()
    for ev in events:
        d = decide(state, ev, now=0.0, default_timeout=600.0)
        state.apply(d)
        if d.job is not None:
            batch.jobs.add(d.job.job)
        batch.datasets.update((d.job_id, name) for name in d.datasets or ())
    await store.save(batch, state)
    ledger = ShardLedger()
    ledger.begin(store)
    ledger.load(await store.load())
    return ledger


async def test_a_status_change_writes_one_small_field_and_the_jobs_end_drops_every_record(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    store = await _owned(redis_client, keys)
    ledger = await _big_job(store, 2000)
    jobs_key, ds_key = keys.shard_state(SHARD, "jobs"), keys.shard_state(SHARD, "datasets")
    job_record = await redis_client.hget(jobs_key, "j")
    assert job_record is not None and len(job_record) < 200, "the job's record holds none of its datasets"
    # What the status change saves, encoded: the one dataset's field and its result, whatever the job's size.
    assert ledger.state.set_status("j", "d5", "committed") is not None
    prep = store.prepare(Batch(datasets={("j", "d5")}), ledger.state)
    assert sum(len(a) for a in prep.args if isinstance(a, bytes | str)) < 400
    ledger.state.set_status("j", "d5", "committing")
    for i in range(2000):
        await ledger.set_status("j", f"d{i}", "committed")
        if i == 5:
            assert (
                msgspec.json.decode(await redis_client.hget(ds_key, "j/d5") or b"")["status"] == "committed"
            )
            assert await redis_client.hget(jobs_key, "j") == job_record, "the job's record is not rewritten"
    assert ledger.state.ended["j"].status == "committed" and "j" not in ledger.state.jobs
    for key in (jobs_key, ds_key, keys.shard_state(SHARD, "attempts")):
        assert not await redis_client.exists(key), key
    assert (await store.load()).ended["j"].status == "committed"


async def test_a_status_change_saved_while_a_new_session_reads_the_state_releases_the_next_commit(
    redis_client: redis.asyncio.Redis, fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work runs on across a session restart: a commit's ``committed`` may be saved while the new session
    reads the state. Found across a Redis restart (tests/fleet/test_commit_order_restart.py): the read
    came first, the save's release was computed on the state it then replaced, and the next job's commit
    of the dataset never ran. The reload waits for the save lock instead."""
    keys = Keys(fleet_name)
    store = await _owned(redis_client, keys)
    state = ShardJobs()
    batch = Batch()
    # Both jobs finished dataset d, early first; early has another dataset, so d's commit does not end it.
    for job, names in (("early", ["d", "e"]), ("late", ["d"])):
        events: list[QueueEvent] = [JobStarted(job=job, datasets=names, timeout_s=600, started_at=0.0)]
        events += [
            TaskFinished(
                job=job, dataset=n, task=0, attempt=0, files=[StagedFile(path="p", size=1)], finished_at=0
            )
            for n in names
        ]
        events.append(
            JobFinished(job=job, datasets=dict.fromkeys(names, DatasetExpectation(tasks=1)), finished_at=0)
        )
        for ev in events:
            d = decide(state, ev, now=0.0, default_timeout=600.0)
            state.apply(d)
            if d.job is not None:
                batch.jobs.add(d.job.job)
            batch.datasets.update((d.job_id, name) for name in d.datasets or ())
    await store.save(batch, state)
    released: list[Commit] = []
    ledger = ShardLedger(release=released.append)
    ledger.begin(store)
    await ledger.reload()
    assert ledger.state.resumed() == [Commit(job="early", dataset="d"), Commit(job="early", dataset="e")]

    gate = asyncio.Event()
    real_save = store.save

    async def held_save(batch: Batch, state: ShardJobs) -> None:
        await gate.wait()  # the change is applied in memory, its save not yet in Redis
        await real_save(batch, state)

    monkeypatch.setattr(store, "save", held_save)
    async with asyncio.TaskGroup() as tg:
        change = tg.create_task(ledger.set_status("early", "d", "committed"))

        async def change_holds_the_lock() -> bool:
            return ledger.save_lock.locked()

        await wait_for(change_holds_the_lock, what="the status change under the save lock")
        reload = tg.create_task(ledger.reload())

        async def reload_done_or_waiting() -> bool:
            return reload.done() or ledger.save_wanted

        await wait_for(reload_done_or_waiting, what="the reload read the state or waits for the lock")
        gate.set()
    assert change.done() and reload.done()
    assert released == [Commit(job="late", dataset="d")], "early passed d on: late's commit is released"
    assert ledger.state.due("d") == Commit(job="late", dataset="d")
    assert ledger.state.jobs["early"].datasets["d"].status == "committed"
    assert (await store.load()).due("d") == Commit(job="late", dataset="d")
