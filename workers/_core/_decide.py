"""What each queue event makes a shard's owner do: :func:`decide` (pure).

It takes the shard's state (:class:`workers._jobstate.ShardJobs`) and one
validated queue event and returns a :class:`workers._jobstate.Decision`: what to
record, what to do. Nothing here does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from shared.events import (
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    TaskFinished,
    TraceContext,
)

from ._jobstate import (
    Attempt,
    DatasetState,
    Decision,
    Ended,
    JobMeta,
    ShardJobs,
)
from ._tally import satisfies
from ._work import Abort, Action, CleanupAttempt, Commit


def _open_job(job: str, now: float, timeout_s: float, app: str = "") -> JobMeta:
    """Return a new job's record (its datasets come in the decision's ``datasets``)."""
    return JobMeta(job=job, opened_at=now, deadline=now + timeout_s, datasets={}, app=app)


_OPEN = DatasetState()  # frozen: one shared by every dataset just named


def _added(meta: JobMeta | None, names: list[str]) -> dict[str, DatasetState]:
    """Return the datasets of ``names`` that ``meta`` does not have yet, each ``open`` (O(names))."""
    have = meta.datasets if meta is not None else _NO_DATASETS
    return {n: _OPEN for n in names if n not in have}


def decide(state: ShardJobs, ev: QueueEvent, *, now: float, default_timeout: float) -> Decision:
    """Return what ``ev`` changes and triggers on this shard (pure).

    A job's timeout (how long its driver may stay silent, see
    ``workers._liveness``) is the event's ``timeout_s``, or
    ``default_timeout`` when the job was never announced; its life is counted
    from when this shard first heard of it (our clock, not the producer's).
    The decision names only the datasets the event adds or changes: its cost
    is the event's size, never the job's.
    """
    ended = state.ended.get(ev.job)
    if isinstance(ev, TaskFinished):
        return _task_finished(state, ev, now=now, default_timeout=default_timeout, ended=ended)
    if ended is not None:
        return Decision(note=f"job {ev.job} already ended ({ended.status})", replayed=True)
    meta = state.jobs.get(ev.job)
    return _traced(_job_level(state, ev, meta, now=now, default_timeout=default_timeout), meta, ev)


def _job_level(
    state: ShardJobs,
    ev: JobStarted | JobFinished | JobFailed | JobCancelled,
    meta: JobMeta | None,
    *,
    now: float,
    default_timeout: float,
) -> Decision:
    if isinstance(ev, JobStarted):
        if meta is None:
            opened = _open_job(ev.job, now, ev.timeout_s, ev.app)
            opened = msgspec.structs.replace(opened, tables=dict(ev.tables), stream=ev.stream)
            return Decision(job=opened, job_id=ev.job, datasets=_added(None, ev.datasets))
        new = meta
        if new.stream is None and ev.stream is not None:
            # A task's report opened the job first: the start still says which batch it commits.
            new = msgspec.structs.replace(new, stream=ev.stream)
        if ev.tables.keys() - new.tables.keys():
            # A start after a task's report, or a producer binding a dataset as it writes it
            # (a repeated job_started): new bindings are added, a dataset's first one stays.
            new = msgspec.structs.replace(new, tables={**ev.tables, **new.tables})
        added = _added(meta, ev.datasets)
        if new is meta and not added:
            return Decision(note="duplicate start", duplicate=True)
        return Decision(job=new if new is not meta else None, job_id=ev.job, datasets=added)
    if isinstance(ev, JobFinished):
        return _job_finished(state, ev, meta, now=now, default_timeout=default_timeout)
    assert isinstance(ev, JobFailed | JobCancelled)
    return _job_aborted(state, ev, meta, now=now, default_timeout=default_timeout)


def _traced(
    d: Decision, meta: JobMeta | None, ev: JobStarted | JobFinished | JobFailed | JobCancelled
) -> Decision:
    """Return ``d`` with the job's record carrying ``ev``'s trace context when it brings a new one.

    Saved with the job so that spans recorded after a restart or a takeover still have
    the producer's context (the in-memory book is filled from it on load). A rejected
    event, or one that changes nothing else (a publisher's retry), leaves it as it was.
    """
    trace = ev.trace
    if not isinstance(trace, TraceContext) or d.reject is not None or d.duplicate or d.replayed:
        return d
    base = d.job if d.job is not None else meta
    if base is None or base.trace == trace:
        return d
    return msgspec.structs.replace(d, job=msgspec.structs.replace(base, trace=trace), job_id=ev.job)


def _task_finished(
    state: ShardJobs, ev: TaskFinished, *, now: float, default_timeout: float, ended: Ended | None
) -> Decision:
    if ended is not None:
        return Decision(actions=(_cleanup(ev),), note=f"job {ev.job} already ended ({ended.status})")
    meta = state.jobs.get(ev.job)
    opened = _open_job(ev.job, now, default_timeout) if meta is None else None
    ds = meta.datasets.get(ev.dataset) if meta is not None else None
    changed: dict[str, DatasetState] | None = None
    if ds is None:
        ds = _OPEN
        changed = {ev.dataset: ds}
    per_task = state.attempts.get((ev.job, ev.dataset))
    seen = per_task.get(ev.task, _NO_ATTEMPTS) if per_task is not None else _NO_ATTEMPTS
    if ev.attempt in seen:
        return Decision(note="duplicate attempt", duplicate=True)
    if ds.status not in ("open", "waiting"):
        # The dataset's fate is sealed and every winner is already recorded
        # (a commit needs them all), so a new attempt is a loser: its files go.
        return Decision(actions=(_cleanup(ev),), note=f"late attempt for a {ds.status} dataset")
    rec = Attempt(
        task=ev.task, attempt=ev.attempt, files=ev.files, watermarks=ev.watermarks, seq=state.seq + 1
    )
    actions: tuple[Action, ...] = ()
    exp = ds.expected
    if ds.status == "waiting" and exp is not None:
        # Counted, not scanned, per event (workers._tally); the full check runs
        # once, when the count says this attempt brings the last task in.
        tally = state.tally.count(ev.job, ev.dataset, exp, per_task or _NO_TASKS)
        if tally + satisfies(exp, ev.task, ev.attempt, seen) == exp.tasks:
            tasks = dict(per_task or _NO_TASKS)
            tasks[ev.task] = {**seen, ev.attempt: rec}
            if _complete(exp, tasks):
                changed = {ev.dataset: msgspec.structs.replace(ds, status="committing")}
                # Commit now only when no job that finished before holds the dataset:
                # else its commit follows theirs (ShardJobs.due).
                if state.first_in_line(ev.dataset) == ev.job:
                    actions = (Commit(job=ev.job, dataset=ev.dataset),)
    return Decision(job=opened, job_id=ev.job, datasets=changed, attempt=(ev.dataset, rec), actions=actions)


# What a task with no recorded attempt has seen, and a dataset with none
# (read-only: shared by every lookup).
_NO_ATTEMPTS: Mapping[int, Attempt] = MappingProxyType({})
_NO_TASKS: Mapping[int, Mapping[int, Attempt]] = MappingProxyType({})
_NO_DATASETS: Mapping[str, DatasetState] = MappingProxyType({})


def _cleanup(ev: TaskFinished) -> CleanupAttempt:
    return CleanupAttempt(job=ev.job, dataset=ev.dataset, task=ev.task, attempt=ev.attempt)


def all_tasks_in(state: ShardJobs, job: str, dataset: str, exp: DatasetExpectation) -> bool:
    """Return True when ``state`` records an attempt of every task ``exp`` expects (its winners, if named)."""
    return _complete(exp, state.attempts.get((job, dataset)) or _NO_TASKS)


def _complete(exp: DatasetExpectation, tasks: Mapping[int, Mapping[int, Attempt]]) -> bool:
    for t in range(exp.tasks):
        seen = tasks.get(t)
        if not seen:
            return False
        if exp.winners is not None and exp.winners[t] not in seen:
            return False
    return True


def _job_finished(
    state: ShardJobs, ev: JobFinished, meta: JobMeta | None, *, now: float, default_timeout: float
) -> Decision:
    """The job succeeded: commit each dataset whose tasks are all in, wait for the others.

    The decision takes the shard's next decision sequence: each dataset it
    names records it as ``fin``, and commits in ``fin`` order. A dataset's
    commit starts at once only when no job that finished before holds the
    dataset (its line is empty); else it follows theirs (``ShardJobs.due``).

    A dataset already named by an earlier ``job_finished`` keeps that one's
    expectation: an identical repeat (a publisher's retry) changes nothing,
    a different one (other winners or task count) is ``inconsistent`` and
    the whole event is rejected. So is a ``job_finished`` for a dataset the
    job was already aborted for (failed, cancelled or timed out): the abort stands.
    """
    opened = _open_job(ev.job, now, default_timeout) if meta is None else None
    have = meta.datasets if meta is not None else _NO_DATASETS
    fin = state.seq + 1
    changed: dict[str, DatasetState] = {}
    actions: list[Action] = []
    for name, exp in ev.datasets.items():
        ds = have.get(name)
        if ds is not None:
            if ds.expected is not None:
                if ds.expected != exp:
                    return Decision(
                        reject="inconsistent",
                        note=f"job_finished of {ev.job} expects {_shown(exp)} for {name!r}, an earlier one"
                        f" {_shown(ds.expected)}: the first stands",
                    )
                continue  # the same expectation again: a repeated delivery
            if ds.status in ("aborting", "aborted"):
                return Decision(
                    reject="inconsistent",
                    note=f"job_finished of {ev.job} came after {name!r} was aborted ({ds.reason}):"
                    " the abort stands",
                )
        tasks = state.attempts.get((ev.job, name), {})
        if _complete(exp, tasks):
            changed[name] = DatasetState(status="committing", expected=exp, fin=fin)
            if name not in state.lines:
                actions.append(Commit(job=ev.job, dataset=name))
        else:
            changed[name] = DatasetState(status="waiting", expected=exp, fin=fin)
    if not changed and opened is None:
        return Decision(note="duplicate finish", duplicate=True)
    return Decision(
        job=opened, job_id=ev.job, datasets=changed, seq=fin if changed else 0, actions=tuple(actions)
    )


def _shown(exp: DatasetExpectation) -> str:
    return f"tasks={exp.tasks} winners={exp.winners}" if exp.winners is not None else f"tasks={exp.tasks}"


def _job_aborted(
    state: ShardJobs,
    ev: JobFailed | JobCancelled,
    meta: JobMeta | None,
    *,
    now: float,
    default_timeout: float,
) -> Decision:
    del state
    opened = _open_job(ev.job, now, default_timeout) if meta is None else None
    have = meta.datasets if meta is not None else _NO_DATASETS
    changed: dict[str, DatasetState] = {}
    actions: list[Action] = []
    kind = "cancelled" if isinstance(ev, JobCancelled) else "failed"
    for name in ev.datasets:
        ds = have.get(name, _OPEN)
        if ds.status not in ("open", "waiting"):
            continue  # a commit that has started wins over a late abort
        changed[name] = msgspec.structs.replace(ds, status="aborting", reason=f"{kind}: {ev.reason}")
        actions.append(Abort(job=ev.job, dataset=name, reason=f"{kind}: {ev.reason}"))
    return Decision(
        job=opened,
        job_id=ev.job,
        datasets=changed,
        actions=tuple(actions),
        note="" if actions else "nothing to abort",
    )
