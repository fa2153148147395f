"""The trace context of each job a worker heard of, bounded: what its commit and abort spans hang under."""

from __future__ import annotations

from typing import Final

from ._port import TraceCarrier

BOOK_SIZE: Final = 65_536
"""Jobs remembered at most (oldest forgotten first); about 200 B each."""


class TraceBook:
    """Job id -> the producer's trace context, from the job's events (a bounded memory, not a record).

    A cache of what the jobs' state records also hold (``JobMeta.trace``): a new
    owner fills it from the state it loads (docs/tracing.md). Not thread safe (one event loop).
    """

    __slots__ = ("_jobs", "_size")

    def __init__(self, size: int = BOOK_SIZE) -> None:
        self._jobs: dict[str, TraceCarrier] = {}
        self._size = size

    def note(self, job: str, carrier: TraceCarrier) -> None:
        """Remember ``carrier`` as ``job``'s context (the latest event's wins)."""
        jobs = self._jobs
        jobs.pop(job, None)
        jobs[job] = carrier
        if len(jobs) > self._size:
            del jobs[next(iter(jobs))]

    def get(self, job: str) -> TraceCarrier | None:
        """Return ``job``'s context, or None when none was heard (or it was forgotten)."""
        return self._jobs.get(job)

    def __len__(self) -> int:
        return len(self._jobs)


__all__ = ["BOOK_SIZE", "TraceBook"]
