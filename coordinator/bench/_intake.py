"""``commitfleet bench``: worker intake throughput against raw Redis consumption, same run.

The figure is the ratio: events per second one worker process decodes,
validates, records durably (job state + acknowledgement in one fenced Lua script) and
acknowledges, divided by the raw ``XREADGROUP COUNT 500`` + ``XACK`` rate of
the same Redis. Both are measured in several alternating rounds (raw first in
odd rounds, the worker first in even ones, each round on a fresh fleet), and
the median of the per-round ratios is reported: a change of machine load
between the two measurements moves one round's ratio, not the median.
The CLI sets this process's garbage collector up as a worker process's
(``workers._heap.tune_gc``), since the worker runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
from rich.console import Console

from coordinator import Coordinator
from coordinator.demo import ThrowawayRedis
from shared import Settings, TaskGroup, load_settings
from shared.events import JobStarted, StagedFile, TaskFinished, TraceContext
from shared.queue import AsyncPublisher, Keys, ShardConsumer, connect, ensure_fleet
from shared.settings import masked_url
from workers import Worker

from ._raw import raw_consume_rate


def _bench_settings(redis_url: str, root: Path) -> Settings:
    return load_settings(
        env={},
        overrides={
            "fleet": {"name": f"bench-{secrets.token_hex(3)}", "shards": 1},
            "redis": {"url": redis_url},
            "store": {"url": root.as_uri()},
            "worker": {"lease": 6.0, "heartbeat": 1.0, "read_block_ms": 100, "read_batch": 500},
            "coordinator": {"tick": 0.1, "http_port": 0},
            "log": {"level": "WARNING", "format": "text"},
        },
    )


async def measure_raw(settings: Settings, n: int) -> float:
    """Return the raw XREADGROUP+XACK rate (events/s) of ``settings``' Redis over ``n`` entries."""
    r = connect(settings.redis)
    try:
        return await raw_consume_rate(r, n)
    finally:
        await r.aclose()


async def measure_intake(settings: Settings, n: int, *, limit_s: float = 300.0) -> float:
    """Return the worker intake rate (events/s) for ``n`` TaskFinished events on a fresh fleet.

    The shard's consumer group is created before the worker starts (the
    worker's own creation then finds it), so the observer never polls a group
    that does not exist yet.

    Raises:
        TimeoutError: the backlog was not drained within ``limit_s`` seconds.
    """
    rate, _cpu = await measure_intake_cpu(settings, n, limit_s=limit_s)
    return rate


async def measure_intake_cpu(
    settings: Settings, n: int, *, limit_s: float = 300.0, trace: TraceContext | None = None
) -> tuple[float, float]:
    """Return :func:`measure_intake`'s rate and this process's CPU microseconds per event meanwhile.

    ``trace``: the job's ``job_started`` carries it (the worker traces as ``settings.tracing`` says).

    The CPU figure (the worker, the idle coordinator and the observer, all in
    this process) moves far less with the machine's load than the rate does.

    Raises:
        TimeoutError: the backlog was not drained within ``limit_s`` seconds.
    """
    r = connect(settings.redis)
    try:
        await ensure_fleet(r, settings.fleet.name, settings.fleet.shards)
        pub = AsyncPublisher(r, settings.fleet.name, settings.fleet.shards)
        files = [
            StagedFile(path="part-0.parquet", size=123456),
            StagedFile(path="part-1.parquet", size=654321),
        ]
        now = time.time()
        opened = JobStarted(job="bench", datasets=["ds"], timeout_s=3600, started_at=now)
        await pub.publish(opened if trace is None else msgspec.structs.replace(opened, trace=trace))
        await pub.publish_many(
            TaskFinished(
                job="bench",
                dataset="ds",
                task=i,
                attempt=0,
                files=files,
                watermarks={"p": i},
                finished_at=now,
            )
            for i in range(n)
        )
        consumer = ShardConsumer(r, Keys(settings.fleet.name), 0, consumer="bench-observer")
        await consumer.ensure_group()
        coord = Coordinator(settings, coordinator_id="bench-coordinator")
        worker = Worker(settings, worker_id="bench-worker")
        async with TaskGroup() as tg:
            tasks = [tg.create_task(coord.run()), tg.create_task(worker.run())]
            try:
                # Start the clock when the shard starts (no event exposes that).
                while 0 not in worker.running_shards:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                started = time.perf_counter()
                cpu0 = time.process_time()
                async with asyncio.timeout(limit_s):
                    await _drained(consumer)
                elapsed = time.perf_counter() - started
                cpu = time.process_time() - cpu0
            finally:
                worker.shutdown()
                coord.shutdown()
            await asyncio.gather(*tasks)
        return n / elapsed, cpu / n * 1e6
    finally:
        await r.aclose()


async def _drained(consumer: ShardConsumer) -> None:
    """Return once the group has read and acknowledged everything in the stream."""
    while True:
        lag = await consumer.lag()
        if lag.pending == 0 and (lag.lag or 0) == 0 and lag.last_delivered_id != b"0-0":
            return
        await asyncio.sleep(0.01)


async def run_bench(settings: Settings, n: int, *, console: Console, rounds: int = 3) -> float:
    """Run the intake benchmark in ``rounds`` alternating rounds; print each and the median ratio; return it.

    Uses REDIS_URL, or a throwaway redis-server.
    """
    work = Path(tempfile.mkdtemp(prefix="commitfleet-bench-"))
    server: ThrowawayRedis | None = None
    try:
        url = os.environ.get("REDIS_URL", "")
        if not url:
            server = ThrowawayRedis(work)
            url = server.url
        console.print(
            f"intake benchmark: {n} TaskFinished events, one worker, one shard, redis {masked_url(url)}, "
            f"{rounds} alternating rounds"
        )
        ratios = []
        for i in range(rounds):
            s = _bench_settings(url, work / f"store-{i}")
            if i % 2 == 0:
                raw = await measure_raw(s, n)
                intake, cpu = await measure_intake_cpu(s, n)
            else:
                intake, cpu = await measure_intake_cpu(s, n)
                raw = await measure_raw(s, n)
            ratios.append(intake / raw)
            console.print(
                f"round {i + 1}: raw XREADGROUP+XACK {raw:,.0f} events/s, worker intake (decode, validate, "
                f"record durably, ack) {intake:,.0f} events/s, ratio {intake / raw:.2f}; "
                f"intake CPU {cpu:.1f} us/event"
            )
        ratio = statistics.median(ratios)
        console.print(f"[bold]ratio intake/raw: {ratio:.2f} (median of {rounds})[/]")
        return ratio
    finally:
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
