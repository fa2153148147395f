"""A status change whose save fails is put back: the job's records as they were, other jobs untouched."""

from __future__ import annotations

from shared.events import JobStarted, StagedFile, TaskFinished
from workers._decide import decide
from workers._intake import _put_back, _records_of
from workers._jobstate import ShardJobs


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


def test_an_ended_job_is_put_back_with_every_attempt_and_nothing_else_moves() -> None:
    state = _state()
    before_jobs, before_attempts = dict(state.jobs), {k: dict(v) for k, v in state.attempts.items()}
    records = _records_of(state, "j")
    assert set(records[1]) == {("j", "a"), ("j", "b")}

    state.end_job("j", "committed", 1.0)  # the change whose save then failed
    assert ("j", "a") not in state.attempts and "j" in state.ended
    _put_back(state, "j", records)

    assert state.jobs == before_jobs
    assert {k: dict(v) for k, v in state.attempts.items()} == before_attempts
    assert "j" not in state.ended


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
    ev = TaskFinished(
        job="new", dataset="c", task=0, attempt=0, files=[StagedFile(path="p", size=1)], finished_at=0
    )
    state.apply(decide(state, ev, now=0, default_timeout=60))
    _put_back(state, "new", records)
    assert "new" not in state.jobs and ("new", "c") not in state.attempts and "new" not in state.ended
