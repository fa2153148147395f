"""A worker's shutdown fits a pod's grace period: bounded after the drain, even with Redis hung.

Real processes; Redis frozen (SIGSTOP: its sockets stay open, nothing answers,
every call waits for ``redis.socket_timeout``) when the worker gets SIGTERM.
Before the hand back was one bounded write, it was one write per shard, each
waiting for the socket timeout (8 shards x 2 s here, 64 x 10 s by default).
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from tests._support.process_fleet import Fleet, report
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for

SOCKET_TIMEOUT = 2.0
DRAIN_GRACE = 2.0


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {
        "redis": {"socket_timeout": SOCKET_TIMEOUT},
        "worker": {"drain_grace": DRAIN_GRACE},
        "log": {"format": "json", "level": "INFO"},
    }


@pytest.fixture
def private_redis(redis_factory: Any) -> RedisServer:
    """A redis-server of this test alone, which it may freeze."""
    server: RedisServer = redis_factory(persistent=True)
    return server


@pytest.fixture
def redis_url(private_redis: RedisServer) -> str:
    return private_redis.url


def shutdown_line(log: str) -> dict[str, Any]:
    for line in log.splitlines():
        if line.startswith("{") and '"worker shut down"' in line:
            rec: dict[str, Any] = json.loads(line)
            return rec
    raise AssertionError(f"no 'worker shut down' line:\n{log[-3000:]}")


async def test_sigterm_with_redis_hung_exits_0_within_the_bound(
    fleet: Fleet, private_redis: RedisServer
) -> None:
    fleet.start("coordinator", "c1")
    w1 = fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")
    shards = fleet.settings.fleet.shards

    async def runners_started() -> bool:
        return w1.output().count('"shard started"') >= shards

    # Its runners running (the assignment alone does not say so): there is something to hand back.
    await wait_for(runners_started, timeout=60, what="w1 runs every shard")
    private_redis.freeze()
    try:
        started = time.monotonic()
        w1.signal(signal.SIGTERM)
        rc = w1.proc.wait(60)
        took = time.monotonic() - started
    finally:
        private_redis.thaw()
    assert rc == 0, w1.output()[-3000:]
    phases = shutdown_line(w1.output())
    report(f"SIGTERM with Redis frozen: exit 0 in {took:.1f}s; phases {phases}")
    # The session may be inside one Redis call (a socket timeout), the board's last write, the hand back and
    # the close are bounded at 2 s each, leaving 1.5 s twice.
    bound = DRAIN_GRACE + 2 * SOCKET_TIMEOUT + 2.0 + 2.0 + 3.0 + 2.0 + 2.0
    assert took < bound, (took, phases)
    # The hand back was tried (Redis frozen: it waited) and gave up in time.
    assert 1.0 <= phases["handback_s"] <= 2.5, phases
