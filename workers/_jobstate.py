"""What a shard's owner knows about its open jobs, and what each event makes it do.

Pure: :func:`decide` takes the shard's state and one validated queue event and
returns a :class:`Decision` (what to record, what to do); :meth:`ShardJobs.apply`
folds a decision into the in-memory state. The async layer persists the same
decision to Redis (together with the message's acknowledgement) and runs the
actions. Nothing here does I/O or reads a clock: ``now`` is passed in.

Per (job, dataset) the status moves along::

    open -> waiting -> committing -> committed
      \\        \\            \\-> quarantined / blocked (operator retry or skip)
       \\-------\\-> aborting -> aborted

``open``: the job is running. ``waiting``: the job finished, but a task (or its
winning attempt) has not reported yet. A job ends on this shard when all its
datasets here are ``committed`` or ``aborted``; later events for it are dropped
and the staged files they name cleaned up.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec

from shared.events import (
    DatasetExpectation,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    QueueEvent,
    RejectReason,
    StagedFile,
    TableBinding,
    TaskFinished,
)

from ._tally import TaskTally, satisfies

Status = Literal[
    "open", "waiting", "committing", "committed", "aborting", "aborted", "quarantined", "blocked"
]
TERMINAL: frozenset[str] = frozenset({"committed", "aborted"})
# Datasets whose staged files now belong to a commit: an abort must not touch them.
COMMIT_OWNED: frozenset[str] = frozenset({"committing", "committed", "quarantined", "blocked"})


STATE_VERSION = 1
"""Version of the shard-state records (JobMeta, Attempt, Ended) this code reads and writes.
A record with another version sets the shard aside (workers/_state_store.py)."""


# gc=False: the state keeps one per task attempt of every open job, and the
# cyclic collector traversed each of them (and the dict holding it) again and
# again; an Attempt refers only to files and numbers, so it can never be part of
# a cycle. commitfleet bench: intake CPU per event 5.45 -> 5.0 us (medians).
class Attempt(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One finished task attempt as recorded (``seq`` = arrival order on the shard)."""

    v: int = STATE_VERSION
    task: int
    attempt: int
    files: list[StagedFile]
    watermarks: dict[str, int] = {}
    seq: int


class DatasetState(msgspec.Struct, frozen=True, kw_only=True):
    """One dataset of one job on this shard."""

    status: Status = "open"
    expected: DatasetExpectation | None = None
    reason: str = ""


class JobMeta(msgspec.Struct, frozen=True, kw_only=True):
    """One open job on this shard (persisted as one small JSON value).

    ``deadline - opened_at`` is the job's timeout: how long its driver may
    stay silent (:attr:`timeout_s`). The field keeps its old name (it was a
    hard deadline once) so records stay readable across versions.
    """

    v: int = STATE_VERSION
    job: str
    opened_at: float
    deadline: float
    datasets: dict[str, DatasetState]
    app: str = ""
    # Datasets bound to Iceberg tables by the producer (job_started); see docs/tables.md.
    tables: dict[str, TableBinding] = msgspec.field(default_factory=dict)

    @property
    def timeout_s(self) -> float:
        """Seconds the job's driver may stay silent before the fleet aborts the job."""
        return self.deadline - self.opened_at


class Ended(msgspec.Struct, frozen=True, kw_only=True):
    """A job that has ended on this shard (kept to drop its late events)."""

    v: int = STATE_VERSION
    status: str
    at: float


# -- actions ----------------------------------------------------------------------


class Commit(msgspec.Struct, frozen=True, kw_only=True):
    """Commit ``dataset`` of ``job`` (its tasks are complete and the job finished)."""

    job: str
    dataset: str


class Abort(msgspec.Struct, frozen=True, kw_only=True):
    """Roll back ``dataset`` of ``job`` (failed, cancelled or timed out)."""

    job: str
    dataset: str
    reason: str


class CleanupAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """Delete one losing or late attempt's staged files."""

    job: str
    dataset: str
    task: int
    attempt: int


Action = Commit | Abort | CleanupAttempt


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one event: records to write and actions to run.

    ``job`` is the job's new metadata (None: unchanged); ``attempt`` a new
    attempt record to store under ``(dataset, attempt)``; ``note`` says why
    nothing happened when the event was dropped (for logs and metrics);
    ``replayed`` marks a job-level event for a job that has already ended
    (the driver sends each once: such a message goes to the dead letters);
    ``reject`` names the reason of any other event the contract forbids (e.g.
    ``inconsistent``: a second ``job_finished`` that contradicts the first),
    which goes to the dead letters with ``note`` as its detail.
    """

    job: JobMeta | None = None
    attempt: tuple[str, Attempt] | None = None
    actions: tuple[Action, ...] = ()
    note: str = ""
    replayed: bool = False
    reject: RejectReason | None = None


def attempt_field(job: str, dataset: str, task: int, attempt: int) -> str:
    """Return the Redis hash field of one attempt record: ``<job>/<dataset>/<task>/<attempt>``."""
    return f"{job}/{dataset}/{task}/{attempt}"


class ShardJobs:
    """The in-memory state of one shard's jobs (owned by one shard runner)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobMeta] = {}
        self.attempts: dict[tuple[str, str], dict[int, dict[int, Attempt]]] = {}
        self.ended: dict[str, Ended] = {}
        self.seq = 0
        self.tally = TaskTally()  # tasks in per waiting dataset (a cache, see workers._tally)
        # job -> the datasets ``attempts`` has a key for: an index, so that a job's end or
        # status change touches its own records, not every open dataset of the shard.
        self._attempted: dict[str, set[str]] = {}

    def load_attempt(self, job: str, dataset: str, rec: Attempt) -> None:
        """Add a persisted attempt record (at shard start, and for each decision applied)."""
        per_task = self.attempts.get((job, dataset))
        if per_task is None:
            per_task = self.attempts[(job, dataset)] = {}
            names = self._attempted.get(job)
            if names is None:
                names = self._attempted[job] = set()
            names.add(dataset)
        per_attempt = per_task.get(rec.task)
        if per_attempt is None:
            per_attempt = per_task[rec.task] = {}
        if self.tally:  # before the record goes in: the tally compares with what was there
            self.tally.added(job, dataset, rec.task, rec.attempt, per_attempt)
        per_attempt[rec.attempt] = rec
        if rec.seq > self.seq:  # not max(): called once per event, and a builtin call costs more
            self.seq = rec.seq

    def apply(self, d: Decision) -> None:
        """Fold ``d`` into the state (after it was persisted)."""
        if d.attempt is not None:
            dataset, rec = d.attempt
            job = d.job.job if d.job is not None else None
            assert job is not None, "an attempt record always comes with its job"
            self.load_attempt(job, dataset, rec)
        if d.job is not None:
            self.jobs[d.job.job] = d.job

    def set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> JobMeta | None:
        """Return the job's metadata with one dataset's status changed (None if unknown)."""
        meta = self.jobs.get(job)
        if meta is None or dataset not in meta.datasets:
            return None
        ds = msgspec.structs.replace(meta.datasets[dataset], status=status, reason=reason)
        return msgspec.structs.replace(meta, datasets={**meta.datasets, dataset: ds})

    def attempts_of(self, job: str) -> dict[tuple[str, str], dict[int, dict[int, Attempt]]]:
        """Return ``job``'s entries of :attr:`attempts` (the same per-task dicts, not copies)."""
        return {(job, d): self.attempts[(job, d)] for d in self._attempted.get(job, ())}

    def replace_attempts(
        self, job: str, records: dict[tuple[str, str], dict[int, dict[int, Attempt]]]
    ) -> None:
        """Make ``records`` (keys of ``job`` only, as :meth:`attempts_of` returns) ``job``'s attempts."""
        for dataset in self._attempted.pop(job, ()):
            del self.attempts[(job, dataset)]
        if records:
            self.attempts.update(records)
            self._attempted[job] = {dataset for _job, dataset in records}
        self.tally.forget(job)

    def end_job(self, job: str, status: str, now: float) -> None:
        """Forget an ended job's records, remembering that it ended."""
        self.jobs.pop(job, None)
        self.replace_attempts(job, {})
        self.ended[job] = Ended(status=status, at=now)

    def winners(self, job: str, dataset: str) -> list[Attempt] | None:
        """Return the attempt to commit for each task, or None while one is missing."""
        meta = self.jobs.get(job)
        if meta is None:
            return None
        exp = meta.datasets[dataset].expected
        if exp is None:
            return None
        tasks = self.attempts.get((job, dataset), {})
        out: list[Attempt] = []
        for t in range(exp.tasks):
            seen = tasks.get(t)
            if not seen:
                return None
            if exp.winners is not None:
                rec = seen.get(exp.winners[t])
                if rec is None:
                    return None
            else:
                rec = min(seen.values(), key=lambda a: a.seq)
            out.append(rec)
        return out

    def losers(self, job: str, dataset: str) -> list[Attempt]:
        """Return every recorded attempt of ``dataset`` that is not a winner."""
        chosen = {(a.task, a.attempt) for a in self.winners(job, dataset) or []}
        return [
            a
            for per_task in self.attempts.get((job, dataset), {}).values()
            for a in per_task.values()
            if (a.task, a.attempt) not in chosen
        ]

    def job_done(self, job: str) -> str | None:
        """Return the job's end status when every dataset here is terminal, else None."""
        meta = self.jobs.get(job)
        if meta is None or not meta.datasets:
            return None
        states = {d.status for d in meta.datasets.values()}
        if not states <= TERMINAL:
            return None
        return "committed" if states == {"committed"} else "aborted"


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
            return Decision(job=msgspec.structs.replace(opened, tables=dict(ev.tables)))
        new = _with_datasets(meta, ev.datasets)
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
