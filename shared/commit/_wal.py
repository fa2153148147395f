"""The write-ahead log, one object per (dataset, job) at ``_wal/<dataset>/<job>.json``: its reads and writes.

:class:`CommitSequence` is the document; :class:`Wal` is one holder's sight of
it, a value (key, sequence, version, epoch) that the pipeline passes from
stage to stage; :class:`WalLog` reads and writes it for one lock holder, each
write taking the last :class:`Wal` and returning the next.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from .._errors import BadInput, Fenced, NotFound, OutcomeUnknown, PreconditionFailed, TransientError
from .._nonce import nonce
from .._retry import RetryPolicy, retry
from ..events import wal_key
from ..locks import Lease
from ..storage import ObjectStore
from ._bounded import retrying
from ._errors import CommitStepFailed
from ._model import FORMAT_VERSION
from ._publish import PublishFile
from ._registry import DEFAULT_REGISTRY, StepRegistry
from ._steps import CommitStep

WAL_VERSIONS: Final = frozenset({FORMAT_VERSION, 2})
"""The log format versions this code reads. v2 (issue 31): the log holds a Delta step with ``seq``
(:class:`._delta.CommitToDelta`), whose ``txn`` version is the job's sequence, not a table version. A log
without one is still written as v1; a v1 log's Delta step reads as ``seq`` 0. A worker older than v2
cannot read a v2 log (the dataset's commits stop there with the reason) instead of taking the job's
sequence for the table version of its commit, which could land a job's Delta version twice."""


def wal_version(steps: list[CommitStep]) -> int:
    """Return the format version a log of ``steps`` is written at: the highest its steps need."""
    return max([FORMAT_VERSION, *(s.wal_version for s in steps)])


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
    if raw.v not in WAL_VERSIONS:
        raise CommitStepFailed(
            f"write-ahead log has format version {raw.v}, this reader knows {sorted(WAL_VERSIONS)}"
        )
    steps = (registry or DEFAULT_REGISTRY).decode_steps(raw.steps)
    fields = {f: getattr(raw, f) for f in raw.__struct_fields__ if f != "steps"}
    return CommitSequence(**fields, steps=steps)


@dataclass(frozen=True, slots=True)
class Wal:
    """One holder's sight of a log: its key, its content and the version it was read or written at."""

    key: str
    sequence: CommitSequence
    version: str

    @property
    def epoch(self) -> int:
        """The lock epoch of the holder that last wrote the log."""
        return self.sequence.epoch


async def read_wal(store: ObjectStore, key: str, registry: StepRegistry | None = None) -> Wal | None:
    """Return the log at ``key`` as read now, or None when there is none.

    Raises:
        CommitStepFailed: the log is unreadable (also: a link or a non-file in
            a local store, where the log should be).
        TransientError / OutcomeUnknown: from the store.
    """
    try:
        obj = await store.read(key)
    except NotFound:
        return None
    except BadInput as exc:
        raise CommitStepFailed(f"{key} is unreadable: {exc}") from exc
    try:
        return Wal(key, decode_sequence(obj.data, registry), obj.info.version)
    except CommitStepFailed as exc:
        raise CommitStepFailed(f"{key}: {exc}") from exc


async def read_sequence(
    store: ObjectStore, dataset: str, job: str, registry: StepRegistry | None = None
) -> CommitSequence | None:
    """Return the unfinished sequence of (dataset, job), or None when there is none.

    Raises:
        CommitStepFailed: the log is unreadable.
    """
    found = await read_wal(store, wal_key(dataset, job), registry)
    return None if found is None else found.sequence


class WalLog:
    """The write-ahead logs as one lock holder reads and writes them (see the module doc).

    Built per call of the core with what every log request needs: the store,
    the holder's lease (its epoch fences every write; it is checked before
    each request), the retry policy (unknown outcomes retried too), the step
    registry and the clock. It keeps no log state: each method takes and
    returns :class:`Wal` values.
    """

    def __init__(
        self,
        store: ObjectStore,
        lease: Lease,
        *,
        policy: RetryPolicy,
        registry: StepRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._lease = lease
        self._policy = retrying(policy)
        self._registry = registry
        self._clock = clock

    async def read(self, dataset: str, job: str) -> Wal | None:
        """Return the log of (dataset, job) as read now, or None when there is none.

        Raises:
            LockLost: our lease is no longer valid (checked first).
            CommitStepFailed: the log is unreadable.
        """
        self._lease.check()
        return await read_wal(self._store, wal_key(dataset, job), self._registry)

    def refuse_newer(self, wal: Wal) -> None:
        """Raise :class:`Fenced` when ``wal`` shows a higher epoch than ours (never touched then)."""
        if wal.epoch > self._lease.epoch:
            raise Fenced(f"{wal.key} is held by epoch {wal.epoch}, ours is {self._lease.epoch}")

    async def claim(self, wal: Wal) -> Wal:
        """Rewrite the log with our epoch and one more attempt, before any step runs.

        A quarantined log is returned as it is, unclaimed (no write).

        Raises:
            Fenced: the log is held by a higher epoch, or was rewritten under us.
            LockLost, TransientError: as :meth:`write`.
        """
        self.refuse_newer(wal)
        if wal.sequence.quarantined is not None:
            return wal
        return await self.write(wal, attempts=wal.sequence.attempts + 1)

    def _claim_existing(self, wal: Wal, seq: CommitSequence) -> None:
        if (wal.sequence.dataset, wal.sequence.job) != (seq.dataset, seq.job):
            raise CommitStepFailed(
                f"{wal.key} holds dataset {wal.sequence.dataset!r} job {wal.sequence.job!r}"
            )

    async def create(self, seq: CommitSequence) -> tuple[Wal, bool]:
        """Create the log for ``seq`` with create-if-absent, without reading it first.

        For a holder that has just listed the dataset's logs under the lock
        and found none: one request. A log that is there after all (written
        since, or the answer to a retry of our own create) is read and claimed
        as :meth:`open` does.

        Returns:
            ``(wal, created)``; ``created`` is False when a log already existed.

        Raises:
            As :meth:`open`.
        """
        self._lease.check()
        key = wal_key(seq.dataset, seq.job)
        fresh = msgspec.structs.replace(
            seq,
            epoch=self._lease.epoch,
            attempts=1,
            quarantined=None,
            nonce=nonce(),
            updated_at=self._clock(),
        )
        body = encode_sequence(fresh)

        async def attempt() -> tuple[Wal, bool]:
            try:
                info = await self._store.write_if_absent(key, body)
            except BadInput as exc:  # a link or a non-file in a local store
                raise CommitStepFailed(f"{key} is unreadable (cannot be created): {exc}") from exc
            except (PreconditionFailed, OutcomeUnknown) as exc:
                found = await read_wal(self._store, key, self._registry)
                if found is None:
                    raise TransientError(f"create of {key} did not land") from exc
                return found, found.sequence.nonce == fresh.nonce
            return Wal(key, fresh, info.version), True

        wal, created = await retry(attempt, self._policy)
        if created:
            return wal, True
        self._claim_existing(wal, seq)
        return await self.claim(wal), False

    async def open(self, seq: CommitSequence) -> tuple[Wal, bool]:
        """Create the log for ``seq``, or claim the one already there for its (dataset, job).

        A claimed log keeps its own steps (a previous holder may have run some
        of them), not ``seq``'s. A quarantined log is returned as it is, unclaimed.

        Returns:
            ``(wal, created)``; ``created`` is False when a log already existed.

        Raises:
            Fenced: the log is held by a higher epoch, or was rewritten under us.
            LockLost: our lease is no longer valid.
            CommitStepFailed: the existing log is unreadable or names another dataset or job.
            TransientError: the store kept failing past the retry budget.
        """
        found = await self.read(seq.dataset, seq.job)
        if found is None:
            return await self.create(seq)
        self._claim_existing(found, seq)
        return await self.claim(found), False

    async def write(self, wal: Wal, **changes: object) -> Wal:
        """Rewrite the log with ``changes``, our epoch and a new nonce, if nobody wrote it since ``wal``.

        Returns:
            The log as written.

        Raises:
            Fenced: another holder wrote or removed the log since we last did.
            LockLost: our lease is no longer valid (checked first).
            TransientError: the store kept failing past the retry budget.

        Cancelled: the write may or may not have landed; the next holder's
        claim resolves it by version.
        """
        self._lease.check()
        new = msgspec.structs.replace(
            wal.sequence,
            **changes,
            epoch=self._lease.epoch,
            nonce=nonce(),
            updated_at=self._clock(),
        )
        body = encode_sequence(new)
        version = wal.version

        async def attempt() -> str:
            try:
                return (await self._store.write_if_match(wal.key, body, version)).version
            except (PreconditionFailed, OutcomeUnknown) as exc:
                return await self._resolve(wal.key, version, new.nonce, exc)

        return Wal(wal.key, new, await retry(attempt, self._policy))

    async def _resolve(self, key: str, version: str, nonce: str, exc: Exception) -> str:
        found = await read_wal(self._store, key, self._registry)
        if found is None:
            raise Fenced(f"{key} was removed by another holder (we hold epoch {self._lease.epoch})") from exc
        if found.sequence.nonce == nonce:
            return found.version  # our write landed; the error answered a retry of it
        if found.version == version:
            # Our write did not land and nobody else wrote: try again.
            raise TransientError(f"write of {key} did not land") from exc
        raise Fenced(
            f"{key} was rewritten by epoch {found.epoch} (we hold epoch {self._lease.epoch})"
        ) from exc

    async def delete(self, wal: Wal) -> None:
        """Remove the log (the sequence is finished or abandoned).

        Raises:
            LockLost: our lease is no longer valid (checked first).
            TransientError: the store kept failing past the retry budget.
        """
        self._lease.check()
        await retry(lambda: self._store.delete(wal.key), self._policy)


__all__ = [
    "CommitSequence",
    "Wal",
    "WalLog",
    "decode_sequence",
    "encode_sequence",
    "read_sequence",
    "read_wal",
]
