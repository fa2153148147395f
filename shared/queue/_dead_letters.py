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
``truncated``      ``1`` when an original value was cut at the copy limit
``orig.<field>``   every original field (``orig.data``, ``orig.sig``), values
                   cut at the copy limit (1 MiB + 1 KiB by default)
=================  ==========================================================

Original fields are prefixed so that a hostile message cannot forge our own
fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio

from ._connect import redis_errors
from ._entry import Entry, entries_from_reply
from ._fleet_meta import read_fleet_meta
from ._keys import Keys

ORIG_PREFIX = b"orig."
MAX_DETAIL_CHARS = 2000
DEFAULT_MAX_COPY_BYTES = 1_048_576 + 1024


def dead_letter_fields(
    entry: Entry,
    *,
    shard: int,
    reason: str,
    detail: str,
    consumer: str,
    now_ms: int,
    max_copy_bytes: int = DEFAULT_MAX_COPY_BYTES,
) -> dict[bytes, bytes]:
    """Return the fields of the dead-letter entry for ``entry`` (see the module doc)."""
    truncated = False
    copied: dict[bytes, bytes] = {}
    for name, value in entry.fields.items():
        if len(value) > max_copy_bytes:
            value, truncated = value[:max_copy_bytes], True
        copied[ORIG_PREFIX + name] = value
    return {
        b"reason": reason.encode("utf-8", "replace")[:200],
        b"detail": detail[:MAX_DETAIL_CHARS].encode("utf-8", "replace"),
        b"stream_id": entry.id,
        b"shard": str(shard).encode(),
        b"consumer": consumer.encode("utf-8", "replace"),
        b"dead_at": str(now_ms).encode(),
        b"truncated": b"1" if truncated else b"0",
        **copied,
    }


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
    """The original entry's fields (without the ``orig.`` prefix)."""


def parse_dead_letter(shard: int, entry: Entry) -> DeadLetter:
    """Return the dead letter an entry of the dead stream holds (tolerant: missing fields are empty)."""
    f = entry.fields

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
        fields={k[len(ORIG_PREFIX) :]: v for k, v in f.items() if k.startswith(ORIG_PREFIX)},
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


__all__ = [
    "DEFAULT_MAX_COPY_BYTES",
    "DeadLetter",
    "count_dead_letters",
    "ORIG_PREFIX",
    "dead_letter_fields",
    "parse_dead_letter",
    "read_dead_letters",
]
