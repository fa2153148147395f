"""The storage lock's record and its pure decisions (no I/O, no clock of its own).

A lock is one JSON object at ``_locks/<name>.json`` holding a :class:`LockRecord`.
Everything here takes the time (wall clock ``now``, or a monotonic instant) and
what was read from the store as arguments, and returns what to do, so the async
layer in ``_lock.py`` only performs I/O and the rules can be tested exhaustively.

Timing rules (``s`` is a :class:`~shared.settings.LockSettings`):

- A record is *held* until ``expires_at + s.max_drift`` by the reader's wall
  clock; after that (or once ``released``) anyone may take it over.
- The holder trusts its lease only until ``start + s.validity - s.max_drift`` by
  its own monotonic clock, where ``start`` is when it *sent* the write that set
  ``expires_at`` (the acquisition or the last successful renewal). With clocks
  that differ by at most ``max_drift``, the holder stops acting before anyone
  else may take the lock over.
"""

from __future__ import annotations

import enum
import math
import random
import re
from collections.abc import Collection
from dataclasses import dataclass

import msgspec

from .._errors import BadInput
from ..settings import LockSettings

RECORD_VERSION = 1
LOCKS_PREFIX = "_locks/"
# A letter or digit first for dataset locks; a leading "_" for fleet-wide locks
# (the coordinator's election), which no dataset name can take.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=-]{0,127}$")
# Wait a hair past the expiry instant so the re-read sees it expired, not equal.
_PAST_EXPIRY = 0.001


class LockRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The body of a lock object (schema version ``v``).

    ``epoch`` goes up by one on every acquisition (the fencing token) and stays
    the same across renewals and the release of one holding. ``nonce`` is fresh
    on every write, so the object's bytes (and an MD5 ETag) change on every
    write, and so a writer can recognise its own write when the answer to the
    write was lost or wrong. Times are Unix seconds by the writer's clock.
    """

    v: int = RECORD_VERSION
    owner: str
    epoch: int
    acquired_at: float
    expires_at: float
    released: bool = False
    nonce: str


@dataclass(frozen=True, slots=True)
class Observed:
    """A lock record together with the store version it was read at."""

    record: LockRecord
    version: str


# -- decisions of an acquirer ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create:
    """No lock object exists: create it (create-if-absent) with epoch 1."""


@dataclass(frozen=True, slots=True)
class TakeOver:
    """The lock is free: overwrite it if it is still at ``version``.

    ``reason`` is ``"released"`` (the holder let go) or ``"expired"`` (the
    holder stopped renewing: a takeover worth logging).
    """

    version: str
    previous: LockRecord
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Someone holds the lock, at the latest until ``until`` (wall clock)."""

    until: float
    holder: LockRecord


@dataclass(frozen=True, slots=True)
class Ours:
    """The object shows one of our own writes: we hold it at ``version``.

    Happens when a write that reported failure (a retried request answering
    412, a timeout) had in fact succeeded: the "ghost lock" case.
    """

    version: str
    record: LockRecord


Decision = Create | TakeOver | Wait | Ours


def lock_key(name: str) -> str:
    """Return the object key of the lock called ``name``.

    Raises:
        BadInput: ``name`` is not one path segment of letters, digits and
            ``_ . = -`` (starting with a letter, digit or ``_``, at most 128 chars).
    """
    if not _NAME.match(name):
        raise BadInput(f"bad lock name {name!r}: use letters, digits and _.=- (one path segment)")
    return f"{LOCKS_PREFIX}{name}.json"


def validate_record(record: LockRecord) -> LockRecord:
    """Return ``record`` when it is a well-formed lock record.

    Raises:
        BadInput: unknown schema version, empty owner or nonce, epoch below 1,
            or times that are not finite.
    """
    if record.v != RECORD_VERSION:
        raise BadInput(f"lock record has schema version {record.v}, this build knows {RECORD_VERSION}")
    if not record.owner or not record.nonce:
        raise BadInput("lock record has an empty owner or nonce")
    if record.epoch < 1:
        raise BadInput(f"lock record has epoch {record.epoch} < 1")
    if not (math.isfinite(record.expires_at) and math.isfinite(record.acquired_at)):
        raise BadInput("lock record has a time that is not finite")
    return record


def encode_record(record: LockRecord) -> bytes:
    """Return the JSON bytes stored for ``record``."""
    return msgspec.json.encode(record)


def decode_record(data: bytes) -> LockRecord:
    """Return the validated record stored in ``data``.

    Raises:
        BadInput: not JSON, not a lock record, or not valid (see
            :func:`validate_record`).
    """
    try:
        record = msgspec.json.decode(data, type=LockRecord)
    except msgspec.DecodeError as exc:
        raise BadInput(f"lock object is not a valid lock record: {exc}") from None
    return validate_record(record)


def held_until(record: LockRecord, settings: LockSettings) -> float:
    """Return the wall-clock instant after which ``record`` may be taken over (if not released)."""
    return record.expires_at + settings.max_drift


def is_held(record: LockRecord, now: float, settings: LockSettings) -> bool:
    """Return whether ``record`` still holds the lock at wall-clock ``now``."""
    return not record.released and now <= held_until(record, settings)


def decide_acquire(
    observed: Observed | None,
    *,
    now: float,
    owner: str,
    nonces: Collection[str],
    settings: LockSettings,
) -> Decision:
    """Decide what an acquirer does after reading the lock object.

    ``observed`` is what was read (None: no object). ``nonces`` are the nonces
    of this acquirer's own claim writes whose outcome it does not know yet.

    Returns:
        :class:`Ours` if the object shows one of those writes (held, not
        released); else :class:`Create` if there is no object;
        :class:`TakeOver` if it is released or expired
        (``now > expires_at + max_drift``); else :class:`Wait`.
    """
    if observed is None:
        return Create()
    rec = observed.record
    if not rec.released and rec.owner == owner and rec.nonce in nonces:
        return Ours(version=observed.version, record=rec)
    if rec.released:
        return TakeOver(version=observed.version, previous=rec, reason="released")
    if now > held_until(rec, settings):
        return TakeOver(version=observed.version, previous=rec, reason="expired")
    return Wait(until=held_until(rec, settings), holder=rec)


def next_epoch(previous: LockRecord | None) -> int:
    """Return the epoch of the next acquisition after ``previous`` (1 for a new lock)."""
    return 1 if previous is None else previous.epoch + 1


def claim_record(
    decision: Create | TakeOver, *, owner: str, now: float, nonce: str, settings: LockSettings
) -> LockRecord:
    """Return the record an acquirer writes to carry out ``decision`` at wall-clock ``now``."""
    previous = decision.previous if isinstance(decision, TakeOver) else None
    return LockRecord(
        owner=owner,
        epoch=next_epoch(previous),
        acquired_at=now,
        expires_at=now + settings.validity,
        nonce=nonce,
    )


def renewed_record(held: LockRecord, *, now: float, nonce: str, settings: LockSettings) -> LockRecord:
    """Return ``held`` extended to ``now + validity``, with a fresh nonce (same owner and epoch)."""
    return msgspec.structs.replace(held, expires_at=now + settings.validity, nonce=nonce)


def released_record(held: LockRecord, *, now: float, nonce: str) -> LockRecord:
    """Return ``held`` marked released at ``now``, with a fresh nonce (same owner and epoch)."""
    return msgspec.structs.replace(held, released=True, expires_at=min(held.expires_at, now), nonce=nonce)


# -- after a write whose answer cannot be trusted ----------------------------------


class Resolution(enum.Enum):
    """What re-reading the lock object says about the holder's own writes."""

    #: The object shows one of our writes (the one we tried or an earlier one).
    OURS = "ours"
    #: The object is still at the version we last knew: nothing landed; retry is safe.
    UNCHANGED = "unchanged"
    #: Someone else wrote the object, or it is gone: the lock is no longer ours.
    SUPERSEDED = "superseded"


def resolve_holder_write(
    current: Observed | None,
    *,
    owner: str,
    epoch: int,
    known_version: str,
    nonces: Collection[str],
) -> Resolution:
    """Classify the lock object as re-read by a holder after an ambiguous write.

    ``known_version`` is the last version the holder knows it wrote; ``nonces``
    are the nonces of its writes since then whose outcome is unknown.

    Returns:
        :attr:`Resolution.OURS` when the object carries our owner, epoch and
        one of ``nonces``; :attr:`Resolution.UNCHANGED` when it is still at
        ``known_version``; :attr:`Resolution.SUPERSEDED` otherwise.
    """
    if current is None:
        return Resolution.SUPERSEDED
    rec = current.record
    if rec.owner == owner and rec.epoch == epoch and rec.nonce in nonces:
        return Resolution.OURS
    if current.version == known_version:
        return Resolution.UNCHANGED
    return Resolution.SUPERSEDED


# -- timing -------------------------------------------------------------------------


def local_deadline(write_started: float, settings: LockSettings) -> float:
    """Return the monotonic instant until which a holder may trust its lease.

    ``write_started`` is the monotonic instant at which the write that set the
    current ``expires_at`` was sent.
    """
    return write_started + settings.validity - settings.max_drift


def poll_delay(
    attempt: int, *, now: float, until: float | None, settings: LockSettings, rng: random.Random
) -> float:
    """Return how long a waiting acquirer sleeps before its next look.

    Full-jitter exponential backoff, drawn from ``[poll_min, min(poll_max,
    poll_min * 2**attempt)]``, and never past the moment the holder's claim
    runs out (``until``, wall clock) when that is sooner.
    """
    cap = min(settings.poll_max, settings.poll_min * (2 ** min(attempt, 30)))
    delay = rng.uniform(settings.poll_min, cap)
    if until is not None:
        delay = min(delay, max(0.0, until - now) + _PAST_EXPIRY)
    return delay


__all__ = [
    "LOCKS_PREFIX",
    "RECORD_VERSION",
    "Create",
    "Decision",
    "LockRecord",
    "Observed",
    "Ours",
    "Resolution",
    "TakeOver",
    "Wait",
    "claim_record",
    "decide_acquire",
    "decode_record",
    "encode_record",
    "held_until",
    "is_held",
    "local_deadline",
    "lock_key",
    "next_epoch",
    "poll_delay",
    "released_record",
    "renewed_record",
    "resolve_holder_write",
    "validate_record",
]
