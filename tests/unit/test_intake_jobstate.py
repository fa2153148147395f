"""job_finished handling: a repeat is a no-op, a contradiction or a finish after an abort is
rejected (inconsistent) with the first decision standing; property: whatever the order of
finishes, the first expectation recorded for a dataset is the one kept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import DatasetExpectation, JobFailed, JobFinished, JobStarted, StagedFile, TaskFinished
from workers._core import Commit, ShardJobs, decide


def _tf(task: int, attempt: int = 0) -> TaskFinished:
    return TaskFinished(
        job="j1",
        dataset="d1",
        task=task,
        attempt=attempt,
        files=[StagedFile(path="p.bin", size=1)],
        finished_at=1.0,
    )


def _fin(tasks: int, winners: list[int] | None = None, **more: DatasetExpectation) -> JobFinished:
    return JobFinished(
        job="j1", datasets={"d1": DatasetExpectation(tasks=tasks, winners=winners), **more}, finished_at=2.0
    )


def _apply(s: ShardJobs, ev: object) -> object:
    d = decide(s, ev, now=10.0, default_timeout=60.0)  # type: ignore[arg-type]
    if d.reject is None and not d.replayed:
        s.apply(d)
    return d


def test_identical_repeat_is_a_no_op_and_other_winners_are_inconsistent() -> None:
    s = ShardJobs()
    for ev in (JobStarted(job="j1", datasets=["d1"], timeout_s=60, started_at=1.0), _tf(0), _fin(2, [0, 0])):
        _apply(s, ev)
    before = s.jobs["j1"]
    again = decide(s, _fin(2, [0, 0]), now=11.0, default_timeout=60.0)
    assert (again.job, again.actions, again.reject, again.note) == (None, (), None, "duplicate finish")
    other = decide(s, _fin(2, [1, 0]), now=11.0, default_timeout=60.0)
    assert other.reject == "inconsistent" and "first stands" in other.note and other.job is None
    fewer = decide(s, _fin(1), now=11.0, default_timeout=60.0)
    assert fewer.reject == "inconsistent"
    assert s.jobs["j1"] is before
    (d,) = [decide(s, _tf(1), now=12.0, default_timeout=60.0)]
    assert d.actions == (Commit(job="j1", dataset="d1"),)


def test_repeat_after_commit_started_is_a_no_op_but_a_contradiction_is_rejected() -> None:
    s = ShardJobs()
    for ev in (_tf(0), _fin(1, [0])):
        _apply(s, ev)
    assert s.jobs["j1"].datasets["d1"].status == "committing"
    assert decide(s, _fin(1, [0]), now=11.0, default_timeout=60.0).reject is None
    assert decide(s, _fin(1, [3]), now=11.0, default_timeout=60.0).reject == "inconsistent"


def test_finish_after_abort_is_inconsistent_and_the_abort_stands() -> None:
    s = ShardJobs()
    for ev in (
        JobStarted(job="j1", datasets=["d1", "d2"], timeout_s=60, started_at=1.0),
        JobFailed(job="j1", datasets=["d1"], reason="oom", failed_at=2.0),
    ):
        _apply(s, ev)
    d = decide(s, _fin(0, d2=DatasetExpectation(tasks=0)), now=11.0, default_timeout=60.0)
    assert d.reject == "inconsistent" and "abort stands" in d.note
    assert s.jobs["j1"].datasets["d1"].status == "aborting"


expectations = st.builds(
    DatasetExpectation,
    tasks=st.integers(0, 3),
    winners=st.none(),
) | st.integers(0, 3).flatmap(
    lambda n: st.builds(
        DatasetExpectation, tasks=st.just(n), winners=st.lists(st.integers(0, 2), min_size=n, max_size=n)
    )
)


@settings(max_examples=300, deadline=None)
@given(st.lists(expectations, min_size=1, max_size=6))
def test_the_first_expectation_always_stands(exps: list[DatasetExpectation]) -> None:
    s = ShardJobs()
    for exp in exps:
        d = _apply(s, JobFinished(job="j1", datasets={"d1": exp}, finished_at=1.0))
        assert d.reject in (None, "inconsistent")  # type: ignore[attr-defined]
        assert (d.reject is None) == (exp == exps[0])  # type: ignore[attr-defined]
    assert s.jobs["j1"].datasets["d1"].expected == exps[0]
