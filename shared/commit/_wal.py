"""The commit-step store: one write-ahead log object per (dataset, job) at ``_wal/<dataset>/<job>.json``.

Rules (they close the holes of Gobblin's store):

- Create is atomic: ``write_if_absent``, carrying the creator's lock epoch.
- Every later write is ``write_if_match`` on the version last read or written,
  and carries the writer's epoch and a fresh nonce (so a content-hash version
  such as an S3 ETag always changes).
- A holder first re-reads the log and rewrites it with its own epoch (the
  *claim*) before it runs any step. From then on a stale holder's next write
  fails its version check: it re-reads, sees someone else's nonce, and raises
  :class:`~shared._errors.Fenced`.
- A log showing an epoch higher than ours is never touched: ``Fenced``.
- An ambiguous write (``OutcomeUnknown``, or a ``PreconditionFailed`` that may
  be the answer to an SDK retry of our own successful write) is resolved by
  re-reading and comparing the nonce, never assumed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec

from .._errors import BadInput, Fenced, NotFound, OutcomeUnknown, PreconditionFailed, TransientError
from .._nonce import nonce
from .._retry import RetryPolicy, retry
from ..events import wal_key
from ..locks import Lease
from ..storage import ObjectStore
from ._errors import CommitStepFailed
from ._model import FORMAT_VERSION
from ._publish import PublishFile
from ._registry import DEFAULT_REGISTRY, StepRegistry
from ._steps import CommitStep

T = TypeVar("T")


class CommitSequence(msgspec.Struct, frozen=True, kw_only=True):
    """One dataset's commit of one job: the ordered steps and the log's bookkeeping.

    ``epoch`` is the lock epoch of the holder that last wrote the log;
    ``attempts`` counts the executions started on it; ``quarantined`` is the
    reason it was set aside (None while it may run); ``done`` lists the indexes
    of steps a holder saw done (a progress hint for people: recovery verifies
    every step again); ``nonce`` changes on every write.
    """

    v: int = FORMAT_VERSION
    dataset: str
    job: str
    epoch: int
    steps: list[CommitStep]
    created_at: float
    updated_at: float = 0.0
    attempts: int = 0
    quarantined: str | None = None
    done: list[int] = msgspec.field(default_factory=list)
    nonce: str = ""

    @property
    def files(self) -> int:
        """How many files the sequence publishes."""
        return sum(1 for s in self.steps if isinstance(s, PublishFile))

    @property
    def bytes(self) -> int:
        """How many bytes the sequence publishes."""
        return sum(s.size for s in self.steps if isinstance(s, PublishFile))


class _RawSequence(msgspec.Struct, frozen=True, kw_only=True):
    v: int
    dataset: str
    job: str
    epoch: int
    steps: msgspec.Raw
    created_at: float
    updated_at: float = 0.0
    attempts: int = 0
    quarantined: str | None = None
    done: list[int] = msgspec.field(default_factory=list)
    nonce: str = ""


_encoder = msgspec.json.Encoder()
_raw_decoder = msgspec.json.Decoder(_RawSequence)


def encode_sequence(seq: CommitSequence) -> bytes:
    """Return the log document's bytes."""
    return _encoder.encode(seq)


def decode_sequence(data: bytes, registry: StepRegistry | None = None) -> CommitSequence:
    """Return the sequence a log document holds.

    Raises:
        CommitStepFailed: malformed, another format version, or a step kind
            ``registry`` (default: the process-wide one) does not know.
    """
    try:
        raw = _raw_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CommitStepFailed(f"write-ahead log unreadable: {exc}") from exc
    if raw.v != FORMAT_VERSION:
        raise CommitStepFailed(
            f"write-ahead log has format version {raw.v}, this reader knows {FORMAT_VERSION}"
        )
    steps = (registry or DEFAULT_REGISTRY).decode_steps(raw.steps)
    fields = {f: getattr(raw, f) for f in raw.__struct_fields__ if f != "steps"}
    return CommitSequence(**fields, steps=steps)


async def read_sequence_at(
    store: ObjectStore, key: str, registry: StepRegistry | None = None
) -> tuple[CommitSequence, str] | None:
    """Return ``(sequence, version)`` of the log at ``key``, or None when there is none.

    Raises:
        CommitStepFailed: the log is unreadable (also: a link or a non-file in
            a local store, where the log should be).
    """
    try:
        obj = await store.read(key)
    except NotFound:
        return None
    except BadInput as exc:
        raise CommitStepFailed(f"{key} is unreadable: {exc}") from exc
    try:
        return decode_sequence(obj.data, registry), obj.info.version
    except CommitStepFailed as exc:
        raise CommitStepFailed(f"{key}: {exc}") from exc


async def read_sequence(
    store: ObjectStore, dataset: str, job: str, registry: StepRegistry | None = None
) -> CommitSequence | None:
    """Return the unfinished sequence of (dataset, job), or None when there is none.

    Raises:
        CommitStepFailed: the log is unreadable.
    """
    found = await read_sequence_at(store, wal_key(dataset, job), registry)
    return None if found is None else found[0]


def _retrying(policy: RetryPolicy) -> RetryPolicy:
    # Unknown outcomes are retried too: every attempt starts by re-reading.
    return RetryPolicy(
        attempts=policy.attempts,
        initial=policy.initial,
        maximum=policy.maximum,
        budget=policy.budget,
        retry_on=(TransientError, OutcomeUnknown),
        wait=policy.wait,
    )


class WalHandle:
    """The log of one sequence as held by one lock holder: its content and version."""

    def __init__(
        self,
        store: ObjectStore,
        seq: CommitSequence,
        version: str,
        lease: Lease,
        *,
        policy: RetryPolicy,
        registry: StepRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._seq = seq
        self._version = version
        self._lease = lease
        self._policy = _retrying(policy)
        self._registry = registry
        self._clock = clock
        self.key = wal_key(seq.dataset, seq.job)

    @property
    def sequence(self) -> CommitSequence:
        """The content as last written or read by this holder."""
        return self._seq

    async def write(self, **changes: object) -> CommitSequence:
        """Rewrite the log with ``changes``, our epoch and a new nonce, if nobody wrote it since.

        Returns:
            The sequence as written.

        Raises:
            Fenced: another holder wrote or removed the log since we last did.
            LockLost: our lease is no longer valid (checked first).
            TransientError: the store kept failing past the retry budget.

        Cancelled: the write may or may not have landed; the next holder's
        claim resolves it by version.
        """
        self._lease.check()
        new = msgspec.structs.replace(
            self._seq,
            **changes,
            epoch=self._lease.epoch,
            nonce=nonce(),
            updated_at=self._clock(),
        )
        body = encode_sequence(new)

        async def attempt() -> str:
            try:
                return (await self._store.write_if_match(self.key, body, self._version)).version
            except (PreconditionFailed, OutcomeUnknown) as exc:
                return await self._resolve(new.nonce, exc)

        self._version = await retry(attempt, self._policy)
        self._seq = new
        return new

    async def _resolve(self, nonce: str, exc: Exception) -> str:
        found = await read_sequence_at(self._store, self.key, self._registry)
        if found is None:
            raise Fenced(
                f"{self.key} was removed by another holder (we hold epoch {self._lease.epoch})"
            ) from exc
        current, version = found
        if current.nonce == nonce:
            return version  # our write landed; the error answered a retry of it
        if version == self._version:
            # Our write did not land and nobody else wrote: try again.
            raise TransientError(f"write of {self.key} did not land") from exc
        raise Fenced(
            f"{self.key} was rewritten by epoch {current.epoch} (we hold epoch {self._lease.epoch})"
        ) from exc

    async def delete(self) -> None:
        """Remove the log (the sequence is finished or abandoned).

        Raises:
            LockLost: our lease is no longer valid (checked first).
            TransientError: the store kept failing past the retry budget.
        """
        self._lease.check()
        await retry(lambda: self._store.delete(self.key), self._policy)


async def _create(
    store: ObjectStore, seq: CommitSequence, key: str, policy: RetryPolicy, registry: StepRegistry | None
) -> tuple[CommitSequence, str, bool]:
    body = encode_sequence(seq)

    async def attempt() -> tuple[CommitSequence, str, bool]:
        try:
            info = await store.write_if_absent(key, body)
        except BadInput as exc:  # a link or a non-file in a local store
            raise CommitStepFailed(f"{key} is unreadable (cannot be created): {exc}") from exc
        except (PreconditionFailed, OutcomeUnknown) as exc:
            found = await read_sequence_at(store, key, registry)
            if found is None:
                raise TransientError(f"create of {key} did not land") from exc
            current, version = found
            return current, version, current.nonce == seq.nonce
        return seq, info.version, True

    return await retry(attempt, _retrying(policy))


async def _claim(handle: WalHandle, lease: Lease) -> WalHandle:
    current = handle.sequence
    if current.epoch > lease.epoch:
        raise Fenced(f"{handle.key} is held by epoch {current.epoch}, ours is {lease.epoch}")
    if current.quarantined is None:
        await handle.write(attempts=current.attempts + 1)
    return handle


async def open_sequence(
    store: ObjectStore,
    seq: CommitSequence,
    lease: Lease,
    *,
    policy: RetryPolicy,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[WalHandle, bool]:
    """Create the log for ``seq``, or claim the one already there for its (dataset, job).

    A claimed log keeps its own steps (a previous holder may have run some of
    them), not ``seq``'s. A quarantined log is returned as it is, unclaimed.

    Returns:
        ``(handle, created)``; ``created`` is False when a log already existed.

    Raises:
        Fenced: the log is held by a higher epoch, or was rewritten under us.
        LockLost: our lease is no longer valid.
        CommitStepFailed: the existing log is unreadable or names another dataset or job.
        TransientError: the store kept failing past the retry budget.
    """
    lease.check()
    found = await read_sequence_at(store, wal_key(seq.dataset, seq.job), registry)
    if found is None:
        return await create_sequence(store, seq, lease, policy=policy, registry=registry, clock=clock)
    current, version = found
    handle = WalHandle(store, current, version, lease, policy=policy, registry=registry, clock=clock)
    return await _claim_existing(handle, seq, lease), False


async def _claim_existing(handle: WalHandle, seq: CommitSequence, lease: Lease) -> WalHandle:
    current = handle.sequence
    if (current.dataset, current.job) != (seq.dataset, seq.job):
        raise CommitStepFailed(f"{handle.key} holds dataset {current.dataset!r} job {current.job!r}")
    return await _claim(handle, lease)


async def create_sequence(
    store: ObjectStore,
    seq: CommitSequence,
    lease: Lease,
    *,
    policy: RetryPolicy,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[WalHandle, bool]:
    """Create the log for ``seq`` with create-if-absent, without reading it first.

    For a holder that has just listed the dataset's logs under the lock and
    found none: one request. A log that is there after all (written since, or
    the answer to a retry of our own create) is read and claimed as
    :func:`open_sequence` does.

    Returns:
        ``(handle, created)``, as :func:`open_sequence`.

    Raises:
        As :func:`open_sequence`.
    """
    lease.check()
    key = wal_key(seq.dataset, seq.job)
    fresh = msgspec.structs.replace(
        seq,
        epoch=lease.epoch,
        attempts=1,
        quarantined=None,
        nonce=nonce(),
        updated_at=clock(),
    )
    current, version, created = await _create(store, fresh, key, policy, registry)
    handle = WalHandle(store, current, version, lease, policy=policy, registry=registry, clock=clock)
    if created:
        return handle, True
    return await _claim_existing(handle, seq, lease), False


async def claim_sequence(
    store: ObjectStore,
    dataset: str,
    job: str,
    lease: Lease,
    *,
    policy: RetryPolicy,
    registry: StepRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> WalHandle | None:
    """Claim the existing log of (dataset, job) for this holder; None when there is none.

    A quarantined log is returned unclaimed (no write).

    Raises:
        Fenced, LockLost, CommitStepFailed, TransientError: as :func:`open_sequence`.
    """
    lease.check()
    key = wal_key(dataset, job)
    found = await read_sequence_at(store, key, registry)
    if found is None:
        return None
    current, version = found
    handle = WalHandle(store, current, version, lease, policy=policy, registry=registry, clock=clock)
    return await _claim(handle, lease)


async def with_retry(fn: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """Run ``fn`` under ``policy``, also retrying unknown outcomes. Returns what ``fn`` returned."""
    return await retry(fn, _retrying(policy))


__all__ = [
    "CommitSequence",
    "WalHandle",
    "claim_sequence",
    "create_sequence",
    "decode_sequence",
    "encode_sequence",
    "open_sequence",
    "read_sequence",
    "read_sequence_at",
    "with_retry",
]
