"""How fleet processes start and die: a bug ends a worker loudly; Redis down at start is waited out.

Real worker and coordinator processes, a real redis-server that the tests stop
and start. A bug is planted in a worker by a launcher of the tests
(tests/_support/faulty_cli.py), never by a hook in the product.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from coordinator._coordinator import LEADER_LOCK
from shared import TransientError
from shared.events import WorkerLeft
from shared.fleet import EXIT_CRASHED, HARD_EXIT_AFTER_S
from shared.locks import read_lock
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.process_fleet import Fleet
from tests._support.processes import FleetProcess
from tests._support.redis_server import RedisHandle, RedisServer
from tests._support.wait import wait_for

WAIT_LINE = "cannot reach the fleet's Redis yet; waiting before trying again"


@pytest.fixture
def private_redis(redis_factory: Any) -> RedisServer:
    """A redis-server of this test alone, which it may stop and start (persistent: the fleet record stays)."""
    server: RedisServer = redis_factory(persistent=True)
    return server


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, redis_server: RedisHandle) -> str:
    """The fleet's Redis: the private one when the test asks for it, else the flushed session server."""
    if "private_redis" in request.fixturenames:
        server: RedisServer = request.getfixturevalue("private_redis")
        return server.url
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


async def exited(p: FleetProcess, timeout: float, what: str) -> int:
    """Wait (polling, with a deadline) until ``p`` has exited; return its exit code."""

    async def probe() -> bool:
        return p.proc.poll() is not None

    await wait_for(probe, timeout=timeout, interval=0.05, what=what)
    rc = p.proc.returncode
    assert rc is not None
    return rc


def start_faulty(
    fleet: Fleet, name: str, fault: str, monkeypatch: pytest.MonkeyPatch, kind: str = "worker"
) -> FleetProcess:
    monkeypatch.setenv("CF_TEST_FAULT", fault)
    p = FleetProcess(kind, name, fleet.config, fleet.log_dir, module="tests._support.faulty_cli")
    fleet.procs.append(p)
    fleet.names[name] = p
    return p


async def left_events(fleet: Fleet, worker: str) -> list[WorkerLeft]:
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    return [e for e in evs if isinstance(e, WorkerLeft) and e.worker == worker]


# -- a bug in a worker ends the process, loudly -------------------------------------------------


async def test_bug_in_a_shard_runner_ends_the_worker_loudly(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet.start("coordinator", "c1")
    fleet.start("worker", "ok")
    bad = start_faulty(fleet, "bad", "raise", monkeypatch)
    rc = await exited(bad, 60, "the faulty worker exits")
    assert rc == EXIT_CRASHED, (rc, bad.output()[-3000:])
    log = bad.output()
    # The traceback, in the log, with where it happened.
    assert re.search(r"CRITICAL .*fatal error in shard \d+: the process ends", log), log[-3000:]
    assert "Traceback (most recent call last)" in log
    assert re.search(r"RuntimeError: planted fault in shard \d+", log), log[-3000:]
    assert "crashed: RuntimeError" in log.splitlines()[-1], log[-500:]
    # The fleet hears why it left, and the lease is gone at once.
    evs = await wait_for(lambda: left_events(fleet, "bad"), timeout=10, what="worker_left of bad")
    everything = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert [ev.reason for ev in evs] == ["crashed"], everything
    live, _dead = await fleet.registry.members()
    assert "bad" not in live
    # The rest of the fleet goes on: the healthy worker takes every shard and commits.
    await wait_for(lambda: fleet.owners_settled({"ok"}), timeout=60, what="ok owns every shard")
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", ["a", "b", "c"], tasks=1))
    await wait_for(lambda: committed(fleet.store, ["a", "b", "c"], "j1"), timeout=60, what="j1 commits")
    assert fleet.names["ok"].terminate(timeout=60) == 0


async def test_a_task_that_ignores_cancellation_cannot_keep_a_crashed_worker_alive(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet.start("coordinator", "c1")
    bad = start_faulty(fleet, "bad", "raise-and-hang", monkeypatch)  # alone, it owns every shard

    async def crash_logged() -> bool:
        return "fatal error in shard" in bad.output()

    # Not "bad owns every shard" first: it crashes as soon as two of its runners have ticked.
    await wait_for(crash_logged, timeout=60, what="the fatal error logged")
    crashed_at = time.monotonic()
    rc = await exited(bad, HARD_EXIT_AFTER_S + 10, "the hung worker is ended")
    assert rc == EXIT_CRASHED, rc
    assert time.monotonic() - crashed_at < HARD_EXIT_AFTER_S + 5
    log = bad.output()
    assert "did not end within" in log, log[-3000:]
    assert "asyncio tasks" in log and "_planted_tick" in log, log[-3000:]  # where it hung
    # It left before it hung up: the fleet knows at once.
    evs = await wait_for(lambda: left_events(fleet, "bad"), timeout=10, what="worker_left of bad")
    everything = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert [ev.reason for ev in evs] == ["crashed"], everything


async def test_bug_in_the_leading_coordinator_ends_it_loudly_and_a_standby_leads(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = start_faulty(fleet, "c-bad", "coordinator-step", monkeypatch, kind="coordinator")
    rc = await exited(bad, 60, "the faulty coordinator exits")
    assert rc == EXIT_CRASHED, (rc, bad.output()[-3000:])
    log = bad.output()
    assert "fatal error in leader election: the process ends" in log, log[-3000:]
    assert "Traceback (most recent call last)" in log and "_planted_step" in log, log[-3000:]
    assert "RuntimeError: planted fault in the leader" in log
    # It released the leader lock on the way out, so another coordinator leads at once.
    record = await read_lock(fleet.store, LEADER_LOCK)
    assert record is not None and record.owner == "c-bad" and record.released, record
    fleet.start("coordinator", "c-ok")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="c-ok leads, w1 owns every shard")


# -- Redis down at start: wait, log, join ---------------------------------------------------------


async def test_worker_and_coordinator_wait_for_redis_and_then_join(
    fleet: Fleet, private_redis: RedisServer
) -> None:
    private_redis.stop()
    c1 = fleet.start("coordinator", "c1")
    w1 = fleet.start("worker", "w1")

    async def both_waiting() -> bool:
        return all(p.output().count(WAIT_LINE) >= 2 for p in (c1, w1))

    await wait_for(both_waiting, timeout=30, what="both log at least two waits")
    assert c1.proc.poll() is None and w1.proc.poll() is None
    # The waits back off: the worker logged a growing retry_in.
    waits = [float(m) for m in re.findall(r"retry_in=([\d.]+)", w1.output())]
    assert waits and max(waits) <= 5.0, waits
    private_redis.start()

    async def settled() -> bool:
        try:
            return await fleet.owners_settled({"w1"})
        except TransientError:  # the test's own client reconnects after the restart
            return False

    await wait_for(settled, timeout=60, what="w1 joins and owns every shard")
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", ["a", "b"], tasks=1))
    await wait_for(lambda: committed(fleet.store, ["a", "b"], "j1"), timeout=60, what="j1 commits")
    assert w1.terminate(timeout=60) == 0
    assert c1.terminate(timeout=60) == 0


@pytest.mark.parametrize("kind", ["worker", "coordinator"])
async def test_sigterm_while_waiting_for_redis_ends_promptly(
    fleet: Fleet, private_redis: RedisServer, kind: str
) -> None:
    private_redis.stop()
    p = fleet.start(kind, "p1")

    async def waiting() -> bool:
        return WAIT_LINE in p.output()

    await wait_for(waiting, timeout=30, what="the first wait logged")
    sent = time.monotonic()
    p.signal(signal.SIGTERM)
    rc = await exited(p, 10, "the process ends after SIGTERM")
    assert rc == 0, (rc, p.output()[-2000:])
    assert time.monotonic() - sent < 3.0
    assert "Traceback" not in p.output()


@pytest.mark.parametrize("kind", ["worker", "coordinator"])
async def test_bad_config_still_exits_2_with_one_line_while_redis_is_down(
    fleet: Fleet, private_redis: RedisServer, kind: str, tmp_path: Path
) -> None:
    private_redis.stop()
    cfg = tmp_path / "bad.toml"
    text, n = re.subn(r"(?m)^heartbeat = .*$", "heartbeat = 100.0", fleet.config.read_text())
    assert n == 1
    cfg.write_text(text)  # more than a third of worker.lease
    p = FleetProcess(kind, "p1", cfg, fleet.log_dir)
    fleet.procs.append(p)
    rc = await exited(p, 30, "the process stops at once")
    assert rc == 2, (rc, p.output())
    lines = p.output().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("commitfleet: config error:") and "heartbeat" in lines[0], lines


async def test_coordinator_refuses_a_fleet_with_another_shard_count(fleet: Fleet, tmp_path: Path) -> None:
    """A fleet.shards set to another count than the fleet's record stops a coordinator: exit 2, one line."""
    n = fleet.settings.fleet.shards
    cfg = tmp_path / "other-n.toml"
    cfg.write_text(fleet.config.read_text().replace(f"shards = {n}\n", f"shards = {n * 2}\n", 1))
    p = FleetProcess("coordinator", "c-wrong", cfg, fleet.log_dir)
    fleet.procs.append(p)
    rc = await exited(p, 60, "the coordinator stops")
    assert rc == 2, (rc, p.output())
    (line,) = p.output().strip().splitlines()
    assert f"was created with {n} shards; this process is configured with {n * 2}" in line, line
