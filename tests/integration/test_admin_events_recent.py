"""``GET /events/recent`` in-process against a real Redis: newest first, filters, cursors, the bounded scan,
the seam with the live stream, auth, and hostile queries (400, never 500)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio

from coordinator.admin import AdminServer
from shared import load_settings
from shared.events import AdminEvent, Committed, JobTimedOut, MessageRejected, Quarantined
from shared.queue import AdminPublisher, Keys, connect, ensure_fleet
from tests._support.redis_server import RedisServer

TOKEN = "t0ken-for-the-recent-events-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
Start = Callable[..., Awaitable[AdminServer]]


@pytest.fixture
async def start_admin(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> AsyncIterator[Start]:
    """Start an AdminServer with a token (its own Redis client); everything stops at the end."""
    await ensure_fleet(redis_client, fleet_name, 4)
    servers: list[tuple[AdminServer, redis.asyncio.Redis]] = []

    async def start(**coordinator: Any) -> AdminServer:
        s = load_settings(
            env={},
            overrides={
                "fleet": {"name": fleet_name, "shards": 4},
                "redis": {"url": redis_url},
                "store": {"url": (tmp_path / "store").as_uri()},
                "coordinator": {"http_port": 0, "admin_token": TOKEN, **coordinator},
            },
        )
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
async def client(server: AdminServer) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20), headers=AUTH) as http:
        yield http, f"http://127.0.0.1:{server.port}"


async def _publish_mix(admin: AdminPublisher) -> list[tuple[str, AdminEvent]]:
    """Publish 40 events of several types, datasets and jobs; return (id, event), oldest first."""
    out: list[tuple[str, AdminEvent]] = []
    for i in range(40):
        ev: AdminEvent
        if i % 10 == 9:
            ev = MessageRejected(at=time.time(), shard=i % 4, reason="schema")
        elif i % 10 == 8:
            ev = JobTimedOut(at=time.time(), shard=1, job=f"j{i % 3}", timeout_s=5.0, datasets=["d1", "zz"])
        elif i % 10 == 7:
            ev = Quarantined(at=time.time(), dataset=f"d{i % 5}", job=f"j{i % 3}", reason="publish failed")
        else:
            ev = Committed(
                at=time.time(), dataset=f"d{i % 5}", job=f"j{i % 3}", files=1, bytes=1, duration_s=0.1
            )
        out.append(((await admin.publish(ev)).decode(), ev))
    return out


async def _get(http: aiohttp.ClientSession, url: str, **params: str) -> dict[str, Any]:
    async with http.get(url, params=params) as resp:
        assert resp.status == 200, (params, await resp.text())
        body: dict[str, Any] = await resp.json()
        return body


async def test_newest_first_filters_and_cursors(
    start_admin: Start, redis_client: redis.asyncio.Redis
) -> None:
    server = await start_admin()
    admin = AdminPublisher(redis_client, server.keys)
    published = await _publish_mix(admin)
    newest_first = [i for i, _ in reversed(published)]
    async with client(server) as (http, base):
        url = f"{base}/events/recent"
        first = await _get(http, url, limit="5")
        assert [e["id"] for e in first["events"]] == newest_first[:5]
        assert first["head"] == newest_first[0]
        assert first["cursor"] == newest_first[4] and first["scanned"] == 5
        assert first["events"][0]["event"]["type"] == "message_rejected"
        # Walking the cursors gives the whole stream once, in order, then no cursor.
        seen, cursor, pages = [e["id"] for e in first["events"]], first["cursor"], 1
        while cursor is not None:
            page = await _get(http, url, limit="7", before=cursor)
            assert page["head"] is None  # only a page read from the stream's end has one
            seen += [e["id"] for e in page["events"]]
            cursor, pages = page["cursor"], pages + 1
        assert seen == newest_first and pages <= 7
        # The default limit takes all 40; no cursor: the start of the stream was reached.
        whole = await _get(http, url)
        assert [e["id"] for e in whole["events"]] == newest_first and whole["cursor"] is None

        def ids(pred: Callable[[AdminEvent], bool]) -> list[str]:
            return [i for i, ev in reversed(published) if pred(ev)]

        got = await _get(http, url, type="committed", dataset="d1")
        want = ids(lambda ev: isinstance(ev, Committed) and ev.dataset == "d1")
        assert [e["id"] for e in got["events"]] == want and len(want) == 8
        assert {e["event"]["dataset"] for e in got["events"]} == {"d1"}
        # A job_timed_out names the datasets it aborted: it matches a dataset filter on them.
        got = await _get(http, url, dataset="d1")
        assert [e["id"] for e in got["events"]] == ids(
            lambda ev: getattr(ev, "dataset", None) == "d1" or "d1" in getattr(ev, "datasets", ())
        )
        assert "job_timed_out" in {e["event"]["type"] for e in got["events"]}
        got = await _get(http, url, job="j2", type="committed,quarantined", limit="3")
        assert [e["id"] for e in got["events"]] == ids(
            lambda ev: isinstance(ev, Committed | Quarantined) and ev.job == "j2"
        )[:3]
        got = await _get(http, url, type="quarantined", dataset="d2", job="j1")
        assert [e["id"] for e in got["events"]] == ids(
            lambda ev: isinstance(ev, Quarantined) and ev.dataset == "d2" and ev.job == "j1"
        )


async def test_a_filter_that_matches_nothing_reads_a_bounded_scan_then_answers_a_cursor(
    start_admin: Start, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("coordinator.admin._http.RECENT_SCAN", 9)
    monkeypatch.setattr("shared.queue._admin_stream.RECENT_READ_PAGE", 4)
    server = await start_admin()
    admin = AdminPublisher(redis_client, server.keys)
    published = await _publish_mix(admin)
    # An entry no reader can decode: counted as read, skipped.
    await redis_client.xadd(server.keys.admin, {b"data": b"{not json"})
    async with client(server) as (http, base):
        url = f"{base}/events/recent"
        page = await _get(http, url, dataset="never-there")
        assert page["events"] == [] and page["scanned"] == 9 and page["cursor"] is not None
        requests, cursor, scanned = 1, page["cursor"], 9
        while cursor is not None:
            page = await _get(http, url, dataset="never-there", before=cursor)
            assert page["events"] == [] and page["scanned"] <= 9
            requests, cursor, scanned = requests + 1, page["cursor"], scanned + page["scanned"]
        assert scanned == len(published) + 1 and requests == 5  # 41 entries, 9 a request
        # The same bound with a filter that matches: the first page holds what the 9 newest hold.
        page = await _get(http, url, type="committed")
        want = [i for i, ev in reversed(published) if isinstance(ev, Committed)]
        newest9 = {i for i, _ in published[-8:]}  # 8 events and the undecodable entry
        assert [e["id"] for e in page["events"]] == [i for i in want if i in newest9]
        assert page["cursor"] == published[-8][0]
        # The entry that does not decode was skipped, nothing else.
        page = await _get(http, url, limit="2")
        assert [e["id"] for e in page["events"]] == [published[-1][0], published[-2][0]]


async def test_the_head_is_where_the_live_stream_takes_over_without_a_duplicate(
    start_admin: Start, redis_client: redis.asyncio.Redis
) -> None:
    server = await start_admin()
    admin = AdminPublisher(redis_client, server.keys)
    async with client(server) as (http, base):
        empty = await _get(http, f"{base}/events/recent")
        assert empty == {"events": [], "head": "0-0", "cursor": None, "scanned": 0}
        old = [
            (await admin.publish(MessageRejected(at=time.time(), shard=0, reason="schema"))).decode()
            for _ in range(3)
        ]
        loaded = await _get(http, f"{base}/events/recent")
        assert [e["id"] for e in loaded["events"]] == old[::-1] and loaded["head"] == old[-1]
        new = (await admin.publish(MessageRejected(at=time.time(), shard=2, reason="schema"))).decode()
        async with http.get(f"{base}/events", params={"from": loaded["head"]}) as resp:
            assert resp.status == 200
            async with asyncio.timeout(10):
                while not (line := (await resp.content.readline()).decode()).startswith("id: "):
                    pass
        assert line == f"id: {new}\n"


async def test_access_checks_and_hostile_queries_get_a_clear_400(start_admin: Start) -> None:
    server = await start_admin(allowed_hosts="fleet.internal")
    base = f"http://127.0.0.1:{server.port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        async with http.get(f"{base}/events/recent") as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        async with http.get(f"{base}/events/recent", headers={**AUTH, "Host": "evil.example"}) as resp:
            assert resp.status == 421
        async with http.get(f"{base}/events/recent", headers={**AUTH, "Host": "fleet.internal"}) as resp:
            assert resp.status == 200
    hostile: list[tuple[str, str]] = [
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=1001", "limit"),
        ("limit=99999999999999999999999", "limit"),
        ("limit=1e3", "limit"),
        ("limit=%EF%BC%91%EF%BC%90", "limit"),  # fullwidth digits: str.isdigit() says yes
        ("limit=", "limit"),
        ("limit=5&limit=6", "once"),
        ("before=garbage", "cursor"),
        ("before=%24", "cursor"),
        (f"before={2**64}-0", "cursor"),
        ("type=committed,commited", "'commited'"),
        ("type=%00", "unknown admin event type"),
        ("dataset=../x", "dataset"),
        ("dataset=" + "a" * 200, "dataset"),
        ("dataset=%C3%A9t%C3%A9", "dataset"),
        ("dataset=%ff%fe", "dataset"),
        ("job=has%20space", "job"),
        ("job=" + "\u202e" * 50, "job"),
        ("job=a&job=b", "once"),
        ("jobs=j1", "unknown parameter 'jobs'"),
    ]
    async with client(server) as (http, base):
        for query, words in hostile:
            async with http.get(f"{base}/events/recent?{query}") as resp:
                assert resp.status == 400, query
                error = (await resp.json())["error"]
                assert words in error and "\n" not in error and len(error) < 1000, (query, error)
        # The live stream refuses the same bad names (they would match nothing, for ever).
        for query in ("dataset=../x", "job=has%20space", "job=a&job=b"):
            async with http.get(f"{base}/events?{query}") as resp:
                assert resp.status == 400, query
        # The largest cursor Redis takes is served (everything is older than it), and the smallest.
        page = await _get(http, f"{base}/events/recent", before=f"{2**64 - 1}-{2**64 - 1}")
        assert page["head"] is None and page["cursor"] is None
        for smallest in ("0-0", "0", "00-000", "0-1", "1"):
            page = await _get(http, f"{base}/events/recent", before=smallest)
            assert page == {"events": [], "head": None, "cursor": None, "scanned": 0}, smallest


async def test_redis_gone_is_a_503_not_a_500(
    redis_factory: Callable[..., RedisServer], fleet_name: str, tmp_path: Path
) -> None:
    private = redis_factory()
    s = load_settings(
        env={},
        overrides={
            "fleet": {"name": fleet_name, "shards": 4},
            "redis": {"url": private.url},
            "store": {"url": (tmp_path / "store").as_uri()},
            "coordinator": {"http_port": 0, "admin_token": TOKEN, "request_timeout": 3},
        },
    )
    r = connect(s.redis, client_name="adm-gone")
    try:
        await ensure_fleet(r, fleet_name, 4)
        server = AdminServer(s, r, Keys(fleet_name), coordinator_id="c-test", leading=asyncio.Event())
        await server.start()
        try:
            async with client(server) as (http, base):
                assert (await _get(http, f"{base}/events/recent"))["head"] == "0-0"
                private.stop()
                async with http.get(f"{base}/events/recent") as resp:
                    assert resp.status == 503
                    assert (await resp.json())["error"]
        finally:
            await server.stop()
    finally:
        await r.aclose()
