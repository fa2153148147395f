"""How long a worker takes to exit after SIGTERM under load (a script, not a test).

Runs a coordinator and ``--workers`` worker processes on local files (with a
modelled object-store latency, ``--latency-ms``: an S3-like store, so commits
are in flight when the signal lands) and a private redis-server; a producer
publishes a job of ``--datasets`` datasets every ``--interval`` seconds while
fewer than ``--max-backlog`` datasets wait for their commit. Then,
``--stops`` times: SIGTERM the oldest worker, time until its process has
exited (and check its exit code is 0), start a fresh one, wait until the
fleet has settled again. Each worker's last log line ``worker shut down``
gives its phases (drain, hand back, leave, close). At the end every published
job must be committed exactly once (``audit`` clean, one ``committed`` event
each)::

    .venv/bin/python -m tests.bench.drain_time --stops 60

Prints p50 / p90 / p99 / max of the time to exit, of the drain and of what
follows it (exit minus drain: hand back + leave + close + interpreter exit),
which is the margin a pod's ``terminationGracePeriodSeconds`` needs on top of
``worker.drain_grace``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import signal
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import redis.asyncio

from shared.commit import audit
from shared.queue import AsyncPublisher, ensure_fleet
from shared.storage import open_store
from tests._support.fleet import fleet_settings
from tests._support.fleet_checks import assert_committed_once, committed, no_wal_left
from tests._support.fleet_jobs import good_job
from tests._support.process_fleet import Fleet
from tests._support.processes import FleetProcess, ThrowawayRedis, write_config


@dataclass
class Stop:
    """One SIGTERM: seconds to exit, exit code, and the worker's own phase seconds."""

    exit_s: float
    rc: int
    phases: dict[str, float]
    draining: bool  # the worker logged a shard with work to drain
    teardown_s: float | None  # from its 'worker shut down' line to the process's exit (interpreter teardown)


def phases_of(log: str) -> tuple[dict[str, float], bool]:
    """Return the phases of the ``worker shut down`` line of a JSON log (and its ``ts`` as ``at``), and
    whether a shard drained work."""
    phases: dict[str, float] = {}
    draining = False
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == "worker shut down":
            phases = {k: float(v) for k, v in rec.items() if k.endswith("_s")}
            phases["at"] = float(rec["ts"])
        elif rec.get("msg") == "draining shard":
            draining = True
    return phases, draining


def wait_exit(p: FleetProcess, ended: list[tuple[float, float]]) -> None:
    """Wait for ``p`` to exit; append the monotonic and wall times it was seen."""
    p.proc.wait()
    ended.append((time.monotonic(), time.time()))


def pct(values: list[float], p: float) -> float:
    """Return the ``p``-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name:<28} (none)"
    return (
        f"{name:<28} p50 {pct(values, 50):6.2f}s  p90 {pct(values, 90):6.2f}s  "
        f"p99 {pct(values, 99):6.2f}s  max {max(values):6.2f}s  mean {statistics.fmean(values):6.2f}s"
    )


async def run(args: argparse.Namespace, work: Path) -> list[Stop]:
    redis_server = ThrowawayRedis(work)
    fleet_name = "drain" + secrets.token_hex(3)
    settings = fleet_settings(
        redis_server.url,
        work / "store",
        fleet_name,
        shards=args.shards,
        worker={"drain_grace": args.drain_grace, "lease": 6.0, "heartbeat": 1.0},
        store={"model_latency_ms": args.latency_ms, "model_latency_p99_ms": args.latency_ms * 5},
        log={"level": "INFO", "format": "json"},
    )
    config = write_config(settings, work / "fleet.toml")
    logs = work / "logs"
    logs.mkdir()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    await ensure_fleet(client, fleet_name, args.shards)
    procs: list[FleetProcess] = []
    stops: list[Stop] = []
    published: list[tuple[str, list[str]]] = []
    try:
        # The producer's own writes (staging) are not the fleet's: no modelled latency for them.
        own = msgspec.structs.replace(settings.store, model_latency_ms=0.0, model_latency_p99_ms=0.0)
        async with open_store(settings.store.url, own) as store:
            publisher = AsyncPublisher(client, fleet_name, args.shards)
            fleet = Fleet(settings, config, logs, store, client, procs, publisher)
            fleet.start("coordinator", "c1")
            live = [fleet.start("worker", f"w{i}") for i in range(args.workers)]
            serial = args.workers

            async def settled() -> None:
                names = {p.name for p in live}
                deadline = time.monotonic() + 120
                while not await fleet.owners_settled(names):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"fleet did not settle on {sorted(names)}")
                    await asyncio.sleep(0.1)

            await settled()

            stop_producing = asyncio.Event()

            outcomes_key = fleet.keys.outcome_counts

            async def backlog() -> int:
                """Datasets published and not yet counted committed by the workers."""
                done = await client.hget(outcomes_key, "committed")
                return len(published) * args.datasets - int(done or 0)

            async def produce() -> None:
                n = 0
                while not stop_producing.is_set():
                    if await backlog() > args.max_backlog:  # a real pipeline waits too; keeps the end short
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop_producing.wait(), args.interval)
                        continue
                    job = f"j{n:05d}"
                    datasets = [f"ds{(n * args.datasets + i) % 997:03d}" for i in range(args.datasets)]
                    events = await good_job(
                        store, job, datasets, tasks=2, duplicate_attempt=False, concurrency=args.datasets
                    )
                    await publisher.publish_many(events)
                    published.append((job, datasets))
                    n += 1
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop_producing.wait(), args.interval)

            producer = asyncio.ensure_future(produce())
            try:
                await asyncio.sleep(2.0)  # load running before the first stop
                for i in range(args.stops):
                    victim = live.pop(0)
                    # A thread of its own sees the exit when it happens, however busy this loop is.
                    ended: list[tuple[float, float]] = []
                    waiter = threading.Thread(target=wait_exit, args=(victim, ended))
                    waiter.start()
                    t0 = time.monotonic()
                    victim.signal(signal.SIGTERM)
                    await asyncio.to_thread(waiter.join, args.drain_grace + 120)
                    rc = victim.proc.wait(1)
                    exit_s = ended[0][0] - t0
                    phases, draining = phases_of(victim.output())
                    at = phases.pop("at", None)
                    teardown = None if at is None else ended[0][1] - at
                    stops.append(Stop(exit_s, rc, phases, draining, teardown))
                    if teardown is not None:
                        phases["teardown_s"] = teardown
                    shown = " ".join(f"{k}={v:.2f}" for k, v in phases.items())
                    note = " (drained work)" if draining else ""
                    print(
                        f"stop {i + 1:3d}/{args.stops}: {victim.name} rc {rc}, {exit_s:5.2f}s {shown}{note}"
                    )
                    live.append(fleet.start("worker", f"w{serial}"))
                    serial += 1
                    await settled()
            finally:
                stop_producing.set()  # the job being published is published whole
                await producer
            # Every job published is committed, exactly once.
            deadline = time.monotonic() + 300
            for job, datasets in published:
                while not await committed(store, datasets, job):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"job {job} not committed")
                    await asyncio.sleep(0.2)
            while not await no_wal_left(store):
                if time.monotonic() > deadline:
                    raise RuntimeError("commit sequences left unfinished")
                await asyncio.sleep(0.2)
            rep = await audit(store)
            assert rep.ok, rep.violations[:10]
            await assert_committed_once(client, fleet_name, {(d, j) for j, ds in published for d in ds})
            print(f"{len(published)} jobs x {args.datasets} datasets committed exactly once; audit clean")
    finally:
        for p in procs:
            p.close()
        await client.aclose()
        redis_server.stop()
    return stops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stops", type=int, default=60)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--datasets", type=int, default=16, help="datasets per job")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between two jobs")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="modelled store latency (p50; p99 5x)")
    ap.add_argument("--drain-grace", type=float, default=30.0)
    ap.add_argument("--max-backlog", type=int, default=2000, help="datasets published and not yet committed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stops = asyncio.run(run(args, Path(tmp)))
    bad = [s for s in stops if s.rc != 0]
    drained = sum(s.draining for s in stops)
    print(f"\n{len(stops)} SIGTERMs, {len(bad)} non-zero exits, {drained} with work to drain")
    print(summary("time to exit", [s.exit_s for s in stops]))
    drains = [s.phases["drain_s"] for s in stops if "drain_s" in s.phases]
    print(summary("drain (phases 1-2)", drains))
    after = [s.exit_s - s.phases["drain_s"] for s in stops if "drain_s" in s.phases]
    print(summary("after the drain (exit-drain)", after))
    for phase in ("handback_s", "leave_s", "close_s"):
        print(summary(phase, [s.phases[phase] for s in stops if phase in s.phases]))
    print(summary("teardown (log line to exit)", [s.teardown_s for s in stops if s.teardown_s is not None]))
    if drains:
        over = [d - args.drain_grace for d in drains]
        print(summary("drain past drain_grace", [max(0.0, o) for o in over]))


if __name__ == "__main__":
    main()
