"""The in-flight board: every commit, abort, recovery and clean-up a shard's owner has under way.

One hash per shard, ``cf:<fleet>:{s<n>}:state:inflight``, field = the work's
label (``commit|<job>|<dataset>``, ...), value = an :class:`InFlight` record
(JSON). The owner writes it on every change of state (queued behind another
work of the dataset, running, retrying since when, attempts, last error) and
deletes the field when the work is done, so ``commitfleet status`` shows what
each dataset is waiting for. Writes are best effort: a Redis error while
updating the board is logged and never stops the work it describes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import msgspec
import redis.asyncio

from shared import TransientError
from shared._logging import kv
from shared.queue import Keys, as_text, redis_errors

log = logging.getLogger("workers.shard")

FORMAT_VERSION = 1
BOARD = "inflight"

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
    """The owner's writer of one shard's in-flight board (best effort, see the module doc)."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, shard: int) -> None:
        self._r = client
        self._key = keys.shard_state(shard, BOARD)

    async def put(self, label: str, rec: InFlight) -> None:
        """Record ``rec`` under ``label``; returns None; a Redis failure is logged, not raised."""
        try:
            with redis_errors("HSET in-flight board"):
                await self._r.hset(self._key, label, _enc.encode(rec))
        except TransientError as exc:
            log.info("in-flight board not updated", extra=kv(work=label, error=str(exc)))

    async def drop(self, label: str) -> None:
        """Remove ``label`` (the work is done or handed on); a Redis failure is logged, not raised."""
        try:
            with redis_errors("HDEL in-flight board"):
                await self._r.hdel(self._key, label)
        except TransientError as exc:
            log.info("in-flight board not updated", extra=kv(work=label, error=str(exc)))

    async def keep_only(self, labels: set[str]) -> None:
        """Drop every field but ``labels`` (left by an earlier owner or session); logged, not raised."""
        try:
            with redis_errors("clean in-flight board"):
                fields = [as_text(f) for f in await self._r.hkeys(self._key)]
                stale = [f for f in fields if f not in labels]
                if stale:
                    await self._r.hdel(self._key, *stale)
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


__all__ = ["InFlight", "InFlightBoard", "WorkState", "read_in_flight", "work_label"]
