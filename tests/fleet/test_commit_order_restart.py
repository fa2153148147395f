"""Job order is commit order across Redis restarts (issue 31 item 2; the variants with owner kills are
test_commit_order.py). Marker ``chaos``: ``pytest -m chaos tests/fleet/test_commit_order_restart.py``.

The fleet runs on a private ``redis-server`` with ``appendonly yes`` + ``appendfsync always`` (docs/queue.md
"Durability": a master that dies and restarts keeps every acknowledged write with AOF). It is SIGKILLed
while most commits are still queued and restarted on the same port with its data; the workers and the
coordinator reconnect by themselves. Every commit must then happen once, the audit must be clean, and each
dataset's commits and each bound table's snapshots/versions must be in the jobs' ``job_finished`` order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests._support.process_fleet import Fleet, report
from tests._support.redis_server import RedisServer
from tests._support.table_order import commits_started_by, jobs_sharing_bound_datasets, order_bindings
from tests._support.wait import wait_for

JOBS = [f"order{j:02d}" for j in range(30)]
DATASETS = [f"shared{i:02d}" for i in range(50)]


@pytest.fixture
def aof_redis(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    """A private Redis with ``appendonly yes`` + ``appendfsync always`` the test may kill and restart."""
    return redis_factory(persistent=True)


@pytest.fixture
def redis_url(aof_redis: RedisServer) -> str:
    """The fleet of this module runs on :func:`aof_redis` (overrides the session server's URL)."""
    return aof_redis.url


def _alive(fleet: Fleet, names: set[str]) -> None:
    dead = {p.name: p.proc.poll() for p in fleet.procs if p.name in names and p.proc.poll() is not None}
    assert not dead, f"processes exited (name: code): {dead}"


@pytest.mark.chaos  # ~30 s; the race it found is pinned by tests/integration/test_state_store_v2.py
async def test_commit_order_is_the_job_order_across_a_redis_kill_and_restart(
    fleet: Fleet, aof_redis: RedisServer
) -> None:
    bindings = order_bindings(DATASETS, iceberg=3, delta=3)
    restarts: list[float] = []

    async def restart_redis(fleet: Fleet) -> None:
        for worker, at_least in (("w1", 20), ("w2", 100)):
            await wait_for(
                lambda w=worker, n=at_least: commits_started_by(fleet, w, n),
                timeout=90,
                interval=0.01,
                what=worker,
            )
            aof_redis.kill()
            loop = asyncio.get_running_loop()
            down = loop.time()
            await asyncio.to_thread(aof_redis.start)
            restarts.append(loop.time() - down)
            # The test's own pooled connections went with the server (the fleet's reconnect by themselves).
            await fleet.redis.connection_pool.disconnect()

    took = await jobs_sharing_bound_datasets(fleet, JOBS, DATASETS, bindings, restart_redis)
    _alive(fleet, {"c1", "w1", "w2"})
    report(
        f"{len(JOBS)} jobs x {len(DATASETS)} shared datasets (6 bound) committed in {took:.1f}s across "
        f"{len(restarts)} Redis SIGKILL+restarts (down {', '.join(f'{s:.2f}' for s in restarts)} s)"
    )
