"""A waiting dataset's tasks are counted, not scanned, per event (workers._core._tally): the count
decides exactly as the full check would, and the work per event does not grow with the tasks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import DatasetExpectation, JobFinished, JobStarted, StagedFile, TaskFinished
from workers._core import Commit, ShardJobs, _decide, _tally, decide
from workers._core._decide import _complete
from workers._ledger import _put_back, _records_of

FILES = [StagedFile(path="p", size=1)]


def _apply(state: ShardJobs, ev: Any) -> Any:
    d = decide(state, ev, now=0.0, default_timeout=60.0)
    if d.reject is None and not d.replayed:
        state.apply(d)
    return d


def _task(task: int, attempt: int = 0) -> TaskFinished:
    return TaskFinished(job="j", dataset="ds", task=task, attempt=attempt, files=FILES, finished_at=0.0)


def _finished(tasks: int, winners: list[int] | None) -> JobFinished:
    exp = DatasetExpectation(tasks=tasks, winners=winners)
    return JobFinished(job="j", datasets={"ds": exp}, finished_at=0.0)


TASKS = 4
events = st.lists(
    st.tuples(st.integers(0, TASKS + 1), st.integers(0, 2)), min_size=0, max_size=30
)  # task (some beyond the job's tasks), attempt (repeats are duplicates)


@settings(max_examples=300, deadline=None)
@given(
    before=events,
    after=events,
    winners=st.none() | st.lists(st.integers(0, 2), min_size=TASKS, max_size=TASKS),
    put_back_at=st.integers(-1, 30),
)
def test_the_count_commits_exactly_when_the_full_check_says_every_task_is_in(
    before: list[tuple[int, int]], after: list[tuple[int, int]], winners: list[int] | None, put_back_at: int
) -> None:
    state = ShardJobs()
    _apply(state, JobStarted(job="j", datasets=["ds"], timeout_s=60.0, started_at=0.0))
    for task, attempt in before:
        _apply(state, _task(task, attempt))
    d = _apply(state, _finished(TASKS, winners))
    exp = DatasetExpectation(tasks=TASKS, winners=winners)
    committed = Commit(job="j", dataset="ds") in d.actions
    for i, (task, attempt) in enumerate(after):
        if i == put_back_at:  # a status change whose save failed: the job's records put back
            _put_back(state, "j", _records_of(state, "j"))
        was_waiting = state.jobs["j"].datasets["ds"].status == "waiting"
        d = _apply(state, _task(task, attempt))
        now_in = _complete(exp, state.attempts.get(("j", "ds"), {}))
        commits = Commit(job="j", dataset="ds") in d.actions
        # A commit exactly when the last task comes in while waiting, never before, never twice.
        assert commits == (was_waiting and now_in and not committed)
        committed = committed or commits


def test_the_work_per_event_does_not_grow_with_the_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned = 0
    real_complete, real_count = _decide._complete, _tally.count_in

    def complete(exp: DatasetExpectation, tasks: Any) -> bool:
        nonlocal scanned
        scanned += len(tasks)
        return real_complete(exp, tasks)

    def count_in(exp: DatasetExpectation, tasks: Any) -> int:
        nonlocal scanned
        scanned += len(tasks)
        return real_count(exp, tasks)

    monkeypatch.setattr(_decide, "_complete", complete)
    monkeypatch.setattr(_tally, "count_in", count_in)
    n = 3000
    state = ShardJobs()
    _apply(state, JobStarted(job="j", datasets=["ds"], timeout_s=60.0, started_at=0.0))
    _apply(state, _finished(n, None))  # the job's end before its tasks' events
    commits = 0
    for t in range(n):
        commits += Commit(job="j", dataset="ds") in _apply(state, _task(t)).actions
    assert commits == 1
    # One count and one full check in all (each a pass over the tasks), not a pass per event.
    assert scanned <= 3 * n


def test_a_job_that_ends_forgets_its_counts() -> None:
    state = ShardJobs()
    _apply(state, JobStarted(job="j", datasets=["ds"], timeout_s=60.0, started_at=0.0))
    _apply(state, _finished(3, None))
    _apply(state, _task(0))
    assert len(state.tally.counts) == 1
    state.end_job("j", "aborted", 0.0)
    assert len(state.tally.counts) == 0
