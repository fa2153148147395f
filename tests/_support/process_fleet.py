"""A test fleet of real processes: the handle the ``fleet`` fixture (tests/fleet/conftest.py) yields,
and the jobs and checks of the tests that run one."""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio

from shared import Settings
from shared.commit import audit
from shared.events import (
    Aborted,
    CommitStarted,
    JobCancelled,
    JobStarted,
    QueueEvent,
    ShardsAssigned,
    WorkerJoined,
)
from shared.fleet import FleetRegistry
from shared.queue import AsyncPublisher, Keys
from shared.storage import ObjectStore
from tests._support.fleet_checks import (
    admin_events,
    assert_committed_once,
    committed,
    no_staging_left,
    no_wal_left,
)
from tests._support.fleet_jobs import failed_job, good_job, stage_task
from tests._support.processes import FleetProcess
from tests._support.wait import wait_for


@dataclass
class Fleet:
    """Handles on a test fleet: its settings, store, Redis, and process starter."""

    settings: Settings
    config: Path
    log_dir: Path
    store: ObjectStore
    redis: redis.asyncio.Redis
    procs: list[FleetProcess]
    publisher: AsyncPublisher
    names: dict[str, FleetProcess] = field(default_factory=dict)

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.fleet.name)

    @property
    def registry(self) -> FleetRegistry:
        return FleetRegistry(self.redis, self.keys)

    def start(self, kind: str, name: str) -> FleetProcess:
        """Start a ``worker`` or ``coordinator`` process called ``name``."""
        p = FleetProcess(kind, name, self.config, self.log_dir)
        self.procs.append(p)
        self.names[name] = p
        return p

    async def owners_settled(self, workers: set[str]) -> bool:
        """Return True when exactly ``workers`` own every shard, none moving, tokens in place."""
        a = await self.registry.assignment(self.settings.fleet.shards)
        if any(s.owner not in workers or s.moving_to for s in a.slots):
            return False
        if set(a.owners()) != workers:
            return False
        tokens = await self.registry.owner_tokens(self.settings.fleet.shards)
        return all(
            t is not None and t.decode().split("@")[0] == s.owner
            for s, t in zip(a.slots, tokens, strict=True)
        )


def report(line: str) -> None:
    """Print a measured figure so it shows in the test log (-s or on failure)."""
    sys.stderr.write(f"[figure] {line}\n")


async def cancelled_job(fleet: Fleet, job: str, datasets: list[str], tasks: int) -> list[QueueEvent]:
    """Return the events of a job cancelled after its tasks staged output, then a late task's."""
    evs: list[QueueEvent] = [JobStarted(job=job, datasets=datasets, timeout_s=600, started_at=time.time())]
    for ds in datasets:
        for t in range(tasks):
            evs.append(await stage_task(fleet.store, job, ds, t, 0))
    evs.append(JobCancelled(job=job, datasets=datasets, reason="user", cancelled_at=time.time()))
    # A cancelled job's tasks can still publish after the job ended.
    evs.append(await stage_task(fleet.store, job, datasets[0], 0, 1))
    return evs


async def assert_exactly_once(fleet: Fleet, expected_commits: set[tuple[str, str]]) -> None:
    """Assert that the fleet finished every commit sequence, the audit is clean and each of
    ``expected_commits`` (and nothing else) was announced once."""
    await wait_for(lambda: no_wal_left(fleet.store), timeout=60, what="every commit sequence finished")
    rep = await audit(fleet.store)
    assert rep.ok, rep.violations[:20]
    await assert_committed_once(fleet.redis, fleet.settings.fleet.name, expected_commits)


async def three_workers_200_datasets(fleet: Fleet) -> None:
    """Three worker processes commit a job of 200 datasets, abort a failed and a cancelled job
    (asserted: every commit once, every abort, the audit clean, every process alive)."""
    fleet.start("coordinator", "c1")
    for i in (1, 2, 3):
        fleet.start("worker", f"w{i}")
    await wait_for(
        lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="3 workers own all shards"
    )
    datasets = [f"ds{i:03d}" for i in range(200)]
    good = await good_job(fleet.store, "big", datasets, tasks=4)
    bad = await failed_job(fleet.store, "bad", datasets[:20], tasks=2)
    cancel = await cancelled_job(fleet, "cancel", datasets[20:40], tasks=2)
    started = time.monotonic()
    await fleet.publisher.publish_many([*good, *bad, *cancel])
    await wait_for(
        lambda: committed(fleet.store, datasets, "big"), timeout=240, interval=0.5, what="200 commits"
    )
    for job in ("big", "bad", "cancel"):
        await wait_for(
            lambda job=job: no_staging_left(fleet.store, job), timeout=60, what=f"{job} staging gone"
        )
    report(f"200 datasets x 4 tasks committed by 3 worker processes in {time.monotonic() - started:.1f}s")

    async def aborts_done() -> bool:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        return Counter(e.job for e in evs if isinstance(e, Aborted)) == Counter({"bad": 20, "cancel": 20})

    await wait_for(aborts_done, timeout=60, what="40 aborted events")
    await assert_exactly_once(fleet, {(ds, "big") for ds in datasets})
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert {e.worker for e in evs if isinstance(e, WorkerJoined)} == {"w1", "w2", "w3"}
    assert any(isinstance(e, ShardsAssigned) for e in evs)
    assert sum(isinstance(e, CommitStarted) for e in evs) >= 200
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited"
