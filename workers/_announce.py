"""The outcome events of (dataset, job): ``committed`` / ``aborted``, put on the admin stream exactly once.

Whoever finishes the work, or finds it finished, calls these; the marker script
behind :meth:`WorkerContext.emit_outcome` keeps the event single (docs/queue.md).
Each returns None once the event is on the stream (appended now or before), and
raises TransientError when Redis stays unreachable: the caller's work is then
retried, and the marker keeps the retry from doubling the event.
"""

from __future__ import annotations

import logging
import time

from shared import TransientError
from shared._logging import kv
from shared.commit import CommitResult, OnCommitted, read_manifest
from shared.events import Aborted, Committed

from ._context import WorkerContext

log = logging.getLogger("workers.shard")


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


def early_notice(ctx: WorkerContext, epoch: int) -> OnCommitted:
    """Return the commit point's hook (``commit_dataset(on_committed=...)``): announce the commit.

    The manifest is written then, so the commit is done; the clean-up and the
    log's deletion that follow change nothing a reader sees. The caller
    announces again when the sequence has ended (the outcome marker keeps one
    event), so a Redis error here costs only the early notice: the hook logs it
    and returns; it never raises TransientError.
    """

    async def notice(res: CommitResult) -> None:
        try:
            await announce_committed(
                ctx,
                res.dataset,
                res.job,
                files=res.files,
                size=res.bytes,
                duration=res.duration,
                epoch=epoch,
                phases=res.phase_seconds,
            )
        except TransientError as exc:
            log.warning(
                "early commit notice not sent; it is sent after the clean-up",
                extra=kv(dataset=res.dataset, job=res.job, error=str(exc)),
            )

    return notice


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


__all__ = ["announce_aborted", "announce_committed", "announce_from_manifest", "early_notice"]
