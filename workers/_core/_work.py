"""Every kind of work a shard's owner runs, its key, and its place in the shard's queue.

Decisions (:func:`workers._core._decide.decide`) produce :data:`Action` s; a
session start adds :class:`Recover` s, the tick :class:`Operate` s. Each piece
is known by its :func:`work_key` (the same work is never queued twice) and
waits in the shard's :class:`~workers._core._work_queue.WorkQueue` as a
:class:`QueuedWork`. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import msgspec


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


class Recover(msgspec.Struct, frozen=True, kw_only=True):
    """Finish an unfinished commit sequence found in ``_wal/`` (no job state needed)."""

    dataset: str


class Operate(msgspec.Struct, frozen=True, kw_only=True):
    """An operator's ``retry`` or ``skip`` of a quarantined sequence (``op`` as requested)."""

    dataset: str
    job: str
    op: str


Work = Action | Recover | Operate


def work_key(w: Work) -> tuple[object, ...]:
    """Return what tells ``w`` apart from other work (the same key is never queued twice)."""
    if isinstance(w, CleanupAttempt):
        return ("cleanup", w.job, w.dataset, w.task, w.attempt)
    if isinstance(w, Recover):
        return ("recover", w.dataset)
    return (type(w).__name__, w.job, w.dataset)


class QueuedWork:
    """A piece of work in the shard's queue: the work, its key, when it was scheduled (``since``)."""

    __slots__ = ("dataset", "key", "since", "turn", "work")

    def __init__(self, work: Work, key: tuple[object, ...], since: float) -> None:
        self.work = work
        self.key = key
        self.since = since
        self.dataset = work.dataset
        # Recoveries belong to no job: they share one turn.
        self.turn = "" if isinstance(work, Recover) else work.job


__all__ = [
    "Abort",
    "Action",
    "CleanupAttempt",
    "Commit",
    "Operate",
    "QueuedWork",
    "Recover",
    "Work",
    "work_key",
]
