"""The in-flight board written behind: coalescing, one pipelined write, nothing lost to a Redis failure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import redis.asyncio

from shared.queue import Keys
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for
from workers._inflight import BOARD, InFlight, InFlightBoard, WorkState


def _rec(dataset: str, state: WorkState = "running") -> InFlight:
    now = time.time()
    return InFlight(
        work="commit", dataset=dataset, job="j", worker="w", state=state, since=now, state_since=now
    )  # type: ignore[arg-type]


async def _commands(r: redis.asyncio.Redis) -> int:
    stats = await r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_hset", "cmdstat_hdel"))


async def test_work_that_ends_before_the_flush_never_reaches_redis(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    board = InFlightBoard(redis_client, keys, 0, delay=0.05)
    key = keys.shard_state(0, BOARD)
    before = await _commands(redis_client)
    for i in range(50):
        board.put(f"commit|j|d{i}", _rec(f"d{i}"))
        board.drop(f"commit|j|d{i}")
    assert await board.flush()
    assert await _commands(redis_client) == before  # nothing to write, nothing written
    assert await redis_client.hlen(key) == 0


async def test_changes_are_written_together_and_deletes_follow_writes(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    board = InFlightBoard(redis_client, keys, 0, delay=0.05)
    key = keys.shard_state(0, BOARD)
    writer = asyncio.create_task(board.run())
    try:
        before = await _commands(redis_client)
        for i in range(20):
            board.put(f"commit|j|d{i}", _rec(f"d{i}", "queued"))
            board.put(f"commit|j|d{i}", _rec(f"d{i}", "running"))  # only the last state is written
        await wait_for(lambda: _hlen_is(redis_client, key, 20), timeout=5, what="20 fields")
        assert await _commands(redis_client) - before == 1  # one HSET for all of them
        raw = await redis_client.hget(key, "commit|j|d3")
        assert raw is not None and b'"running"' in raw
        for i in range(20):
            board.drop(f"commit|j|d{i}")
        await wait_for(lambda: _hlen_is(redis_client, key, 0), timeout=5, what="fields deleted")
        assert await _commands(redis_client) - before == 2  # and one HDEL
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def test_a_redis_failure_keeps_the_changes_for_the_next_flush(
    redis_factory: Callable[..., RedisServer], fleet_name: str
) -> None:
    server = redis_factory(persistent=True)  # a's field survives the restart: its delete must not be lost
    keys = Keys(fleet_name)
    key = keys.shard_state(0, BOARD)
    r = redis.asyncio.Redis.from_url(server.url, socket_timeout=2, socket_connect_timeout=2)
    try:
        board = InFlightBoard(r, keys, 0, delay=0.05)
        board.put("commit|j|a", _rec("a"))
        assert await board.flush()
        server.stop()
        board.put("commit|j|b", _rec("b"))
        board.drop("commit|j|a")
        assert not await board.flush()  # logged, not raised
        server.restart()
        writer = asyncio.create_task(board.run())
        try:
            board.put("commit|j|c", _rec("c"))  # wakes the writer; b and a's delete are still due
            await wait_for(
                lambda: _fields_are(r, key, {b"commit|j|b", b"commit|j|c"}), timeout=20, what="b and c only"
            )
        finally:
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
    finally:
        await r.aclose()


async def _hlen_is(r: redis.asyncio.Redis, key: str, n: int) -> bool:
    return bool(await r.hlen(key) == n)


async def _fields_are(r: redis.asyncio.Redis, key: str, fields: set[bytes]) -> bool:
    try:
        return set(await r.hkeys(key)) == fields
    except (redis.exceptions.ConnectionError, OSError):
        return False


class _GatedPipelines:
    """A client whose pipelines wait at ``execute`` until ``gate`` is set (``entered`` says one waits)."""

    def __init__(self, real: redis.asyncio.Redis) -> None:
        self._real = real
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def pipeline(self, transaction: bool = True) -> _GatedPipeline:
        return _GatedPipeline(self._real.pipeline(transaction=transaction), self)


class _GatedPipeline:
    def __init__(self, real: redis.asyncio.client.Pipeline, owner: _GatedPipelines) -> None:
        self._real = real
        self._owner = owner

    async def __aenter__(self) -> _GatedPipeline:
        await self._real.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._real.__aexit__(*exc)

    def hset(self, *args: object, **kwargs: object) -> None:
        self._real.hset(*args, **kwargs)  # type: ignore[arg-type]

    def hdel(self, *args: object) -> None:
        self._real.hdel(*args)  # type: ignore[arg-type]

    async def execute(self) -> list[object]:
        self._owner.entered.set()
        await self._owner.gate.wait()
        return await self._real.execute()


async def test_work_that_ends_while_its_record_is_being_written_is_deleted_after_it(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    gated = _GatedPipelines(redis_client)
    board = InFlightBoard(gated, keys, 0, delay=0.05)  # type: ignore[arg-type]
    key = keys.shard_state(0, BOARD)
    board.put("commit|j|d", _rec("d"))
    flushing = asyncio.create_task(board.flush())
    await asyncio.wait_for(gated.entered.wait(), timeout=5)
    board.drop("commit|j|d")  # the work ended while its "running" record is on its way
    gated.gate.set()
    assert await flushing
    assert await redis_client.hexists(key, "commit|j|d")  # written: it was on its way...
    assert await board.flush()
    assert await redis_client.hlen(key) == 0  # ...and deleted by the next flush, never left behind


async def test_the_writer_ends_when_a_write_loses_its_cancel(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    """On Python 3.11 redis-py can drop a cancel landing as a command completes; the
    writer then sees its request still pending and ends (its shard runner waits for it)."""
    board = InFlightBoard(redis_client, Keys(fleet_name), 0, delay=0.01)
    in_write = asyncio.Event()

    async def write_that_loses_the_cancel() -> bool:
        in_write.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # what the lost cancel looks like from here: the write "completed"
        return True

    board.flush = write_that_loses_the_cancel  # type: ignore[method-assign]
    writer = asyncio.create_task(board.run())
    board.put("commit|j|d0", _rec("d0"))
    await asyncio.wait_for(in_write.wait(), 5)
    writer.cancel()  # once, as a TaskGroup or the runner does
    done, _ = await asyncio.wait([writer], timeout=5)
    assert writer in done, "the board writer went on after its cancel was lost"
    assert writer.cancelled()
