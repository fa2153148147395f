"""The fleet side of ``commitfleet bench commit`` and the command's runner (see :mod:`._commit`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from coordinator.admin import fleet_summary
from coordinator.demo import FleetProcess, ThrowawayRedis, write_config
from shared import Settings
from shared.commit import CommitRequest, commit_dataset
from shared.events import Committed, DatasetExpectation, JobFinished, JobStarted, TaskFinished, lock_name
from shared.locks import StorageLock
from shared.queue import AsyncPublisher, Keys, connect, read_admin_range
from shared.storage import CountingStore, LatencyModel, ObjectStore, open_store

from ._commit import (
    ModeResult,
    Workload,
    open_raw,
    run_baseline,
    run_core,
    stage,
    timed_inprocess,
    verify,
)

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# With a latency model, the default temporary store goes to memory where there is one (see run_commit_bench).
_SHM: Path | None = Path("/dev/shm") if os.path.isdir("/dev/shm") else None


def _cpu_seconds(pid: int) -> float:
    # utime + stime of a live process (Linux); 0 where /proc is not there.
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def fleet_settings(base: Settings, redis_url: str) -> Settings:
    """Return the settings of the benchmark's fleet: ``base``'s store and lock, a fresh fleet name."""
    return msgspec.structs.replace(
        base,
        fleet=msgspec.structs.replace(base.fleet, name=f"bench-{secrets.token_hex(3)}", shards=16),
        redis=msgspec.structs.replace(base.redis, url=redis_url),
        coordinator=msgspec.structs.replace(base.coordinator, tick=0.2, http_port=0),
        log=msgspec.structs.replace(base.log, level="WARNING", format="json"),
    )


async def _ready(settings: Settings, workers: int) -> bool:
    r = connect(settings.redis)
    try:
        doc: dict[str, Any] = await fleet_summary(r, Keys(settings.fleet.name), settings)
    finally:
        await r.aclose()
    return (
        len(doc["workers"]) == workers
        and all(w["shards"] for w in doc["workers"])
        and all(row["owner"] and not row["moving_to"] for row in doc["shard_table"])
    )


async def _poll(check: Any, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def run_fleet(
    settings: Settings, w: Workload, workers: int, work: Path, limit_s: float, *, samples: int = 0
) -> ModeResult:
    """Commit ``w`` through a coordinator and ``workers`` worker processes; return its figures.

    ``samples``: the single 4-file datasets committed after it, one at a time, for the
    latency p50 (:data:`LATENCY_SAMPLES` when 0).

    Raises:
        TimeoutError: the fleet did not settle, or did not commit everything within ``limit_s``.
    """
    config = write_config(settings, work / "bench-fleet.toml")
    procs = [FleetProcess("coordinator", "bench-coordinator", config, work)]
    procs += [FleetProcess("worker", f"bench-worker-{i}", config, work) for i in range(workers)]
    raw = open_raw(settings)
    r = connect(settings.redis)
    try:
        async with raw:
            await _poll(lambda: _ready(settings, workers), 60, "the benchmark fleet to settle")
            job, names = w.job("fleet"), w.names("fleet")
            winners = await stage(raw, w, "fleet")
            # The producer's publishes wait for the fleet's durability level, as a driver's do.
            pub = AsyncPublisher(
                r, settings.fleet.name, settings.fleet.shards, durability=settings.redis.durable
            )
            now = time.time()
            await pub.publish(JobStarted(job=job, datasets=names, timeout_s=3600, started_at=now))
            await pub.publish_many(
                TaskFinished(job=job, dataset=ds, task=a.task, attempt=0, files=a.files, finished_at=now)
                for ds, atts in winners.items()
                for a in atts
            )
            expect = {ds: DatasetExpectation(tasks=w.files, winners=[0] * w.files) for ds in names}
            cpu0 = sum(_cpu_seconds(p.pid) for p in procs[1:])
            t0 = time.perf_counter()
            await pub.publish(JobFinished(job=job, datasets=expect, finished_at=time.time()))
            committed: set[str] = set()
            last = b"-"

            async def all_committed() -> bool:
                nonlocal last
                for entry_id, ev in await read_admin_range(r, Keys(settings.fleet.name), start=last):
                    last = b"(" + entry_id
                    if isinstance(ev, Committed) and ev.job == job:
                        committed.add(ev.dataset)
                return len(committed) == len(names)

            await _poll(all_committed, limit_s, f"{len(names)} commits")
            seconds = time.perf_counter() - t0
            cpu = sum(_cpu_seconds(p.pid) for p in procs[1:]) - cpu0
            await verify(raw, w, "fleet")
            alone = [
                await _one_alone(r, raw, pub, settings, w.size, i) for i in range(samples or LATENCY_SAMPLES)
            ]
            return ModeResult(
                mode="fleet",
                seconds=seconds,
                datasets=w.datasets,
                cpu_seconds=cpu,
                latency_p50_s=statistics.median(g for g, _d in alone),
                commit_p50_s=statistics.median(d for _g, d in alone),
            )
    except BaseException:
        for p in procs:
            with contextlib.suppress(OSError):
                print(f"--- {p.name} log (tail) ---\n{p.output()[-2000:]}")
        raise
    finally:
        await r.aclose()
        for p in procs:
            try:
                p.terminate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            p.close()


def model_p50(model: LatencyModel, widths: list[int], draws: int = 20_000) -> float:
    """Return the median, under ``model``, of the time of rounds of these widths run one after another.

    A round of width w lasts as long as the slowest of its w requests; with a
    lognormal model that is more than the median per round even with no
    overhead at all (about 1.45 x 9 medians for a 4-file commit at p99 = 5 x
    median), which is the floor a latency ratio should be read against.
    """
    totals = sorted(sum(max(model.sample() for _ in range(w)) for w in widths) for _ in range(draws))
    return totals[len(totals) // 2]


LATENCY_SAMPLES = 11
"""Single 4-file datasets committed one after another by the fleet, for the p50 of one commit's latency."""


async def _one_alone(
    r: Any, raw: ObjectStore, pub: AsyncPublisher, settings: Settings, size: int, i: int
) -> tuple[float, float]:
    """Return the seconds from ``job_finished`` of one 4-file dataset to its ``committed`` event,
    and the commit's own duration (lock held, as the event says)."""
    w = Workload(datasets=1, files=4, size=size)
    mode = f"alone{i}"
    job, (ds,) = w.job(mode), w.names(mode)
    winners = await stage(raw, w, mode)
    keys = Keys(settings.fleet.name)
    tail = await r.xrevrange(keys.admin, count=1)  # read only what comes after this
    last = b"(" + tail[0][0] if tail else b"-"
    now = time.time()
    await pub.publish(JobStarted(job=job, datasets=[ds], timeout_s=3600, started_at=now))
    await pub.publish_many(
        TaskFinished(job=job, dataset=ds, task=a.task, attempt=0, files=a.files, finished_at=now)
        for a in winners[ds]
    )
    t0 = time.perf_counter()
    await pub.publish(
        JobFinished(job=job, datasets={ds: DatasetExpectation(tasks=4, winners=[0] * 4)}, finished_at=now)
    )
    deadline = t0 + 60
    while True:
        for entry_id, ev in await read_admin_range(r, keys, start=last):
            last = b"(" + entry_id
            if isinstance(ev, Committed) and ev.job == job:
                gap = time.perf_counter() - t0
                await verify(raw, w, mode)
                return gap, ev.duration_s
        if time.perf_counter() > deadline:
            raise TimeoutError(f"dataset {ds} not committed within 60 s")
        await asyncio.sleep(0.002)


async def probe_one_commit(
    store: ObjectStore, raw: ObjectStore, settings: Settings, files: int
) -> CountingStore:
    """Commit one dataset of ``files`` files alone through the core, lock included; return the counts."""
    w = Workload(datasets=1, files=files, size=1024)
    winners = await stage(raw, w, "probe")
    ((ds, atts),) = winners.items()
    counting = CountingStore(store)
    lock = StorageLock(counting, lock_name(ds), owner="bench-probe", settings=settings.lock)
    async with lock.hold() as lease:
        req = CommitRequest(dataset=ds, job=w.job("probe"), winners=atts, expected_tasks=files)
        await commit_dataset(counting, req, lease, settings)
    return counting


async def run_commit_bench(
    settings: Settings,
    w: Workload,
    *,
    modes: list[str],
    workers: int,
    inflight: int,
    console: Console,
) -> list[ModeResult]:
    """Run the chosen modes on the configured store (a temporary local one when none); print the table."""
    work = Path(tempfile.mkdtemp(prefix="commitfleet-bench-commit-"))
    cleanup = [work]
    server: ThrowawayRedis | None = None
    try:
        if not settings.store.url:
            root = work / "store"
            if settings.store.model_latency_ms and _SHM is not None:
                # The model stands for a cloud store's round trip; a local store on disk would add
                # its own fsync latency and CPU to every request, which a cloud client does not pay.
                memory = Path(tempfile.mkdtemp(prefix="commitfleet-bench-commit-", dir=_SHM))
                cleanup.append(memory)
                root = memory / "store"
            root.mkdir()
            settings = msgspec.structs.replace(
                settings, store=msgspec.structs.replace(settings.store, url=root.as_uri())
            )
        lat = settings.store.model_latency_ms
        console.print(
            f"commit benchmark: {w.datasets} datasets x {w.files} files of {w.size} B on {settings.store.url}"
            + (
                f", modelled latency median {lat} ms p99 {settings.store.model_latency_p99_ms} ms"
                if lat
                else ""
            )
        )
        results: list[ModeResult] = []
        store = open_store(settings.store.url, settings.store)
        raw = open_raw(settings)
        async with store, raw:
            probe = await probe_one_commit(store, raw, settings, 4)
            console.print(
                f"one 4-file commit (lock to release): {probe.total} requests in {probe.rounds} sequential "
                f"rounds: {dict(sorted(probe.requests.items()))}"
            )
            for mode in modes:
                if mode == "baseline":
                    results.append(
                        await timed_inprocess(mode, store, raw, w, lambda s, ws: run_baseline(s, w, ws))
                    )
                elif mode == "core":
                    results.append(
                        await timed_inprocess(
                            mode, store, raw, w, lambda s, ws: run_core(s, settings, w, ws, inflight)
                        )
                    )
        if "fleet" in modes:
            url = os.environ.get("REDIS_URL", "")
            if not url:
                server = ThrowawayRedis(work)
                url = server.url
            limit = max(120.0, w.datasets * w.files * 0.05)
            results.append(await run_fleet(fleet_settings(settings, url), w, workers, work, limit))
        _print(results, console)
        fleet = next((x for x in results if x.mode == "fleet"), None)
        if fleet is not None and fleet.latency_p50_s is not None:
            line = (
                f"fleet, one 4-file dataset alone ({LATENCY_SAMPLES} in turn): p50 job_finished -> committed "
                f"{fleet.latency_p50_s * 1000:.0f} ms (the commit itself: "
                f"{(fleet.commit_p50_s or 0) * 1000:.0f} ms)"
            )
            if lat:
                floor = probe.rounds * lat / 1000
                ratio = fleet.latency_p50_s / floor
                line += f" = {ratio:.2f} x its {probe.rounds} sequential rounds x {lat:g} ms"
                model = LatencyModel(lat / 1000, settings.store.model_latency_p99_ms / 1000, seed=1)
                own = model_p50(model, probe.widths)
                line += (
                    f"; the model's own p50 for those rounds (widths {probe.widths}: a parallel round waits"
                    f" for its slowest request) is {own * 1000:.0f} ms,"
                    f" {fleet.latency_p50_s / own:.2f} x that"
                )
            console.print(line)
        return results
    finally:
        if server is not None:
            server.stop()
        for path in cleanup:
            with contextlib.suppress(OSError):
                shutil.rmtree(path)


def _print(results: list[ModeResult], console: Console) -> None:
    base = next((r for r in results if r.mode == "baseline"), None)
    table = Table("mode", "seconds", "datasets/s", "x baseline", "requests/dataset", "client CPU ms/dataset")
    for r in results:
        ratio = f"{base.seconds / r.seconds:.2f}" if base is not None and r.seconds > 0 else "-"
        req = f"{r.requests_per_dataset:.1f}" if r.requests_per_dataset is not None else "-"
        cpu = f"{1000 * r.cpu_seconds / r.datasets:.1f}" if r.cpu_seconds is not None else "-"
        table.add_row(r.mode, f"{r.seconds:.2f}", f"{r.rate:.1f}", ratio, req, cpu)
    console.print(table)


__all__ = ["probe_one_commit", "run_commit_bench", "run_fleet"]
