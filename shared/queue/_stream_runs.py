"""The last run of each streaming app, in Redis: which job runs (or ran) which micro-batch.

One small hash per app (``cf:<fleet>:{F}:stream.<app_id>``), written by the
driver before a batch's job starts and when it ends, so a restarted driver
finds the run its predecessor left unfinished and aborts it at once. Redis
holds no decision here: the store's record of the last committed batch does
(``shared.commit``'s stream records); this is the fast path and the pointer to
a dead run. Memory: one hash per app id, expiring after :data:`RUN_TTL_S`
without a batch.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import redis
import redis.asyncio

from ._connect import redis_errors
from ._keys import Keys

RUN_TTL_S = 30 * 86400
"""A run record outlives its app's last batch by this long (then the store's records alone decide)."""

RunState = Literal["running", "done", "failed"]


class StreamRun(msgspec.Struct, frozen=True, kw_only=True):
    """One run of one micro-batch of a streaming app (``datasets``: the job's)."""

    v: int = 1
    job: str
    batch: int
    query: str
    state: RunState
    datasets: list[str]
    at: float


_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(StreamRun)
_FIELD = "run"


def stream_run_key(keys: Keys, app_id: str) -> str:
    """Return the key of ``app_id``'s run record (a fleet-level key)."""
    return keys.fleet_key(f"stream.{app_id}")


def _decode(raw: bytes | str | None) -> StreamRun | None:
    if raw is None:
        return None
    try:
        return _dec.decode(raw)
    except msgspec.DecodeError:
        return None  # unreadable: as if absent; the store's records decide


def read_stream_run_sync(client: redis.Redis, keys: Keys, app_id: str) -> StreamRun | None:
    """Return the app's last run, or None (never written, expired, flushed or unreadable).

    Raises:
        TransientError: Redis unavailable.
    """
    with redis_errors("HGET stream run"):
        raw = client.hget(stream_run_key(keys, app_id), _FIELD)
    return _decode(raw)


def write_stream_run_sync(client: redis.Redis, keys: Keys, app_id: str, run: StreamRun) -> None:
    """Record ``run`` as the app's last run (and refresh the record's expiry).

    Raises:
        TransientError: Redis unavailable.
    """
    key = stream_run_key(keys, app_id)
    with redis_errors("HSET stream run"):
        pipe = client.pipeline(transaction=True)
        pipe.hset(key, _FIELD, _enc.encode(run))
        pipe.expire(key, RUN_TTL_S)
        pipe.execute()


async def read_stream_run(client: redis.asyncio.Redis, keys: Keys, app_id: str) -> StreamRun | None:
    """Async twin of :func:`read_stream_run_sync`."""
    with redis_errors("HGET stream run"):
        raw = await client.hget(stream_run_key(keys, app_id), _FIELD)
    return _decode(raw)


async def delete_stream_run(client: redis.asyncio.Redis, keys: Keys, app_id: str) -> bool:
    """Delete the app's run record; return True when there was one.

    Raises:
        TransientError: Redis unavailable.
    """
    with redis_errors("DEL stream run"):
        return bool(await client.delete(stream_run_key(keys, app_id)))


__all__ = [
    "RUN_TTL_S",
    "StreamRun",
    "delete_stream_run",
    "read_stream_run",
    "read_stream_run_sync",
    "stream_run_key",
    "write_stream_run_sync",
]
