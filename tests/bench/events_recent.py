"""``GET /events/recent`` benchmark (a script, not a test): one answer's time and size, full admin stream.

Starts a private redis-server, fills the admin stream with ``--events``
``committed`` events (100,000: the stream's default cap), written by the
project's encoder, starts an :class:`AdminServer` in this process and asks
``/events/recent`` ``--runs`` times per query: no filter (100 and 1,000
events), and filters that match little or nothing (each then reads its whole
bounded scan, ``RECENT_SCAN`` entries). Prints median and p95 wall time and
the answer's size::

    .venv/bin/python -m tests.bench.events_recent --events 100000 --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from coordinator.admin import AdminServer
from shared import load_settings
from shared.events import Committed, encode_admin
from shared.queue import Keys, connect, ensure_fleet
from tests._support.redis_server import RedisServer


async def run(events: int, runs: int, workdir: Path) -> None:
    server_redis = RedisServer(workdir / "redis")
    server_redis.start()
    try:
        s = load_settings(
            env={},
            overrides={
                "fleet": {"name": "bench", "shards": 4},
                "redis": {"url": server_redis.url},
                "store": {"url": (workdir / "store").as_uri()},
                "coordinator": {"http_port": 0},
            },
        )
        r = connect(s.redis, client_name="bench-events")
        keys = Keys("bench")
        await ensure_fleet(r, "bench", 4)
        for first in range(0, events, 1000):
            async with r.pipeline(transaction=False) as pipe:
                for i in range(first, min(first + 1000, events)):
                    ev = Committed(
                        at=time.time(),
                        dataset=f"ds{i % 5000}",
                        job=f"job-{i // 10}",
                        files=3,
                        bytes=1234,
                        duration_s=0.2,
                        phases={"publish": 0.1, "apply": 0.05},
                    )
                    pipe.xadd(keys.admin, {b"data": encode_admin(ev)})
                await pipe.execute()
        admin = AdminServer(s, r, keys, coordinator_id="bench", leading=asyncio.Event())
        await admin.start()
        url = f"http://127.0.0.1:{admin.port}/events/recent"
        queries = [
            ("no filter, limit 100", {}),
            ("no filter, limit 1000", {"limit": "1000"}),
            ("job of 10 events (newest)", {"job": f"job-{events // 10 - 3}"}),
            ("dataset that matches nothing", {"dataset": "nothing"}),
            ("type that matches nothing", {"type": "aborted"}),
        ]
        print(f"admin stream: {await r.xlen(keys.admin)} entries; {runs} requests per query")
        try:
            async with aiohttp.ClientSession() as http:
                for label, params in queries:
                    times: list[float] = []
                    size = scanned = 0
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        async with http.get(url, params=params) as resp:
                            body = await resp.read()
                            assert resp.status == 200, body
                        times.append(time.perf_counter() - t0)
                        size = len(body)
                    async with http.get(url, params=params) as resp:
                        scanned = (await resp.json())["scanned"]
                    times.sort()
                    p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
                    print(
                        f"{label:32} median {statistics.median(times) * 1000:6.1f} ms"
                        f"  p95 {p95 * 1000:6.1f} ms  {size:7d} bytes  {scanned:6d} entries read"
                    )
        finally:
            await admin.stop()
            await r.aclose()
    finally:
        server_redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.events, args.runs, Path(tmp)))


if __name__ == "__main__":
    main()
