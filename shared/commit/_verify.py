"""Verification before publishing: every staged source is checked before the first copy.

Each :class:`PublishFile` source must exist with the size its task reported
and, when the producer gave an MD5, the same MD5 as the store's own (S3
single-part ETag, GCS ``md5Hash``, Azure Content-MD5; on local files computed
by reading the file: :meth:`~shared.storage.ObjectStore.head_md5`). All
sources are checked in one parallel round (at most
``settings.commit.publish_concurrency`` reads at a time), so a sequence whose
input is wrong is quarantined with nothing in the dataset folder.

Where the store keeps no MD5 for an object (S3 multipart or SSE-KMS, GCS
composite, Azure block-committed blobs without Content-MD5) only the size can
be compared: the file is published and the manifest lists the producer's MD5
unverified (see docs/commit.md).

A source that is gone is fine only when its destination is already right (an
earlier holder published it before a crash): that step counts as done and is
not run again. Otherwise the data is lost and the sequence is quarantined.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from .._errors import CommitfleetError, LockLost, NotFound, OutcomeUnknown, TransientError
from .._retry import RetryPolicy
from ..storage import ObjectInfo, ObjectStore
from ._bounded import for_each_bounded, with_retry
from ._errors import CommitStepFailed
from ._publish import PublishFile
from ._steps import CommitStep, StepContext


async def _head(store: ObjectStore, key: str) -> ObjectInfo | None:
    try:
        return await store.head(key)
    except NotFound:
        return None


def _mismatch(step: PublishFile, got: ObjectInfo) -> str | None:
    if got.size != step.size:
        return f"staged file {step.src} is {got.size} bytes, its task reported {step.size}"
    if step.md5 is not None and got.checksum is not None and got.checksum.lower() != step.md5.lower():
        return f"staged file {step.src} has MD5 {got.checksum}, its task reported {step.md5}"
    return None


async def check_source(step: PublishFile, ctx: StepContext) -> ObjectInfo | None:
    """Check one publish step's source against what its task reported.

    Returns:
        The source's info when it is there and right (the step must run; its
        copy is pinned to this version), or None when the source is gone and
        the destination is already right (published by an earlier holder:
        the step is done).

    Raises:
        CommitStepFailed: the source differs in size or MD5, or it is gone and
            the destination is missing or wrong (data lost).
        LinkRefused / BadInput: the local store met a link or a non-file.
        TransientError / OutcomeUnknown: from the store (the caller retries).
    """
    store = ctx.store
    try:
        src = await (store.head_md5(step.src) if step.md5 is not None else store.head(step.src))
    except NotFound:
        dst = await _head(store, step.dst)
        if dst is not None and dst.size == step.size and _mismatch(step, dst) is None:
            return None
        found = "missing" if dst is None else f"{dst.size} bytes"
        raise CommitStepFailed(
            f"staged file {step.src} is missing and {step.dst} is {found}, "
            f"expected {step.size} bytes: data lost, not retrying"
        ) from None
    wrong = _mismatch(step, src)
    if wrong is not None:
        raise CommitStepFailed(wrong)
    return src


async def verify_sources(
    items: list[tuple[int, CommitStep]],
    ctx: StepContext,
    policy: RetryPolicy,
    *,
    listed: Mapping[str, ObjectInfo] | None = None,
) -> tuple[set[int], dict[str, ObjectInfo], str | None]:
    """Check the source of every :class:`PublishFile` in ``items``, in parallel (bounded).

    A source found in ``listed`` (the staging folder as listed by this holder,
    under the lock) is judged on that listing, with no request; any other is
    read (:func:`check_source`). Each read runs under ``policy`` (transient
    errors and unknown outcomes are retried). Once one check fails, no
    further check starts.

    Returns:
        The indexes of steps found already done, the verified info of each
        source still to publish (by key: the copies are pinned to it), and
        the reason the sequence must be quarantined (``publish <src> -> <dst>: verify: <error>``) or None.

    Raises:
        LockLost / Fenced: the lease was lost (checked before each read).

    Cancelled: the reads in flight are cancelled; nothing was written.
    """
    done: set[int] = set()
    verified: dict[str, ObjectInfo] = {}
    failure: list[str] = []

    async def one(item: tuple[int, CommitStep]) -> None:
        i, step = item
        assert isinstance(step, PublishFile)
        ctx.lease.check()
        try:
            info = listed.get(step.src) if listed is not None else None
            if info is not None:
                wrong = _mismatch(step, info)
                if wrong is not None:
                    raise CommitStepFailed(wrong)
            else:
                info = await with_retry(partial(check_source, step, ctx), policy)
        except LockLost:
            raise
        except CommitfleetError as exc:
            spent = "retry budget spent: " if isinstance(exc, TransientError | OutcomeUnknown) else ""
            # Same first words as a failure of the step itself (operators and
            # status displays read the step there), then what was found.
            failure.append(f"publish {step.src} -> {step.dst}: verify: {spent}{type(exc).__name__}: {exc}")
            return
        if info is None:
            done.add(i)
        else:
            verified[step.src] = info

    publishes = [(i, s) for i, s in items if isinstance(s, PublishFile)]
    await for_each_bounded(
        publishes, one, ctx.settings.commit.publish_concurrency, stop=lambda: bool(failure)
    )
    return done, verified, (failure[0] if failure else None)


__all__ = ["check_source", "verify_sources"]
