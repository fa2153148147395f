"""What the commit core's calls return: frozen values the worker turns into admin events."""

from __future__ import annotations

from typing import Literal

import msgspec

CommitStatus = Literal["committed", "quarantined", "blocked", "refused"]


class CommitResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of committing (or recovering) one dataset's sequence.

    ``status``:

    - ``committed``: the manifest exists and the log is gone (``already_committed``
      says the manifest was there before this call: nothing was done).
    - ``quarantined``: this sequence exhausted its retry budget or hit a step
      that cannot succeed; it stays in ``_wal/`` with ``quarantined`` = reason
      until an operator runs ``retry`` or ``skip``.
    - ``blocked``: a sequence of the dataset (job ``blocked_by``: an earlier
      job, or this job itself) was already quarantined, or its log is
      unreadable, so nothing ran; ``quarantined`` holds that reason. It was
      reported when it was quarantined; this call adds nothing new.
    - ``refused``: a streaming job's micro-batch that the dataset's stream
      record already covers (``refused`` says why, see ``_stream_gate``);
      the job's staged files for the dataset were deleted
      (``files_deleted``) and nothing else was written.

    ``steps_redone`` counts the steps that were found not done and executed;
    ``phase_seconds`` times each phase that ran;
    ``recovered`` says this sequence was found in the log (an earlier holder
    started it); ``recovered_jobs`` lists older sequences of the dataset that
    were finished first, and ``earlier`` holds their results (including one
    that got quarantined now and therefore blocks this job).
    """

    dataset: str
    job: str
    status: CommitStatus
    files: int = 0
    bytes: int = 0
    duration: float = 0.0
    steps: int = 0
    steps_redone: int = 0
    recovered: bool = False
    already_committed: bool = False
    attempts: int = 0
    quarantined: str | None = None
    blocked_by: str | None = None
    refused: str | None = None
    files_deleted: int = 0
    recovered_jobs: list[str] = msgspec.field(default_factory=list)
    earlier: list[CommitResult] = msgspec.field(default_factory=list)
    phase_seconds: dict[str, float] = msgspec.field(default_factory=dict)
    """Wall time of each phase this call ran (``publish``, ``apply``, ...,
    each with its log write), for the step-latency metrics."""

    @property
    def ok(self) -> bool:
        """True when the dataset's commit of the job is complete."""
        return self.status == "committed"


class RecoveryResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of finishing a dataset's unfinished sequences, oldest first.

    ``blocked_by`` names the job whose sequence is quarantined or unreadable
    (recovery stopped there; ``reason`` says why), else None.
    """

    dataset: str
    results: list[CommitResult] = msgspec.field(default_factory=list)
    blocked_by: str | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """True when nothing unfinished is left for the dataset."""
        return self.blocked_by is None and all(r.ok for r in self.results)


AbortStatus = Literal["aborted", "commit_in_progress", "already_committed"]


class AbortResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of aborting one dataset of one job.

    ``commit_in_progress``: a commit had already written its log, and a
    commit that has written its log wins: nothing was deleted.
    ``already_committed``: the manifest exists: nothing was deleted.
    ``aborted``: the job's staged files for the dataset were deleted.
    """

    dataset: str
    job: str
    status: AbortStatus
    files_deleted: int = 0


SkipOutcome = Literal["rolled_back", "forgotten"]


class SkipResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of an operator's ``skip`` of a quarantined sequence.

    ``rolled_back``: no manifest existed; the job's published files (those no
    manifest lists) and its staged files were deleted, then the log.
    ``forgotten``: the manifest existed (the commit was complete, only clean-up
    was left); the log was deleted, leftovers are reported by ``audit``.
    """

    dataset: str
    job: str
    outcome: SkipOutcome
    published_deleted: int = 0
    staged_deleted: int = 0


__all__ = [
    "AbortResult",
    "AbortStatus",
    "CommitResult",
    "CommitStatus",
    "RecoveryResult",
    "SkipOutcome",
    "SkipResult",
]
