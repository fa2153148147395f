"""A fleet holding many open datasets, built through the real path (issue 32 item 5).

:func:`open_fleet` starts a private redis-server, a coordinator process and
worker processes (the product's launcher, as the other process benches do),
waits until the workers own every shard, notes the coordinator's idle memory,
then plays the producers: each job's tasks stage a tiny file in the
local-files store's folder (plain files, as executors write them; in processes of
their own, the next jobs' while this one's events are published) and the
job's ``job_started`` and ``task_finished`` events are published
(``AsyncPublisher``). No job finishes, so every dataset stays open, waiting
for its job's end (the liveness timeout is a day). It returns once the
workers' intake has read, saved and acknowledged every event (no lag, nothing
pending on any shard) and the shards' saved state holds every dataset. The
caller then measures against the fleet while it is up; leaving the context
stops it all.

Used by ``python -m tests.bench.status_scale`` and its smoke test.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio

from shared import Settings
from shared.events import (
    DatasetExpectation,
    JobFinished,
    JobStarted,
    QueueEvent,
    StagedFile,
    TaskFinished,
    staged_key,
)
from shared.fleet import FleetRegistry
from shared.queue import AsyncPublisher, Keys, ensure_fleet
from tests._support.fleet import fleet_settings
from tests._support.memory import rss_mb
from tests._support.processes import FleetProcess, ThrowawayRedis, free_port, write_config

QUICK_DATASETS = 5_000
"""Open datasets of the quick state (``status_scale --quick``, the builder's smoke test)."""
# A day: the open jobs are not timed out while they are measured (their drivers publish no liveness).
JOB_TIMEOUT_S = 86_400.0
STAGED_NAME = "part-0.bin"
STAGERS = 2  # staging processes: the two cores' file system calls side by side
_STAGED = b"x" * 16  # what every staged file holds: its content is never read while the job is open


@dataclass(frozen=True)
class ScaleSpec:
    """The open work to build: ``datasets`` spread over ``jobs`` jobs, ``tasks`` task reports each."""

    datasets: int = 100_000
    tasks: int = 10
    jobs: int = 100
    workers: int = 4
    shards: int = 64

    def job_names(self) -> list[str]:
        """Return the jobs' names, in publishing order."""
        return [f"job-{j:05d}" for j in range(self.jobs)]

    def datasets_of(self, j: int) -> list[str]:
        """Return the names of job number ``j``'s datasets (split evenly, the rest to the last job)."""
        per = self.datasets // self.jobs
        end = self.datasets if j == self.jobs - 1 else (j + 1) * per
        return [f"ds{i:07d}" for i in range(j * per, end)]


@dataclass
class OpenFleet:
    """Handles on the built fleet and what the build took."""

    spec: ScaleSpec
    settings: Settings
    config: Path
    redis_url: str
    http_port: int
    coordinator: FleetProcess
    workers: list[FleetProcess]
    idle_rss_mb: float = 0.0
    idle_hwm_mb: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)


def vm_mb(pid: int, field_name: str) -> float:
    """Return the ``/proc/<pid>/status`` figure ``field_name`` (``VmHWM``, ``VmRSS``) in MB (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field_name}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def open_datasets(r: redis.asyncio.Redis, keys: Keys, shards: int) -> int:
    """Return how many datasets of open jobs the shards' saved state holds (``state:datasets`` fields)."""
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.hlen(keys.shard_state(s, "datasets"))
        counts = await pipe.execute()
    return sum(int(c) for c in counts)


async def unread_events(r: redis.asyncio.Redis, keys: Keys, shards: int) -> int:
    """Return the events the shards' consumer groups have not read yet or not acknowledged (lag + pending)."""
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.xinfo_groups(keys.events(s))
        replies = await pipe.execute()
    left = 0
    for groups in replies:
        if not groups:
            return -1  # a shard's group is not there yet: its owner has not started
        for g in groups:
            lag = g.get("lag")
            left += int(g.get("pending") or 0) + (1 if lag is None else int(lag))
    return left


async def _owned(registry: FleetRegistry, shards: int, workers: set[str]) -> bool:
    a = await registry.assignment(shards)
    if any(s.owner not in workers or s.moving_to for s in a.slots) or set(a.owners()) != workers:
        return False
    tokens = await registry.owner_tokens(shards)
    return all(
        t is not None and t.decode().split("@")[0] == s.owner for s, t in zip(a.slots, tokens, strict=True)
    )


async def _poll(
    probe: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


def _stage_files(root: Path, job: str, names: list[str], tasks: int) -> float:
    """Write a tiny staged file for every task of ``job`` under ``root`` (as an executor writes its
    output: plain files, no fsync); return the seconds it took."""
    t = time.perf_counter()
    for name in names:
        for task in range(tasks):
            path = root / staged_key(job, name, task, 0, STAGED_NAME)
            os.makedirs(path.parent, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, _STAGED)
            finally:
                os.close(fd)
    return time.perf_counter() - t


async def _job_events(
    pool: ProcessPoolExecutor, root: Path, job: str, names: list[str], tasks: int
) -> tuple[list[QueueEvent], float]:
    """Stage every task's file of ``job`` (in ``pool``'s process) and return its events
    (``job_started``, then the task reports) and the seconds the staging took."""
    loop = asyncio.get_running_loop()
    staging = await loop.run_in_executor(pool, _stage_files, root, job, names, tasks)
    now = time.time()
    staged = [StagedFile(path=STAGED_NAME, size=len(_STAGED))]
    evs: list[QueueEvent] = [JobStarted(job=job, datasets=names, timeout_s=JOB_TIMEOUT_S, started_at=now)]
    evs += [
        TaskFinished(job=job, dataset=n, task=t, attempt=0, files=staged, finished_at=now)
        for n in names
        for t in range(tasks)
    ]
    return evs, staging


async def finish_jobs(fleet: OpenFleet, r: redis.asyncio.Redis, count: int) -> int:
    """Publish ``job_finished`` for the first ``count`` jobs: their datasets turn to committing (queued for a
    slot, then running) while the rest stay waiting; return how many datasets that is."""
    spec = fleet.spec
    publisher = AsyncPublisher(r, fleet.settings.fleet.name, spec.shards)
    evs: list[QueueEvent] = []
    n = 0
    for j, job in enumerate(spec.job_names()[:count]):
        names = spec.datasets_of(j)
        expect = DatasetExpectation(tasks=spec.tasks, winners=[0] * spec.tasks)
        evs.append(JobFinished(job=job, datasets=dict.fromkeys(names, expect), finished_at=time.time()))
        n += len(names)
    await publisher.publish_many(evs)
    return n


@asynccontextmanager
async def open_fleet(
    work: Path,
    spec: ScaleSpec,
    *,
    progress: bool = False,
    build_timeout: float = 3600.0,
    stagers: int = STAGERS,
) -> AsyncIterator[OpenFleet]:
    """Start the fleet in ``work``, build ``spec``'s open work through it, yield it; stop it all on exit.

    ``stagers``: processes writing the staged files, each a job ahead of the publishing.

    Raises:
        RuntimeError: redis-server did not start, or the fleet did not settle or take in every
            event within ``build_timeout`` seconds (the processes' logs are in ``work/logs``).
    """
    log = print if progress else (lambda *_a, **_k: None)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = ThrowawayRedis(work)
    procs: list[FleetProcess] = []
    try:
        name = "scale" + secrets.token_hex(3)
        port = free_port()
        settings = fleet_settings(
            server.url,
            work / "store",
            name,
            shards=spec.shards,
            # The default lease: a loaded machine's slow ticks must not move shards while the state builds.
            worker={"lease": 15.0, "heartbeat": 3.0},
            coordinator={"http_port": port},
        )
        config = write_config(settings, work / "fleet.toml")
        r = redis.asyncio.Redis.from_url(server.url)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(r.aclose)
            keys = Keys(name)
            await ensure_fleet(r, name, spec.shards)
            t0 = time.monotonic()
            coordinator = FleetProcess("coordinator", "c1", config, logs)
            procs.append(coordinator)
            workers = [FleetProcess("worker", f"w{i}", config, logs) for i in range(spec.workers)]
            procs.extend(workers)
            registry = FleetRegistry(r, keys)
            names = {w.name for w in workers}
            await _poll(lambda: _owned(registry, spec.shards, names), 180, "the workers to own every shard")
            fleet = OpenFleet(spec, settings, config, server.url, port, coordinator, workers)
            fleet.phases_s["start"] = time.monotonic() - t0
            log(f"fleet up in {fleet.phases_s['start']:.1f} s ({spec.workers} workers, {spec.shards} shards)")
            fleet.idle_rss_mb = rss_mb(coordinator.pid)
            fleet.idle_hwm_mb = vm_mb(coordinator.pid, "VmHWM")
            publisher = AsyncPublisher(r, name, spec.shards)
            root = work / "store"
            jobs = spec.job_names()
            t1 = time.monotonic()
            staging = publishing = 0.0
            # The next jobs stage their files while this one's events are published (a producer's
            # executors write while the driver reports), in processes of their own (no shared
            # interpreter lock), so the build takes what the slower of the two does.
            pool = stack.enter_context(
                ProcessPoolExecutor(stagers, mp_context=multiprocessing.get_context("spawn"))
            )
            async with asyncio.TaskGroup() as tg:

                def stage(j: int) -> asyncio.Task[tuple[list[QueueEvent], float]]:
                    return tg.create_task(_job_events(pool, root, jobs[j], spec.datasets_of(j), spec.tasks))

                ahead = collections.deque(stage(j) for j in range(min(stagers, spec.jobs)))
                for j in range(spec.jobs):
                    evs, secs = await ahead.popleft()
                    staging += secs
                    if j + stagers < spec.jobs:
                        ahead.append(stage(j + stagers))
                    tp = time.monotonic()
                    await publisher.publish_many(evs)
                    publishing += time.monotonic() - tp
                    if (j + 1) % max(1, spec.jobs // 10) == 0:
                        log(
                            f"  {j + 1}/{spec.jobs} jobs staged and published ({time.monotonic() - t1:.0f} s)"
                        )
            fleet.phases_s["produce"] = time.monotonic() - t1
            fleet.phases_s["stage"] = staging
            fleet.phases_s["publish"] = publishing
            t2 = time.monotonic()

            async def taken_in() -> bool:
                left = await unread_events(r, keys, spec.shards)
                return left == 0 and await open_datasets(r, keys, spec.shards) == spec.datasets

            await _poll(taken_in, build_timeout, "the workers to take in every event", interval=1.0)
            fleet.phases_s["intake_after_publish"] = time.monotonic() - t2
            fleet.phases_s["build"] = time.monotonic() - t0
            took = fleet.phases_s
            log(
                f"built {spec.datasets} open datasets x {spec.tasks} tasks in {took['build']:.0f} s "
                f"(staging and publishing {took['produce']:.0f} s: staging {staging:.0f} s of process time, "
                f"publishing {publishing:.0f} s, side by side; intake after the last publish "
                f"{took['intake_after_publish']:.0f} s)"
            )
            yield fleet
    finally:
        for p in procs:
            p.close()
        server.stop()
