"""Dead letters: entries that can never be processed, kept with the reason.

A dead-letter entry (stream ``cf:<fleet>:{s<n>}:dead``) has these fields:

=================  ==========================================================
``reason``         a short stable code (e.g. ``bad_json``, ``unsafe_path``,
                   ``deleted`` for an entry trimmed while pending)
``detail``         one human line (at most 2000 characters)
``stream_id``      the entry's id in the shard's event stream
``shard``          the shard number
``consumer``       the consumer that rejected it
``dead_at``        milliseconds since the epoch
``truncated``      ``1`` when an original value was cut at the copy limit, or
                   fields beyond the first 32 were left out
``orig.<field>``   the original fields (``orig.data``, ``orig.sig`` first, at
                   most 32), values cut at the copy limit (the worker passes
                   ``security.max_message_bytes``, default 1 MiB)
=================  ==========================================================

Original fields are prefixed so that a hostile message cannot forge our own
fields. An entry that repeats a field name is copied as sent, repeats
included (``orig.data`` twice for ``data A data B``): the dead letter then
repeats that name too, and :func:`parse_dead_letter` gives its original
fields as a :class:`~shared.events.RepeatedFields`.

The dead stream is capped by count and by age (``cap_dead_letters``, run by
the shard's owner on its trim timer; ``queue.dead_letter_maxlen`` and
``queue.dead_letter_max_age``): a dead letter is for an operator to look at,
not a record kept for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio

from ..events import RepeatedFields
from ._connect import redis_errors
from ._entry import Entry, entries_from_reply, fields_of
from ._fleet_meta import read_fleet_meta
from ._keys import Keys
from ._stream_replies import keep_repeated_fields

ORIG_PREFIX = b"orig."
MAX_DETAIL_CHARS = 2000
DEFAULT_MAX_COPY_BYTES = 1_048_576
"""The default cut-off of each copied value: ``security.max_message_bytes``'s default,
so that any entry that was not ``oversized`` is kept whole and can be replayed."""
MAX_COPIED_FIELDS = 32
"""At most this many original fields are copied (``data`` and ``sig`` first): an entry
with thousands of fields must not make the dead-letter write itself fail."""
_FIRST = (b"data", b"sig")


def _raw(value: object) -> bytes:
    # Redis hands us bytes; anything else (a caller's str) is stored as its text.
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    text = value if isinstance(value, str) else repr(value)
    return text.encode("utf-8", "backslashreplace")


def dead_letter_fields(
    entry: Entry,
    *,
    shard: int,
    reason: str,
    detail: str,
    consumer: str,
    now_ms: int,
    max_copy_bytes: int = DEFAULT_MAX_COPY_BYTES,
) -> list[tuple[bytes, bytes]]:
    """Return the fields of the dead-letter entry for ``entry``, in order (see the module doc).

    A list, not a dict: the fields of an entry that repeats a name (a
    :class:`~shared.events.RepeatedFields`) are all copied, repeats included.

    Total: whatever the entry holds (any bytes, str, thousands of fields),
    the result is bytes to bytes, at most :data:`MAX_COPIED_FIELDS` original
    fields of at most ``max_copy_bytes`` each (``truncated`` says when
    something was left out).
    """
    truncated = False
    fields = entry.fields
    pairs = list(fields.pairs if type(fields) is RepeatedFields else fields.items())
    pairs.sort(key=lambda p: _raw(p[0]) not in _FIRST)  # stable: data, sig, then as sent
    if len(pairs) > MAX_COPIED_FIELDS:
        pairs, truncated = pairs[:MAX_COPIED_FIELDS], True
    copied: list[tuple[bytes, bytes]] = []
    for name, raw_value in pairs:
        value = _raw(raw_value)
        if len(value) > max_copy_bytes:
            value, truncated = value[:max_copy_bytes], True
        copied.append((ORIG_PREFIX + _raw(name), value))
    return [
        (b"reason", reason.encode("utf-8", "backslashreplace")[:200]),
        (b"detail", detail[:MAX_DETAIL_CHARS].encode("utf-8", "backslashreplace")),
        (b"stream_id", _raw(entry.id)),
        (b"shard", str(shard).encode()),
        (b"consumer", consumer.encode("utf-8", "backslashreplace")),
        (b"dead_at", str(now_ms).encode()),
        (b"truncated", b"1" if truncated else b"0"),
        *copied,
    ]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-letter entry, parsed."""

    shard: int
    id: bytes
    """The dead-letter entry's own id (in the dead stream)."""
    stream_id: bytes
    """The original entry's id in the shard's event stream."""
    reason: str
    detail: str
    consumer: str
    dead_at_ms: int
    truncated: bool
    fields: dict[bytes, bytes]
    """The original entry's fields (without the ``orig.`` prefix); an empty
    :class:`~shared.events.RepeatedFields` holding them all, as sent, when it repeated a name."""


def parse_dead_letter(shard: int, entry: Entry) -> DeadLetter:
    """Return the dead letter an entry of the dead stream holds (tolerant: missing fields are empty)."""
    f = entry.fields
    flat_orig: list[bytes] = []
    if type(f) is RepeatedFields:  # the original repeated a name, so does its copy (orig.<name>)
        own: list[bytes] = []
        for name, value in f.pairs:
            if name.startswith(ORIG_PREFIX):
                flat_orig += (name[len(ORIG_PREFIX) :], value)
            else:
                own += (name, value)
        f = fields_of(own)  # our own fields are written once; a repeated one reads as missing
    else:
        for name, value in f.items():
            if name.startswith(ORIG_PREFIX):
                flat_orig += (name[len(ORIG_PREFIX) :], value)

    def text(name: bytes) -> str:
        return f.get(name, b"").decode("utf-8", "replace")

    try:
        dead_at = int(f.get(b"dead_at", b"0"))
    except ValueError:
        dead_at = 0
    return DeadLetter(
        shard=shard,
        id=entry.id,
        stream_id=f.get(b"stream_id", b""),
        reason=text(b"reason"),
        detail=text(b"detail"),
        consumer=text(b"consumer"),
        dead_at_ms=dead_at,
        truncated=f.get(b"truncated") == b"1",
        fields=fields_of(flat_orig),
    )


async def read_dead_letters(
    redis_client: redis.asyncio.Redis,
    keys: Keys,
    shard: int | None = None,
    *,
    count: int | None = None,
) -> list[DeadLetter]:
    """Return the dead letters of one shard, or of every shard of the fleet, oldest first per shard.

    ``count`` caps the number read per shard. With ``shard=None`` the shard
    count comes from the fleet's meta record (no record: no dead letters).

    Raises:
        TransientError: Redis is unreachable.
        ConfigError: the fleet's meta record is malformed.
    """
    keep_repeated_fields(redis_client)
    if shard is None:
        meta = await read_fleet_meta(redis_client, keys.fleet)
        if meta is None:
            return []
        shards: range | list[int] = range(meta.shards)
    else:
        shards = [shard]
    out: list[DeadLetter] = []
    with redis_errors("read_dead_letters"):
        async with redis_client.pipeline(transaction=False) as pipe:
            for s in shards:
                pipe.xrange(keys.dead(s), count=count)
            replies = await pipe.execute()
    for s, reply in zip(shards, replies, strict=True):
        out.extend(parse_dead_letter(s, e) for e in entries_from_reply([[b"", reply]]))
    return out


async def count_dead_letters(redis_client: redis.asyncio.Redis, keys: Keys, shards: int) -> dict[int, int]:
    """Return ``{shard: number of dead letters}`` for the shards that have any (one pipelined XLEN each).

    Raises:
        TransientError: Redis is unreachable.
    """
    with redis_errors("count_dead_letters"):
        async with redis_client.pipeline(transaction=False) as pipe:
            for s in range(shards):
                pipe.xlen(keys.dead(s))
            lengths = await pipe.execute()
    return {s: int(n) for s, n in enumerate(lengths) if n}


async def cap_dead_letters(
    redis_client: redis.asyncio.Redis,
    keys: Keys,
    shard: int,
    *,
    maxlen: int,
    max_age_s: float,
    now_ms: int,
) -> int:
    """Drop the shard's dead letters beyond the newest ``maxlen`` and those older than ``max_age_s``.

    A dead letter's id is given by Redis when it is written (``*``), so its
    millisecond part is its age: XTRIM MINID by time, then XTRIM MAXLEN (exact,
    so the cap is a cap). Idempotent.

    Returns:
        How many dead letters were removed.

    Raises:
        TransientError: Redis is unreachable.
    """
    floor = max(0, now_ms - int(max_age_s * 1000))
    stream = keys.dead(shard)
    with redis_errors("cap_dead_letters"):
        async with redis_client.pipeline(transaction=False) as pipe:
            pipe.xtrim(stream, minid=f"{floor}-0", approximate=False)
            pipe.xtrim(stream, maxlen=maxlen, approximate=False)
            by_age, by_count = await pipe.execute()
    return int(by_age) + int(by_count)


__all__ = [
    "cap_dead_letters",
    "DEFAULT_MAX_COPY_BYTES",
    "MAX_COPIED_FIELDS",
    "DeadLetter",
    "count_dead_letters",
    "ORIG_PREFIX",
    "dead_letter_fields",
    "parse_dead_letter",
    "read_dead_letters",
]
