"""A dataset's commits run in the order its jobs finished (issue 31 item 2), and a status change is O(1)
(item 4): the pure side (workers._core: decide, ShardJobs' lines and counts)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.events import (
    DatasetExpectation,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
)
from workers._core import (
    PASSED,
    TERMINAL,
    Abort,
    Commit,
    DatasetState,
    Decision,
    ShardJobs,
    Status,
    decide,
)


def _tf(job: str, dataset: str, task: int = 0) -> TaskFinished:
    return TaskFinished(
        job=job,
        dataset=dataset,
        task=task,
        attempt=0,
        files=[StagedFile(path=f"part-{task}", size=1)],
        finished_at=1.0,
    )


def _fin(job: str, *datasets: str, tasks: int = 1) -> JobFinished:
    return JobFinished(
        job=job, datasets={d: DatasetExpectation(tasks=tasks) for d in datasets}, finished_at=2.0
    )


def _run(state: ShardJobs, *events: QueueEvent) -> list[Decision]:
    out = []
    for ev in events:
        d = decide(state, ev, now=100.0, default_timeout=60.0)
        assert d.reject is None, d.note
        state.apply(d)
        out.append(d)
    return out


def _commits(ds: list[Decision]) -> list[Commit]:
    return [a for d in ds for a in d.actions if isinstance(a, Commit)]


def _pass(state: ShardJobs, job: str, dataset: str, status: Status) -> Commit | None:
    """What ShardLedger.set_status does in memory: the change, then the commit it releases."""
    assert state.set_status(job, dataset, status) is not None
    return state.due(dataset) if status in PASSED else None


def test_a_later_job_that_is_complete_first_commits_after_the_earlier_job() -> None:
    s = ShardJobs()
    # j1 finished first, but its task comes last; j2 is complete when it finishes.
    ds = _run(s, _fin("j1", "d", tasks=2), _tf("j1", "d", 0), _tf("j2", "d"), _fin("j2", "d"))
    assert _commits(ds) == [], "j2 may not commit d before j1, which finished before it"
    assert s.jobs["j2"].datasets["d"].status == "committing"
    assert s.first_in_line("d") == "j1" and s.due("d") is None  # j1 waits for its task
    (d,) = _run(s, _tf("j1", "d", 1))
    assert d.actions == (Commit(job="j1", dataset="d"),)
    assert _pass(s, "j1", "d", "committed") == Commit(job="j2", dataset="d")
    assert _pass(s, "j2", "d", "committed") is None
    assert "d" not in s.lines


def test_the_order_is_the_order_of_the_job_finished_decisions_not_of_the_tasks() -> None:
    s = ShardJobs()
    _run(s, *(_tf(j, "d") for j in ("j3", "j2", "j1")))
    ds = _run(s, _fin("j1", "d"), _fin("j2", "d"), _fin("j3", "d"))
    assert _commits(ds) == [Commit(job="j1", dataset="d")]
    fins = [s.jobs[j].datasets["d"].fin for j in ("j1", "j2", "j3")]
    assert fins == sorted(fins) and len(set(fins)) == 3
    order = ["j1"]
    while (nxt := _pass(s, order[-1], "d", "committed")) is not None:
        order.append(nxt.job)
    assert order == ["j1", "j2", "j3"]


def test_an_earlier_job_aborted_or_quarantined_lets_the_next_commit_go() -> None:
    s = ShardJobs()
    _run(s, _fin("j1", "d", "e", tasks=2), _tf("j2", "d"), _tf("j2", "e"), _fin("j2", "d", "e"))
    (d,) = _run(s, JobFailed(job="j1", datasets=["d", "e"], reason="x", failed_at=3.0))
    assert set(d.actions) == {Abort(job="j1", dataset=n, reason="failed: x") for n in ("d", "e")}
    assert s.due("d") is None, "j1's abort of d is under way: j2 waits for it"
    assert _pass(s, "j1", "d", "aborted") == Commit(job="j2", dataset="d")
    assert _pass(s, "j1", "e", "quarantined") == Commit(job="j2", dataset="e")


def test_a_blocked_commit_holds_its_dataset_and_is_not_released_twice() -> None:
    s = ShardJobs()
    _run(s, _tf("j1", "d"), _tf("j2", "d"), _tf("j3", "d"), _fin("j1", "d"), _fin("j2", "d"), _fin("j3", "d"))
    assert _pass(s, "j1", "d", "quarantined") == Commit(job="j2", dataset="d")
    assert _pass(s, "j2", "d", "blocked") is None  # behind the quarantined sequence
    assert s.first_in_line("d") == "j2"  # j3 stays behind j2
    assert _pass(s, "j1", "d", "committed") is None  # the operator's retry: j2 is resumed by it, blocked
    assert _pass(s, "j2", "d", "committed") == Commit(job="j3", dataset="d")


def test_a_new_owner_resumes_each_datasets_first_commit_in_finish_order() -> None:
    s = ShardJobs()
    for j in ("j1", "j2", "j3"):
        _run(s, _tf(j, "d"), _tf(j, "e"))
    _run(s, _fin("j1", "d"), _fin("j2", "d", "e"), _fin("j3", "e", "d"))
    _run(s, JobFailed(job="j1", datasets=["x"], reason="r", failed_at=1.0))
    # What the store hands the next owner, in another order (hash order is no order at all).
    loaded = ShardJobs()
    for job in ("j3", "j1", "j2"):
        meta = s.jobs[job]
        loaded.add_job(msgspec.structs.replace(meta, datasets={}))
        for name in reversed(list(meta.datasets)):
            loaded.put(job, name, meta.datasets[name])
    assert loaded.lines == s.lines
    assert loaded.resumed() == [
        Abort(job="j1", dataset="x", reason="failed: r"),
        Commit(job="j1", dataset="d"),
        Commit(job="j2", dataset="e"),
    ]


def test_a_status_put_back_out_of_turn_keeps_the_line_in_order() -> None:
    s = ShardJobs()
    _run(s, *(_tf(j, "d") for j in ("j1", "j2", "j3")), _fin("j1", "d"), _fin("j2", "d"), _fin("j3", "d"))
    journal: list[Any] = []
    s.journal = journal
    s.set_status("j1", "d", "committed")
    s.journal = None
    assert list(s.lines["d"]) == ["j2", "j3"]
    s.undo(journal)  # the save failed
    assert list(s.lines["d"]) == ["j1", "j2", "j3"]
    assert s.jobs["j1"].datasets["d"].status == "committing"


def test_a_decision_names_only_what_the_event_changes() -> None:
    """A job of N datasets: a task's report or a late start copies none of the other N (item 4)."""
    s = ShardJobs()
    names = [f"d{i}" for i in range(1000)]
    _run(s, JobStarted(job="j", datasets=names, timeout_s=60, started_at=0.0))
    (d,) = _run(s, _tf("j", "d7"))
    assert d.job is None and not d.datasets
    (d,) = _run(s, _tf("j", "new"))
    assert d.job is None and list(d.datasets or ()) == ["new"]
    _run(s, _tf("j", "d3"))
    (d,) = _run(s, _fin("j", "d3"))
    assert list(d.datasets or ()) == ["d3"] and d.actions == (Commit(job="j", dataset="d3"),)
    (d,) = _run(s, JobStarted(job="j", datasets=["d1", "late"], timeout_s=60, started_at=0.0))
    assert d.job is None and list(d.datasets or ()) == ["late"]
    meta = s.jobs["j"]
    assert s.set_status("j", "d3", "committed") is meta, "changed in place, not copied"
    assert len(meta.datasets) == 1002


_STATUSES: list[Status] = ["open", "waiting", "committing", "committed", "aborting", "aborted", "quarantined"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["j1", "j2", "j3"]),
            st.sampled_from(["a", "b", "c"]),
            st.sampled_from(_STATUSES),
            st.integers(min_value=0, max_value=5),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_the_counts_and_lines_always_match_a_full_scan(ops: list[tuple[str, str, Status, int, bool]]) -> None:
    """Whatever puts, undos and job ends come, job_done, live and the lines equal a scan of every dataset."""
    s = ShardJobs()
    for job in ("j1", "j2", "j3"):
        _run(s, JobStarted(job=job, datasets=["a"], timeout_s=60, started_at=0.0))
    for job, name, status, fin, undo in ops:
        if job not in s.jobs:
            continue
        journal: list[Any] = []
        s.journal = journal
        s.put(job, name, DatasetState(status=status, fin=fin))
        s.journal = None
        if undo:
            s.undo(journal)
        elif s.job_done(job) is not None:
            s.end_job(job, "x", 0.0)
        _check(s)


def _check(s: ShardJobs) -> None:
    lines: dict[str, list[tuple[int, str]]] = {}
    for job, meta in s.jobs.items():
        states = list(meta.datasets.values())
        scan_done = None
        if states and all(d.status in TERMINAL for d in states):
            scan_done = "aborted" if any(d.status == "aborted" for d in states) else "committed"
        assert s.job_done(job) == scan_done
        assert s.live(job) == any(d.status in ("open", "waiting") for d in states)
        for name, d in meta.datasets.items():
            if d.fin and d.status not in PASSED:
                lines.setdefault(name, []).append((d.fin, job))
    assert {n: [j for _f, j in sorted(v)] for n, v in lines.items()} == {
        n: list(line) for n, line in s.lines.items()
    }
