"""The publish phase of a sequence: verify, copy every file, then delete the sources (with the fence).

Three rounds of requests, each a bounded parallel batch
(``settings.commit.publish_concurrency`` at a time):

1. Verification, on one listing of the job's staging folder for the dataset
   (a fresh commit lists it before writing the log, a recovering holder just
   before this phase): each source is judged on the listing (size, and MD5
   where the store lists one) with no further request; a source the listing
   does not show is checked on its own (:func:`~._verify.check_source`: gone
   is fine only when its destination is already right).
2. Copies, pinned to the verified versions. Each copy's answer says what was
   copied (size and MD5): a copy that does not match its report is the
   verification of the bytes themselves (local files list no MD5, so there it
   is the MD5 check). When any file is wrong, every copy this run made is
   removed again and the sequence is quarantined: nothing of it is left in the
   dataset folder, and no source was deleted.
3. Only when every copy is right, the sources are deleted, and at the same
   time the log is rewritten once (the *fence*): a holder that was taken over
   stops there with :class:`~shared._errors.Fenced`, before the watermarks and
   the manifest. Deleting a source is safe for a stale holder too (the step's
   done state is "source gone, destination right", which the copy made true).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import partial

from .._errors import BadInput, CommitfleetError, LockLost
from .._retry import RetryPolicy
from ..storage import ObjectInfo
from ._bounded import for_each_bounded, with_retry
from ._errors import CommitStepFailed
from ._progress import Progress, describe_step, step_failure
from ._publish import PublishFile
from ._steps import CommitStep, StepContext
from ._verify import verify_sources


async def run_publish(
    items: list[tuple[int, CommitStep]],
    ctx: StepContext,
    policy: RetryPolicy,
    progress: Progress,
    *,
    listed: Mapping[str, ObjectInfo] | None,
    fence: Callable[[], Awaitable[object]],
) -> None:
    """Run the publish steps ``items`` as the module doc says; the outcome (and timings) is in ``progress``.

    ``listed`` is the staging folder as listed before the log was written (a
    fresh commit), or None (a recovering holder: every source is read).
    ``fence`` is awaited once, with the source deletes, when every copy is right.

    Raises:
        LockLost / Fenced: the lease was lost, or the fence found a newer holder.
        TransientError: removing this run's copies after a failure kept failing.

    Cancelled: copies and deletes in flight are cancelled; all of them are
    idempotent and the next holder verifies them.
    """
    limit = ctx.settings.commit.publish_concurrency
    timings = progress.timings
    start = time.monotonic()
    done, verified, progress.failure = await verify_sources(items, ctx, policy, listed=listed)
    progress.done |= done
    timings["verify"] = time.monotonic() - start
    start = time.monotonic()
    pinned = replace(ctx, verified=verified)
    copied: list[tuple[int, PublishFile]] = []

    async def copy_one(item: tuple[int, CommitStep]) -> None:
        i, step = item
        assert isinstance(step, PublishFile)
        ctx.lease.check()
        try:
            made = await with_retry(partial(step.copy_checked, pinned), policy)
        except LockLost:
            raise
        except (CommitStepFailed, BadInput) as exc:
            # The copy's answer judged the source: a verification failure like any other.
            if progress.failure is None:
                progress.failure = f"{describe_step(step)}: verify: {type(exc).__name__}: {exc}"
            return
        except CommitfleetError as exc:
            if progress.failure is None:
                progress.failure = step_failure(step, exc)
            return
        if made:
            copied.append((i, step))
        else:
            progress.done.add(i)

    if progress.failure is None:
        pending = [it for it in items if it[0] not in progress.done]
        await for_each_bounded(pending, copy_one, limit, stop=lambda: progress.failure is not None)
    if progress.failure is not None:

        async def undo(item: tuple[int, PublishFile]) -> None:
            ctx.lease.check()
            await with_retry(partial(ctx.store.delete, item[1].dst), policy)

        # The sources are all still there: nothing of this run stays published.
        await for_each_bounded(copied, undo, limit)
        timings["publish"] = time.monotonic() - start
        return

    async def delete_one(item: tuple[int, PublishFile]) -> None:
        ctx.lease.check()
        try:
            await with_retry(partial(ctx.store.delete, item[1].src), policy)
        except LockLost:
            raise
        except CommitfleetError as exc:
            if progress.failure is None:
                progress.failure = step_failure(item[1], exc)
            return
        progress.done.add(item[0])
        progress.redone += 1

    jobs: list[Callable[[], Awaitable[object]]] = [*(partial(delete_one, it) for it in copied), fence]

    async def call(job: Callable[[], Awaitable[object]]) -> None:
        await job()

    # One batch: the deletes, and the fence in a slot of its own (queued
    # behind them only when there are more files than the concurrency).
    await for_each_bounded(jobs, call, limit + 1)
    timings["publish"] = time.monotonic() - start


__all__ = ["run_publish"]
