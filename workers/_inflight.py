"""The in-flight board: every commit, abort, recovery and clean-up a shard's owner has under way.

One hash per shard, ``cf:<fleet>:{s<n>}:state:inflight``, field = the work's
label (``commit|<job>|<dataset>``, ...), value = an :class:`InFlight` record
(JSON). The owner records the work that holds a slot (running, retrying since
when, attempts, last error) and deletes the field when the work is done, so
``commitfleet status`` shows what each dataset is waiting for: a commit or
abort due that is not on the board is queued (waiting for a slot or for its
dataset). Queued work is not written, so the board is bounded by the owners'
slots, never by the open work; the changes are written together at most every
``FLUSH_DELAY_S`` (work that ends sooner never shows). Writes are best effort:
a Redis error while updating the board is logged and never stops the work it
describes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Literal

import msgspec
import redis.asyncio

from shared import TransientError, kv, raise_if_cancelling
from shared.queue import Keys, as_text, redis_errors

log = logging.getLogger("workers.shard")

FORMAT_VERSION = 1
BOARD = "inflight"
# How late the board may show a change: work shorter than this never reaches Redis.
FLUSH_DELAY_S = 0.25

WorkState = Literal["queued", "running", "retrying"]


class InFlight(msgspec.Struct, frozen=True, kw_only=True):
    """One work item of a shard's owner, as ``commitfleet status`` shows it.

    ``since``: when the work was scheduled; ``state_since``: when it entered
    ``state``; ``attempts``: attempts started; ``last_error``: why the last
    one ended early; ``next_attempt_at``: when ``retrying`` work runs again.
    """

    v: int = FORMAT_VERSION
    work: str
    dataset: str
    job: str = ""
    worker: str
    state: WorkState
    since: float
    state_since: float
    attempts: int = 0
    last_error: str = ""
    next_attempt_at: float | None = None


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(InFlight)


def work_label(key: tuple[object, ...]) -> str:
    """Return the board field of a work key (``commit|job|dataset``, ``recover|dataset``, ...)."""
    return "|".join(str(k).lower() if i == 0 else str(k) for i, k in enumerate(key))


class InFlightBoard:
    """The owner's writer of one shard's in-flight board (best effort, see the module doc).

    Changes are kept in memory and written together, one pipelined HSET/HDEL
    every ``delay`` seconds at most: a commit of a few hundred milliseconds
    used to cost an HSET when it started and an HDEL when it ended, two round
    trips per dataset for a record nobody read. Now work that ends within
    ``delay`` never reaches Redis, and the board shows anything under way for
    longer, ``delay`` late at most. :meth:`run` does the writing.
    """

    def __init__(
        self, client: redis.asyncio.Redis, keys: Keys, shard: int, *, delay: float = FLUSH_DELAY_S
    ) -> None:
        self._r = client
        self._key = keys.shard_state(shard, BOARD)
        self._delay = delay
        self._pending: dict[str, bytes | None] = {}  # label -> record to write, or None: delete it
        self._written: set[str] = set()  # labels this board has in Redis (bounded by open work)
        self._writing: set[str] = set()  # labels a flush is writing right now (may be in Redis)
        self._wake = asyncio.Event()

    def put(self, label: str, rec: InFlight) -> None:
        """Record ``rec`` under ``label`` (written by the next flush); returns None, never raises."""
        self._pending[label] = _enc.encode(rec)
        self._wake.set()

    def drop(self, label: str) -> None:
        """Remove ``label`` (the work is done or handed on); returns None, never raises."""
        # A record on its way (a flush under way) may land after this: delete it after it.
        if label in self._written or label in self._writing:
            self._pending[label] = None
            self._wake.set()
        else:
            self._pending.pop(label, None)  # never written: nothing to delete

    async def flush(self) -> bool:
        """Write what changed since the last flush in one pipelined round trip.

        Returns:
            False when Redis failed (logged; the changes are kept for the next
            flush unless newer ones replaced them meanwhile), else True.

        Cancelled: the changes taken for this write are put back (unless newer).
        """
        if not self._pending:
            return True
        batch, self._pending = self._pending, {}
        puts = {label: rec for label, rec in batch.items() if rec is not None}
        drops = [label for label, rec in batch.items() if rec is None]
        done = False
        self._writing = set(puts)
        try:
            with redis_errors("update in-flight board"):
                async with self._r.pipeline(transaction=False) as pipe:
                    if puts:
                        pipe.hset(self._key, mapping=puts)  # type: ignore[arg-type]
                    if drops:
                        pipe.hdel(self._key, *drops)
                    await pipe.execute()
            done = True
            self._written.update(puts)
            self._written.difference_update(drops)
        except TransientError as exc:
            log.info("in-flight board not updated", extra=kv(changes=len(batch), error=str(exc)))
        finally:
            self._writing = set()
            if not done:
                for label, rec in batch.items():
                    self._pending.setdefault(label, rec)
        return done

    async def run(self) -> None:
        """Flush the board at most every ``delay`` seconds while there are changes; returns when cancelled.

        Raises:
            CancelledError: when the runner is done with the board (its owner
                calls :meth:`flush` once more after that, to write the end).
        """
        pause = self._delay
        while True:
            await self._wake.wait()
            await asyncio.sleep(pause)
            self._wake.clear()
            flushed = await self.flush()
            # A cancel lost inside the write (Python 3.11, redis-py) ends the loop here.
            raise_if_cancelling()
            if flushed:
                pause = self._delay
            else:  # Redis is down: try again, less and less often
                pause = min(pause * 2, 5.0)
                self._wake.set()

    async def keep_only(self, labels: set[str]) -> None:
        """Drop every field but ``labels`` (left by an earlier owner or session); logged, not raised."""
        try:
            with redis_errors("clean in-flight board"):
                fields = [as_text(f) for f in await self._r.hkeys(self._key)]
                stale = [f for f in fields if f not in labels]
                if stale:
                    await self._r.hdel(self._key, *stale)
                self._written = {f for f in fields if f in labels}
        except TransientError as exc:
            log.info("in-flight board not cleaned", extra=kv(error=str(exc)))


async def read_in_flight(client: redis.asyncio.Redis, keys: Keys, shards: int) -> list[dict[str, Any]]:
    """Return every shard's in-flight work (oldest first), each record as a dict with its ``shard``.

    A record that does not decode is returned as ``{"shard", "label", "state": "unreadable"}``.

    Raises:
        TransientError: Redis is unreachable.
    """
    with redis_errors("read in-flight boards"):
        async with client.pipeline(transaction=False) as pipe:
            for s in range(shards):
                pipe.hgetall(keys.shard_state(s, BOARD))
            boards = await pipe.execute()
    out: list[dict[str, Any]] = []
    now = time.time()
    for shard, board in enumerate(boards):
        for label, raw in board.items():
            try:
                rec = _dec.decode(raw)
            except msgspec.DecodeError:
                out.append({"shard": shard, "label": as_text(label), "state": "unreadable"})
                continue
            row: dict[str, Any] = {"shard": shard, "label": as_text(label), **msgspec.to_builtins(rec)}
            row["age_s"] = round(now - rec.since, 3)
            out.append(row)
    out.sort(key=lambda r: float(r.get("since", 0.0)))
    return out


__all__ = ["FLUSH_DELAY_S", "InFlight", "InFlightBoard", "WorkState", "read_in_flight", "work_label"]
