"""The one call the worker makes to commit a dataset of a finished job."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import msgspec

from .._retry import RetryPolicy
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectInfo, ObjectStore
from ._bounded import for_each_bounded
from ._errors import CommitStepFailed
from ._execute import commit_policy, execute_sequence, run_claimed
from ._model import CommitRequest, Manifest
from ._plan import plan_commit
from ._publish import PublishFile
from ._publish_phase import list_staging
from ._recovery import UnfinishedSequence, list_unfinished, recover_dataset
from ._registry import StepRegistry
from ._results import CommitResult
from ._steps import CommitStep, read_manifest
from ._wal import CommitSequence, claim_sequence, create_sequence, with_retry


def _found_committed(req: CommitRequest, manifest: Manifest) -> CommitResult:
    """Return the result of a commit whose manifest was already in the store."""
    return CommitResult(
        dataset=req.dataset,
        job=req.job,
        status="committed",
        files=len(manifest.files),
        bytes=manifest.bytes,
        already_committed=True,
    )


async def _survey(
    store: ObjectStore, req: CommitRequest, policy: RetryPolicy, registry: StepRegistry | None
) -> tuple[list[UnfinishedSequence], dict[str, ObjectInfo]]:
    """One round: the dataset's logs, and the job's staging folder for the dataset, listed together."""
    unfinished: list[UnfinishedSequence] = []
    staged: dict[str, ObjectInfo] = {}

    async def logs() -> None:
        unfinished[:] = await with_retry(
            partial(list_unfinished, store, req.dataset, registry=registry), policy
        )

    async def staging() -> None:
        staged.update(await list_staging(store, req.job, req.dataset, policy))

    async def call(fn: Callable[[], Awaitable[None]]) -> None:
        await fn()

    await for_each_bounded([logs, staging], call, 2)
    return unfinished, staged


async def _fresh(
    store: ObjectStore,
    req: CommitRequest,
    seq: CommitSequence,
    staged: dict[str, ObjectInfo],
    lease: Lease,
    settings: Settings,
    registry: StepRegistry | None,
    clock: Callable[[], float],
) -> CommitResult:
    """Commit ``seq`` when the survey found no log of the dataset.

    A manifest can exist only once every winner's staged file is gone (the
    sources are deleted before the manifest is written, and never come back):
    when the listing shows every source, the manifest is not read.
    """
    publishes = [s for s in seq.steps if isinstance(s, PublishFile)]
    if not publishes or any(s.src not in staged for s in publishes):
        manifest = await read_manifest(store, req.dataset, req.job)
        if manifest is not None:
            return _found_committed(req, manifest)
    handle, created = await create_sequence(
        store, seq, lease, policy=commit_policy(settings), registry=registry, clock=clock
    )
    return await run_claimed(
        handle, store, lease, settings, recovered=not created, listed=staged if created else None, clock=clock
    )


async def commit_dataset(
    store: ObjectStore,
    req: CommitRequest,
    lease: Lease,
    settings: Settings,
    *,
    registry: StepRegistry | None = None,
    extra_steps: Sequence[CommitStep] = (),
    clock: Callable[[], float] = time.time,
) -> CommitResult:
    """Commit ``req`` exactly once, under the dataset's lock (``lease``).

    0. One round: list the dataset's logs and the job's staging folder for
       the dataset together. No log (the usual case): skip 1 and 2, and read
       the manifest in 3 only when the listing misses a winner's file.
    1. Finish every other unfinished sequence of the dataset, oldest first. A
       quarantined or unreadable one blocks the dataset: ``blocked``.
    2. If this job's log exists, recover it (``recovered``).
    3. Else, if this job's manifest exists, it is already committed: the
       result repeats the manifest's figures (``already_committed``).
    4. Else plan, write the log, execute (the sources judged on the listing).

    The lock is not taken here: the caller holds it and passes its lease.

    Returns:
        ``committed``, ``quarantined`` or ``blocked`` (see :class:`CommitResult`).

    Raises:
        BadInput: the request is inconsistent (see :func:`plan_commit`).
        LockLost / Fenced: the lease was lost, or a newer holder took over.
        TransientError: the store failed past the budget on the log itself.

    Cancelled: whatever ran is idempotent; the next holder verifies it.
    """
    start = time.monotonic()
    lease.check()

    earlier: list[CommitResult] = []

    def finish(res: CommitResult, recovered_jobs: list[str]) -> CommitResult:
        return msgspec.structs.replace(
            res, recovered_jobs=recovered_jobs, earlier=earlier, duration=time.monotonic() - start
        )

    def blocked(by: str, reason: str | None, recovered_jobs: list[str]) -> CommitResult:
        res = CommitResult(
            dataset=req.dataset, job=req.job, status="blocked", blocked_by=by, quarantined=reason
        )
        return finish(res, recovered_jobs)

    policy = commit_policy(settings)
    unfinished, staged = await _survey(store, req, policy, registry)
    if not unfinished:
        # The fast path: no log of the dataset is left, so nothing to recover.
        seq = plan_commit(req, lease.epoch, now=clock(), extra_steps=extra_steps)
        try:
            return finish(await _fresh(store, req, seq, staged, lease, settings, registry, clock), [])
        except CommitStepFailed as exc:
            # A log appeared meanwhile that cannot be read: it blocks the dataset.
            return blocked(req.job, str(exc), [])

    recovery = await recover_dataset(
        store, req.dataset, lease, settings, registry=registry, exclude_job=req.job, clock=clock
    )
    earlier.extend(recovery.results)
    recovered_jobs = [r.job for r in recovery.results if r.ok]
    if recovery.blocked_by is not None:
        return blocked(recovery.blocked_by, recovery.reason, recovered_jobs)

    try:
        handle = await claim_sequence(
            store, req.dataset, req.job, lease, policy=policy, registry=registry, clock=clock
        )
        if handle is not None:
            res = await run_claimed(handle, store, lease, settings, recovered=True, clock=clock)
            return finish(res, recovered_jobs)
        manifest = await read_manifest(store, req.dataset, req.job)
    except CommitStepFailed as exc:
        return blocked(req.job, str(exc), recovered_jobs)
    if manifest is not None:
        return finish(_found_committed(req, manifest), recovered_jobs)

    seq = plan_commit(req, lease.epoch, now=clock(), extra_steps=extra_steps)
    try:
        res = await execute_sequence(store, seq, lease, settings, registry=registry, clock=clock)
    except CommitStepFailed as exc:
        # A log appeared meanwhile that cannot be read: it blocks the dataset.
        return blocked(req.job, str(exc), recovered_jobs)
    return finish(res, recovered_jobs)


__all__ = ["commit_dataset"]
