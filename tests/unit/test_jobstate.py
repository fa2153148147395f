"""The worker's pure job state machine: what each event records and triggers."""

from __future__ import annotations

from shared.events import (
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
)
from workers._core import Abort, CleanupAttempt, Commit, Decision, ShardJobs, decide


def _tf(task: int, attempt: int = 0, job: str = "j1", dataset: str = "d1") -> TaskFinished:
    return TaskFinished(
        job=job,
        dataset=dataset,
        task=task,
        attempt=attempt,
        files=[StagedFile(path=f"part-{task}.parquet", size=10)],
        watermarks={"p0": task},
        finished_at=1.0,
    )


def _run(state: ShardJobs, *events: QueueEvent, now: float = 100.0) -> list[Decision]:
    out = []
    for ev in events:
        d = decide(state, ev, now=now, default_timeout=60.0)
        state.apply(d)
        out.append(d)
    return out


def _started(job: str = "j1", datasets: tuple[str, ...] = ("d1",)) -> JobStarted:
    return JobStarted(job=job, datasets=list(datasets), timeout_s=30.0, started_at=1.0)


def _finished(tasks: int = 2, winners: list[int] | None = None, job: str = "j1") -> JobFinished:
    return JobFinished(
        job=job, datasets={"d1": DatasetExpectation(tasks=tasks, winners=winners)}, finished_at=2.0
    )


def test_commit_when_finished_and_all_tasks_reported() -> None:
    s = ShardJobs()
    ds = _run(s, _started(), _tf(0), _tf(1), _finished())
    assert ds[-1].actions == (Commit(job="j1", dataset="d1"),)
    assert s.jobs["j1"].datasets["d1"].status == "committing"
    winners = s.winners("j1", "d1")
    assert winners is not None and [(a.task, a.attempt) for a in winners] == [(0, 0), (1, 0)]


def test_finish_before_last_task_waits_then_commits_on_arrival() -> None:
    s = ShardJobs()
    ds = _run(s, _started(), _tf(0), _finished())
    assert ds[-1].actions == ()
    assert s.jobs["j1"].datasets["d1"].status == "waiting"
    (d,) = _run(s, _tf(1))
    assert d.actions == (Commit(job="j1", dataset="d1"),)


def test_named_winners_wait_for_the_winning_attempt() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0), _tf(1, attempt=0), _finished(winners=[0, 1]))
    assert s.jobs["j1"].datasets["d1"].status == "waiting"
    (d,) = _run(s, _tf(1, attempt=1))
    assert d.actions == (Commit(job="j1", dataset="d1"),)
    winners = s.winners("j1", "d1")
    assert winners is not None and [(a.task, a.attempt) for a in winners] == [(0, 0), (1, 1)]
    assert [(a.task, a.attempt) for a in s.losers("j1", "d1")] == [(1, 0)]


def test_without_winners_the_first_reported_attempt_wins() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0, attempt=3), _tf(0, attempt=1), _finished(tasks=1))
    winners = s.winners("j1", "d1")
    assert winners is not None and winners[0].attempt == 3


def test_duplicate_attempt_is_recorded_once() -> None:
    s = ShardJobs()
    ds = _run(s, _started(), _tf(0), _tf(0))
    assert ds[-1].attempt is None and ds[-1].note == "duplicate attempt"


def test_failure_aborts_open_datasets_and_late_events_are_cleaned() -> None:
    s = ShardJobs()
    ds = _run(s, _started(), _tf(0), JobFailed(job="j1", datasets=["d1"], reason="boom", failed_at=3.0))
    assert ds[-1].actions == (Abort(job="j1", dataset="d1", reason="failed: boom"),)
    (late,) = _run(s, _tf(1, attempt=2))
    assert late.actions == (CleanupAttempt(job="j1", dataset="d1", task=1, attempt=2),)


def test_cancel_after_commit_started_does_not_abort() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0), _tf(1), _finished())
    (d,) = _run(s, JobCancelled(job="j1", datasets=["d1"], reason="user", cancelled_at=4.0))
    assert d.actions == ()
    assert s.jobs["j1"].datasets["d1"].status == "committing"


def test_late_loser_of_committing_dataset_is_cleaned_up() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0), _tf(1), _finished())
    (d,) = _run(s, _tf(1, attempt=1))
    assert d.actions == (CleanupAttempt(job="j1", dataset="d1", task=1, attempt=1),)


def test_ended_job_drops_events_and_cleans_late_attempts() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0), _tf(1), _finished())
    meta = s.set_status("j1", "d1", "committed")
    assert meta is not None
    s.jobs["j1"] = meta
    assert s.job_done("j1") == "committed"
    s.end_job("j1", "committed", now=200.0)
    ds = _run(s, _finished(), _tf(1, attempt=5))
    assert ds[0].actions == () and "already ended" in ds[0].note
    assert ds[1].actions == (CleanupAttempt(job="j1", dataset="d1", task=1, attempt=5),)
    assert "j1" not in s.jobs


def test_unannounced_job_is_opened_with_the_default_timeout() -> None:
    s = ShardJobs()
    _run(s, _tf(0), now=10.0)
    assert s.jobs["j1"].timeout_s == 60.0


def test_decide_does_not_mutate_state() -> None:
    s = ShardJobs()
    _run(s, _started(), _tf(0))
    before = (dict(s.jobs), {k: dict(v) for k, v in s.attempts.items()}, s.seq)
    decide(s, _tf(1), now=1.0, default_timeout=1.0)
    decide(s, _finished(), now=1.0, default_timeout=1.0)
    assert (dict(s.jobs), {k: dict(v) for k, v in s.attempts.items()}, s.seq) == before
