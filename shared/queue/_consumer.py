"""The consumer side of one shard's stream (used by workers).

Consumer-group semantics (one group, ``workers``, per shard stream):

- ``read`` delivers new entries (XREADGROUP ``>``); each stays *pending* to
  this consumer until it is acknowledged (``ack``) or dead-lettered.
- A worker acknowledges an entry only once what it says is durable.
- A restarted worker with the same consumer name re-reads its own pending
  entries first (``read_pending``), then new ones.
- A new owner of a shard takes over the pending entries of consumers that
  are KNOWN dead (their lease expired) with ``claim_from``; entries are never
  claimed by idle time, because a live consumer that holds an entry a long
  time (a slow commit) would have it stolen.
- Redis delivers an entry at least once: a read whose reply is lost
  (connection dropped after the command was sent, or the read cancelled)
  leaves its entries pending to us unseen. The next ``read`` returns them
  first (it re-reads our own pending entries above the highest id it handed
  out), so nothing is stuck until a restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from .._aio import raise_if_cancelling
from .._errors import NotFound
from .._logging import kv
from ._connect import redis_errors
from ._dead_letters import DEFAULT_MAX_COPY_BYTES, dead_letter_fields
from ._entry import Entry, as_text, entries_from_raw, entries_from_reply, id_key, max_id
from ._keys import Keys
from ._stream_replies import keep_repeated_fields

DEFAULT_GROUP = "workers"

log = logging.getLogger("shared.queue")

# XACK first, XADD to the dead stream only when the XACK removed the entry from
# the pending list: atomic (both keys share the shard's hash tag) and idempotent,
# so a dead_letter retried after a lost reply never writes two dead letters.
_DEAD_LETTER_LUA = """
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 0 then return false end
local fields = {}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
return redis.call('XADD', KEYS[2], '*', unpack(fields))
"""

# Move up to ARGV[4] pending entries of consumer ARGV[2] to ARGV[3]. Filtered by
# consumer name, never by idle time. When the dead consumer has nothing left it
# is deleted (DELCONSUMER drops pending entries, so only once it has none).
# An entry deleted from the stream while pending (XDEL, trimming) is dropped
# from the pending list by XCLAIM (Redis 7.0+) and not returned: it gets its
# `deleted` dead letter here, in the same script, so it never vanishes in
# silence and a retried script cannot write it twice (it is no longer pending).
# Returns {claimed entries, number of ids that were pending, ids dead-lettered}.
_CLAIM_LUA = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', tonumber(ARGV[4]), ARGV[2])
local claimed = {}
local gone = {}
if #pending > 0 then
  local ids = {}
  for i, p in ipairs(pending) do ids[i] = p[1] end
  claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, unpack(ids))
  local got = {}
  for _, e in ipairs(claimed) do got[e[1]] = true end
  for _, id in ipairs(ids) do
    if not got[id] then
      redis.call('XADD', KEYS[2], '*', 'reason', 'deleted', 'detail', ARGV[7], 'stream_id', id,
        'shard', ARGV[5], 'consumer', ARGV[3], 'dead_at', ARGV[6], 'truncated', '0')
      gone[#gone + 1] = id
    end
  end
end
if #pending < tonumber(ARGV[4]) then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return {claimed, #pending, gone}
"""
_DELETED_DETAIL = "the entry was trimmed or deleted while pending: no content left"

# Trim the acknowledged prefix of a stream, atomically (no entry can be
# delivered between the look and the trim). The floor is, over EVERY group of
# the stream, the smallest id still pending (to any consumer, a previous owner
# included) or, for a group with nothing pending, the id just after its
# last-delivered id. No group at all: nothing was ever consumed, keep all.
# XINFO GROUPS' pending count is exact, so a group with pending entries always
# contributes its smallest pending id (XPENDING summary form).
# Returns {entries removed, floor id or false}.
_TRIM_LUA = """
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {0, false} end
local floor_ms, floor_seq = nil, nil
for _, g in ipairs(groups) do
  local name, pending, last = nil, 0, '0-0'
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then pending = tonumber(g[i + 1])
    elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local ms, seq
  if pending > 0 then
    local summary = redis.call('XPENDING', KEYS[1], name)
    local dash = string.find(summary[2], '-', 1, true)
    ms, seq = tonumber(string.sub(summary[2], 1, dash - 1)), tonumber(string.sub(summary[2], dash + 1))
  else
    local dash = string.find(last, '-', 1, true)
    ms, seq = tonumber(string.sub(last, 1, dash - 1)), tonumber(string.sub(last, dash + 1)) + 1
  end
  if floor_ms == nil or ms < floor_ms or (ms == floor_ms and seq < floor_seq) then
    floor_ms, floor_seq = ms, seq
  end
end
local floor = string.format('%d-%d', floor_ms, floor_seq)
return {redis.call('XTRIM', KEYS[1], 'MINID', floor), floor}
"""


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What one :func:`trim_acknowledged` did."""

    removed: int
    """Entries removed from the stream."""
    floor: bytes | None
    """Every entry below this id is gone; None when the stream has no consumer group (nothing removed)."""


async def trim_acknowledged(redis_client: redis.asyncio.Redis, stream: str | bytes) -> Trimmed:
    """Remove from ``stream`` every entry that every consumer group has delivered and had acknowledged.

    One Lua script (one key): XINFO GROUPS, XPENDING's smallest id per group
    with pending entries, then XTRIM MINID at the lowest of those floors, so an
    entry still pending to any consumer (a previous owner's included) or not
    yet delivered to some group is never removed. Workers acknowledge an entry
    in the same MULTI as its effect on the shard state, so what this removes
    is durable elsewhere. Idempotent; safe to retry and to run concurrently.

    Returns:
        How many entries were removed and the floor id.

    Raises:
        TransientError: Redis is unreachable.
    """
    with redis_errors("trim_acknowledged"):
        try:
            raw = await redis_client.eval(_TRIM_LUA, 1, stream)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return Trimmed(removed=0, floor=None)
            raise
    floor = raw[1]
    return Trimmed(removed=int(raw[0]), floor=floor if isinstance(floor, bytes) else None)


@dataclass(frozen=True, slots=True)
class ShardLag:
    """How far a shard's consumer group is behind."""

    shard: int
    length: int
    """Entries in the stream."""
    pending: int
    """Entries delivered and not yet acknowledged."""
    lag: int | None
    """Entries not yet delivered to the group (None when Redis cannot tell, e.g. after deletions)."""
    last_delivered_id: bytes


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One consumer of a shard's group."""

    name: str
    pending: int
    idle_ms: int


class ShardConsumer:
    """One consumer (a worker) of one shard's consumer group.

    Methods raise :class:`~shared.TransientError` when Redis is unreachable;
    the caller decides how to retry (``ack`` and ``dead_letter`` are
    idempotent and safe to retry; ``read`` is safe too, see the module doc).
    Not for concurrent use by several tasks.
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        shard: int,
        group: str = DEFAULT_GROUP,
        consumer: str = "",
        *,
        max_copy_bytes: int = DEFAULT_MAX_COPY_BYTES,
    ) -> None:
        if not consumer:
            raise ValueError("a consumer name is required")
        self.redis = keep_repeated_fields(redis_client)  # an entry that repeats a field name is seen
        self.keys = keys
        self.shard = shard
        self.group = group
        self.consumer = consumer
        # The scripts below take both streams: one slot, by the key layout.
        self.stream, self.dead_stream = Keys.one_slot([keys.events(shard), keys.dead(shard)])
        self._max_copy_bytes = max_copy_bytes
        self._dead_letter = redis_client.register_script(_DEAD_LETTER_LUA)
        self._claim = redis_client.register_script(_CLAIM_LUA)
        # Highest id handed to the caller; every such id is <= the group's
        # last-delivered id, so entries pending to us above it were lost in transit.
        self._high: bytes | None = None
        self._resync = False

    def took(self, entries: list[Entry]) -> list[Entry]:
        """Return ``entries``, recorded as read by this consumer through another
        command (the shard state's save reads ahead); in id order, like a read's."""
        return self._seen(entries)

    def _seen(self, entries: list[Entry]) -> list[Entry]:
        # Every caller hands entries in id order (a stream read returns them so,
        # claim_from sorts): the last one is the highest.
        if entries:
            self._high = max_id(self._high, (entries[-1].id,))
        return entries

    async def ensure_group(self) -> None:
        """Create the shard's stream and consumer group if missing (reading from id 0).

        Returns when the group exists. Raises TransientError. Idempotent.
        """
        with redis_errors("XGROUP CREATE"):
            try:
                await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    async def _xreadgroup(self, from_id: bytes, count: int, block_ms: int | None) -> list[Entry]:
        with redis_errors("XREADGROUP"):
            reply = await self.redis.xreadgroup(
                self.group, self.consumer, {self.stream: from_id}, count=count, block=block_ms
            )
        if block_ms is not None:
            raise_if_cancelling()  # entries read stay pending: the next reader gets them
        return entries_from_reply(reply)

    async def read(self, count: int, block_ms: int) -> list[Entry]:
        """Return up to ``count`` entries: any lost in transit first, else new ones (waits ``block_ms``).

        ``block_ms`` must stay well below the client's socket timeout. When the
        group or stream is gone (Redis restarted without persistence, or the
        stream was deleted) the group is re-created and an empty list returned.

        Raises:
            TransientError: Redis is unreachable; the next call returns what
                this one may have taken.

        Cancellation: entries this read took stay pending to us and come back
        from the next ``read`` (or ``read_pending`` after a restart).
        """
        try:
            if self._resync:
                lost = await self._xreadgroup(self._high or b"0", count, None)
                if lost:
                    return self._seen(lost)
                self._resync = False
            entries = await self._xreadgroup(b">", count, block_ms)
        except NotFound:
            # The group is gone, and with it our pending list: nothing to resync.
            self._resync = False
            await self.ensure_group()
            return []
        except BaseException:
            self._resync = True
            raise
        return self._seen(entries)

    async def read_pending(self, count: int = 500, after: bytes = b"0") -> list[Entry]:
        """Return up to ``count`` of our own pending entries with an id above ``after``, oldest first.

        Page by passing the last id returned as ``after``; an empty list means
        there are no more. Entries whose content was trimmed away come back
        with empty fields (``Entry.deleted``): acknowledge or dead-letter them.

        Raises:
            TransientError: Redis is unreachable.
            NotFound: the group does not exist (call ``ensure_group``).
        """
        return self._seen(await self._xreadgroup(after, count, None))

    async def ack(self, ids: list[bytes]) -> int:
        """Acknowledge entries; return how many were pending (already acked ones count 0).

        Idempotent. Raises TransientError.
        """
        if not ids:
            return 0
        with redis_errors("XACK"):
            return int(await self.redis.xack(self.stream, self.group, *ids))

    async def dead_letter(self, entry: Entry, reason: str, detail: str) -> bytes | None:
        """Move ``entry`` to the shard's dead-letter stream and acknowledge it, atomically.

        One Lua script (both keys share the shard's hash tag, so it works on
        Redis Cluster): the entry is acknowledged and, only if it was still
        pending, appended to the dead stream with ``reason`` and ``detail``.

        Returns:
            The dead-letter entry's id, or None when the entry was no longer
            pending (already acknowledged or dead-lettered: nothing written).

        Raises:
            TransientError: Redis is unreachable (safe to retry).
        """
        fields = dead_letter_fields(
            entry,
            shard=self.shard,
            reason=reason,
            detail=detail,
            consumer=self.consumer,
            now_ms=int(time.time() * 1000),
            max_copy_bytes=self._max_copy_bytes,
        )
        args: list[Any] = [self.group, entry.id]
        for name, value in fields:
            args += [name, value]
        with redis_errors("dead_letter"):
            result = await self._dead_letter(keys=[self.stream, self.dead_stream], args=args)
        return result if isinstance(result, bytes) else None

    async def claim_from(self, dead_consumers: list[str], *, page: int = 500) -> list[Entry]:
        """Take over every pending entry of the named consumers, which the caller knows are dead.

        Each page is one Lua script (XPENDING for that consumer + XCLAIM), so
        only entries still pending to the dead consumer move; a dead consumer
        left with no pending entries is removed from the group. Entries
        deleted from the stream meanwhile are dead-lettered (reason
        ``deleted``) by the same script, since XCLAIM drops them (Redis 7.0+);
        on older Redis they come back with empty fields (``Entry.deleted``).
        Never pass a live consumer: its in-flight entries would be taken.

        Returns:
            The claimed entries (now pending to us), in id order per consumer.

        Raises:
            TransientError: Redis is unreachable; what was claimed before
                stays pending to us and shows up in ``read_pending``.
        """
        out: list[Entry] = []
        for name in dead_consumers:
            if name == self.consumer:
                continue
            while True:
                args: list[Any] = [self.group, name, self.consumer, page, self.shard, int(time.time() * 1000)]
                with redis_errors("claim_from"):
                    raw = await self._claim(
                        keys=[self.stream, self.dead_stream], args=[*args, _DELETED_DETAIL]
                    )
                claimed, seen, gone = entries_from_raw(raw[0]), int(raw[1]), raw[2]
                out.extend(claimed)
                if gone:
                    log.warning(
                        "pending entries deleted from the stream were dead-lettered",
                        extra=kv(shard=self.shard, consumer=name, ids=[as_text(i) for i in gone]),
                    )
                if seen < page:
                    break
        out.sort(key=lambda e: id_key(e.id))
        return self._seen(out)

    async def consumers(self) -> list[ConsumerInfo]:
        """Return the group's consumers with their pending counts and idle times.

        Raises:
            TransientError: Redis is unreachable.
            NotFound: the stream or group does not exist.
        """
        with redis_errors("XINFO CONSUMERS"):
            rows = await self.redis.xinfo_consumers(self.stream, self.group)
        return [
            ConsumerInfo(
                name=as_text(row["name"]),
                pending=int(row["pending"]),
                idle_ms=int(row["idle"]),
            )
            for row in rows
        ]

    async def lag(self) -> ShardLag:
        """Return the group's backlog: stream length, pending and undelivered counts.

        Raises:
            TransientError: Redis is unreachable.
            NotFound: the stream or group does not exist.
        """
        with redis_errors("XINFO GROUPS"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xlen(self.stream)
                pipe.xinfo_groups(self.stream)
                length, groups = await pipe.execute()
        for row in groups:
            if as_text(row["name"]) == self.group:
                raw_lag = row.get("lag")
                return ShardLag(
                    shard=self.shard,
                    length=int(length),
                    pending=int(row["pending"]),
                    lag=None if raw_lag is None else int(raw_lag),
                    last_delivered_id=row["last-delivered-id"],
                )
        raise NotFound(f"no consumer group {self.group!r} on {self.stream}")


__all__ = ["DEFAULT_GROUP", "ConsumerInfo", "ShardConsumer", "ShardLag", "Trimmed", "trim_acknowledged"]
