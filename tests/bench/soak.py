"""Soak benchmark (a script, not a test): does memory follow open work, not history?

Runs ``--datasets`` N datasets x ``--tasks`` tasks (one job per ``--per-job``
datasets) through a coordinator and ``--workers`` worker processes on local
files and a private redis-server, samples every ``--sample`` seconds each
worker's RSS, the coordinator's RSS and Redis ``used_memory``, and prints a
table and a verdict against the targets of issue 9::

    .venv/bin/python -m tests.bench.soak --datasets 5000
    .venv/bin/python -m tests.bench.soak --datasets 100000 --trim-workers 2   # A/B of malloc_trim

Targets: worker RSS at the end within 5 MB of its value at a tenth of the run
(after warm-up); Redis working state (``used_memory`` without the kept history
and the client connections' buffers, see docs/queue.md "What is kept") within
2x its idle level once drained, the history listed by key kind with its
bound; ``commitfleet status`` under 60 lines, answered in under 1 s.

Rows are printed as they are sampled; SIGTERM (or SIGINT) stops the load early
and still reports what was measured, marked as stopped early.

Jobs are published while at most ``--open-jobs`` are unfinished, so the
backlog in Redis stays bounded as in a real pipeline.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import redis.asyncio

from coordinator.admin import fleet_summary
from shared import Settings
from shared.queue import RESULT_RETENTION_S, AsyncPublisher, Keys, ensure_fleet
from shared.storage import open_store
from tests._support.fleet import fleet_settings
from tests._support.fleet_jobs import good_job
from tests._support.memory import rss_mb
from tests._support.processes import FleetProcess, ThrowawayRedis, write_config


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


async def clients_mb(r: redis.asyncio.Redis) -> float:
    """Return the memory of the client connections' buffers in MB (``INFO memory``)."""
    return int((await r.info("memory"))["mem_clients_normal"]) / 1e6


async def committed(r: redis.asyncio.Redis, keys: Keys) -> int:
    return int(await r.hget(keys.outcome_counts, "committed") or 0)


async def sampler(
    r: redis.asyncio.Redis,
    keys: Keys,
    procs: list[FleetProcess],
    run: Run,
    args: argparse.Namespace,
    t0: float,
) -> None:
    """Sample every ``args.sample`` s; print every ``args.print_every``-th sample at once.

    Printed as it goes, so a run stopped early (a deadline) leaves its figures in the log.
    """
    while True:
        s = Sample(
            t=time.monotonic() - t0,
            committed=await committed(r, keys),
            workers=[rss_mb(p.pid) for p in procs[1:]],
            coordinator=rss_mb(procs[0].pid),
            redis_mb=await used_memory_mb(r),
        )
        run.samples.append(s)
        if args.print_every and (len(run.samples) - 1) % args.print_every == 0:
            print(row(s), flush=True)
        await asyncio.sleep(args.sample)


def header(labels: list[str]) -> str:
    return f"{'t (s)':>7} {'committed':>9} {'coord MB':>8} {'redis MB':>8}  worker RSS MB " + " ".join(labels)


def row(s: Sample) -> str:
    w = " ".join(f"{x:6.1f}" for x in s.workers)
    return f"{s.t:7.0f} {s.committed:9d} {s.coordinator:8.1f} {s.redis_mb:8.2f}  {w}"


# Key kinds that keep history on purpose, each bounded by a cap or a retention
# (docs/queue.md, "What is kept"): they are reported apart from the working state.
HISTORY = ("admin stream", "outcome markers", "job results", "ended-job records", "dead letters")


def as_text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def key_kind(key: str) -> str:
    """Return the kind of a fleet key (``cf:<fleet>:...``), without dataset, job or shard names."""
    rest = key.split(":", 2)[2]
    if rest.startswith("{cf:"):  # the admin stream's slot: outcome markers and counts
        tail = rest.split("}:", 1)[1]
        return "outcome counts" if tail == "outcomes" else "outcome markers"
    if rest.startswith("{s"):
        parts = rest.split("}:", 1)[1].split(":")
        kind = {"result": "job results", "alive": "job liveness", "dead": "dead letters"}.get(parts[0])
        if kind:
            return kind
        if parts[0] == "state":
            if parts[1] == "results":  # the results' age order (queue.results_max): part of the results
                return "job results"
            return "ended-job records" if parts[1] == "ended" else f"shard state:{parts[1]}"
        return f"shard {parts[0]}"
    if rest == "admin":
        return "admin stream"
    return rest.split(".", 1)[0]


@dataclass
class Kind:
    keys: int = 0
    items: int = 0  # stream entries, hash fields, 1 for a string
    bytes: int = 0


async def breakdown(r: redis.asyncio.Redis, fleet: str) -> dict[str, Kind]:
    """Return ``{key kind: Kind}`` for the fleet's keys (``MEMORY USAGE`` with all samples)."""
    out: dict[str, Kind] = {}
    async for key in r.scan_iter(match=f"cf:{fleet}:*", count=1000):
        k = out.setdefault(key_kind(key.decode()), Kind())
        kind = as_text(await r.type(key))
        k.keys += 1
        # The markers' and the results' eviction orders: bytes, not more markers or results.
        if key.endswith((b":outcome-order", b":state:results")):
            k.bytes += int(await r.memory_usage(key, samples=0) or 0)
            continue
        k.items += int(await r.xlen(key) if kind == "stream" else await r.hlen(key) if kind == "hash" else 1)
        k.bytes += int(await r.memory_usage(key, samples=0) or 0)
    return out


def history_bound(kind: str, k: Kind, s: Settings) -> str:
    """Return what bounds the history of ``kind``, in words and (when capped) in MB at the measured size."""
    per = k.bytes / max(k.items, 1)
    if kind == "admin stream":
        cap = s.admin.stream_maxlen
        return f"cap admin.stream_maxlen={cap} entries ~ {cap * per / 1e6:.1f} MB"
    if kind == "dead letters":
        cap = s.fleet.shards * s.queue.dead_letter_maxlen
        return f"cap {s.fleet.shards} x queue.dead_letter_maxlen = {cap} ~ {cap * per / 1e6:.1f} MB"
    if kind == "outcome markers":
        cap = s.queue.outcome_markers_max
        return f"cap queue.outcome_markers_max={cap} ~ {cap * per / 1e6:.1f} MB"
    if kind == "job results":
        hours = RESULT_RETENTION_S / 3600
        cap = s.fleet.shards * s.queue.results_max
        return (
            f"datasets answered in the last {hours:.0f} h, at most {s.fleet.shards} x queue.results_max"
            f" = {cap} ~ {cap * per / 1e6:.1f} MB (~{per:.0f} B each)"
        )
    return f"jobs ended within queue.ended_retention={s.queue.ended_retention:.0f} s (~{per:.0f} B a job)"


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


async def publish_and_drain(
    args: argparse.Namespace, settings: Settings, r: redis.asyncio.Redis, keys: Keys, pub: AsyncPublisher
) -> None:
    """Publish the jobs (at most ``--open-jobs`` unfinished); return once drained and trimmed."""
    async with open_store(settings.store.url, settings.store) as store:
        done_jobs = 0
        for n, start in enumerate(range(0, args.datasets, args.per_job)):
            # Staged before waiting for a free slot (and 64 datasets at once), as
            # a pipeline's executors would: the producer must not be what limits
            # the rate the fleet is soaked at.
            names = [f"ds{i}" for i in range(start, min(start + args.per_job, args.datasets))]
            events = await good_job(
                store, f"job{start}", names, tasks=args.tasks, duplicate_attempt=False, concurrency=64
            )
            while n - done_jobs >= args.open_jobs:
                done = await committed(r, keys)
                done_jobs = done // args.per_job
                if n - done_jobs >= args.open_jobs:
                    await asyncio.sleep(0.2)
            await pub.publish_many(events)
    while await committed(r, keys) < args.datasets:
        await asyncio.sleep(0.5)
    drained_at = time.monotonic()
    while any([await r.xlen(keys.events(s)) for s in range(args.shards)]):
        await asyncio.sleep(0.5)
        if time.monotonic() - drained_at > 60:
            break
    await asyncio.sleep(args.sample * 2)


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
    # Same-run A/B of malloc_trim: the first --trim-workers workers call it every
    # --malloc-trim-interval s (default: the setting's default), the others never
    # (one fleet, one Redis, the same load).
    interval = settings.worker.malloc_trim_interval
    if args.malloc_trim_interval is not None:
        interval = args.malloc_trim_interval

    def with_trim(seconds: float) -> Settings:
        worker = msgspec.structs.replace(settings.worker, malloc_trim_interval=seconds)
        return msgspec.structs.replace(settings, worker=worker)

    config = write_config(with_trim(0.0), work / "soak.toml")
    trim_config = write_config(with_trim(interval), work / "soak-trim.toml")
    trimmed = args.workers if args.trim_workers is None else min(args.trim_workers, args.workers)
    keys = Keys(fleet)
    r = redis.asyncio.Redis.from_url(server.url)
    env_note = ""
    if args.malloc_trim_threshold is not None:
        os.environ["MALLOC_TRIM_THRESHOLD_"] = str(args.malloc_trim_threshold)
        env_note = f" MALLOC_TRIM_THRESHOLD_={args.malloc_trim_threshold}"
    procs = [FleetProcess("coordinator", "soak-coordinator", config, work)]
    launcher = "coordinator"
    if args.tracemalloc is not None:
        launcher = "tests.bench._traced"
        os.environ["CF_TRACEMALLOC_DIR"] = str(args.tracemalloc.resolve())
        os.environ["CF_TRACEMALLOC_EVERY"] = str(args.tracemalloc_every)
    procs += [
        FleetProcess(
            "worker", f"soak-worker-{i}", trim_config if i < trimmed else config, work, module=launcher
        )
        for i in range(args.workers)
    ]
    labels = [f"w{i}:{'trim' if i < trimmed and interval > 0 else 'plain'}" for i in range(args.workers)]
    run = Run()
    t0 = time.monotonic()
    stopped_early = False
    try:
        await ensure_fleet(r, fleet, args.shards)
        # Idle: the fleet up and settled, nothing published yet.
        await asyncio.sleep(5)
        # Both idle and drained figures leave out the client connections' buffers
        # (INFO mem_clients_normal): they follow the connection count, not what Redis stores.
        run.idle_redis_mb = await used_memory_mb(r) - await clients_mb(r)
        print(header(labels), flush=True)
        task = asyncio.create_task(sampler(r, keys, procs, run, args, t0))
        pub = AsyncPublisher(r, fleet, args.shards)
        print(
            f"soak: {args.datasets} datasets x {args.tasks} tasks, {args.workers} workers{env_note},"
            f" malloc_trim every {interval} s in {trimmed} of them, {work}",
            flush=True,
        )
        # SIGTERM / SIGINT (also under nohup, where SIGINT is ignored) stop the load
        # early; the figures so far are still reported, marked as such.
        loop = asyncio.get_running_loop()
        load = asyncio.create_task(publish_and_drain(args, settings, r, keys, pub))
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, load.cancel)
        try:
            await load
        except asyncio.CancelledError:
            stopped_early = True
            print(f"stopped early at {await committed(r, keys)} committed", flush=True)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        drained_redis = await used_memory_mb(r)
        drained_clients = await clients_mb(r)
        connections = int((await r.info("clients"))["connected_clients"])
        kept = await breakdown(r, fleet)
        lines, seconds, rc = status_check(config)
        # What the status costs without starting Python: the same document, in-process.
        t = time.perf_counter()
        await fleet_summary(r, keys, settings)
        inproc = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare = time.perf_counter() - t
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
    if stopped_early:
        print("STOPPED EARLY: the fleet had not drained; Redis figures are not 'drained' ones")
    print(f"client connection buffers once drained: {drained_clients:.2f} MB for {connections} connections")
    print(
        f"status document in-process: {inproc:.3f} s; a bare Python start on this machine now: {bare:.2f} s"
    )
    return report(args, run, drained_redis - drained_clients, kept, settings, lines, seconds, rc)


def report(
    args: argparse.Namespace,
    run: Run,
    drained_redis: float,
    kept: dict[str, Kind],
    settings: Settings,
    lines: int,
    seconds: float,
    rc: int,
) -> int:
    print("table (every n-th sample):")
    step = max(1, len(run.samples) // 40)
    for s in run.samples[::step] + run.samples[-1:]:
        print(row(s))
    print("what Redis keeps once drained (MEMORY USAGE by key kind):")
    for kind, k in sorted(kept.items(), key=lambda kv: -kv[1].bytes):
        tag = "history" if kind in HISTORY else "working"
        print(f"  {tag:<8} {kind:<22} {k.keys:>7} keys {k.items:>8} items {k.bytes / 1e6:8.2f} MB")
    history = sum(k.bytes for kind, k in kept.items() if kind in HISTORY) / 1e6
    working = drained_redis - history  # drained_redis: without client buffers (printed above)
    print(f"kept history {history:.2f} MB, each part bounded:")
    for kind in HISTORY:
        if kind in kept:
            print(
                f"  {kind:<18} {kept[kind].bytes / 1e6:6.2f} MB;"
                f" bound: {history_bound(kind, kept[kind], settings)}"
            )
    tenth = next((s for s in run.samples if s.committed >= args.datasets // 10), run.samples[0])
    last = run.samples[-1]
    growth = [b - a for a, b in zip(tenth.workers, last.workers, strict=True)]
    ok_rss = all(g <= 5.0 for g in growth)
    # The target applies to the working state: used_memory minus the history kept on
    # purpose (which MEMORY USAGE measures per key; what it misses, such as the key
    # table's own buckets, stays on the working side, so this errs against us).
    ok_redis = working <= 2 * run.idle_redis_mb
    ok_status = rc == 0 and lines < 60 and seconds < 1.0
    print()
    print(
        f"worker RSS at {tenth.committed} committed: {[round(x, 1) for x in tenth.workers]} MB; "
        f"at the end: {[round(x, 1) for x in last.workers]} MB; growth {[round(g, 1) for g in growth]} MB"
        f" -> {'OK' if ok_rss else 'OVER'} (target <= 5 MB)"
    )
    print(
        f"redis used_memory without client buffers: idle {run.idle_redis_mb:.2f} MB,"
        f" drained {drained_redis:.2f} MB ="
        f" working state {working:.2f} MB + kept history {history:.2f} MB"
        f" -> working state {'OK' if ok_redis else 'OVER'} (target <= 2x idle)"
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
    p.add_argument(
        "--malloc-trim-interval",
        type=float,
        default=None,
        help="worker.malloc_trim_interval (default: its default)",
    )
    p.add_argument("--trim-workers", type=int, default=None, help="how many workers trim (default: all)")
    p.add_argument("--print-every", type=int, default=5, help="print every n-th sample as it is taken")
    p.add_argument(
        "--tracemalloc",
        type=Path,
        default=None,
        metavar="DIR",
        help="watch the workers' heap: object counts (with CF_TRACEMALLOC_FRAMES > 0 also tracemalloc"
        " snapshots) into DIR every --tracemalloc-every s (tests/bench/_traced.py; diff with"
        " tests/bench/heapdiff.py); the RSS figures then include the watcher's cost",
    )
    p.add_argument("--tracemalloc-every", type=float, default=120.0)
    sys.exit(asyncio.run(soak(p.parse_args())))


if __name__ == "__main__":
    main()
