"""The fleet's admin event stream (``cf:<fleet>:admin``): capped, one field ``data`` per entry.

Writers (workers, coordinators) append with ``MAXLEN ~ settings.admin.stream_maxlen``;
readers (``commitfleet events --follow``, the HTTP event stream, tests)
follow it with XREAD. Entries that do not decode (for instance an event type
of a newer fleet version) are skipped by readers and logged.

Outcomes (``committed``, ``aborted``) go through :meth:`AdminPublisher.publish_outcome`:
one Lua script sets the (dataset, job) marker, appends the entry and counts it,
or does nothing when the marker is already there, so whoever finishes or finds
the work finished can announce it and exactly one entry results. The markers
are history kept on purpose and bounded: at most ``markers_max`` (oldest
forgotten first) and none older than ``marker_retention_s``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import redis.asyncio
from redis.commands.core import AsyncScript

from .._aio import raise_if_cancelling
from .._retry import RetryPolicy, retry
from ..events import DATA_FIELD, AdminEvent, InvalidMessage, RepeatedFields, decode_admin, encode_admin
from ..settings import Durability, resolve_durability
from ._cluster import is_cluster
from ._connect import redis_errors
from ._durability import check_durable, queue_durable
from ._entry import Entry, as_bytes, entries_from_reply
from ._keys import Keys
from ._stream_replies import keep_repeated_fields

log = logging.getLogger(__name__)

DEFAULT_ADMIN_MAXLEN = 100_000
_DATA = DATA_FIELD.encode()

# How long an outcome marker is kept at most: the same as the workers' ended-job records
# (the default of the queue.ended_retention setting), the window in which a (dataset, job) can
# still be replayed by a new owner.
OUTCOME_RETENTION_S: Final = 7 * 86400
# How many outcome markers are kept at most (the default of queue.outcome_markers_max).
DEFAULT_MARKERS_MAX: Final = 100_000
# Markers forgotten at most per announcement: the cap holds (one in, at least one out)
# while each script stays short.
_EVICT_PER_CALL: Final = 16

Outcome = Literal["committed", "aborted"]

# KEYS: admin stream, markers hash, counts hash, markers' order stream, legacy marker key
#       (one slot: the admin stream's).
# ARGV: data, admin maxlen, outcome, marker field, markers max, retention (ms), evict per call.
# Returns {1, new entry id} or {0, marker value "<outcome> <entry id>"}.
# The order stream's ids are the markers' times (Redis clock), so the oldest are
# found with XRANGE and age is read off the id.
_OUTCOME_SCRIPT: Final = """
local prev = redis.call('HGET', KEYS[2], ARGV[4])
if not prev then
  prev = redis.call('GET', KEYS[5])
end
if prev then
  return {0, prev}
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'data', ARGV[1])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[3] .. ' ' .. id)
local at = redis.call('XADD', KEYS[4], '*', 'f', ARGV[4])
redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
local over = redis.call('XLEN', KEYS[4]) - tonumber(ARGV[5])
local min_ms = tonumber(string.match(at, '^(%d+)')) - tonumber(ARGV[6])
local ids, fields = {}, {}
for i, e in ipairs(redis.call('XRANGE', KEYS[4], '-', '+', 'COUNT', ARGV[7])) do
  if i > over and tonumber(string.match(e[1], '^(%d+)')) >= min_ms then
    break
  end
  ids[#ids + 1] = e[1]
  fields[#fields + 1] = e[2][2]
end
if #ids > 0 then
  redis.call('HDEL', KEYS[2], unpack(fields))
  redis.call('XDEL', KEYS[4], unpack(ids))
end
return {1, id}
"""
_OUTCOME_KEYS: Final = 5  # admin, markers, counts, order, the legacy marker key


class AdminPublisher:
    """Appends admin events to the fleet's capped admin stream.

    The caller owns ``redis_client``. Transient errors are retried under
    ``policy``; a retried :meth:`publish` may duplicate an informational
    admin event (readers see it twice). Outcomes (``committed``,
    ``aborted``) go through :meth:`publish_outcome`, which never does.

    ``durability`` other than ``memory`` (``redis.durability``; or the older
    ``wait_replicas`` > 0): every append is followed by the level's ``WAIT`` /
    ``WAITAOF`` on the same connection (see :mod:`._durability`); fewer
    acknowledgements is a transient error and the append is retried (an
    outcome's marker makes that retry harmless; if the write that fell short
    was lost in a failover, the retry appends it again).
    """

    def __init__(
        self,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        *,
        maxlen: int = DEFAULT_ADMIN_MAXLEN,
        markers_max: int = DEFAULT_MARKERS_MAX,
        marker_retention_s: float = OUTCOME_RETENTION_S,
        policy: RetryPolicy | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
        durability: Durability | None = None,
    ) -> None:
        """Set the caps: ``maxlen`` the admin stream's; ``markers_max``, ``marker_retention_s`` the markers'.

        Raises:
            ValueError: a cap below 1 or a retention below one second.
        """
        if maxlen < 1 or markers_max < 1 or marker_retention_s < 1:
            raise ValueError("maxlen and markers_max must be >= 1, marker_retention_s >= 1")
        self.redis = redis_client
        self.keys = keys
        self.maxlen = maxlen
        self.markers_max = markers_max
        self.marker_retention_ms = int(marker_retention_s * 1000)
        self.policy = policy or RetryPolicy()
        self.durability = durability or resolve_durability("", wait_replicas, wait_timeout)
        self._outcome_script: AsyncScript | None = None

    async def publish(self, ev: AdminEvent) -> bytes:
        """Append ``ev``; return its stream id.

        Raises:
            TransientError: Redis stayed unreachable for the whole retry policy.
        """
        return await self.publish_raw(encode_admin(ev))

    async def publish_raw(self, data: bytes) -> bytes:
        """Raw layer: append one entry ``{data: data}``; return its stream id. Raises as :meth:`publish`."""

        async def send() -> bytes:
            with redis_errors("XADD admin"):
                if self.durability.waits:
                    return as_bytes((await self._waited("xadd", self.keys.admin, {_DATA: data}))[0])
                entry_id = await self.redis.xadd(
                    self.keys.admin, {_DATA: data}, maxlen=self.maxlen, approximate=True
                )
            return as_bytes(entry_id)

        return await retry(send, self.policy)

    async def publish_outcome(
        self,
        ev: AdminEvent,
        *,
        dataset: str,
        job: str,
        outcome: Outcome,
    ) -> bool:
        """Append ``ev`` (the ``committed`` or ``aborted`` event of (dataset, job)) unless already announced.

        One script, atomic: if the marker of (dataset, job) is absent (in
        :attr:`Keys.outcome_markers`, or as a key an older version wrote), set
        it, append the entry and add one to ``outcome`` in
        :attr:`Keys.outcome_counts`, and forget the oldest markers beyond
        ``markers_max`` or older than the retention (at most 16 per call); else
        do nothing. A retry after an answer that got lost finds the marker, so
        it never appends twice.

        Returns:
            True when this call appended the entry; False when it was already
            there (a marker with another outcome is logged as an error).

        Raises:
            TransientError: Redis stayed unreachable for the whole retry policy.
        """
        k = self.keys
        legacy = k.outcome_marker(dataset, job)  # also checks the names
        keys = Keys.one_slot([k.admin, k.outcome_markers, k.outcome_counts, k.outcome_order, legacy])
        args: list[bytes | str | int] = [
            encode_admin(ev),
            self.maxlen,
            outcome,
            f"{dataset}/{job}",
            self.markers_max,
            self.marker_retention_ms,
            _EVICT_PER_CALL,
        ]

        async def send() -> tuple[bool, bytes]:
            with redis_errors("admin outcome script"):
                if self.durability.waits:
                    reply = (await self._waited("eval", *keys, *args))[0]
                else:
                    reply = await self._script(keys=keys, args=args)
            return bool(int(reply[0])), as_bytes(reply[1])

        appended, value = await retry(send, self.policy)
        if not appended:
            previous = value.split(b" ", 1)[0].decode(errors="replace")
            if previous != outcome:
                log.error(
                    "%s of %s/%s not announced: it was announced %s before",
                    outcome,
                    dataset,
                    job,
                    previous,
                )
        return appended

    async def _waited(self, kind: str, *args: Any) -> list[Any]:
        """Run one XADD (``kind`` "xadd") or the outcome script ("eval"), then the wait, on one connection.

        Returns a one-element list: the XADD's or the script's reply. Raises
        TransientError (via check_durable) when the wait fell short.
        """
        if is_cluster(self.redis):
            await self.redis.initialize()  # the slot map routes the WAIT
        async with self.redis.pipeline(transaction=False) as pipe:
            if kind == "xadd":
                pipe.xadd(args[0], args[1], maxlen=self.maxlen, approximate=True)
            else:
                pipe.eval(_OUTCOME_SCRIPT, _OUTCOME_KEYS, *args)
                # WAIT / WAITAOF cover the writes of their own connection only: when the script
                # found the marker (written by an earlier try, on another connection whose wait
                # never answered) it wrote nothing, and the wait alone would not wait for that
                # marker and entry. One write after it does: replication and the append-only
                # file are one ordered log per master.
                pipe.set(self.keys.fleet_key("wait"), b"1")
            waits = queue_durable(self.redis, pipe, [self.keys.admin], self.durability)
            replies = check_durable(list(await pipe.execute()), waits, self.durability, client=self.redis)
            return replies[:1]

    @property
    def _script(self) -> AsyncScript:
        if self._outcome_script is None:
            self._outcome_script = self.redis.register_script(_OUTCOME_SCRIPT)
        return self._outcome_script


def _decoded(entries: list[Entry], *, skipped: list[str] | None = None) -> list[tuple[bytes, AdminEvent]]:
    """Return the entries that decode, in order; log each skipped one, or add its id to ``skipped``."""
    out: list[tuple[bytes, AdminEvent]] = []
    for entry in entries:
        data = entry.fields.get(_DATA)
        if data is None:
            fields = entry.fields
            why = fields.rejection().detail if type(fields) is RepeatedFields else "has no data field"
            if skipped is None:
                log.warning("admin entry %s skipped: %s", entry.id.decode(), why)
            else:
                skipped.append(entry.id.decode())
            continue
        try:
            out.append((entry.id, decode_admin(data)))
        except InvalidMessage as exc:
            if skipped is None:
                log.warning("admin entry %s skipped: %s", entry.id.decode(), exc)
            else:
                skipped.append(entry.id.decode())
    return out


async def _last_id(redis_client: redis.asyncio.Redis, keys: Keys) -> bytes:
    with redis_errors("XREVRANGE admin"):
        newest = await redis_client.xrevrange(keys.admin, count=1)
    return as_bytes(newest[0][0]) if newest else b"0-0"


async def follow_admin(
    redis_client: redis.asyncio.Redis,
    keys: Keys,
    *,
    from_id: bytes | str = "$",
    block_ms: int = 1000,
    count: int = 100,
    policy: RetryPolicy | None = None,
) -> AsyncGenerator[tuple[bytes, AdminEvent], None]:
    """Yield ``(stream id, event)`` for every admin event after ``from_id``, forever.

    ``from_id`` ``"$"`` means events appended from now on (resolved to the
    newest id at the start, so nothing appended between two reads is
    missed); ``"0"`` replays the whole (capped) stream first. ``block_ms``
    must stay below the client's socket timeout.

    Raises:
        TransientError: Redis stayed unreachable for a whole retry policy
            (each read gets a fresh budget, so a Redis restart is survived).

    Cancellation: stops at once; resume with ``from_id`` = the last id seen.
    Close the generator (``aclose``) when you stop iterating early.
    """
    policy = policy or RetryPolicy()
    keep_repeated_fields(redis_client)
    last: bytes
    if from_id in ("$", b"$"):
        last = await retry(lambda: _last_id(redis_client, keys), policy)
    else:
        last = from_id.encode() if isinstance(from_id, str) else from_id

    async def read() -> list[Entry]:
        with redis_errors("XREAD admin"):
            reply = await redis_client.xread({keys.admin: last}, count=count, block=block_ms)
        raise_if_cancelling()
        return entries_from_reply(reply)

    while True:
        entries = await retry(read, policy)
        if not entries:
            continue
        last = entries[-1].id
        for item in _decoded(entries):
            yield item


async def read_admin_range(
    redis_client: redis.asyncio.Redis,
    keys: Keys,
    start: bytes | str = "-",
    end: bytes | str = "+",
    count: int | None = None,
) -> list[tuple[bytes, AdminEvent]]:
    """Return the admin events with ids in ``[start, end]``, oldest first (undecodable ones skipped).

    Raises:
        TransientError: Redis is unreachable.
    """
    keep_repeated_fields(redis_client)
    with redis_errors("XRANGE admin"):
        rows = await redis_client.xrange(keys.admin, min=start, max=end, count=count)
    return _decoded(entries_from_reply([[keys.admin, rows]]))


@dataclass(frozen=True, slots=True)
class RecentPage:
    """One page of :func:`read_admin_recent`: the matching events, newest first, and where to go on."""

    # (stream id, event), newest first.
    events: list[tuple[bytes, AdminEvent]]
    # The newest id in the stream when the read began at its end (``before`` None; b"0-0" when
    # empty): a follower that starts after it (XREAD from it, SSE ``from``) sees every later
    # entry and none of these again. None when the page began at a cursor.
    head: bytes | None
    # Go on strictly before this id for older events; None when the start of the stream was reached.
    cursor: bytes | None
    # Entries read (matching or not, undecodable ones included).
    scanned: int


# Entries read per XREVRANGE of read_admin_recent.
RECENT_READ_PAGE: Final = 500


async def read_admin_recent(
    redis_client: redis.asyncio.Redis,
    keys: Keys,
    *,
    limit: int,
    scan: int,
    match: Callable[[AdminEvent], bool] | None = None,
    before: bytes | str | None = None,
) -> RecentPage:
    """Return up to ``limit`` of the newest admin events that ``match``, reading at most ``scan`` entries.

    Reads backwards from the newest entry (or from just before the cursor
    ``before``) with XREVRANGE, :data:`RECENT_READ_PAGE` entries at a time.
    It stops at ``limit`` matches, after ``scan`` entries read, or at the start
    of the stream, whichever comes first: a filter that matches nothing costs
    ``scan`` entries, not the stream. The page's ``cursor`` continues it.
    Undecodable entries are counted in ``scanned`` and skipped (one debug
    line per call, not one per entry).

    Raises:
        ValueError: ``limit`` or ``scan`` below 1.
        TransientError: Redis is unreachable.

    Cancellation: stops at once (reads only).
    """
    if limit < 1 or scan < 1:
        raise ValueError("limit and scan must be >= 1")
    keep_repeated_fields(redis_client)
    end: bytes | str = "+"
    if before is not None:
        raw = before.encode() if isinstance(before, str) else before
        if not raw.replace(b"0", b"").strip(b"-"):
            # Nothing is older than 0-0 (and Redis refuses "(0-0" as a range's end).
            return RecentPage(events=[], head=None, cursor=None, scanned=0)
        end = b"(" + raw
    head: bytes | None = None
    events: list[tuple[bytes, AdminEvent]] = []
    skipped: list[str] = []
    scanned = 0
    cursor: bytes | None = None
    while True:
        want = min(RECENT_READ_PAGE, scan - scanned)
        with redis_errors("XREVRANGE admin"):
            rows = await redis_client.xrevrange(keys.admin, max=end, min="-", count=want)
        raise_if_cancelling()
        entries = entries_from_reply([[keys.admin, rows]])
        if before is None and head is None:
            head = entries[0].id if entries else b"0-0"
        for entry_id, ev in _decoded(entries, skipped=skipped):
            if match is None or match(ev):
                events.append((entry_id, ev))
                if len(events) == limit:
                    cursor = entry_id
                    break
        if cursor is not None:
            # Stopped at the limit: the entries after the match in this read were not looked at.
            scanned += next(n for n, e in enumerate(entries, 1) if e.id == cursor)
            break
        scanned += len(entries)
        if len(entries) < want:
            break  # the start of the stream: nothing older
        cursor = entries[-1].id
        if scanned >= scan:
            break
        end = b"(" + cursor
        cursor = None
    if skipped:
        log.debug("%d admin entries skipped (undecodable), e.g. %s", len(skipped), skipped[0])
    return RecentPage(events=events, head=head, cursor=cursor, scanned=scanned)


__all__ = [
    "DEFAULT_ADMIN_MAXLEN",
    "DEFAULT_MARKERS_MAX",
    "OUTCOME_RETENTION_S",
    "RECENT_READ_PAGE",
    "AdminPublisher",
    "Outcome",
    "RecentPage",
    "follow_admin",
    "read_admin_range",
    "read_admin_recent",
]
