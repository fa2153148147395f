"""Running a commit sequence: verify each step, redo what is not done, in phase order.

Order: the ``publish`` steps (verified, copied, then the sources deleted
together with one rewrite of the log, the *fence*: see :mod:`._publish_phase`),
then the ``apply`` steps one by one (watermarks, custom steps), then the
manifest, then the clean-up, then the log is deleted. The log is written only
where recovery or fencing needs it: created (or claimed) before the first
step, rewritten once after the copies (a stale holder stops there with
``Fenced``, before the watermarks and the manifest; a sequence without publish
steps is fenced before its first step), rewritten on quarantine, deleted at
the end. Recovery never trusts the log's progress hint: it verifies every step.
The lease is checked before each phase and before every step.

Each step runs as ``is_done`` -> ``execute`` (or its cheaper ``ensure``) under
the commit retry policy; transient errors and unknown outcomes are retried
(the next try starts by re-checking: an unknown outcome is re-read, never
assumed). When a step's budget is spent, or it raises
:class:`CommitStepFailed`, no further step starts, and the sequence is
quarantined: the log keeps it with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from .._retry import RetryPolicy
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectInfo, ObjectStore
from ._publish_phase import Progress, describe_step, list_staging, run_publish
from ._registry import StepRegistry
from ._results import CommitResult, CommitStatus
from ._steps import PHASES, StepContext
from ._wal import CommitSequence, WalHandle, open_sequence


def commit_policy(settings: Settings) -> RetryPolicy:
    """Return the retry policy of commit steps described by ``settings.commit.retry``."""
    return RetryPolicy.from_settings(settings.commit.retry)


async def run_claimed(
    handle: WalHandle,
    store: ObjectStore,
    lease: Lease,
    settings: Settings,
    *,
    recovered: bool,
    listed: Mapping[str, ObjectInfo] | None = None,
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Run the sequence of a log this holder has created or claimed; see the module doc.

    ``listed``: the job's staging folder for the dataset as this holder listed
    it before creating the log (sources are judged on it); None to list it here.

    Returns:
        ``committed`` (log deleted), ``quarantined`` (quarantined now: the log
        keeps the reason) or ``blocked`` (it was quarantined before this call:
        nothing ran; ``blocked_by`` is its own job).

    Raises:
        LockLost / Fenced: the lease was lost or a newer holder took over; the
            log is left as it is for that holder.
        TransientError: the store failed past the budget while writing the log
            itself (the sequence is then neither finished nor quarantined).

    Cancelled: steps in flight are cancelled; everything done so far is
    idempotent and the next holder verifies it.
    """
    start = time.monotonic()
    seq = handle.sequence
    policy = commit_policy(settings)
    timings: dict[str, float] = {}

    def result(status: CommitStatus, redone: int, reason: str | None = None) -> CommitResult:
        return CommitResult(
            dataset=seq.dataset,
            job=seq.job,
            status=status,
            blocked_by=seq.job if status == "blocked" else None,
            files=seq.files,
            bytes=seq.bytes,
            duration=time.monotonic() - start,
            steps=len(seq.steps),
            steps_redone=redone,
            recovered=recovered,
            attempts=handle.sequence.attempts,
            quarantined=reason,
            phase_seconds=timings,
        )

    if seq.quarantined is not None:
        # Quarantined earlier (and reported then): nothing runs until an operator acts.
        return result("blocked", 0, seq.quarantined)
    ctx = StepContext(store=store, lease=lease, settings=settings, clock=clock)
    progress = Progress()
    fenced = False

    async def fence() -> None:
        nonlocal fenced
        await handle.write(done=sorted(progress.done))
        fenced = True

    for phase in PHASES:
        items = [(i, s) for i, s in enumerate(seq.steps) if s.phase == phase]
        if not items:
            continue
        phase_start = time.monotonic()
        lease.check()
        if phase == "publish":
            if listed is None:
                listed = await list_staging(store, seq.job, seq.dataset, policy)
            await run_publish(items, ctx, policy, progress, listed=listed, fence=fence, timings=timings)
        else:
            if not fenced:
                await fence()
            for i, step in items:
                lease.check()
                await progress.run(i, step, ctx, policy)
                if progress.failure is not None:
                    break
            timings[phase] = time.monotonic() - phase_start
        if progress.failure is not None:
            await handle.write(quarantined=progress.failure, done=sorted(progress.done))
            return result("quarantined", progress.redone, progress.failure)
    await handle.delete()
    return result("committed", progress.redone)


async def execute_sequence(
    store: ObjectStore,
    seq: CommitSequence,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Write ``seq`` to the log (or claim the log already there) and run it to the end.

    An existing log of the same (dataset, job) wins over ``seq``: its steps
    are the ones verified and redone, and the result says ``recovered``.

    Returns:
        ``committed`` or ``quarantined`` (see :class:`CommitResult`).

    Raises:
        Fenced: the log shows a higher epoch than ``lease.epoch``, or a newer
            holder rewrote it while we ran; we stopped.
        LockLost: the lease was lost; we stopped.
        CommitStepFailed: an existing log is unreadable or names another job.
        TransientError: the store failed past the budget on the log itself.

    Cancelled: as :func:`run_claimed`.
    """
    handle, created = await open_sequence(
        store, seq, lease, policy=commit_policy(settings), registry=registry, clock=clock
    )
    return await run_claimed(handle, store, lease, settings, recovered=not created, clock=clock)


__all__ = ["commit_policy", "describe_step", "execute_sequence", "run_claimed"]
