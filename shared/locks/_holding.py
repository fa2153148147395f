"""One holding of a storage lock as its holder knows it, and the conditional writes that keep it.

A :class:`LockHandle` is what a holding needs of its lock (the store, the
key, the timing, the clocks, the release policy), no more: the lock builds one
and hands it to each of its leases. A :class:`Holding` is the holder's view of
the lock object (the record and version it last wrote, its local deadline, the
nonces of writes whose outcome is unknown) and the writes on it: a renewal, a
release, each conditional on the version last written, an ambiguous answer
settled by re-reading the object and looking for our own nonces.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from .._errors import Fenced, LockLost, NotFound, OutcomeUnknown, PreconditionFailed, TransientError
from .._retry import RetryPolicy
from ..settings import LockSettings
from ..storage import ObjectStore
from ._io import AMBIGUOUS, READ_AGAIN, RELEASES, SEEN, Clock, new_nonce, observe
from ._notify import ReleaseNotifier
from ._state import (
    LockRecord,
    Observed,
    Resolution,
    encode_record,
    local_deadline,
    released_record,
    renewed_record,
    resolve_holder_write,
)

log = logging.getLogger("shared.locks")


@dataclass(frozen=True, slots=True)
class LockHandle:
    """What a holding needs of its lock: where the object is, the timing, the clocks, the release policy.

    ``clock`` is the wall clock written into records; ``monotonic`` measures
    local deadlines; ``retry`` governs release; ``rng`` jitters the backoff of
    failed renewals; ``notifier`` (optional) tells other processes of a release.
    """

    store: ObjectStore
    name: str
    key: str
    settings: LockSettings
    clock: Clock
    monotonic: Clock
    retry: RetryPolicy
    rng: random.Random
    notifier: ReleaseNotifier | None


class Holding:
    """The holder's view of the lock object during one holding, and its conditional writes.

    ``handle`` is the lock's :class:`LockHandle` (read by the heartbeat too).
    ``closing`` is set once the holding is being released (the heartbeat stops
    renewing); ``superseded`` once a renewal found the lock taken by someone
    else (the release then writes nothing).
    """

    def __init__(self, handle: LockHandle, *, record: LockRecord, version: str, write_started: float) -> None:
        """Start from the claim that won: ``record`` written at ``version``, sent at ``write_started``
        (monotonic); remembered as this process's latest sight of the lock."""
        self.handle = handle
        self._record = record
        self._version = version
        SEEN.put(handle.store, handle.key, Observed(record=record, version=version))
        self._deadline = local_deadline(write_started, handle.settings)
        # Nonces of writes whose outcome is unknown, with the monotonic instant
        # each was sent; cleared on every confirmed write (a later write on an
        # older version can no longer land).
        self._pending: dict[str, float] = {}
        self._last_seen: Observed | None = None
        self.closing = False
        self.superseded = False

    @property
    def record(self) -> LockRecord:
        """The last lock record this holder knows it wrote."""
        return self._record

    @property
    def deadline(self) -> float:
        """The monotonic instant until which the holding is valid locally."""
        return self._deadline

    def renewed_at(self) -> float:
        """Return the monotonic instant the last confirmed renewal (or the claim) was sent."""
        s = self.handle.settings
        return self._deadline - s.validity + s.max_drift

    def loss_reason(self, what: str) -> LockLost:
        """Return the error of a holding lost because ``what``, naming the holder last seen:
        :class:`Fenced` when that holder has a newer epoch, else :class:`LockLost`."""
        name, epoch = self.handle.name, self._record.epoch
        current = self._last_seen
        if current is None:
            return LockLost(f"lock {name} (epoch {epoch}): {what}, the lock object is gone")
        rec = current.record
        msg = f"lock {name} (epoch {epoch}): {what}, now held by {rec.owner} (epoch {rec.epoch})"
        return Fenced(msg) if rec.epoch > epoch else LockLost(msg)

    async def renew_once(self) -> Resolution:
        """Write one renewal on the version last written.

        Returns:
            OURS when it landed (or a re-read shows one of our writes),
            UNCHANGED when the outcome is still unknown (try again),
            SUPERSEDED when the lock object is no longer ours.

        Cancelled: the write's outcome stays unknown (its nonce is kept, so a
        later re-read still recognises it).
        """
        h = self.handle
        nonce = new_nonce()
        started = h.monotonic()
        record = renewed_record(self._record, now=h.clock(), nonce=nonce, settings=h.settings)
        self._pending[nonce] = started
        try:
            info = await h.store.write_if_match(h.key, encode_record(record), self._version)
        except AMBIGUOUS as exc:
            log.debug("renewal of %s answered %r; re-reading", h.name, exc)
            return await self._resolve()
        self._confirm(record, info.version, started)
        return Resolution.OURS

    async def release_once(self) -> None:
        """Write the released record on the version last written; return once it is there.

        Returns also when a re-read shows the lock is no longer ours (nothing
        to release) or shows our own release.

        Raises:
            TransientError: the write did not land (or could not be settled);
                worth another try.
            Whatever else the store raised.
        """
        h = self.handle
        nonce = new_nonce()
        record = released_record(self._record, now=h.clock(), nonce=nonce)
        self._pending[nonce] = h.monotonic()
        try:
            info = await h.store.write_if_match(h.key, encode_record(record), self._version)
        except (PreconditionFailed, NotFound, OutcomeUnknown):
            try:
                current = await observe(h.store, h.key)
            except READ_AGAIN as exc:
                raise TransientError(f"could not re-read lock {h.name}: {exc!r}") from exc
            outcome = self._judge_seen(current)
            if outcome is Resolution.SUPERSEDED:
                log.info("lock %s (epoch %d) was no longer ours at release", h.name, self._record.epoch)
                return
            if outcome is Resolution.OURS and current is not None and current.record.released:
                return
            raise TransientError(f"release of lock {h.name} did not land; trying again") from None
        self._confirm(record, info.version, 0.0)

    def _confirm(self, record: LockRecord, version: str, started: float) -> None:
        h = self.handle
        self._record = record
        self._version = version
        SEEN.put(h.store, h.key, Observed(record=record, version=version))
        self._pending.clear()
        if record.released:
            # Waiters in this process take it over now, not at their next poll.
            RELEASES.notify(h.store, h.key)
        else:
            self._deadline = local_deadline(started, h.settings)

    def _judge_seen(self, current: Observed | None) -> Resolution:
        """Return what the lock object ``current`` (as re-read) says of our writes; adopt it when
        it shows one of them (the record, version and local deadline become its)."""
        outcome = resolve_holder_write(
            current,
            owner=self._record.owner,
            epoch=self._record.epoch,
            known_version=self._version,
            nonces=self._pending,
        )
        if outcome is Resolution.OURS:
            assert current is not None
            self._confirm(current.record, current.version, self._pending[current.record.nonce])
        return outcome

    async def _resolve(self) -> Resolution:
        """Re-read after an ambiguous write; adopt the object if it shows one of our writes."""
        try:
            current = await observe(self.handle.store, self.handle.key)
        except READ_AGAIN:
            return Resolution.UNCHANGED
        outcome = self._judge_seen(current)
        if outcome is Resolution.OURS and current is not None and current.record.released:
            # Our own release landed (seen while releasing); nothing more to renew.
            return Resolution.OURS
        self._last_seen = current
        return outcome


__all__ = ["Holding", "LockHandle"]
