"""A held lease's renewals: the heartbeat's loop, and what an ambiguous renewal turns out to be.

A mixin of :class:`~shared.locks._held.HeldLease` (its state lives there);
kept apart because the loop and its resolution are a room of their own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from .._errors import LockLost
from ._io import AMBIGUOUS, READ_AGAIN, new_nonce, observe
from ._state import (
    LockRecord,
    Observed,
    Resolution,
    encode_record,
    poll_delay,
    renewed_record,
    resolve_holder_write,
)

if TYPE_CHECKING:
    from ._lock import StorageLock

log = logging.getLogger("shared.locks")


class Renewals:
    """The renewing half of a held lease (see :class:`~shared.locks._held.HeldLease`)."""

    _lock: StorageLock
    _record: LockRecord
    _version: str
    _deadline: float
    _pending: dict[str, float]
    _closing: bool
    _superseded: bool
    _last_seen: Observed | None

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        raise NotImplementedError

    @property
    def owner(self) -> str:
        raise NotImplementedError

    def _mark_lost(self, error: LockLost) -> None:
        raise NotImplementedError

    def _confirm(self, record: LockRecord, version: str, started: float) -> None:
        raise NotImplementedError

    def _loss_reason(self, what: str) -> LockLost:
        raise NotImplementedError

    async def _beat(self) -> None:
        s = self._lock.settings
        failures = 0
        mono = self._lock.monotonic
        while not self._closing:
            if failures == 0:
                delay = self._renewed_at() + s.renew_interval - mono()
            else:
                delay = poll_delay(failures - 1, now=0.0, until=None, settings=s, rng=self._lock.rng)
            await asyncio.sleep(max(0.0, min(delay, self._deadline - mono())))
            if mono() >= self._deadline:
                self._mark_lost(LockLost(f"lock {self.name} ran out locally before a renewal got through"))
                return
            timeout = asyncio.timeout(self._deadline - mono())
            try:
                async with timeout:
                    outcome = await self._renew_once()
            except TimeoutError:
                if not timeout.expired():
                    raise
                self._mark_lost(LockLost(f"lock {self.name} ran out locally while renewing"))
                return
            if outcome is Resolution.OURS:
                failures = 0
            elif outcome is Resolution.UNCHANGED:
                failures += 1
            else:
                self._superseded = True
                self._mark_lost(self._loss_reason("renewal refused"))
                return

    def _renewed_at(self) -> float:
        return self._deadline - self._lock.settings.validity + self._lock.settings.max_drift

    async def _renew_once(self) -> Resolution:
        lock = self._lock
        nonce = new_nonce()
        started = lock.monotonic()
        record = renewed_record(self._record, now=lock.clock(), nonce=nonce, settings=lock.settings)
        self._pending[nonce] = started
        try:
            info = await lock.store.write_if_match(lock.key, encode_record(record), self._version)
        except AMBIGUOUS as exc:
            log.debug("renewal of %s answered %r; re-reading", self.name, exc)
            return await self._resolve()
        self._confirm(record, info.version, started)
        return Resolution.OURS

    def _judge_seen(self, current: Observed | None) -> Resolution:
        """Return what the lock object ``current`` (as re-read) says of our writes; adopt it when
        it shows one of them (the record, version and local deadline become its)."""
        outcome = resolve_holder_write(
            current,
            owner=self.owner,
            epoch=self.epoch,
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
            current = await observe(self._lock.store, self._lock.key)
        except READ_AGAIN:
            return Resolution.UNCHANGED
        outcome = self._judge_seen(current)
        if outcome is Resolution.OURS and current is not None and current.record.released:
            # Our own release landed (seen while releasing); nothing more to renew.
            return Resolution.OURS
        self._last_seen = current
        return outcome


__all__ = ["Renewals"]
