"""The abort path: clean up a failed or cancelled job's staged output, unless its commit already won."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from .._errors import NotFound
from ..events import manifest_key, staging_prefix, wal_key
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectStore
from ._bounded import commit_policy, with_retry
from ._results import AbortResult
from ._steps import StepContext, delete_prefixes


async def _exists(store: ObjectStore, key: str) -> bool:
    try:
        await store.head(key)
    except NotFound:
        return False
    return True


async def abort_dataset(
    store: ObjectStore,
    dataset: str,
    job: str,
    lease: Lease,
    settings: Settings | None = None,
    *,
    clock: Callable[[], float] = time.time,
) -> AbortResult:
    """Abort the job for the dataset: delete its staged files, unless a commit won.

    Rules, under the dataset's lock (``lease``):

    - A log exists for (dataset, job): a commit that has written its log wins.
      Nothing is deleted; ``commit_in_progress`` (the commit, or its recovery,
      finishes it).
    - The manifest exists: the job is committed; nothing is deleted;
      ``already_committed``.
    - Else every object under ``_staging/<job>/<dataset>/`` is deleted (all
      attempts); ``aborted`` with the count.

    Idempotent; transient store errors are retried under the commit policy.

    Returns:
        An :class:`AbortResult`.

    Raises:
        LockLost: the lease was lost (checked before each delete).
        TransientError: the store kept failing past the budget.
    """
    settings = settings or Settings()
    policy = commit_policy(settings)
    lease.check()
    if await with_retry(partial(_exists, store, wal_key(dataset, job)), policy):
        return AbortResult(dataset=dataset, job=job, status="commit_in_progress")
    if await with_retry(partial(_exists, store, manifest_key(dataset, job)), policy):
        return AbortResult(dataset=dataset, job=job, status="already_committed")
    ctx = StepContext(store=store, lease=lease, settings=settings, clock=clock)
    deleted = await with_retry(partial(delete_prefixes, ctx, [staging_prefix(job, dataset)]), policy)
    return AbortResult(dataset=dataset, job=job, status="aborted", files_deleted=deleted)


class _NoLease:
    """The lease of work that needs no lock: never lost."""

    name = "-"
    epoch = 0

    def check(self) -> None:
        return None


async def cleanup_staged_attempt(
    store: ObjectStore,
    job: str,
    dataset: str,
    task: int,
    attempt: int,
    *,
    lease: Lease | None = None,
    settings: Settings | None = None,
) -> int:
    """Delete one attempt's staged files (a late event of a job that has ended).

    The worker calls this for attempts that can no longer be committed: late
    or duplicate ``TaskFinished`` events of an aborted job, or of a committed
    job's losing attempts. While a log exists for (dataset, job) nothing is
    deleted (the attempt may be a winner the commit is publishing; the
    commit's own clean-up removes the rest).

    Returns:
        How many objects were deleted (0 when a commit is in progress).

    Raises:
        LockLost: ``lease`` was given and lost.
        TransientError: the store kept failing past the budget.
    """
    settings = settings or Settings()
    policy = commit_policy(settings)
    held: Lease = lease if lease is not None else _NoLease()
    held.check()
    if await with_retry(partial(_exists, store, wal_key(dataset, job)), policy):
        return 0
    ctx = StepContext(store=store, lease=held, settings=settings)
    return await with_retry(
        partial(delete_prefixes, ctx, [staging_prefix(job, dataset, task, attempt)]), policy
    )


__all__ = ["abort_dataset", "cleanup_staged_attempt"]
