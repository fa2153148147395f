"""Running a sequence's steps: in phase order, each verified first, under the bounds and the retry budget.

Order: the ``publish`` steps (verified, copied, then the sources deleted
together with the *fence*: see :mod:`._publish_phase`), then the ``apply``
steps one by one (watermarks, the table step, custom steps), then the
manifest, then the clean-up. A sequence without publish steps is fenced
before its first step. The fence is the one write of the log while steps run;
it is the caller's (the pipeline's), handed in as a callable: this module
never touches the log. The lease is checked before each phase and before
every step.

Each step runs as ``is_done`` -> ``execute`` (or its cheaper ``ensure``) under
the commit retry policy; transient errors and unknown outcomes are retried
(the next try starts by re-checking: an unknown outcome is re-read, never
assumed). Steps that can prepare part of their work ahead of their turn
(:mod:`._head_start`) start it when the run begins, beside the publish phase
(on stores where that pays).
When a step's budget is spent, or it raises
:class:`CommitStepFailed`, no further step starts: the run ends with the
failure recorded, and the caller quarantines the sequence.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from .._errors import CommitfleetError, LockLost
from .._retry import RetryPolicy
from ..storage import ObjectInfo
from ..tracing import Attributes
from ._bounded import with_retry
from ._head_start import HeadStarts, worth_starting
from ._progress import Progress, step_failure
from ._publish_phase import run_publish
from ._steps import PHASES, CommitStep, StepContext
from ._survey import list_staging

Fence = Callable[[list[int]], Awaitable[object]]
"""Rewrite the log once, with the indexes of the steps seen done so far (the progress hint)."""


async def run_step(
    i: int, step: CommitStep, ctx: StepContext, policy: RetryPolicy, progress: Progress
) -> None:
    """Ensure step ``i`` under ``policy``; record it done (and redone), or its failure, in ``progress``.

    Raises:
        LockLost / Fenced only: every other error of ours is the step's failure.
    """
    executed = False

    async def attempt() -> None:
        nonlocal executed
        executed = await step.ensure(ctx) or executed

    try:
        await with_retry(attempt, policy)
    except LockLost:
        raise
    except CommitfleetError as exc:
        if progress.failure is None:
            progress.failure = step_failure(step, exc)
        return
    progress.done.add(i)
    progress.redone += int(executed)


async def run_steps(
    steps: list[CommitStep],
    ctx: StepContext,
    policy: RetryPolicy,
    *,
    dataset: str,
    job: str,
    listed: Mapping[str, ObjectInfo] | None,
    fence: Fence,
) -> Progress:
    """Run ``steps`` (a sequence of (dataset, job)) as the module doc says, until done or the first failure.

    ``listed``: the job's staging folder for the dataset as this holder listed
    it before creating the log (sources are judged on it); None to list it
    just before the publish phase. ``fence`` is awaited exactly once, with the
    source deletes or before the first step that is not a publish.

    Returns:
        The run's :class:`Progress`: steps seen done, steps redone, the phase
        timings, and ``failure`` (the quarantine reason) or None when every
        step is done.

    Raises:
        LockLost / Fenced: the lease was lost, or the fence found a newer holder.
        TransientError: the store kept failing while removing this run's
            copies after a failure.

    Cancelled: steps in flight are cancelled; everything done so far is
    idempotent and the next holder verifies it.
    """
    starts = HeadStarts()
    ctx = replace(ctx, head_starts=starts)
    try:
        if worth_starting(ctx.store.url, ctx.settings.store.model_latency_ms):
            starts.start(steps, ctx)
        progress = await _run_phases(steps, ctx, policy, dataset=dataset, job=job, listed=listed, fence=fence)
    except BaseException:
        await starts.close()  # cancelled or failing too: the preparations never outlive the run
        raise
    bug = await starts.close()
    if bug is not None:
        raise bug
    return progress


async def _run_phases(
    steps: list[CommitStep],
    ctx: StepContext,
    policy: RetryPolicy,
    *,
    dataset: str,
    job: str,
    listed: Mapping[str, ObjectInfo] | None,
    fence: Fence,
) -> Progress:
    progress = Progress()
    fenced = False

    async def fence_once() -> None:
        nonlocal fenced
        await fence(sorted(progress.done))
        fenced = True

    for phase in PHASES:
        items = [(i, s) for i, s in enumerate(steps) if s.phase == phase]
        if not items:
            continue
        phase_start = time.monotonic()
        ctx.lease.check()
        with ctx.tracer.span(f"commitfleet.{phase}", attributes=_phase_attributes(ctx, phase, items)) as span:
            if phase == "publish":
                if listed is None:
                    listed = await list_staging(ctx.store, job, dataset, policy)
                await run_publish(items, ctx, policy, progress, listed=listed, fence=fence_once)
            else:
                if not fenced:
                    await fence_once()
                for i, step in items:
                    ctx.lease.check()
                    await run_step(i, step, ctx, policy, progress)
                    if progress.failure is not None:
                        break
                progress.timings[phase] = time.monotonic() - phase_start
            if progress.failure is not None:
                span.set("commitfleet.failure", progress.failure[:200])
        if progress.failure is not None:
            break
    return progress


def _phase_attributes(ctx: StepContext, phase: str, items: list[tuple[int, CommitStep]]) -> Attributes | None:
    """The attributes of a phase's span (None, built for nothing, when tracing is off)."""
    if not ctx.tracer.enabled:
        return None
    return {"commitfleet.phase": phase, "commitfleet.steps": len(items)}


__all__ = ["Fence", "run_step", "run_steps"]
