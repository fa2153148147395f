"""What a shard's owner knows about its open jobs: the records, the decision type, the state.

:func:`workers._core._decide.decide` takes the shard's state and one validated queue
event and returns a :class:`Decision` (what to record, what to do);
:meth:`ShardJobs.apply` folds a decision into the in-memory state. The async layer persists the same
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

from typing import Final, Literal, get_args

import msgspec

from shared.events import (
    DatasetExpectation,
    RejectReason,
    StagedFile,
    StreamBatch,
    TableBinding,
    TraceContext,
)

from ._tally import TaskTally
from ._work import Abort, Action, Commit

Status = Literal[
    "open", "waiting", "committing", "committed", "aborting", "aborted", "quarantined", "blocked"
]
STATUSES: Final[tuple[Status, ...]] = get_args(Status)
"""Every status, in the order above (the fields of a shard's ``state:counts``)."""
TERMINAL: frozenset[str] = frozenset({"committed", "aborted"})
# Datasets whose staged files now belong to a commit: an abort must not touch them.
COMMIT_OWNED: frozenset[str] = frozenset({"committing", "committed", "quarantined", "blocked"})


STATE_VERSION = 2
"""Version of the shard-state records (JobMeta, DatasetState, Attempt, Ended) this code writes.

v2 (issue 31): each dataset of an open job is its own record (``state:datasets``, field
``<job>/<dataset>``) instead of a part of its job's record, so that a status change writes one small
field; and a dataset records ``fin``, the shard's decision sequence of the ``job_finished`` that named
it, so that a dataset's work runs in the order the jobs finished after any change of owner. A v1
JobMeta (datasets inside) is migrated when the shard is loaded (workers/_state_store.py); v1 Attempt
and Ended records have the v2 shape and are read as they are. A record of any other version sets the
shard aside."""

READS: frozenset[int] = frozenset({1, STATE_VERSION})
"""The record versions this code reads (v1 JobMeta records are migrated on load)."""

# A dataset whose status is one of these no longer holds back later jobs' commits of it:
# committed or aborted, or quarantined (the commit core then blocks later commits behind the
# quarantined sequence, until an operator retries or skips it).
PASSED: frozenset[str] = TERMINAL | {"quarantined"}


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
    """One dataset of one job on this shard (persisted as its own record since v2).

    ``fin`` is the shard's decision sequence of the ``job_finished`` that named the
    dataset (0 while the job has not finished it): the dataset's commits run in
    ``fin`` order (:attr:`ShardJobs.lines`).
    """

    v: int = STATE_VERSION
    status: Status = "open"
    expected: DatasetExpectation | None = None
    reason: str = ""
    fin: int = 0


class JobMeta(msgspec.Struct, frozen=True, kw_only=True):
    """One open job on this shard.

    Persisted (v2) without its datasets: each is its own record. In memory
    ``datasets`` holds them, changed in place through :class:`ShardJobs`
    (never copied per change). ``deadline - opened_at`` is the job's timeout:
    how long its driver may stay silent (:attr:`timeout_s`). The field keeps
    its old name (it was a hard deadline once) so records stay readable across versions.
    """

    v: int = STATE_VERSION
    job: str
    opened_at: float
    deadline: float
    datasets: dict[str, DatasetState] = msgspec.field(default_factory=dict)
    app: str = ""
    # Datasets bound to Iceberg tables by the producer (job_started); see docs/tables.md.
    tables: dict[str, TableBinding] = msgspec.field(default_factory=dict)
    # The micro-batch a streaming job commits (job_started); see docs/streaming.md.
    stream: StreamBatch | None = None
    # The producer's trace context of the job's latest job-level event that carried one
    # (docs/tracing.md): kept so that a new owner's commit and abort spans still hang under it.
    trace: TraceContext | None = None

    @property
    def timeout_s(self) -> float:
        """Seconds the job's driver may stay silent before the fleet aborts the job."""
        return self.deadline - self.opened_at


class Ended(msgspec.Struct, frozen=True, kw_only=True):
    """A job that has ended on this shard (kept to drop its late events)."""

    v: int = STATE_VERSION
    status: str
    at: float


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one event: records to write and actions to run.

    ``job`` is the job's new job-level record (None: unchanged; a new job's
    comes with no datasets); ``datasets`` the new state of each dataset of job
    ``job_id`` the event adds or changes (only those: never a copy of the
    job's other datasets); ``attempt`` a new attempt record of ``job_id`` to
    store under ``(dataset, attempt)``; ``seq`` the shard's decision sequence
    the decision took (0: none); ``note`` says why nothing happened when the
    event was dropped (for logs and metrics), ``duplicate`` that it repeated
    what the state already holds (a publisher's retry); ``replayed`` marks a
    job-level event for a job that has already ended (the driver sends each
    once: such a message goes to the dead letters); ``reject`` names the
    reason of any other event the contract forbids (e.g. ``inconsistent``: a
    second ``job_finished`` that contradicts the first), which goes to the
    dead letters with ``note`` as its detail.
    """

    job: JobMeta | None = None
    job_id: str = ""
    datasets: dict[str, DatasetState] | None = None  # None rather than {}: no dict per task report
    attempt: tuple[str, Attempt] | None = None
    seq: int = 0
    actions: tuple[Action, ...] = ()
    note: str = ""
    duplicate: bool = False
    replayed: bool = False
    reject: RejectReason | None = None


def attempt_field(job: str, dataset: str, task: int, attempt: int) -> str:
    """Return the Redis hash field of one attempt record: ``<job>/<dataset>/<task>/<attempt>``."""
    return f"{job}/{dataset}/{task}/{attempt}"


def dataset_field(job: str, dataset: str) -> str:
    """Return the Redis hash field of one dataset's record (v2): ``<job>/<dataset>``."""
    return f"{job}/{dataset}"


class ShardJobs:
    """The in-memory state of one shard's jobs (owned by one shard runner).

    Jobs enter through :meth:`apply` (or :meth:`add_job`), and every change of a
    dataset's state goes through :meth:`put`: it keeps the indexes below exact,
    so that a status change, the end test of a job (:meth:`job_done`) and the
    next commit of a dataset (:meth:`due`) cost O(1), whatever the job's size.

    ``lines`` holds, per dataset, the jobs that finished it (``fin`` > 0) and
    whose commit or abort of it has not passed yet (:data:`PASSED`), in
    ``fin`` order: only the first may commit the dataset. ``seq`` is the
    shard's decision sequence: the highest ``seq`` of an attempt or ``fin``
    of a dataset it holds (ended jobs' records are gone, so it may restart
    lower after a reload: only the order among open records matters).
    """

    def __init__(self) -> None:
        self.jobs: dict[str, JobMeta] = {}
        self.attempts: dict[tuple[str, str], dict[int, dict[int, Attempt]]] = {}
        self.ended: dict[str, Ended] = {}
        self.seq = 0
        self.tally = TaskTally()  # tasks in per waiting dataset (a cache, see workers._tally)
        # job -> the datasets ``attempts`` has a key for: an index, so that a job's end or
        # status change touches its own records, not every open dataset of the shard.
        self._attempted: dict[str, set[str]] = {}
        self.lines: dict[str, dict[str, int]] = {}
        # job -> how many of its datasets are not terminal / aborted / open or waiting.
        self._unended: dict[str, int] = {}
        self._aborted: dict[str, int] = {}
        self._live: dict[str, int] = {}
        # While not None, each :meth:`put` appends (job, dataset, state before): what
        # :meth:`undo` puts back when the change's save fails.
        self.journal: list[tuple[str, str, DatasetState | None]] | None = None

    # -- the job and dataset records ------------------------------------------------------

    def add_job(self, meta: JobMeta) -> None:
        """Make ``meta`` the job's record (a new job, or a job-level change sharing its datasets)."""
        old = self.jobs.get(meta.job)
        self.jobs[meta.job] = meta
        if old is not None and old.datasets is meta.datasets:
            return  # the same datasets (msgspec.structs.replace keeps the dict): nothing to index
        if old is not None:
            for name, ds in old.datasets.items():
                self._unindex(meta.job, name, ds)
        for name, ds in meta.datasets.items():
            self._index(meta.job, name, ds)

    def put(self, job: str, dataset: str, ds: DatasetState) -> None:
        """Make ``ds`` the state of ``dataset`` of ``job`` (a known job), in place: O(1)."""
        datasets = self.jobs[job].datasets
        old = datasets.get(dataset)
        if self.journal is not None:
            self.journal.append((job, dataset, old))
        if old is not None:
            self._unindex(job, dataset, old)
        datasets[dataset] = ds
        self._index(job, dataset, ds)

    def undo(self, journal: list[tuple[str, str, DatasetState | None]]) -> None:
        """Put back what the puts of ``journal`` changed (newest first), for jobs still open."""
        for job, dataset, old in reversed(journal):
            meta = self.jobs.get(job)
            if meta is None:
                continue
            if old is not None:
                self.put(job, dataset, old)
            elif dataset in meta.datasets:
                self._unindex(job, dataset, meta.datasets.pop(dataset))

    def _index(self, job: str, dataset: str, ds: DatasetState) -> None:
        status = ds.status
        if status in TERMINAL:
            if status == "aborted":
                self._aborted[job] = self._aborted.get(job, 0) + 1
        else:
            self._unended[job] = self._unended.get(job, 0) + 1
            if status == "open" or status == "waiting":
                self._live[job] = self._live.get(job, 0) + 1
        fin = ds.fin
        if fin:
            if fin > self.seq:
                self.seq = fin
            if status not in PASSED:
                line = self.lines.get(dataset)
                if line is None:
                    self.lines[dataset] = {job: fin}
                elif fin > line[next(reversed(line))]:
                    line[job] = fin
                else:  # put back out of turn, or loaded: keep the line in fin order
                    line[job] = fin
                    self.lines[dataset] = dict(sorted(line.items(), key=lambda jf: (jf[1], jf[0])))

    def _unindex(self, job: str, dataset: str, ds: DatasetState) -> None:
        status = ds.status
        if status in TERMINAL:
            if status == "aborted":
                _decrement(self._aborted, job)
        else:
            _decrement(self._unended, job)
            if status == "open" or status == "waiting":
                _decrement(self._live, job)
        if ds.fin and status not in PASSED:
            line = self.lines.get(dataset)
            if line is not None and line.pop(job, None) is not None and not line:
                del self.lines[dataset]

    # -- the order of a dataset's commits -------------------------------------------------

    def first_in_line(self, dataset: str) -> str | None:
        """Return the job whose commit of ``dataset`` comes next (the earliest finished), or None."""
        line = self.lines.get(dataset)
        return next(iter(line)) if line else None

    def due(self, dataset: str) -> Commit | None:
        """Return the commit of ``dataset`` to run now: the first job in its line, when that one
        is ``committing`` (else None: it waits for tasks, aborts, or is blocked)."""
        job = self.first_in_line(dataset)
        if job is None:
            return None
        if self.jobs[job].datasets[dataset].status != "committing":
            return None
        return Commit(job=job, dataset=dataset)

    def resumed(self) -> list[Action]:
        """Return the work a new session takes up from the state: every abort under way, and the
        commit (``committing`` or ``blocked``) first in each dataset's line, the earliest finished
        first. Later commits of a dataset follow as those before them pass (:meth:`due`)."""
        work: list[Action] = []
        for meta in self.jobs.values():
            if not self._unended.get(meta.job):
                continue
            for name, ds in meta.datasets.items():
                if ds.status == "aborting":
                    work.append(Abort(job=meta.job, dataset=name, reason=ds.reason or "aborted"))
                elif ds.status in ("committing", "blocked") and not ds.fin:
                    work.append(Commit(job=meta.job, dataset=name))  # in no line (cannot happen in v2)
        heads = []
        for name, line in self.lines.items():
            job = next(iter(line))
            heads.append((line[job], name, job))
        for _fin, name, job in sorted(heads):
            if self.jobs[job].datasets[name].status in ("committing", "blocked"):
                work.append(Commit(job=job, dataset=name))
        return work

    # -- attempts -------------------------------------------------------------------------

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
        if self.tally.counts:  # before the record goes in: the tally compares with what was there
            self.tally.added(job, dataset, rec.task, rec.attempt, per_attempt)
        per_attempt[rec.attempt] = rec
        if rec.seq > self.seq:  # not max(): called once per event, and a builtin call costs more
            self.seq = rec.seq

    def apply(self, d: Decision) -> None:
        """Fold ``d`` into the state (after it was persisted)."""
        if d.job is not None:
            self.add_job(d.job)
        if d.datasets:
            put, job = self.put, d.job_id
            for name, ds in d.datasets.items():
                put(job, name, ds)
        if d.attempt is not None:
            dataset, rec = d.attempt
            assert d.job_id, "an attempt record always comes with its job"
            self.load_attempt(d.job_id, dataset, rec)
        if d.seq > self.seq:
            self.seq = d.seq

    def set_status(self, job: str, dataset: str, status: Status, reason: str = "") -> JobMeta | None:
        """Change one dataset's status (and reason) in place; return the job's record (None if unknown).

        O(1): the job's other datasets are neither copied nor looked at.
        """
        meta = self.jobs.get(job)
        if meta is None:
            return None
        ds = meta.datasets.get(dataset)
        if ds is None:
            return None
        self.put(job, dataset, msgspec.structs.replace(ds, status=status, reason=reason))
        return meta

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

    def remove_job(self, job: str) -> None:
        """Forget ``job``'s record and datasets (not its attempts): O(1) when they all ended."""
        meta = self.jobs.pop(job, None)
        if meta is not None and self._unended.get(job):
            for name, ds in meta.datasets.items():  # not all ended: leave no line behind
                self._unindex(job, name, ds)
        self._unended.pop(job, None)
        self._aborted.pop(job, None)
        self._live.pop(job, None)

    def end_job(self, job: str, status: str, now: float) -> None:
        """Forget an ended job's records, remembering that it ended."""
        self.remove_job(job)
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

    def live(self, job: str) -> bool:
        """Return whether a dataset of ``job`` is still ``open`` or ``waiting`` (O(1))."""
        return self._live.get(job, 0) > 0

    def job_done(self, job: str) -> str | None:
        """Return the job's end status when every dataset here is terminal, else None (O(1))."""
        meta = self.jobs.get(job)
        if meta is None or not meta.datasets or self._unended.get(job, 0):
            return None
        return "aborted" if self._aborted.get(job, 0) else "committed"


def _decrement(counts: dict[str, int], key: str) -> None:
    n = counts.get(key, 0) - 1
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)
