"""The admin API in-process against a real Redis: metrics, token, Host check, SSE limits, console guards."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import redis.asyncio
from prometheus_client.parser import text_string_to_metric_families

from coordinator.admin import AdminServer
from coordinator.admin._metrics import OTHER
from shared import ConfigError, Settings, load_settings
from shared.events import Committed, MessageRejected
from shared.queue import AdminPublisher, Keys, connect, ensure_fleet, shard_of
from tests._support.redis_server import RedisServer
from tests._support.wait import wait_for
from workers import DatasetState

TOKEN = "t0ken-for-the-admin-api-tests"
Start = Callable[..., Awaitable[AdminServer]]


def _settings(redis_url: str, tmp_path: Path, fleet: str, **coordinator: Any) -> Settings:
    return load_settings(
        env={},
        overrides={
            "fleet": {"name": fleet, "shards": 4},
            "redis": {"url": redis_url},
            "store": {"url": (tmp_path / "store").as_uri()},
            "coordinator": {"http_port": 0, **coordinator},
        },
    )


@pytest.fixture
async def start_admin(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> AsyncIterator[Start]:
    """Start an AdminServer (own Redis client named ``adm-<fleet>``); everything stops at the end."""
    await ensure_fleet(redis_client, fleet_name, 4)
    servers: list[tuple[AdminServer, redis.asyncio.Redis]] = []

    async def start(**coordinator: Any) -> AdminServer:
        s = _settings(redis_url, tmp_path, fleet_name, **coordinator)
        r = connect(s.redis, client_name=f"adm-{fleet_name}")
        server = AdminServer(s, r, Keys(fleet_name), coordinator_id="c-test", leading=asyncio.Event())
        servers.append((server, r))
        await server.start()
        return server

    yield start
    for server, r in servers:
        await server.stop()
        await r.aclose()


@asynccontextmanager
async def client(server: AdminServer, **headers: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    # unsafe: keep cookies of an IP-address host (127.0.0.1), as a browser does.
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=20), headers=headers, cookie_jar=jar
    ) as http:
        yield http, f"http://127.0.0.1:{server.port}"


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Parse Prometheus text (raises on a malformed exposition) into {(sample, labels): value}."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_hostile_label_values_add_no_series(
    start_admin: Start, redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    server = await start_admin()
    follower = asyncio.ensure_future(server.follow_admin())
    try:
        async with client(server) as (http, base):

            async def metrics() -> str:
                async with http.get(f"{base}/metrics") as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                    return await resp.text()

            before = series(await metrics())
            lab = ("fleet", fleet_name)
            assert before[("commitfleet_rejections_total", (lab, ("reason", "bad_signature")))] == 0
            assert before[("commitfleet_workers", (lab,))] == 0
            hostile = 'x"} 1\ncommitfleet_evil{a="b'
            admin = AdminPublisher(redis_client, Keys(fleet_name))
            await admin.publish(MessageRejected(at=time.time(), shard=1, reason=hostile, detail=hostile))
            await admin.publish(MessageRejected(at=time.time(), shard=1, reason="bad_signature"))
            await admin.publish(
                Committed(
                    at=time.time(),
                    dataset="d",
                    job="j",
                    files=1,
                    bytes=1,
                    duration_s=0.2,
                    phases={"publish": 0.1, hostile: 0.1},
                )
            )

            async def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
                now = series(await metrics())
                key = ("commitfleet_commit_phase_seconds_count", (lab, ("phase", OTHER)))
                return now if now.get(key) == 1 else None

            after = await wait_for(counted, what="the hostile events counted")
            assert set(after) == set(before), set(after) ^ set(before)
            assert after[("commitfleet_rejections_total", (lab, ("reason", OTHER)))] == 1
            assert after[("commitfleet_rejections_total", (lab, ("reason", "bad_signature")))] == 1
            assert after[("commitfleet_admin_events_total", (lab, ("type", "message_rejected")))] == 2
            assert after[("commitfleet_commit_phase_seconds_count", (lab, ("phase", "publish")))] == 1
            assert after[("commitfleet_commit_duration_seconds_count", (lab,))] == 1
            assert "evil" not in await metrics()
            # The commit history of the console counts it too.
            async with http.get(f"{base}/ui/api/commits") as resp:
                hist = await resp.json()
            assert hist["commits"] == 1 and len(hist["points"]) == 60
            assert hist["points"][-1]["max_s"] == 0.2 or hist["points"][-2]["max_s"] == 0.2
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_token_and_host_checks(start_admin: Start) -> None:
    server = await start_admin(admin_token=TOKEN, allowed_hosts="fleet.internal, ops.example:8787")
    async with client(server) as (http, base):
        async with http.get(f"{base}/healthz") as resp:  # tells nothing: open
            assert resp.status == 200
        for path in ("/status", "/metrics", "/events", "/ui/api/commits"):
            async with http.get(f"{base}{path}") as resp:
                assert resp.status == 401, path
                assert resp.headers["WWW-Authenticate"] == "Bearer"
            wrong = {"Authorization": "Bearer wrong-token-xxxxxxxx"}
            async with http.get(f"{base}{path}", headers=wrong) as resp:
                assert resp.status == 401, path
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get(f"{base}/status", headers=auth) as resp:
            assert resp.status == 200
            assert (await resp.json())["coordinator"]["id"] == "c-test"
        # DNS rebinding: a name that resolves to 127.0.0.1 but is not ours is refused, token or not.
        for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example"):
            async with http.get(f"{base}/status", headers={**auth, "Host": host}) as resp:
                assert resp.status == 421, host
        for host in ("fleet.internal", "FLEET.internal:9000", "ops.example", "localhost:1", "[::1]:8787"):
            async with http.get(f"{base}/status", headers={**auth, "Host": host}) as resp:
                assert resp.status == 200, host
        # The console page sends a browser to its login form.
        async with http.get(f"{base}/ui", allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/ui/login"
        async with http.get(f"{base}/ui/login") as resp:
            assert resp.status == 200 and "Content-Security-Policy" in resp.headers


async def test_exposed_without_token_does_not_start(start_admin: Start, tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "10.1.2.3", "fleet.example"):
        with pytest.raises(ConfigError) as err:
            await start_admin(http_host=host)
        assert "admin_token is required" in str(err.value) and "\n" not in str(err.value), host
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert load_settings(env={}, overrides={"coordinator": {"http_host": host}})
    server = await start_admin(http_host="0.0.0.0", admin_token=TOKEN)
    assert server.port
    # The process: one line, exit 2, before it waits for Redis (nothing listens on port 1).
    env = {
        **os.environ,
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "COMMITFLEET_STORE": (tmp_path / "s").as_uri(),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coordinator", "coordinator", "--http-host", "0.0.0.0",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err_b = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, (out, err_b)
    assert err_b.decode().count("\n") == 1 and "admin_token is required" in err_b.decode(), err_b


async def test_console_login_cookie_and_cross_site_posts(start_admin: Start) -> None:
    server = await start_admin(admin_token=TOKEN)
    async with client(server) as (http, base):
        origin = {"Origin": base}
        login = f"{base}/ui/login"
        async with http.post(login, data={"token": "nope"}, headers=origin, allow_redirects=False) as r:
            assert r.status == 303 and "failed" in r.headers["Location"]
            assert "commitfleet_session" not in r.cookies
        async with http.post(login, data={"token": TOKEN}, headers=origin, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/ui"
            cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
        async with http.get(f"{base}/ui") as resp:  # the cookie now opens the console
            assert resp.status == 200 and "commitfleet console" in await resp.text()
        body = {"dataset": "qa", "job": "j1"}
        # Authenticated by the cookie but from another site: refused before anything is read.
        for bad in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            async with http.post(f"{base}/ui/api/retry", json=body, headers=bad) as resp:
                assert resp.status == 403, bad
        async with http.post(f"{base}/ui/api/retry", json=body, headers=origin) as resp:
            assert resp.status == 409  # nothing quarantined
        bad_name = {"dataset": "../x", "job": "j"}
        async with http.post(f"{base}/ui/api/skip", json=bad_name, headers=origin) as r:
            assert r.status == 400
    async with client(server) as (http, base):  # no cookie
        async with http.post(f"{base}/ui/api/retry", json=body, headers={"Origin": base}) as resp:
            assert resp.status == 401
        async with http.post(
            f"{base}/ui/api/retry", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as resp:
            assert resp.status == 409


async def _xread_clients(r: redis.asyncio.Redis, name: str) -> int:
    clients = await r.client_list()
    return sum(1 for c in clients if c.get("name") == name and c.get("cmd") == "xread")


async def test_sse_keepalive(start_admin: Start) -> None:
    server = await start_admin(sse_keepalive=0.2)
    async with client(server) as (http, base):
        # A filter that never matches: only keep-alive comments arrive.
        async with http.get(f"{base}/events?dataset=never-matches") as resp:
            assert resp.status == 200
            assert re.match(r"retry: \d+", (await resp.content.readline()).decode())
            lines = [(await resp.content.readline()).decode() for _ in range(4)]
        assert ": keep-alive\n" in lines, lines
        # Events read in one batch each carry their own id (a resume point must skip nothing).
        admin = AdminPublisher(server.r, server.keys)
        ids = [(await admin.publish(MessageRejected(at=time.time(), shard=0, reason="schema"))).decode()]
        ids += [(await admin.publish(MessageRejected(at=time.time(), shard=0, reason="schema"))).decode()]
        got: list[str] = []
        async with http.get(f"{base}/events", params={"from": "0"}) as resp:
            async with asyncio.timeout(10):
                while len(got) < 2:
                    line = (await resp.content.readline()).decode()
                    if line.startswith("id: "):
                        got.append(line.removeprefix("id: ").strip())
        assert got == ids
        for bad in ("garbage", "1-2-3", "$x"):
            async with http.get(f"{base}/events", params={"from": bad}) as resp:
                assert resp.status == 400, bad
        # An unknown event type would filter out every event: refused, naming the known ones.
        async with http.get(f"{base}/events", params={"type": "committed,commited"}) as resp:
            assert resp.status == 400
            assert "'commited'" in (await resp.json())["error"]


async def test_sse_cap_and_disconnect_noticed_at_once(
    start_admin: Start, redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    # No keep-alive write for a minute: only the disconnect itself can end the streams.
    server = await start_admin(sse_keepalive=60, sse_max_clients=2)
    name = f"adm-{fleet_name}"
    tasks_before = len(asyncio.all_tasks())
    async with client(server) as (http, base):
        url = f"{base}/events?dataset=never-matches"
        first = await http.get(url)
        second = await http.get(url)
        assert first.status == second.status == 200
        async with http.get(url, headers={"Connection": "close"}) as third:
            assert third.status == 503 and third.headers["Retry-After"]

        async def reading() -> bool:
            return await _xread_clients(redis_client, name) == 2

        await wait_for(reading, what="the two streams' blocking reads")
        assert server.sse_clients == 2
        first.close()
        second.close()

        async def released() -> bool:
            return server.sse_clients == 0 and await _xread_clients(redis_client, name) == 0

        # Well within the 5 s a blocking read lasts here: noticed at the disconnect, not later.
        await wait_for(released, timeout=2, what="the disconnected streams ended, their Redis reads gone")
        # The handler tasks are gone too (not just parked between two reads).
        await wait_for(
            lambda: asyncio.sleep(0, len(asyncio.all_tasks()) <= tasks_before), timeout=2, what="tasks"
        )
        # A new client is served again.
        async with http.get(url) as again:
            assert again.status == 200
            assert re.match(r"retry: \d+", (await again.content.readline()).decode())


async def test_a_request_ends_at_its_timeout(
    redis_factory: Callable[..., RedisServer], fleet_name: str, tmp_path: Path
) -> None:
    server_redis = redis_factory()
    s = _settings(server_redis.url, tmp_path, fleet_name, request_timeout=0.5)
    r = connect(s.redis, client_name="adm-timeout")
    try:
        await ensure_fleet(r, fleet_name, 4)
        server = AdminServer(s, r, Keys(fleet_name), coordinator_id="c-test", leading=asyncio.Event())
        await server.start()
        try:
            async with client(server) as (http, base):
                assert server_redis.proc is not None
                # Redis stops answering; its client would wait for its 10 s socket timeout.
                os.killpg(server_redis.proc.pid, signal.SIGSTOP)
                try:
                    t0 = time.monotonic()
                    async with http.get(f"{base}/status") as resp:
                        assert resp.status == 503
                        assert (await resp.json())["error"] == "request timed out"
                    assert time.monotonic() - t0 < 3
                    async with http.get(f"{base}/healthz") as resp:  # the server itself goes on
                        assert resp.status == 200
                finally:
                    os.killpg(server_redis.proc.pid, signal.SIGCONT)
        finally:
            await server.stop()
    finally:
        await r.aclose()


async def test_commit_history_reads_the_last_hour_back_in_pages(
    start_admin: Start, redis_client: redis.asyncio.Redis, fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("coordinator.admin._http.BACKFILL_PAGE", 2)
    admin = AdminPublisher(redis_client, Keys(fleet_name))
    for i in range(5):
        await admin.publish(
            Committed(at=time.time(), dataset=f"d{i}", job="j", files=1, bytes=1, duration_s=0.1 * (i + 1))
        )
    server = await start_admin()
    follower = asyncio.ensure_future(server.follow_admin())
    try:
        await wait_for(lambda: asyncio.sleep(0, server.history.series(time.time())["commits"] == 5))
        new = Committed(at=time.time(), dataset="new", job="j", files=1, bytes=1, duration_s=0.1)
        await admin.publish(new)
        await wait_for(lambda: asyncio.sleep(0, server.history.series(time.time())["commits"] == 6))
        # The metrics count what this coordinator saw since it started: the new one only.
        assert server.metrics.agg.commit_seconds.total == 1
        assert max(p["max_s"] or 0 for p in server.history.series(time.time())["points"]) == 0.5
    finally:
        follower.cancel()
        # Ends at once when cancelled (the coordinator's shutdown relies on it).
        done, _ = await asyncio.wait([follower], timeout=5)
        if not done:
            follower.print_stack()
            import sys as _s

            _s.stdout.flush()
        assert done


async def _raw_status(port: int, request: bytes) -> int:
    """Send ``request`` as is (bytes no client library would send) and return the answer's status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 20)
        return int(line.split()[1])
    finally:
        writer.close()
        await writer.wait_closed()


async def test_credentials_that_are_not_utf8_are_refused_not_an_error(start_admin: Start) -> None:
    server = await start_admin(admin_token=TOKEN)
    assert server.port is not None
    for header in (b"Authorization: Bearer \xff\xfe", b"Cookie: commitfleet_session=\xff\xfe\xed\xa0\x80"):
        request = b"GET /status HTTP/1.1\r\nHost: localhost\r\n" + header + b"\r\nConnection: close\r\n\r\n"
        assert await _raw_status(server.port, request) == 401, header


async def test_a_stream_id_redis_would_refuse_is_a_bad_request(start_admin: Start) -> None:
    server = await start_admin(admin_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with client(server, **auth) as (http, base):
        too_big = str(2**64)  # one past what Redis takes
        for start in (too_big, f"1-{too_big}", "99999999999999999999", "\u0661\u0662\u0663"):
            async with http.get(f"{base}/events", params={"from": start}) as resp:
                assert resp.status == 400, start
                assert "bad stream id" in (await resp.json())["error"]
            async with http.get(f"{base}/events", headers={"Last-Event-ID": start}) as resp:
                assert resp.status == 400, start
        # The largest id Redis takes is still served (an empty stream from there on).
        biggest = f"{2**64 - 1}-{2**64 - 1}"
        async with http.get(f"{base}/events", params={"from": biggest}) as resp:
            assert resp.status == 200


async def test_requests_the_server_cannot_parse_are_400_and_no_error_in_the_log(
    start_admin: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = await start_admin(admin_token=TOKEN)
    assert server.port is not None
    hostile = [
        b"GET /status HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET /status HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n",
        b"GET /status HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    ]
    with caplog.at_level(logging.INFO):
        for request in hostile:
            assert await _raw_status(server.port, request) == 400, request[:40]
        # Still serving.
        request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        assert await _raw_status(server.port, request) == 200
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]


async def test_status_pages_over_http_with_glob_characters_in_names(
    start_admin: Start, redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    """GET /status/datasets passes its filters through as given: a prefix with glob characters
    matches literally, every page is bounded, and GET /status carries no list of open work."""
    keys = Keys(fleet_name)
    names = ["a*1", "a*2", "ab", "a?", "[x]", "[x]y"]
    for name in names:
        raw = msgspec.json.encode(DatasetState(status="waiting"))
        await redis_client.hset(keys.shard_state(shard_of(name, 4), "datasets"), f"j1/{name}", raw)
    server = await start_admin()
    async with client(server) as (http, base):

        async def listed(**params: str) -> list[str]:
            got: list[str] = []
            cursor = None
            for _ in range(50):
                q = {**params, "limit": "1", **({"cursor": cursor} if cursor else {})}
                async with http.get(f"{base}/status/datasets", params=q) as resp:
                    assert resp.status == 200, await resp.text()
                    page = await resp.json()
                assert len(page["items"]) <= 1
                got += [i["dataset"] for i in page["items"]]
                if (cursor := page["next"]) is None:
                    return sorted(got)
            raise AssertionError("pages never ended")

        assert await listed(prefix="a*") == ["a*1", "a*2"]
        assert await listed(prefix="[x]") == ["[x]", "[x]y"]
        assert await listed(dataset="a?") == ["a?"]
        assert await listed(state="pending", job="j1") == sorted(names)
        assert await listed(job="j2") == []
        async with http.get(f"{base}/status") as resp:
            doc = await resp.json()
        assert "pending" not in doc and "open_jobs" not in doc and "totals" in doc
        for bad in ({"shard": "-1"}, {"shard": "4"}, {"limit": "1001"}, {"limit": "x"}):
            async with http.get(f"{base}/status/datasets", params=bad) as resp:
                assert resp.status == 400, bad
        async with http.get(f"{base}/status/jobs", params={"limit": "201"}) as resp:
            assert resp.status == 400
