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

from typing import Literal

import msgspec

from shared.events import (
    DatasetExpectation,
    RejectReason,
    StagedFile,
    StreamBatch,
    TableBinding,
)

from ._tally import TaskTally
from ._work import Action

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
    # The micro-batch a streaming job commits (job_started); see docs/streaming.md.
    stream: StreamBatch | None = None

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
        if self.tally.counts:  # before the record goes in: the tally compares with what was there
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
        # From the last dataset named: work runs in the order the datasets
        # were named, so while the job is under way one not ended yet is found
        # at once (this runs on every status change: a full pass made a job of
        # N datasets cost N^2).
        committed = True
        for d in reversed(meta.datasets.values()):
            if d.status not in TERMINAL:
                return None
            if d.status != "committed":
                committed = False
        return "committed" if committed else "aborted"
