"""A status change whose save fails is put back: the job's records as they were, other jobs untouched.

Through the real ``set_status`` / ``save_change`` of a shard's ledger, with a state store whose save fails
or succeeds: a change that ends the job drops the job's attempts only once its save is durable, so a failed
save has nothing of them to rebuild (and a status change copies none of them).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared import TransientError
from shared.events import JobStarted, StagedFile, TaskFinished
from workers._core import ShardJobs, decide
from workers._ledger import ShardLedger, _put_back, _records_of
from workers._state_store import Batch


def _state() -> ShardJobs:
    state = ShardJobs()
    for job in ("j", "other"):
        state.apply(
            decide(
                state,
                JobStarted(job=job, datasets=["a", "b"], timeout_s=60, started_at=0),
                now=0,
                default_timeout=60,
            )
        )
        for ds in ("a", "b"):
            for task in range(3):
                ev = TaskFinished(
                    job=job,
                    dataset=ds,
                    task=task,
                    attempt=0,
                    files=[StagedFile(path="p", size=1)],
                    finished_at=0,
                )
                state.apply(decide(state, ev, now=0, default_timeout=60))
    return state


class _Store:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.saved: list[Batch] = []

    async def save(self, batch: Batch, state: ShardJobs) -> None:
        del state
        await asyncio.sleep(0)
        if self.fail:
            raise TransientError("redis went away")
        self.saved.append(batch)


def _Runner(state: ShardJobs, store: _Store) -> Any:
    """Return a shard's ledger holding ``state`` and saving through ``store``."""
    ledger = ShardLedger()
    ledger.load(state)
    ledger.begin(store)  # type: ignore[arg-type]
    return ledger


def _snapshot(state: ShardJobs) -> tuple[Any, ...]:
    return (
        # The datasets by value: a status change sets them in place (ShardJobs.put).
        {job: (meta, dict(meta.datasets)) for job, meta in state.jobs.items()},
        {k: {t: dict(a) for t, a in v.items()} for k, v in state.attempts.items()},
        dict(state.ended),
    )


async def test_a_job_end_whose_save_fails_leaves_the_state_as_it_was() -> None:
    state = _state()
    runner = _Runner(state, _Store(fail=False))
    await runner.set_status("j", "a", "committed")
    before = _snapshot(state)
    runner.store.fail = True
    with pytest.raises(TransientError):
        await runner.set_status("j", "b", "committed")  # the change that ends the job
    assert _snapshot(state) == before


async def test_a_job_end_drops_the_jobs_attempts_once_saved_and_nothing_else() -> None:
    state = _state()
    store = _Store(fail=False)
    runner = _Runner(state, store)
    other = _snapshot(state)[1]
    await runner.set_status("j", "a", "aborted", "boom")
    assert "j" in state.jobs and ("j", "b") in state.attempts
    await runner.set_status("j", "b", "aborted", "boom")
    assert "j" not in state.jobs and state.ended["j"].status == "aborted"
    assert {k for k in state.attempts if k[0] == "j"} == set()
    assert _snapshot(state)[1] == {k: v for k, v in other.items() if k[0] != "j"}
    last = store.saved[-1]
    assert last.ended == {"j"} and not last.jobs
    assert sorted(last.drop_attempts) == sorted(f"j/{ds}/{t}/0" for ds in ("a", "b") for t in range(3))


def test_a_job_that_was_not_there_is_removed_again() -> None:
    state = _state()
    records = _records_of(state, "new")
    state.apply(
        decide(
            state,
            JobStarted(job="new", datasets=["c"], timeout_s=60, started_at=0),
            now=0,
            default_timeout=60,
        )
    )
    _put_back(state, "new", records)
    assert "new" not in state.jobs and "new" not in state.ended
    assert not state.live("new") and "c" not in state.lines


class _Counting(dict[Any, Any]):
    lookups = 0

    def __getitem__(self, key: Any) -> Any:
        type(self).lookups += 1
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        type(self).lookups += 1
        return super().get(key, default)


async def test_a_status_change_that_does_not_end_the_job_looks_up_no_attempt() -> None:
    """A job of N datasets makes N status changes: each used to copy the job's attempts (N^2 in all)."""
    state = _state()
    state.attempts = _Counting(state.attempts)
    runner = _Runner(state, _Store(fail=False))
    await runner.set_status("j", "a", "aborted", "boom")
    runner.store.fail = True
    with pytest.raises(TransientError):
        await runner.set_status("j", "b", "aborting", "boom")
    assert _Counting.lookups == 0
