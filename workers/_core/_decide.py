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


def _open_job(job: str, datasets: list[str], now: float, timeout_s: float, app: str = "") -> JobMeta:
    return JobMeta(
        job=job,
        opened_at=now,
        deadline=now + timeout_s,
        datasets={d: DatasetState() for d in datasets},
        app=app,
    )


def _with_datasets(meta: JobMeta, names: list[str]) -> JobMeta:
    missing = [n for n in names if n not in meta.datasets]
    if not missing:
        return meta
    return msgspec.structs.replace(meta, datasets={**meta.datasets, **{n: DatasetState() for n in missing}})


def decide(state: ShardJobs, ev: QueueEvent, *, now: float, default_timeout: float) -> Decision:
    """Return what ``ev`` changes and triggers on this shard (pure).

    A job's timeout (how long its driver may stay silent, see
    ``workers._liveness``) is the event's ``timeout_s``, or
    ``default_timeout`` when the job was never announced; its life is counted
    from when this shard first heard of it (our clock, not the producer's).
    """
    ended = state.ended.get(ev.job)
    if isinstance(ev, TaskFinished):
        return _task_finished(state, ev, now=now, default_timeout=default_timeout, ended=ended)
    if ended is not None:
        return Decision(note=f"job {ev.job} already ended ({ended.status})", replayed=True)
    meta = state.jobs.get(ev.job)
    if isinstance(ev, JobStarted):
        if meta is None:
            opened = _open_job(ev.job, ev.datasets, now, ev.timeout_s, ev.app)
            return Decision(job=msgspec.structs.replace(opened, tables=dict(ev.tables), stream=ev.stream))
        new = _with_datasets(meta, ev.datasets)
        if new.stream is None and ev.stream is not None:
            # A task's report opened the job first: the start still says which batch it commits.
            new = msgspec.structs.replace(new, stream=ev.stream)
        if ev.tables.keys() - new.tables.keys():
            # A start after a task's report, or a producer binding a dataset as it writes it
            # (a repeated job_started): new bindings are added, a dataset's first one stays.
            new = msgspec.structs.replace(new, tables={**ev.tables, **new.tables})
        return Decision(
            job=new if new is not meta else None, note="" if new is not meta else "duplicate start"
        )
    if isinstance(ev, JobFinished):
        return _job_finished(state, ev, meta, now=now, default_timeout=default_timeout)
    assert isinstance(ev, JobFailed | JobCancelled)
    return _job_aborted(state, ev, meta, now=now, default_timeout=default_timeout)


def _task_finished(
    state: ShardJobs, ev: TaskFinished, *, now: float, default_timeout: float, ended: Ended | None
) -> Decision:
    if ended is not None:
        return Decision(actions=(_cleanup(ev),), note=f"job {ev.job} already ended ({ended.status})")
    meta = state.jobs.get(ev.job) or _open_job(ev.job, [ev.dataset], now, default_timeout)
    ds = meta.datasets.get(ev.dataset)
    if ds is None:
        meta = _with_datasets(meta, [ev.dataset])
        ds = meta.datasets[ev.dataset]
    per_task = state.attempts.get((ev.job, ev.dataset))
    seen = per_task.get(ev.task, _NO_ATTEMPTS) if per_task is not None else _NO_ATTEMPTS
    if ev.attempt in seen:
        return Decision(note="duplicate attempt")
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
                ds = msgspec.structs.replace(ds, status="committing")
                meta = msgspec.structs.replace(meta, datasets={**meta.datasets, ev.dataset: ds})
                actions = (Commit(job=ev.job, dataset=ev.dataset),)
    return Decision(job=meta, attempt=(ev.dataset, rec), actions=actions)


# What a task with no recorded attempt has seen, and a dataset with none
# (read-only: shared by every lookup).
_NO_ATTEMPTS: Mapping[int, Attempt] = MappingProxyType({})
_NO_TASKS: Mapping[int, Mapping[int, Attempt]] = MappingProxyType({})


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

    A dataset already named by an earlier ``job_finished`` keeps that one's
    expectation: an identical repeat (a publisher's retry) changes nothing,
    a different one (other winners or task count) is ``inconsistent`` and
    the whole event is rejected. So is a ``job_finished`` for a dataset the
    job was already aborted for (failed, cancelled or timed out): the abort stands.
    """
    meta = _with_datasets(meta or _open_job(ev.job, [], now, default_timeout), list(ev.datasets))
    datasets = dict(meta.datasets)
    actions: list[Action] = []
    for name, exp in ev.datasets.items():
        ds = datasets[name]
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
            datasets[name] = DatasetState(status="committing", expected=exp)
            actions.append(Commit(job=ev.job, dataset=name))
        else:
            datasets[name] = DatasetState(status="waiting", expected=exp)
    new = msgspec.structs.replace(meta, datasets=datasets)
    if new == meta:
        return Decision(note="duplicate finish")
    return Decision(job=new, actions=tuple(actions))


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
    meta = _with_datasets(meta or _open_job(ev.job, [], now, default_timeout), list(ev.datasets))
    datasets = dict(meta.datasets)
    actions: list[Action] = []
    kind = "cancelled" if isinstance(ev, JobCancelled) else "failed"
    for name in ev.datasets:
        ds = datasets[name]
        if ds.status not in ("open", "waiting"):
            continue  # a commit that has started wins over a late abort
        datasets[name] = msgspec.structs.replace(ds, status="aborting", reason=f"{kind}: {ev.reason}")
        actions.append(Abort(job=ev.job, dataset=name, reason=f"{kind}: {ev.reason}"))
    new = msgspec.structs.replace(meta, datasets=datasets)
    return Decision(job=new, actions=tuple(actions), note="" if actions else "nothing to abort")
