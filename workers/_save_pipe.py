"""A shard's saves sent ahead: the next batch is judged while Redis runs this one's save.

Under a backlog, intake sends a batch's save (the fenced script of
:mod:`workers._state_store`) and the read of a batch after it (``XREADGROUP``)
together, on a connection it takes from the pool for them, and reads their
replies only after it has judged the batch it already holds. Redis and the
worker then work at the same time instead of in turn. Only with a plain
Redis client and ``redis.durability`` = ``memory`` (see
:attr:`ShardStateStore.sends_ahead`); elsewhere intake saves one batch at a
time, each waiting for its ``WAIT`` / ``WAITAOF``.

The save itself is the same script, so it is as atomic and as fenced as a
plain one; what changes is only when its reply is read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.exceptions as rx
from redis.asyncio.connection import AbstractConnection, ConnectionPool

from shared.queue import DEFAULT_GROUP, Entry, entries_from_raw, redis_errors

from ._state_store import Prepared, ShardStateStore


class SentSave:
    """A save (and maybe a read) on the wire; :meth:`result` reads the replies, :meth:`abandon` drops them."""

    def __init__(
        self,
        store: ShardStateStore,
        prep: Prepared,
        pool: ConnectionPool,
        conn: AbstractConnection,
        asked: int,
    ) -> None:
        self._store = store
        self._prep = prep
        self._pool = pool
        self._conn: AbstractConnection | None = conn
        self.asked = asked
        """How many entries the read behind the save asked for (0: no read)."""

    async def result(self) -> list[Entry]:
        """Return the entries the read took once the save is durable (in id order, pending to our consumer).

        A read that fails (the group deleted, say) returns nothing and leaves
        the problem to the next plain read.

        Raises:
            Fenced: another worker owns the shard: nothing was written or
                acknowledged; entries the read took stay pending to us, and
                the owner takes them over on its next tick.
            TransientError: Redis unavailable (the save is atomic and
                idempotent: all of it or nothing was written).

        Cancelled: the connection is closed (its replies unread), then
            ``CancelledError`` is re-raised; the save's outcome is unknown.
        """
        conn = self._conn
        if conn is None:
            raise RuntimeError("the replies of this save were already read or dropped")
        read: object = None
        with redis_errors("save shard state"):
            try:
                try:
                    saved: object = await conn.read_response()
                except rx.ResponseError as exc:
                    saved = exc
                if self.asked:
                    try:
                        read = await conn.read_response()
                    except rx.ResponseError:
                        read = None
            except BaseException:
                await self.abandon()
                raise
            self._conn = None
            await self._pool.release(conn)
            saved = await self._store.settle(self._prep, saved)
        self._store.check_saved(saved)
        return entries_from_raw(_rows(read))

    async def abandon(self) -> None:
        """Close the connection without reading its replies (shielded); safe twice. Never raises."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.shield(_drop(self._pool, conn))


async def send_save(store: ShardStateStore, prep: Prepared, read_next: int) -> SentSave:
    """Send ``prep``'s save and, with ``read_next`` > 0, a read of that many new entries behind it.

    Returns:
        The save on the wire: await its :meth:`SentSave.result` (or call
        :meth:`SentSave.abandon`) before the next save of the shard.

    Raises:
        TransientError: Redis unavailable (nothing was sent, or the save's
            outcome is unknown).
        TypeError: the store does not send ahead (see ``sends_ahead``).

    Cancelled: the connection is closed; whether the save ran is unknown.
    """
    if not store.sends_ahead:
        raise TypeError("this shard state store saves one batch at a time")
    pool = store.redis.connection_pool
    commands: list[tuple[str | bytes | int, ...]] = [
        ("EVALSHA", store.script_sha, len(prep.keys), *prep.keys, *prep.args)
    ]
    if read_next:
        group, consumer, stream = DEFAULT_GROUP, store.consumer, store.stream
        commands.append(("XREADGROUP", "GROUP", group, consumer, "COUNT", read_next, "STREAMS", stream, ">"))
    with redis_errors("save shard state"):
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except BaseException:
            await asyncio.shield(_drop(pool, conn))
            raise
    return SentSave(store, prep, pool, conn, read_next)


def _rows(read: object) -> Any:
    """Return the rows of a raw one-stream XREADGROUP reply: ``{stream: rows}`` in RESP3,
    ``[[stream, rows]]`` in RESP2; none for a nil (nothing new) or a failed read."""
    if isinstance(read, dict):
        return next(iter(read.values()), None)
    if isinstance(read, list) and read:
        return read[0][1]
    return None


async def _drop(pool: ConnectionPool, conn: AbstractConnection) -> None:
    # Replies may still be on their way: the connection cannot serve anybody else.
    try:
        await conn.disconnect()
    finally:
        await pool.release(conn)


__all__ = ["SentSave", "send_save"]
