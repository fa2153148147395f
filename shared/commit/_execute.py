"""Running a commit sequence: verify each step, redo what is not done, in phase order.

Order: every ``publish`` step in parallel (at most
``settings.commit.publish_concurrency`` at a time), then the ``apply`` steps
one by one (watermarks, custom steps), then the manifest, then the clean-up,
then the log is deleted. After each phase the holder rewrites the log (the
progress hint, and a fencing point: a stale holder stops there with
``Fenced``). The lease is checked before each phase and before every step.

Each step runs as ``is_done`` -> ``execute`` under the commit retry policy;
transient errors and unknown outcomes are retried (the next try starts by
re-checking ``is_done``: an unknown outcome is re-read, never assumed). When
a step's budget is spent, or it raises :class:`CommitStepFailed`, no further
step starts, and the sequence is quarantined: the log keeps it with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .._errors import CommitfleetError, LockLost, OutcomeUnknown, TransientError
from .._retry import RetryPolicy
from .._settings import Settings
from ..locks import Lease
from ..storage import ObjectStore
from ._bounded import for_each_bounded
from ._registry import StepRegistry
from ._results import CommitResult, CommitStatus
from ._steps import PHASES, CommitStep, PublishFile, StepContext
from ._wal import CommitSequence, WalHandle, open_sequence, with_retry


def describe_step(step: CommitStep) -> str:
    """Return a short human description of a step, for reasons and logs."""
    if isinstance(step, PublishFile):
        return f"publish {step.src} -> {step.dst}"
    return f"{step.__struct_config__.tag} step"


def commit_policy(settings: Settings) -> RetryPolicy:
    """Return the retry policy of commit steps described by ``settings.commit.retry``."""
    return RetryPolicy.from_settings(settings.commit.retry)


async def _run_step(step: CommitStep, ctx: StepContext, policy: RetryPolicy) -> bool:
    executed = False

    async def attempt() -> None:
        nonlocal executed
        executed = await step.ensure(ctx) or executed

    await with_retry(attempt, policy)
    return executed


def _failure(step: CommitStep, exc: CommitfleetError) -> str:
    if isinstance(exc, TransientError | OutcomeUnknown):
        return f"{describe_step(step)}: retry budget spent: {type(exc).__name__}: {exc}"
    return f"{describe_step(step)}: {type(exc).__name__}: {exc}"


class _Progress:
    def __init__(self) -> None:
        self.done: set[int] = set()
        self.redone = 0
        self.failure: str | None = None

    async def run(self, i: int, step: CommitStep, ctx: StepContext, policy: RetryPolicy) -> None:
        try:
            executed = await _run_step(step, ctx, policy)
        except LockLost:
            raise
        except CommitfleetError as exc:
            if self.failure is None:
                self.failure = _failure(step, exc)
            return
        self.done.add(i)
        self.redone += int(executed)


async def _run_parallel(
    items: list[tuple[int, CommitStep]], ctx: StepContext, policy: RetryPolicy, progress: _Progress
) -> None:
    async def one(item: tuple[int, CommitStep]) -> None:
        ctx.lease.check()
        await progress.run(item[0], item[1], ctx, policy)

    await for_each_bounded(
        items, one, ctx.settings.commit.publish_concurrency, stop=lambda: progress.failure is not None
    )


async def run_claimed(
    handle: WalHandle,
    store: ObjectStore,
    lease: Lease,
    settings: Settings,
    *,
    recovered: bool,
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Run the sequence of a log this holder has created or claimed; see the module doc.

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
    progress = _Progress()
    for phase in PHASES:
        items = [(i, s) for i, s in enumerate(seq.steps) if s.phase == phase]
        if not items:
            continue
        phase_start = time.monotonic()
        lease.check()
        if phase == "publish":
            await _run_parallel(items, ctx, policy, progress)
        else:
            for i, step in items:
                lease.check()
                await progress.run(i, step, ctx, policy)
                if progress.failure is not None:
                    break
        if progress.failure is not None:
            await handle.write(quarantined=progress.failure, done=sorted(progress.done))
            return result("quarantined", progress.redone, progress.failure)
        if phase != "cleanup":
            await handle.write(done=sorted(progress.done))
        timings[phase] = time.monotonic() - phase_start
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
