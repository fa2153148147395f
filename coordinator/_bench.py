"""``commitfleet bench``: worker intake throughput against raw Redis consumption, same run.

The figure is the ratio: events per second one worker process decodes,
validates, records durably (job state + acknowledgement in one MULTI/EXEC) and
acknowledges, divided by the raw ``XREADGROUP COUNT 500`` + ``XACK`` rate of
the same Redis measured just before. Both run against the same server, so
machine noise mostly cancels out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from rich.console import Console

from shared import Settings, load_settings
from shared.events import JobStarted, StagedFile, TaskFinished
from shared.queue import AsyncPublisher, Keys, ShardConsumer, connect, ensure_fleet, raw_consume_rate
from workers import Worker

from ._coordinator import Coordinator
from ._procs import ThrowawayRedis


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


async def measure_intake(settings: Settings, n: int) -> tuple[float, float]:
    """Return (worker intake events/s, raw consume events/s) for ``n`` TaskFinished events."""
    r = connect(settings.redis)
    try:
        raw = await raw_consume_rate(r, n)
        await ensure_fleet(r, settings.fleet.name, settings.fleet.shards)
        pub = AsyncPublisher(r, settings.fleet.name, settings.fleet.shards)
        files = [
            StagedFile(path="part-0.parquet", size=123456),
            StagedFile(path="part-1.parquet", size=654321),
        ]
        now = time.time()
        await pub.publish(JobStarted(job="bench", datasets=["ds"], timeout_s=3600, started_at=now))
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
        coord = Coordinator(settings, coordinator_id="bench-coordinator")
        worker = Worker(settings, worker_id="bench-worker")
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(coord.run()), tg.create_task(worker.run())]
            try:
                # Start the clock when the shard starts (no event exposes that).
                while 0 not in worker.running_shards:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                started = time.perf_counter()
                while True:
                    lag = await consumer.lag()
                    if lag.pending == 0 and (lag.lag or 0) == 0 and lag.last_delivered_id != b"0-0":
                        break
                    await asyncio.sleep(0.01)
                elapsed = time.perf_counter() - started
            finally:
                worker.shutdown()
                coord.shutdown()
            await asyncio.gather(*tasks)
        return n / elapsed, raw
    finally:
        await r.aclose()


async def run_bench(settings: Settings, n: int, *, console: Console) -> None:
    """Run the intake benchmark and print the ratio (uses REDIS_URL or a throwaway redis-server)."""
    work = Path(tempfile.mkdtemp(prefix="commitfleet-bench-"))
    server: ThrowawayRedis | None = None
    try:
        url = os.environ.get("REDIS_URL", "")
        if not url:
            server = ThrowawayRedis(work)
            url = server.url
        s = _bench_settings(url, work / "store")
        console.print(f"intake benchmark: {n} TaskFinished events, one worker, one shard, redis {url}")
        intake, raw = await measure_intake(s, n)
        console.print(f"raw XREADGROUP+XACK: {raw:,.0f} events/s")
        console.print(f"worker intake (decode, validate, record durably, ack): {intake:,.0f} events/s")
        console.print(f"[bold]ratio intake/raw: {intake / raw:.2f}[/]")
    finally:
        if server is not None:
            server.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
