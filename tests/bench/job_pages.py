"""Job and dataset pages benchmark (a script, not a test): does a page cost the same whatever the job's size?

Starts a private redis-server and writes, as the workers write them, a fleet
of ``--shards`` shards holding one job of ``--datasets`` open datasets (100,000;
a third of them committed, with their results) and a baseline job of 100
datasets in the same hashes. Serves the admin API in this process and asks,
``--runs`` times each: the first page of ``GET /jobs/{job}`` (100 datasets)
of the baseline and of the big job, a page of 1,000, and then walks the big
job's every page (1,000 a page) once. Then ``GET /datasets/{name}`` of a
dataset with one commit and of one with ``--commits`` (1,000) manifests in a
local store. Prints median and max times, bytes, and each big figure as a
ratio against its baseline measured in the same run, and this process's RSS
before and after (the pages hold one page at a time)::

    .venv/bin/python -m tests.bench.job_pages --datasets 100000 --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec
import redis.asyncio

from coordinator.admin import AdminServer
from shared import load_settings
from shared.commit import Manifest, ManifestFile
from shared.events import Committed, encode_admin, manifest_key
from shared.queue import DatasetResult, Keys, connect, encode_result, ensure_fleet, shard_of
from shared.storage import open_store
from tests._support.memory import rss_mb
from tests._support.redis_server import RedisServer
from workers import DatasetState, JobMeta

BASE = 100


async def _fill(r: redis.asyncio.Redis, keys: Keys, shards: int, job: str, n: int, prefix: str) -> None:
    enc = msgspec.json.Encoder()
    now = time.time()
    for first in range(0, n, 5000):
        async with r.pipeline(transaction=False) as pipe:
            for i in range(first, min(first + 5000, n)):
                name = f"{prefix}{i:06d}"
                s = shard_of(name, shards)
                done = i % 3 == 0
                ds = DatasetState(status="committed" if done else "waiting")
                pipe.hset(keys.shard_state(s, "datasets"), f"{job}/{name}", enc.encode(ds))
                if done:
                    res = DatasetResult(
                        status="committed", files=10, bytes=10_000, manifest=manifest_key(name, job), at=now
                    )
                    pipe.hset(keys.job_result(s, job), name, encode_result(res))
            await pipe.execute()
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.hset(
                keys.shard_state(s, "jobs"),
                job,
                enc.encode(JobMeta(job=job, opened_at=now, deadline=now + 300)),
            )
        await pipe.execute()


async def _timed(http: aiohttp.ClientSession, url: str, runs: int, **params: str) -> tuple[list[float], int]:
    times: list[float] = []
    size = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        async with http.get(url, params=params) as resp:
            body = await resp.read()
            assert resp.status == 200, body[:300]
        times.append(time.perf_counter() - t0)
        size = len(body)
    return times, size


def _line(label: str, times: list[float], size: int, base: float | None = None) -> str:
    med = statistics.median(times)
    ratio = f"  {med / base:5.2f}x baseline" if base else ""
    return f"{label:44} median {med * 1000:7.1f} ms  max {max(times) * 1000:7.1f} ms  {size:8d} bytes{ratio}"


async def run(datasets: int, commits: int, shards: int, runs: int, workdir: Path) -> None:
    server_redis = RedisServer(workdir / "redis")
    server_redis.start()
    try:
        s = load_settings(
            env={},
            overrides={
                "fleet": {"name": "bench", "shards": shards},
                "redis": {"url": server_redis.url},
                "store": {"url": (workdir / "store").as_uri()},
                "coordinator": {"http_port": 0},
            },
        )
        (workdir / "store").mkdir()
        r = connect(s.redis, client_name="bench-pages")
        keys = Keys("bench")
        await ensure_fleet(r, "bench", shards)
        t0 = time.perf_counter()
        await _fill(r, keys, shards, "job-base", BASE, "b")
        await _fill(r, keys, shards, "job-big", datasets, "d")
        print(
            f"state: {datasets:,} + {BASE} datasets on {shards} shards,"
            f" written in {time.perf_counter() - t0:.1f} s"
        )
        async with open_store(s.store.url, s.store) as store:
            for i in range(commits):
                for name in (["one"] if i == 0 else []) + ["many"]:
                    m = Manifest(
                        dataset=name,
                        job=f"job-{i:06d}",
                        files=[ManifestFile(key=f"{name}/f{i}", size=100)],
                        watermarks={"k": i},
                        epoch=1,
                        committed_at=time.time(),
                    )
                    await store.write(manifest_key(name, m.job), msgspec.json.encode(m))
            async with r.pipeline(transaction=False) as pipe:
                for i in range(max(0, commits - 20), commits):
                    ev = Committed(
                        at=time.time(), dataset="many", job=f"job-{i:06d}", files=1, bytes=100, duration_s=0.1
                    )
                    pipe.xadd(keys.admin, {b"data": encode_admin(ev)})
                await pipe.execute()
            admin = AdminServer(s, r, keys, coordinator_id="bench", leading=asyncio.Event(), store=store)
            await admin.start()
            base_url = f"http://127.0.0.1:{admin.port}"
            rss0 = rss_mb(os.getpid())
            try:
                async with aiohttp.ClientSession() as http:
                    b_times, b_size = await _timed(http, f"{base_url}/jobs/job-base", runs, limit="100")
                    base = statistics.median(b_times)
                    print(_line(f"job page, {BASE}-dataset job (baseline)", b_times, b_size))
                    times, size = await _timed(http, f"{base_url}/jobs/job-big", runs, limit="100")
                    print(_line(f"job page 1, {datasets:,}-dataset job", times, size, base))
                    times, size = await _timed(http, f"{base_url}/jobs/job-big", runs, limit="1000")
                    print(_line(f"job page 1 (1,000), {datasets:,}-dataset job", times, size, base))
                    cursor: str | None = None
                    pages, seen, page_times, biggest = 0, 0, [], 0
                    walk0 = time.perf_counter()
                    while True:
                        params = {"limit": "1000", "events": "0"} | ({"cursor": cursor} if cursor else {})
                        t1 = time.perf_counter()
                        async with http.get(f"{base_url}/jobs/job-big", params=params) as resp:
                            body = await resp.read()
                        page_times.append(time.perf_counter() - t1)
                        doc = msgspec.json.decode(body)
                        pages += 1
                        seen += len(doc["datasets"])
                        biggest = max(biggest, len(body))
                        if (cursor := doc["next"]) is None:
                            break
                    walk = time.perf_counter() - walk0
                    print(
                        f"walk of every page (1,000 a page): {seen:,} datasets in {pages} pages,"
                        f" {walk:.2f} s; page median {statistics.median(page_times) * 1000:.1f} ms,"
                        f" max {max(page_times) * 1000:.1f} ms, largest {biggest:,} bytes"
                    )
                    d_times, d_size = await _timed(http, f"{base_url}/datasets/one", runs)
                    print(_line("dataset page, 1 commit (baseline)", d_times, d_size))
                    times, size = await _timed(http, f"{base_url}/datasets/many", runs)
                    print(
                        _line(
                            f"dataset page, {commits:,} commits (newest 10)",
                            times,
                            size,
                            statistics.median(d_times),
                        )
                    )
                    times, size = await _timed(http, f"{base_url}/datasets/many", runs, commits="100")
                    print(
                        _line(
                            f"dataset page, {commits:,} commits (newest 100)",
                            times,
                            size,
                            statistics.median(d_times),
                        )
                    )
                print(
                    f"this process's RSS: {rss0:.0f} MB before the requests,"
                    f" {rss_mb(os.getpid()):.0f} MB after"
                )
            finally:
                await admin.stop()
                await r.aclose()
    finally:
        server_redis.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.datasets, args.commits, args.shards, args.runs, Path(tmp)))


if __name__ == "__main__":
    main()
