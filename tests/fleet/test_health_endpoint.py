"""The worker's health endpoint, probed on real worker processes as a kubelet would.

A worker whose event loop is blocked fails liveness within the probe's timeout
(and answers 503 once it can answer at all); a Redis outage keeps liveness
and fails readiness until Redis is back; start-up fails until Redis is first
reached; hostile bytes on the port leave the worker committing. The blocked
loop is planted by a launcher of the tests (tests/_support/faulty_cli.py),
never by a hook in the product.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared import TransientError
from tests._support.fleet_checks import committed
from tests._support.fleet_jobs import good_job
from tests._support.health import probe, status_of
from tests._support.ports import free_port
from tests._support.process_fleet import Fleet, report
from tests._support.processes import FleetProcess
from tests._support.redis_server import RedisHandle, RedisServer
from tests._support.wait import wait_for

PROBE_TIMEOUT = 1.0  # the kubelet's default timeoutSeconds
MAX_LOOP_LAG = 1.0
BLOCK_S = 4.0


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {"worker": {"max_loop_lag": MAX_LOOP_LAG}}


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


def start_worker(
    fleet: Fleet, name: str, port: int, monkeypatch: pytest.MonkeyPatch | None = None
) -> FleetProcess:
    """Start a worker serving its health endpoint on ``port`` (``--http-port``); with ``monkeypatch``,
    through the launcher whose SIGUSR2 blocks the event loop for ``BLOCK_S``."""
    extra = ["--http-port", str(port)]
    if monkeypatch is None:
        p = FleetProcess("worker", name, fleet.config, fleet.log_dir, extra)
    else:
        monkeypatch.setenv("CF_TEST_FAULT", "block-loop")
        monkeypatch.setenv("CF_TEST_BLOCK_S", str(BLOCK_S))
        p = FleetProcess(
            "worker", name, fleet.config, fleet.log_dir, extra, module="tests._support.faulty_cli"
        )
    fleet.procs.append(p)
    fleet.names[name] = p
    return p


async def answers(port: int, path: str, status: int) -> bool:
    return await status_of(port, path, timeout=PROBE_TIMEOUT) == status


async def test_a_blocked_event_loop_fails_liveness_within_the_probe_timeout(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    fleet.start("coordinator", "c1")
    w1 = start_worker(fleet, "w1", port, monkeypatch)
    await wait_for(lambda: answers(port, "/readyz", 200), timeout=60, what="w1 ready")
    await wait_for(lambda: answers(port, "/livez", 200), timeout=30, what="w1 live")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")

    w1.signal(signal.SIGUSR2)  # the loop sleeps BLOCK_S seconds from now
    blocked_at = time.monotonic()
    # A kubelet's probe gets no answer within its timeout: it fails.
    assert await probe(port, "/livez", timeout=PROBE_TIMEOUT) is None
    # A patient client gets an answer once the loop runs again, and it is a failure.
    late = await probe(port, "/livez", timeout=BLOCK_S + 10)
    assert late is not None
    assert late.status == 503, late
    assert "event loop" in late.body, late
    assert time.monotonic() - blocked_at >= BLOCK_S - 0.5
    # Readiness is not what failed: the worker is a member all along.
    # Once the lag is out of its window the worker is live again (the kubelet's failureThreshold
    # decides whether it was restarted meanwhile); it commits as before.
    await wait_for(lambda: answers(port, "/livez", 200), timeout=30, what="live again after the block")
    report(f"blocked loop: no answer within {PROBE_TIMEOUT}s; 503 once answered; live again later")
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", ["a", "b"], tasks=1))
    await wait_for(lambda: committed(fleet.store, ["a", "b"], "j1"), timeout=60, what="j1 commits")
    assert w1.terminate(timeout=60) == 0


async def test_a_redis_outage_keeps_liveness_and_fails_readiness(
    fleet: Fleet, private_redis: RedisServer
) -> None:
    port = free_port()
    fleet.start("coordinator", "c1")
    w1 = start_worker(fleet, "w1", port)
    await wait_for(lambda: answers(port, "/readyz", 200), timeout=60, what="w1 ready")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")

    private_redis.kill()
    await wait_for(lambda: answers(port, "/readyz", 503), timeout=10, what="not ready while Redis is down")
    body = await probe(port, "/readyz")
    assert body is not None and "Redis" in body.body, body
    # Well past the membership lease (3 s) and a few heartbeats: liveness holds all along.
    down_until = time.monotonic() + 3 * fleet.settings.worker.lease
    checks = 0
    while time.monotonic() < down_until:
        live = await probe(port, "/livez", timeout=PROBE_TIMEOUT)
        assert live is not None and live.status == 200, live
        assert await status_of(port, "/readyz") == 503
        checks += 1
        await asyncio.sleep(0.25)
    assert w1.proc.poll() is None

    private_redis.start()
    back = time.monotonic()
    await wait_for(lambda: answers(port, "/readyz", 200), timeout=60, what="ready again with Redis back")
    report(
        f"Redis outage: /livez 200 in {checks} checks over {3 * fleet.settings.worker.lease:g}s; "
        f"/readyz 503, then 200 {time.monotonic() - back:.1f}s after Redis came back"
    )
    assert await status_of(port, "/livez") == 200

    async def settled_again() -> bool:
        try:
            return await fleet.owners_settled({"w1"})
        except TransientError:  # the test's own client reconnects after the restart
            return False

    await wait_for(settled_again, timeout=60, what="w1 owns every shard again")
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", ["a", "b"], tasks=1))
    await wait_for(lambda: committed(fleet.store, ["a", "b"], "j1"), timeout=60, what="j1 commits")
    assert w1.terminate(timeout=60) == 0


async def test_startup_fails_until_redis_is_reached(fleet: Fleet, private_redis: RedisServer) -> None:
    port = free_port()
    private_redis.stop()
    fleet.start("coordinator", "c1")
    w1 = start_worker(fleet, "w1", port)
    await wait_for(lambda: answers(port, "/startupz", 503), timeout=30, what="startup failing, served")
    assert await status_of(port, "/readyz") == 503
    assert await status_of(port, "/livez") == 200  # waiting for Redis is not a reason to restart
    private_redis.start()
    await wait_for(lambda: answers(port, "/startupz", 200), timeout=60, what="started once Redis answers")
    await wait_for(lambda: answers(port, "/readyz", 200), timeout=60, what="ready")
    assert w1.terminate(timeout=60) == 0


async def test_metrics_show_the_process_and_the_worker(fleet: Fleet) -> None:
    port = free_port()
    fleet.start("coordinator", "c1")
    w1 = start_worker(fleet, "w1", port)
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")

    async def scrape() -> dict[str, float]:
        answer = await probe(port, "/metrics")
        assert answer is not None and answer.status == 200
        return {s.name: s.value for fam in text_string_to_metric_families(answer.body) for s in fam.samples}

    async def owns_all() -> dict[str, float] | None:
        values = await scrape()
        return (
            values if values.get("commitfleet_worker_shards_owned") == fleet.settings.fleet.shards else None
        )

    values = await wait_for(owns_all, timeout=30, what="metrics show every shard owned")
    assert values["process_resident_memory_bytes"] > 10e6
    assert values["process_open_fds"] > 0
    assert values["process_cpu_seconds_total"] > 0
    assert "python_gc_collections_total" in values
    assert 0 <= values["commitfleet_worker_lease_age_seconds"] <= fleet.settings.worker.lease
    assert values["commitfleet_worker_live"] == 1.0
    assert values["commitfleet_worker_ready"] == 1.0
    assert values["commitfleet_worker_inflight"] == 0
    assert values["commitfleet_worker_queued"] == 0
    assert w1.terminate(timeout=60) == 0


def hostile_requests(rng: random.Random) -> list[bytes]:
    """Return bytes no well-behaved client sends."""
    out = [
        b"",
        b"\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /livez\r\n\r\n",
        b"GET /livez HTTP/9.9\r\n\r\n",
        b"GET livez HTTP/1.1\r\n\r\n",
        b"\x00\x01\x02 /livez HTTP/1.1\r\n\r\n",
        b"GET /\xff\xfe HTTP/1.1\r\n\r\n",
        b"POST /livez HTTP/1.1\r\nContent-Length: 100000000\r\n\r\n" + b"x" * 70000,
        b"GET /livez HTTP/1.1\r\n" + b"X-A: b\r\n" * 5000 + b"\r\n",
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: " + b"h" * 9000 + b"\r\n\r\n",
        b"GET /livez HTTP/1.1\n\n",
        b"GET /livez HTTP/1.1\r\n",  # never ends its head
        b"DELETE /readyz HTTP/1.1\r\n\r\n",
        b"GET /metrics?x=" + b"%00" * 100 + b" HTTP/1.1\r\n\r\n",
        b"GET /../../etc/passwd HTTP/1.1\r\n\r\n",
        b"GET /livez HTTP/1.1\r\n\r\nGET /livez HTTP/1.1\r\n\r\n" * 50,
    ]
    out += [rng.randbytes(rng.randint(1, 20_000)) for _ in range(40)]
    return out


async def send(port: int, payload: bytes, *, linger: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(payload)
        async with asyncio.timeout(linger):
            await writer.drain()
            await reader.read(1 << 20)
    except (OSError, TimeoutError):
        pass
    finally:
        writer.transport.abort()


async def test_hostile_bytes_on_the_port_leave_the_worker_committing(fleet: Fleet) -> None:
    port = free_port()
    seed = int(os.environ.get("CF_FUZZ_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    fleet.start("coordinator", "c1")
    w1 = start_worker(fleet, "w1", port)
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns every shard")
    datasets = [f"ds{i}" for i in range(20)]
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", datasets, tasks=2))
    # Idle connections beyond the server's limit, and every hostile payload, while it commits.
    idle = [asyncio.ensure_future(send(port, b"", linger=8.0)) for _ in range(40)]
    payloads = hostile_requests(rng)
    rounds = 0
    for _ in range(3):
        await asyncio.gather(*(send(port, p, linger=2.0) for p in payloads))
        rounds += 1
    await asyncio.gather(*idle)
    await wait_for(lambda: committed(fleet.store, datasets, "j1"), timeout=60, what="j1 commits")
    await wait_for(lambda: answers(port, "/livez", 200), timeout=10, what="live after the fuzz")
    assert await status_of(port, "/readyz") == 200
    assert w1.proc.poll() is None
    log = w1.output()
    assert "unexpected error answering a request" not in log, f"seed {seed}"
    assert "Traceback" not in log, f"seed {seed}: {log[-3000:]}"
    report(f"health endpoint fuzz: {rounds} x {len(payloads)} hostile payloads + 40 idle, seed {seed}")
    assert w1.terminate(timeout=60) == 0
