"""The outcome events of (dataset, job): ``committed`` / ``aborted``, put on the admin stream exactly once.

Whoever finishes the work, or finds it finished, calls these; the marker script
behind :meth:`WorkerContext.emit_outcome` keeps the event single (docs/queue.md).
Each returns None once the event is on the stream (appended now or before), and
raises TransientError when Redis stays unreachable: the caller's work is then
retried, and the marker keeps the retry from doubling the event.
"""

from __future__ import annotations

import time

from shared.commit import read_manifest
from shared.events import Aborted, Committed

from ._context import WorkerContext


async def announce_committed(
    ctx: WorkerContext,
    dataset: str,
    job: str,
    *,
    files: int,
    size: int,
    duration: float = 0.0,
    epoch: int = 0,
    phases: dict[str, float] | None = None,
) -> None:
    """Put the one ``committed`` event of (dataset, job) on the admin stream, if not there yet."""
    ev = Committed(
        at=time.time(),
        worker=ctx.worker_id,
        dataset=dataset,
        job=job,
        files=files,
        bytes=size,
        duration_s=duration,
        epoch=epoch,
        phases=phases or {},
    )
    await ctx.emit_outcome(ev, dataset=dataset, job=job, outcome="committed")


async def announce_aborted(
    ctx: WorkerContext, dataset: str, job: str, reason: str, files_deleted: int
) -> None:
    """Put the one ``aborted`` event of (dataset, job) on the admin stream, if not there yet."""
    ev = Aborted(
        at=time.time(),
        worker=ctx.worker_id,
        dataset=dataset,
        job=job,
        reason=reason,
        files_deleted=files_deleted,
    )
    await ctx.emit_outcome(ev, dataset=dataset, job=job, outcome="aborted")


async def announce_from_manifest(ctx: WorkerContext, dataset: str, job: str, epoch: int) -> None:
    """Announce a commit found complete by its manifest (figures read from it)."""
    manifest = await read_manifest(ctx.store, dataset, job)
    files = len(manifest.files) if manifest is not None else 0
    size = manifest.bytes if manifest is not None else 0
    await announce_committed(ctx, dataset, job, files=files, size=size, epoch=epoch)


__all__ = ["announce_aborted", "announce_committed", "announce_from_manifest"]
