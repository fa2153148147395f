"""Soak benchmark (a script, not a test): does memory follow open work, not history?

Runs ``--datasets`` N datasets x ``--tasks`` tasks (one job per ``--per-job``
datasets) through a coordinator and ``--workers`` worker processes on local
files and a private redis-server, samples every ``--sample`` seconds each
worker's RSS, the coordinator's RSS and Redis ``used_memory``, and prints a
table and a verdict against the targets of issue 9::

    .venv/bin/python -m tests.bench.soak --datasets 5000
    .venv/bin/python -m tests.bench.soak --datasets 100000 --malloc-trim-threshold 131072

Targets: worker RSS at the end within 5 MB of its value at a tenth of the run
(after warm-up); Redis ``used_memory`` within 2x its idle level once drained;
``commitfleet status`` under 60 lines, answered in under 1 s.

Jobs are published while at most ``--open-jobs`` are unfinished, so the
backlog in Redis stays bounded as in a real pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio

from coordinator._procs import FleetProcess, ThrowawayRedis, write_config
from shared import Settings
from shared.queue import AsyncPublisher, Keys, ensure_fleet
from shared.storage import open_store
from tests.fleet._helpers import fleet_settings, good_job


def rss_mb(pid: int) -> float:
    """Return the resident set size of ``pid`` in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Sample:
    t: float
    committed: int
    workers: list[float]
    coordinator: float
    redis_mb: float


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    idle_redis_mb: float = 0.0


async def used_memory_mb(r: redis.asyncio.Redis) -> float:
    info = await r.info("memory")
    return int(info["used_memory"]) / 1e6


async def committed(r: redis.asyncio.Redis, keys: Keys) -> int:
    return int(await r.hget(keys.outcome_counts, "committed") or 0)


async def sampler(
    r: redis.asyncio.Redis, keys: Keys, procs: list[FleetProcess], run: Run, every: float, t0: float
) -> None:
    while True:
        run.samples.append(
            Sample(
                t=time.monotonic() - t0,
                committed=await committed(r, keys),
                workers=[rss_mb(p.pid) for p in procs[1:]],
                coordinator=rss_mb(procs[0].pid),
                redis_mb=await used_memory_mb(r),
            )
        )
        await asyncio.sleep(every)


# Key kinds that keep history on purpose, for a documented retention (docs/queue.md, "What is kept").
RETAINED = {"admin", "admin outcome marker", "job result"}


async def breakdown(r: redis.asyncio.Redis, fleet: str) -> dict[str, tuple[int, int]]:
    """Return ``{key kind: (keys, bytes)}`` for the fleet's keys (the kind drops dataset and job names)."""
    out: dict[str, tuple[int, int]] = {}
    async for key in r.scan_iter(match=f"cf:{fleet}:*", count=1000):
        text = key.decode()
        parts = text.split(":")
        kind = ":".join(p for p in parts[2:4] if not p.startswith("{s")) or text
        if ":outcome:" in text:
            kind = "admin outcome marker"
        elif ":result:" in text:
            kind = "job result"
        elif ":alive:" in text:
            kind = "job liveness"
        n, size = out.get(kind, (0, 0))
        out[kind] = (n + 1, size + int(await r.memory_usage(key) or 0))
    return out


def status_check(config: Path) -> tuple[int, float, int]:
    """Run ``commitfleet status``; return (lines, seconds, exit code)."""
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "coordinator", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "140"},
    )
    return len(res.stdout.splitlines()), time.perf_counter() - t, res.returncode


async def soak(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="commitfleet-soak-"))
    server = ThrowawayRedis(work)
    fleet = "soak-" + secrets.token_hex(3)
    settings: Settings = fleet_settings(
        server.url,
        work / "store",
        fleet,
        shards=args.shards,
        queue={"trim_interval": 2.0},
        log={"level": "WARNING", "format": "json"},
        coordinator={"tick": 0.5, "http_port": 0},
        worker={"lease": 15.0, "heartbeat": 3.0, "read_block_ms": 500, "drain_grace": 30.0},
        lock={"validity": 30.0, "renew_interval": 10.0, "max_drift": 0.5, "poll_min": 0.05, "poll_max": 2.0},
    )
    (work / "store").mkdir()
    config = write_config(settings, work / "soak.toml")
    keys = Keys(fleet)
    r = redis.asyncio.Redis.from_url(server.url)
    env_note = ""
    if args.malloc_trim_threshold is not None:
        os.environ["MALLOC_TRIM_THRESHOLD_"] = str(args.malloc_trim_threshold)
        env_note = f" MALLOC_TRIM_THRESHOLD_={args.malloc_trim_threshold}"
    procs = [FleetProcess("coordinator", "soak-coordinator", config, work)]
    procs += [FleetProcess("worker", f"soak-worker-{i}", config, work) for i in range(args.workers)]
    run = Run()
    t0 = time.monotonic()
    try:
        await ensure_fleet(r, fleet, args.shards)
        # Idle: the fleet up and settled, nothing published yet.
        await asyncio.sleep(5)
        run.idle_redis_mb = await used_memory_mb(r)
        task = asyncio.create_task(sampler(r, keys, procs, run, args.sample, t0))
        pub = AsyncPublisher(r, fleet, args.shards)
        print(
            f"soak: {args.datasets} datasets x {args.tasks} tasks, {args.workers} workers{env_note}, {work}"
        )
        async with open_store(settings.store.url, settings.store) as store:
            done_jobs = 0
            for n, start in enumerate(range(0, args.datasets, args.per_job)):
                while n - done_jobs >= args.open_jobs:
                    done = await committed(r, keys)
                    done_jobs = done // args.per_job
                    if n - done_jobs >= args.open_jobs:
                        await asyncio.sleep(0.2)
                names = [f"ds{i}" for i in range(start, min(start + args.per_job, args.datasets))]
                await pub.publish_many(
                    await good_job(store, f"job{start}", names, tasks=args.tasks, duplicate_attempt=False)
                )
        while await committed(r, keys) < args.datasets:
            await asyncio.sleep(0.5)
        drained_at = time.monotonic()
        while any([await r.xlen(keys.events(s)) for s in range(args.shards)]):
            await asyncio.sleep(0.5)
            if time.monotonic() - drained_at > 60:
                break
        await asyncio.sleep(args.sample * 2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        drained_redis = await used_memory_mb(r)
        kept = await breakdown(r, fleet)
        lines, seconds, rc = status_check(config)
    finally:
        await r.aclose()
        for p in procs:
            try:
                p.terminate(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
            p.close()
        server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("what Redis keeps once drained (MEMORY USAGE by key kind):")
    for kind, (n, size) in sorted(kept.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<28} {n:>7} keys {size / 1e6:8.2f} MB")
    retained = sum(size for kind, (_n, size) in kept.items() if kind in RETAINED) / 1e6
    print(
        f"  of which history kept for a set retention (admin stream, outcome markers, job results):"
        f" {retained:.2f} MB;"
        f" without it {drained_redis - retained:.2f} MB"
    )
    return report(args, run, drained_redis, lines, seconds, rc)


def report(
    args: argparse.Namespace, run: Run, drained_redis: float, lines: int, seconds: float, rc: int
) -> int:
    print(f"{'t (s)':>7} {'committed':>9} {'coord MB':>8} {'redis MB':>8}  worker RSS MB")
    step = max(1, len(run.samples) // 40)
    for s in run.samples[::step] + run.samples[-1:]:
        w = " ".join(f"{x:6.1f}" for x in s.workers)
        print(f"{s.t:7.0f} {s.committed:9d} {s.coordinator:8.1f} {s.redis_mb:8.2f}  {w}")
    tenth = next((s for s in run.samples if s.committed >= args.datasets // 10), run.samples[0])
    last = run.samples[-1]
    growth = [b - a for a, b in zip(tenth.workers, last.workers, strict=True)]
    ok_rss = all(g <= 5.0 for g in growth)
    ok_redis = drained_redis <= 2 * run.idle_redis_mb
    ok_status = rc == 0 and lines < 60 and seconds < 1.0
    print()
    print(
        f"worker RSS at {tenth.committed} committed: {[round(x, 1) for x in tenth.workers]} MB; "
        f"at the end: {[round(x, 1) for x in last.workers]} MB; growth {[round(g, 1) for g in growth]} MB"
        f" -> {'OK' if ok_rss else 'OVER'} (target <= 5 MB)"
    )
    print(
        f"redis used_memory idle {run.idle_redis_mb:.2f} MB, drained {drained_redis:.2f} MB"
        f" -> {'OK' if ok_redis else 'OVER'} (target <= 2x idle)"
    )
    print(
        f"status: {lines} lines in {seconds:.2f} s (exit {rc}) -> {'OK' if ok_status else 'OVER'}"
        " (target < 60 lines, < 1 s; the time includes starting Python)"
    )
    verdict = ok_rss and ok_redis and ok_status
    print("verdict:", "PASS" if verdict else "FAIL")
    return 0 if verdict else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", type=int, default=5000)
    p.add_argument("--tasks", type=int, default=10)
    p.add_argument("--per-job", type=int, default=1000)
    p.add_argument("--open-jobs", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--sample", type=float, default=2.0)
    p.add_argument("--keep", action="store_true", help="keep the work folder (store, logs)")
    p.add_argument(
        "--malloc-trim-threshold", type=int, default=None, help="MALLOC_TRIM_THRESHOLD_ for workers"
    )
    sys.exit(asyncio.run(soak(p.parse_args())))


if __name__ == "__main__":
    main()
