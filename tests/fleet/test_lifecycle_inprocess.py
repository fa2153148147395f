"""What ends one shard and what ends a worker, with a coordinator and a worker in this process.

Faults are planted by monkeypatching one method; everything else is real
(redis-server, the local store). The separate-process twins are in
tests/fleet/test_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from shared import BadInput, Fenced, Settings
from shared.events import WorkerLeft
from shared.fleet import FleetRegistry, ProcessCrashed
from shared.queue import Keys
from tests._support.fleet import InProcessFleet, fleet_settings, inprocess_fleet
from tests._support.fleet_checks import committed
from tests._support.fleet_jobs import good_job
from tests._support.routing import dataset_on
from tests._support.wait import wait_for
from workers._shard import ShardRunner

SHARDS = 4


def _settings(redis_url: str, fleet: str, tmp: Path) -> Settings:
    return fleet_settings(redis_url, tmp / "store", fleet, shards=SHARDS)


async def _left(fleet: InProcessFleet) -> list[WorkerLeft]:
    evs = await fleet.admin_events()
    return [e for e in evs if isinstance(e, WorkerLeft) and e.worker == fleet.worker.worker_id]


async def _owns_all(fleet: InProcessFleet) -> bool:
    return fleet.worker.running_shards == frozenset(range(SHARDS))


async def test_expected_errors_end_one_shard_which_starts_again_later(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fenced, a CommitfleetError (a shard set aside) or a runner ending on its own: that shard only."""
    real_tick = ShardRunner._tick
    real_run = ShardRunner.run
    planted = {0: 0, 1: 0, 2: 0}

    async def tick(self: ShardRunner) -> None:
        if self.shard == 0 and not planted[0]:
            planted[0] += 1
            raise BadInput("planted per-shard error")
        if self.shard == 1 and not planted[1]:
            planted[1] += 1
            raise Fenced("planted: another owner")
        await real_tick(self)

    async def run(self: ShardRunner) -> None:
        if self.shard == 2 and not planted[2]:
            planted[2] += 1
            return  # ends on its own, not asked to stop
        await real_run(self)

    monkeypatch.setattr(ShardRunner, "_tick", tick)
    monkeypatch.setattr(ShardRunner, "run", run)
    caplog.set_level(logging.INFO, logger="workers")
    async with inprocess_fleet(
        redis_client, _settings(redis_url, fleet_name, tmp_path), ensure=False, workers_may_fail=True
    ) as r:
        await wait_for(lambda: _all_planted(planted), timeout=30, what="every fault hit")
        t0 = time.monotonic()
        await wait_for(lambda: _owns_all(r), timeout=30, what="every shard running again")
        assert time.monotonic() - t0 < 10
        assert not r.worker_task.done()
        messages = [(rec.getMessage(), getattr(rec, "fields", {})) for rec in caplog.records]
        failed = [f for m, f in messages if m == "shard runner failed; starting it again later"]
        assert [f["shard"] for f in failed] == [0] and 1.0 <= failed[0]["retry_in"] <= 2.0, failed
        assert [f["shard"] for m, f in messages if m == "shard lost to another owner"] == [1]
        on_own = [
            f["shard"] for m, f in messages if m == "shard runner ended on its own; starting it again later"
        ]
        assert on_own == [2]
        assert not [rec for rec in caplog.records if rec.levelno >= logging.CRITICAL]
        # Every shard commits, the ones that failed included.
        datasets = [dataset_on(s, SHARDS, "d") for s in range(SHARDS)]
        await r.publisher.publish_many(await good_job(r.store, "j1", datasets, tasks=1))
        await wait_for(lambda: committed(r.store, datasets, "j1"), timeout=60, what="j1 commits everywhere")
    assert r.worker_task.exception() is None
    assert [e.reason for e in await _left(r)] == ["shutdown"]


async def _all_planted(planted: dict[int, int]) -> bool:
    return all(planted.values())


@pytest.mark.parametrize("where", ["action", "heartbeat"])
async def test_a_bug_anywhere_in_the_worker_ends_it_at_once(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    armed = asyncio.Event()  # the fault fires once every shard runs
    if where == "action":

        async def do(self: ShardRunner, work: Any) -> None:
            raise KeyError(f"planted bug in an action for {work.dataset}")

        monkeypatch.setattr(ShardRunner, "_do", do)
    else:
        real_renew = FleetRegistry.renew

        async def renew(self: FleetRegistry, *args: Any) -> bool:
            if armed.is_set():
                raise ValueError("planted bug in the heartbeat")
            return await real_renew(self, *args)

        monkeypatch.setattr(FleetRegistry, "renew", renew)
    caplog.set_level(logging.INFO)
    async with inprocess_fleet(
        redis_client, _settings(redis_url, fleet_name, tmp_path), ensure=False, workers_may_fail=True
    ) as r:
        await wait_for(lambda: _owns_all(r), timeout=30, what="w1 runs every shard")
        armed.set()
        if where == "action":
            await r.publisher.publish_many(await good_job(r.store, "j1", ["a"], tasks=1))
        t0 = time.monotonic()
        await asyncio.wait([r.worker_task], timeout=30)
        assert r.worker_task.done(), "the worker did not end"
        assert time.monotonic() - t0 < 5
        error = r.worker_task.exception()
        assert isinstance(error, ProcessCrashed), error
        crit = [rec for rec in caplog.records if rec.levelno == logging.CRITICAL]
        assert len(crit) == 1, [rec.getMessage() for rec in crit]
        assert crit[0].exc_info is not None
        planted = KeyError if where == "action" else ValueError
        assert isinstance(crit[0].exc_info[1], planted)
        assert ("shard" if where == "action" else "heartbeat") in crit[0].getMessage()
        assert isinstance(error.__cause__, planted)
        assert [e.reason for e in await _left(r)] == ["crashed"]
        live, _dead = await FleetRegistry(r.redis, Keys(fleet_name)).members()
        assert "w1" not in live
        assert r.worker.running_shards == frozenset()
