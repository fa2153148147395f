"""A baseline for the worker-intake benchmark: raw consume throughput of one stream."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time

import redis
import redis.asyncio

from shared.queue import Keys, entries_from_reply, keep_repeated_fields, redis_errors

# About the size of a real TaskFinished message with a few files.
_PAYLOAD = (
    b'{"type":"task_finished","v":1,"job":"bench","dataset":"ds","task":0,"attempt":0,' + b"x" * 220 + b"}"
)


async def raw_consume_rate(redis_client: redis.asyncio.Redis, n: int, *, count: int = 500) -> float:
    """Return entries per second for XREADGROUP COUNT ``count`` + XACK over ``n`` synthetic entries.

    Fills a private stream (``cf:bench-<random>:{s0}:events``) with ``n``
    ~300-byte entries (pipelined, not timed), then times reading and
    acknowledging them all in batches from one consumer, without decoding.
    The stream is deleted afterwards, also on error or cancellation.

    Raises:
        TransientError: Redis is unreachable.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    keep_repeated_fields(redis_client)  # entries parsed as the worker's reads parse them
    stream = Keys("bench-" + secrets.token_hex(4)).events(0)
    try:
        with redis_errors("bench fill"):
            for start in range(0, n, 1000):
                async with redis_client.pipeline(transaction=False) as pipe:
                    for _ in range(min(1000, n - start)):
                        pipe.xadd(stream, {b"data": _PAYLOAD})
                    await pipe.execute()
            await redis_client.xgroup_create(stream, "bench", id="0")
        done = 0
        started = time.perf_counter()
        with redis_errors("bench consume"):
            while done < n:
                entries = entries_from_reply(
                    await redis_client.xreadgroup("bench", "c", {stream: ">"}, count=count)
                )
                if not entries:
                    break
                await redis_client.xack(stream, "bench", *[e.id for e in entries])
                done += len(entries)
        elapsed = time.perf_counter() - started
    finally:
        # Shielded so a cancelled benchmark still removes its stream.
        with contextlib.suppress(redis.RedisError):
            await asyncio.shield(redis_client.delete(stream))
    return done / elapsed if elapsed > 0 else float("inf")


__all__ = ["raw_consume_rate"]
