"""The ``commitfleet`` CLI and the coordinator's admin HTTP API against a running fleet.

Every command runs as a real subprocess (``python -m coordinator ...``) with an
environment free of ``COMMITFLEET_*`` / ``REDIS_URL``, the way an operator runs
it; the tests check its real output and exit codes against what the fleet of
real coordinator and worker processes did (manifests in the store, admin
events in Redis).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.commit import list_unfinished, read_manifest
from shared.events import (
    Aborted,
    Committed,
    DatasetExpectation,
    JobFinished,
    JobStarted,
    OperatorAction,
    Quarantined,
    QueueEvent,
    manifest_key,
    wal_key,
)
from shared.queue import Keys
from tests._support.cli import cli, cli_argv, cli_env
from tests._support.fleet_checks import admin_events, clean_audit, committed, no_staging_left
from tests._support.fleet_jobs import corrupted_job, failed_job, good_job, stage_task
from tests._support.ports import free_port
from tests._support.process_fleet import Fleet
from tests._support.processes import FleetProcess
from tests._support.status_pages import parse_status_json, status_with_pages
from tests._support.wait import wait_for


def row(*cells: str) -> str:
    """Return a regex for a Rich table row whose cells start with ``cells``, in order."""
    return r"[\s│]+".join(re.escape(c) for c in cells)


async def status_doc(fleet: Fleet) -> dict[str, Any]:
    """Return the status document read in-process (cheap, for polling)."""
    return await status_with_pages(fleet.redis, fleet.keys, fleet.settings)


async def wait_admin(fleet: Fleet, probe: Any, what: str, timeout: float = 60) -> Any:
    """Wait until ``probe(admin events)`` returns something truthy; return it."""

    async def check() -> Any:
        return probe(await admin_events(fleet.redis, fleet.settings.fleet.name))

    return await wait_for(check, timeout=timeout, interval=0.1, what=what)


async def read_line_until(stream: asyncio.StreamReader, pred: Any, deadline: float, seen: list[str]) -> str:
    """Read lines from ``stream`` until one satisfies ``pred``; fail after ``deadline`` (monotonic)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no matching line before the deadline; lines so far: {seen}")
        try:
            raw = await asyncio.wait_for(stream.readline(), left)
        except TimeoutError:
            continue
        if not raw:
            raise AssertionError(f"stream ended; lines so far: {seen}")
        line = raw.decode().rstrip("\n")
        seen.append(line)
        if pred(line):
            return line


# -- a fleet with commits, an abort and an open job: status, events, audit, HTTP ---------------


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    """A known admin API port for this module's coordinators."""
    return {"coordinator": {"http_port": free_port()}}


async def test_status_events_audit_and_http_api(fleet: Fleet) -> None:
    cfg = fleet.config
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers own all shards")

    good = await good_job(fleet.store, "j-good", ["alpha", "beta", "gamma"], tasks=2)
    bad = await failed_job(fleet.store, "j-bad", ["delta"], tasks=1)
    # A job still running (open), and a finished one that waits for a task that never reported.
    opened: list[QueueEvent] = [
        JobStarted(job="j-open", datasets=["eps"], timeout_s=600, started_at=time.time()),
        await stage_task(fleet.store, "j-open", "eps", 0, 0),
    ]
    waiting: list[QueueEvent] = [
        JobStarted(job="j-wait", datasets=["eta"], timeout_s=600, started_at=time.time()),
        await stage_task(fleet.store, "j-wait", "eta", 0, 0),
        JobFinished(job="j-wait", datasets={"eta": DatasetExpectation(tasks=2)}, finished_at=time.time()),
    ]
    await fleet.publisher.publish_many([*good, *bad, *opened, *waiting])
    await wait_for(
        lambda: committed(fleet.store, ["alpha", "beta", "gamma"], "j-good"), what="j-good commits"
    )
    await wait_admin(fleet, lambda evs: any(isinstance(e, Aborted) for e in evs), "delta aborted")
    await wait_for(lambda: no_staging_left(fleet.store, "j-bad"), what="j-bad staging gone")

    async def open_jobs_seen() -> bool:
        doc = await status_doc(fleet)
        return sorted(j["job"] for j in doc["open_jobs"]) == ["j-open", "j-wait"] and bool(doc["pending"])

    await wait_for(open_jobs_seen, what="only j-open and j-wait open")

    # status --json: the document, checked against what the fleet is.
    res = await cli("status", "--config", cfg, "--json")
    assert res.rc == 0, res.err
    doc = parse_status_json(res.out)
    assert doc["fleet"] == fleet.settings.fleet.name
    assert doc["shards"] == 8
    assert doc["leader"] == "c1"
    workers = {w["id"]: w for w in doc["workers"]}
    assert set(workers) == {"w1", "w2"}
    owned = [s for w in workers.values() for s in w["shards"]]
    assert sorted(owned) == list(range(8)), owned
    assert sorted(len(w["shards"]) for w in workers.values()) == [4, 4]
    assert all(w["pid"] == fleet.names[w["id"]].pid for w in workers.values())
    assert sorted(j["job"] for j in doc["open_jobs"]) == ["j-open", "j-wait"]
    assert doc["totals"]["open_jobs"] == 2
    assert sorted((d["job"], d["dataset"], d["status"]) for d in doc["datasets"]) == [
        ("j-open", "eps", "open"),
        ("j-wait", "eta", "waiting"),
    ]
    assert [(p["dataset"], p["job"], p["status"]) for p in doc["pending"]] == [("eta", "j-wait", "waiting")]
    assert doc["quarantined"] == []
    assert doc["expired_workers"] == []
    assert all(r["owner"] in ("w1", "w2") and r["moving_to"] is None for r in doc["shard_table"])

    # status (text): the same facts for a person.
    res = await cli("status", "--config", cfg)
    assert res.rc == 0, res.err
    assert f"fleet {fleet.settings.fleet.name}" in res.out
    assert "leader c1" in res.out
    rows = {ln.split()[0]: ln for ln in res.out.splitlines() if re.match(r"^\s*w[12]\s", ln)}
    assert set(rows) == {"w1", "w2"}, res.out
    assert all(re.search(r"\s4\s", ln) for ln in rows.values()), res.out  # 4 shards each
    assert "moving 0  unowned 0" in res.out
    assert (
        "open jobs 2  datasets waiting for tasks 1  queued 0  running 0  blocked 0  quarantined 0" in res.out
    ), res.out
    assert re.search(r"j-open\s+\d", res.out), res.out
    assert re.search(r"j-wait\s+\d", res.out), res.out
    assert re.search(row("eta", "j-wait"), res.out), res.out
    assert "no quarantined datasets" in res.out

    # events: every admin event so far; --json lines parse; filters narrow.
    res = await cli("events", "--config", cfg, "--json", "--last", "1000")
    assert res.rc == 0, res.err
    evs = res.json_lines()
    types = [e["type"] for e in evs]
    assert {e["worker"] for e in evs if e["type"] == "worker_joined"} == {"w1", "w2"}
    assert "shards_assigned" in types
    assert sorted(e["dataset"] for e in evs if e["type"] == "committed") == ["alpha", "beta", "gamma"]
    assert [(e["dataset"], e["job"]) for e in evs if e["type"] == "aborted"] == [("delta", "j-bad")]
    ids = [e["id"] for e in evs]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-")))), "events out of order"
    stored = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert len(evs) == len(stored)

    res = await cli("events", "--config", cfg)  # text, default --last 50
    assert res.rc == 0, res.err
    lines = res.out.splitlines()
    assert len(lines) == min(50, len(stored))
    assert all(re.match(r"^\d\d:\d\d:\d\d \w+", ln) for ln in lines), lines
    assert any(re.search(r"\scommitted\s.*dataset=alpha job=j-good", ln) for ln in lines), lines

    # Repeated, or comma-separated as the README writes it (that form used to filter out every event).
    for types in (("--type", "committed", "-t", "aborted"), ("--type", "committed,aborted")):
        res = await cli("events", "--config", cfg, "--json", *types)
        assert res.rc == 0, res.err
        assert sorted((e["type"], e["dataset"]) for e in res.json_lines()) == [
            ("aborted", "delta"),
            ("committed", "alpha"),
            ("committed", "beta"),
            ("committed", "gamma"),
        ], types
    res = await cli("events", "--config", cfg, "--json", "--type", "commited")
    assert res.rc == 2 and res.out == ""
    assert "unknown admin event type(s) 'commited'" in res.err and "committed" in res.err, res.err
    # A name no event can carry would match nothing: refused, as GET /events and /events/recent refuse it.
    for bad in (("--dataset", "../alpha"), ("--job", "j bad")):
        res = await cli("events", "--config", cfg, "--json", *bad)
        assert res.rc == 2 and res.out == "", bad
        assert bad[0].removeprefix("--") in res.err and "\n" not in res.err.strip(), res.err
    res = await cli("events", "--config", cfg, "--json", "--dataset", "alpha")
    assert res.rc == 0, res.err
    got = res.json_lines()
    assert {e["dataset"] for e in got} == {"alpha"}
    assert [e["type"] for e in got] == ["commit_started", "committed"]
    res = await cli("events", "--config", cfg, "--json", "--job", "j-bad")
    assert res.rc == 0, res.err
    assert [(e["type"], e["dataset"]) for e in res.json_lines()] == [("aborted", "delta")]
    res = await cli("events", "--config", cfg, "--json", "--type", "committed", "--last", "2")
    assert res.rc == 0, res.err
    assert len(res.json_lines()) == 2

    # events --follow: prints the backlog, then a commit that happens after it started.
    follow = await asyncio.create_subprocess_exec(
        *cli_argv("events", "--config", cfg, "--follow", "--type", "committed"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cli_env(),
        start_new_session=True,
    )
    try:
        assert follow.stdout is not None and follow.stderr is not None
        seen: list[str] = []
        deadline = time.monotonic() + 30
        await read_line_until(follow.stdout, lambda ln: "job=j-good" in ln, deadline, seen)
        # The backlog has been read: whatever is appended from now on must show.
        await fleet.publisher.publish_many(await good_job(fleet.store, "j-late", ["zeta"], tasks=1))
        line = await read_line_until(follow.stdout, lambda ln: "job=j-late" in ln, deadline, seen)
        assert re.search(r"\scommitted\s.*dataset=zeta job=j-late", line), line
        assert all(" committed " in ln for ln in seen), seen  # the filter holds while following
        assert follow.returncode is None, "events --follow exited on its own"
        # Ctrl-C ends it quietly.
        os.killpg(follow.pid, signal.SIGINT)
        async with asyncio.timeout(15):
            _out, err = await follow.communicate()
        rc: int | None = follow.returncode
        assert rc in (0, 130, -signal.SIGINT), (rc, err)
        assert b"Traceback" not in err, err.decode()
    finally:
        if follow.returncode is None:
            os.killpg(follow.pid, signal.SIGKILL)
            await follow.wait()

    # audit: clean store -> exit 0; a planted stray file -> exit 1, listed; --json parses.
    root = str(fleet.settings.store.url)
    res = await cli("audit", root)
    assert res.rc == 0, (res.out, res.err)
    assert "no violations" in res.out
    assert "datasets 4  manifests 4" in res.out, res.out
    await fleet.store.write("alpha/stray.bin", b"not listed by any manifest")
    res = await cli("audit", Path(root.removeprefix("file://")))  # a plain path works too
    assert res.rc == 1, (res.out, res.err)
    assert re.search(row("unlisted_file", "alpha/stray.bin", "no manifest lists it"), res.out), res.out
    res = await cli("audit", root, "--json")
    assert res.rc == 1, res.err
    report = json.loads(res.out)
    assert [(v["kind"], v["key"]) for v in report["violations"]] == [("unlisted_file", "alpha/stray.bin")]
    assert report["manifests"] == 4
    await fleet.store.delete("alpha/stray.bin")

    # The admin HTTP API of the coordinator process.
    base = f"http://127.0.0.1:{fleet.settings.coordinator.http_port}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(f"{base}/healthz") as resp:
            assert resp.status == 200
            assert (await resp.text()).strip() == "ok"
        async with http.get(f"{base}/status") as resp:
            assert resp.status == 200
            assert resp.content_type == "application/json"
            hdoc = await resp.json()
        assert {w["id"] for w in hdoc["workers"]} == {"w1", "w2"}
        assert hdoc["coordinator"] == {"id": "c1", "leading": True}
        assert hdoc["leader"] == "c1"
        assert hdoc["totals"]["open_jobs"] == 2 and "open_jobs" not in hdoc and "pending" not in hdoc
        # One job a page; a page reads a bounded part of the state, so one may come back empty.
        listed: list[str] = []
        params = {"limit": "1"}
        for _ in range(20):
            async with http.get(f"{base}/status/jobs", params=params) as resp:
                assert resp.status == 200
                jpage = await resp.json()
            assert len(jpage["items"]) <= 1
            listed += [j["job"] for j in jpage["items"]]
            if jpage["next"] is None:
                break
            params = {"limit": "1", "cursor": jpage["next"]}
        assert jpage["next"] is None and sorted(listed) == ["j-open", "j-wait"]
        async with http.get(f"{base}/status/datasets", params={"state": "pending"}) as resp:
            assert resp.status == 200
            page = await resp.json()
        assert [(d["dataset"], d["job"], d["state"]) for d in page["items"]] == [("eta", "j-wait", "waiting")]
        assert page["next"] is None
        for bad in ({"state": "sleeping"}, {"limit": "0"}, {"cursor": "nonsense"}, {"sort": "x"}):
            async with http.get(f"{base}/status/datasets", params=bad) as resp:
                assert resp.status == 400, bad

        async def metrics() -> dict[tuple[str, str], float]:
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
            # Parsed by prometheus_client's own parser (a malformed exposition raises).
            got = {
                (s.name, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
            }
            # Workers flush their counters about once a second.
            return got if got.get(("commitfleet_committed_total", lab)) == 4 else {}

        lab = f"fleet={fleet.settings.fleet.name}"
        got = await wait_for(metrics, timeout=30, interval=0.2, what="committed_total 4 in /metrics")
        for name, value in (
            ("commitfleet_committed_total", 4),
            ("commitfleet_aborted_total", 1),
            ("commitfleet_quarantined_total", 0),
            ("commitfleet_workers", 2),
            ("commitfleet_open_jobs", 2),
            ("commitfleet_pending_datasets", 1),
            ("commitfleet_quarantined_datasets", 0),
            ("commitfleet_commit_duration_seconds_count", 4),
            ("commitfleet_admin_sse_clients", 0),
        ):
            assert got.get((name, lab)) == value, (name, got)
        assert got[("commitfleet_admin_events_total", f"{lab},type=committed")] == 4, got
        # Step latencies: one histogram per commit phase, each commit counted once.
        for phase in ("publish", "apply", "manifest", "cleanup"):
            assert got[("commitfleet_commit_phase_seconds_count", f"{lab},phase={phase}")] == 4, (phase, got)

        # /events: server-sent events, replayed from the start and filtered.
        async with http.get(f"{base}/events", params={"from": "0", "type": "committed"}) as resp:
            assert resp.status == 200
            assert resp.content_type == "text/event-stream"
            sse = await read_sse(resp, 2)
        assert [e["event"] for e in sse] == ["committed", "committed"]
        for e in sse:
            data = json.loads(e["data"])
            assert data["type"] == "committed" and data["job"] == "j-good"
            assert re.fullmatch(r"\d+-\d+", e["id"])
        # Resuming after the last id seen (Last-Event-ID) goes on from there.
        async with http.get(
            f"{base}/events", params={"type": "committed"}, headers={"Last-Event-ID": sse[-1]["id"]}
        ) as resp:
            more = await read_sse(resp, 2)
        datasets = [json.loads(e["data"])["dataset"] for e in (*sse, *more)]
        assert sorted(datasets) == ["alpha", "beta", "gamma", "zeta"]


async def read_sse(resp: aiohttp.ClientResponse, n: int, timeout: float = 15) -> list[dict[str, str]]:
    """Read ``n`` server-sent events (``id``, ``event``, ``data`` fields) from ``resp``."""
    events: list[dict[str, str]] = []
    current: dict[str, str] = {}
    async with asyncio.timeout(timeout):
        while len(events) < n:
            raw = await resp.content.readline()
            if not raw:
                raise AssertionError(f"event stream ended after {events}")
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in current:  # a block without data (``retry:``) is no event
                    events.append(current)
                current = {}
                continue
            if line.startswith(":"):
                continue  # a comment: the server's keep-alive
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
    return events


# -- quarantine, then retry and skip from the CLI ------------------------------------------------


async def test_retry_and_skip_quarantined_datasets(fleet: Fleet) -> None:
    cfg = fleet.config
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all shards")

    # Two datasets whose staged file is shorter than its task reported: both quarantine.
    fix_evs, fix_key, fix_bytes = await corrupted_job(fleet.store, "j-fix", "qa")
    skip_evs, _skip_key, _ = await corrupted_job(fleet.store, "j-skip", "qb")
    await fleet.publisher.publish_many([*fix_evs, *skip_evs])

    def quarantined(evs: list[Any]) -> set[tuple[str, str]]:
        return {(e.dataset, e.job) for e in evs if isinstance(e, Quarantined)}

    await wait_admin(
        fleet, lambda evs: quarantined(evs) == {("qa", "j-fix"), ("qb", "j-skip")}, "2 quarantined events"
    )
    # A later job of qb waits behind the quarantined sequence.
    await fleet.publisher.publish_many(await good_job(fleet.store, "j-after", ["qb"], tasks=2))

    async def blocked() -> bool:
        doc = await status_doc(fleet)
        return any(
            (p["dataset"], p["job"], p["status"]) == ("qb", "j-after", "blocked") for p in doc["pending"]
        )

    await wait_for(blocked, what="qb/j-after blocked")

    res = await cli("status", "--config", cfg, "--json")
    assert res.rc == 0, res.err
    doc = parse_status_json(res.out)
    assert [(q["dataset"], q["job"]) for q in doc["quarantined"]] == [("qa", "j-fix"), ("qb", "j-skip")]
    assert all("publish" in q["reason"] and "reported" in q["reason"] for q in doc["quarantined"]), doc
    assert ("qb", "j-after", "blocked") in [(p["dataset"], p["job"], p["status"]) for p in doc["pending"]]
    res = await cli("status", "--config", cfg)
    assert res.rc == 0, res.err
    assert re.search(row("qa", "j-fix", "publish"), res.out), res.out
    assert re.search(row("qb", "j-skip", "publish"), res.out), res.out
    assert "no quarantined datasets" not in res.out

    # The audit reports the quarantined sequences.
    res = await cli("audit", fleet.settings.store.url, "--json")
    assert res.rc == 1, res.err
    kinds = {(v["kind"], v["key"]) for v in json.loads(res.out)["violations"]}
    assert {
        ("quarantined_sequence", wal_key("qa", "j-fix")),
        ("quarantined_sequence", wal_key("qb", "j-skip")),
    } <= kinds

    # An operator request for something that is not there: one line, exit 2, nothing sent.
    res = await cli("retry", "qa", "j-nope", "--config", cfg)
    assert res.rc == 2, (res.out, res.err)
    assert res.err.count("\n") == 1 and "no unfinished commit sequence" in res.err, res.err
    res = await cli("skip", "../etc", "j-fix", "--config", cfg)
    assert res.rc == 2, (res.out, res.err)
    assert res.err.count("\n") == 1, res.err

    # retry before the cause is fixed: quarantined again, and the command says so.
    res = await cli("retry", "qa", "j-fix", "--config", cfg)
    assert res.rc == 1, (res.rc, res.out, res.err)
    assert res.err.count("\n") == 1 and "quarantined again" in res.err, res.err
    assert await read_manifest(fleet.store, "qa", "j-fix") is None

    # retry after fixing the cause: the dataset commits, exactly once.
    await fleet.store.write(fix_key, fix_bytes)
    res = await cli("retry", "qa", "j-fix", "--config", cfg)
    assert res.rc == 0, (res.out, res.err)
    assert "retry of qa / j-fix done by w1" in res.out
    manifest = await read_manifest(fleet.store, "qa", "j-fix")
    assert manifest is not None
    assert len(manifest.files) == 2
    assert await no_staging_left(fleet.store, "j-fix")
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert [(e.dataset, e.job) for e in evs if isinstance(e, Committed) and e.dataset == "qa"] == [
        ("qa", "j-fix")
    ]
    assert [(e.dataset, e.action) for e in evs if isinstance(e, OperatorAction)] == [("qa", "retry")] * 2

    # skip: rolled back, and the job that waited behind it commits.
    res = await cli("skip", "qb", "j-skip", "--config", cfg)
    assert res.rc == 0, (res.out, res.err)
    assert "skip of qb / j-skip done by w1" in res.out
    assert await read_manifest(fleet.store, "qb", "j-skip") is None
    assert await no_staging_left(fleet.store, "j-skip")
    assert [u.job for u in await list_unfinished(fleet.store, "qb") if u.job == "j-skip"] == []
    published = [i.key async for i in fleet.store.list("qb/") if "/_commits/" not in i.key]
    assert not any("j-skip" in k for k in published), published
    await wait_for(lambda: committed(fleet.store, ["qb"], "j-after"), timeout=30, what="qb/j-after commits")
    assert await fleet.store.head(manifest_key("qb", "j-after"))

    async def settled_status() -> dict[str, Any] | None:
        res = await cli("status", "--config", cfg, "--json")
        assert res.rc == 0, res.err
        doc = parse_status_json(res.out)
        return doc if not doc["pending"] and not doc["open_jobs"] else None

    doc = await wait_for(settled_status, timeout=30, interval=0.2, what="nothing pending")
    assert doc["quarantined"] == []
    res = await cli("audit", fleet.settings.store.url)
    assert res.rc == 0, (res.out, res.err)
    assert "no violations" in res.out
    assert (await clean_audit(fleet.store)).ok
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert [(e.dataset, e.action) for e in evs if isinstance(e, OperatorAction)] == [
        ("qa", "retry"),
        ("qa", "retry"),
        ("qb", "skip"),
    ]
    assert sorted((e.dataset, e.job) for e in evs if isinstance(e, Committed)) == [
        ("qa", "j-fix"),
        ("qb", "j-after"),
    ]

    # With no worker to act, an operator request gives up after --timeout, with one line.
    stuck_evs, _key, _ = await corrupted_job(fleet.store, "j-stuck", "qc")
    await fleet.publisher.publish_many(stuck_evs)
    await wait_admin(fleet, lambda evs: ("qc", "j-stuck") in quarantined(evs), "qc quarantined")
    assert fleet.names["w1"].terminate(timeout=30) == 0
    started = time.monotonic()
    res = await cli("retry", "qc", "j-stuck", "--config", cfg, "--timeout", "1.5")
    assert res.rc == 1, (res.out, res.err)
    assert res.err.count("\n") == 1, res.err
    assert "no worker acted on the retry request within 1.5s" in res.err, res.err
    assert time.monotonic() - started < 15


# -- commands that need no fleet ------------------------------------------------------------------


@pytest.mark.parametrize("admin", [False, True], ids=["queue", "admin"])
async def test_schema_prints_json_schema(admin: bool) -> None:
    res = await cli("schema", *(["--admin"] if admin else []))
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    jsonschema.Draft202012Validator.check_schema(doc)
    text = json.dumps(doc)
    for tag in ("worker_joined", "committed", "quarantined") if admin else ("job_started", "task_finished"):
        assert tag in text, tag


BAD_SETTINGS = [
    ("status", {"COMMITFLEET_LOCK_VALIDITY": "abc"}, None, "lock"),
    ("status", {"COMMITFLEET_FOO_BAR": "1"}, None, "COMMITFLEET_FOO_BAR"),
    ("status", {}, "this is [not toml", "not valid TOML"),
    ("status", {}, '[fleet]\nshards = "many"\n', "shards"),
    ("status", {"COMMITFLEET_CONFIG": "/nonexistent/commitfleet.toml"}, None, "not found"),
    ("events", {"COMMITFLEET_LOCK_VALIDITY": "abc"}, None, "lock"),
    ("retry", {}, "this is [not toml", "not valid TOML"),
    ("worker", {"COMMITFLEET_FOO_BAR": "1"}, None, "COMMITFLEET_FOO_BAR"),
    ("worker", {"COMMITFLEET_WORKER_LEASE": "nan"}, None, "worker.lease must be a finite number"),
]


@pytest.mark.parametrize(
    ("command", "env", "config_text", "needle"),
    BAD_SETTINGS,
    ids=[
        "bad-value",
        "unknown-var",
        "not-toml",
        "bad-type-in-file",
        "missing-file",
        "events",
        "retry",
        "worker",
        "worker-nan",
    ],
)
async def test_bad_setting_stops_with_one_line(
    tmp_path: Path, command: str, env: dict[str, str], config_text: str | None, needle: str
) -> None:
    args: list[str | Path] = [command]
    if command == "retry":
        args += ["ds", "job1"]
    if config_text is not None:
        path = tmp_path / "bad.toml"
        path.write_text(config_text)
        args += ["--config", path]
    # Nothing listens here: a command that got past its settings would fail otherwise.
    res = await cli(*args, env=cli_env(REDIS_URL="redis://127.0.0.1:9/0", **env), timeout=30)
    assert res.rc == 2, (res.rc, res.out, res.err)
    assert res.out == ""
    lines = res.err.splitlines()
    assert len(lines) == 1, res.err
    assert lines[0].startswith("commitfleet: config error:"), lines
    assert needle in lines[0], lines


async def test_error_line_is_not_wrapped_without_a_terminal(tmp_path: Path) -> None:
    env = cli_env(COMMITFLEET_CONFIG=str(tmp_path / ("a-rather-long-folder-name" * 3) / "commitfleet.toml"))
    del env["COLUMNS"]  # as under systemd, cron or a CI log: no terminal, no COLUMNS
    res = await cli("status", env=env, timeout=30)
    assert res.rc == 2, (res.rc, res.out, res.err)
    assert len(res.err.splitlines()) == 1, res.err


async def test_operator_request_that_cannot_apply_is_refused_once(fleet: Fleet) -> None:
    """A retry for a sequence that does not exist is refused, reported and dropped (not retried forever)."""
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all")
    from shared.queue import shard_of

    shard = shard_of("ghost", fleet.settings.fleet.shards)
    key = fleet.keys.shard_state(shard, "operator")
    # What the CLI would send, for a sequence that is not there (the CLI itself refuses earlier).
    await fleet.redis.hset(key, "ghost/no-such-job", "retry")

    async def refused() -> list[OperatorAction]:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        return [e for e in evs if isinstance(e, OperatorAction) and e.dataset == "ghost"]

    (ev,) = await wait_for(refused, timeout=30, what="refused operator_action")
    assert (ev.action, ev.outcome, ev.job) == ("retry", "refused", "no-such-job")
    assert ev.detail
    await wait_for(lambda: _gone(fleet, key), timeout=30, what="request dropped")
    assert len(await refused()) == 1


async def _gone(fleet: Fleet, key: str) -> bool:
    return not await fleet.redis.hlen(key)


async def test_worker_refuses_a_fleet_with_another_shard_count(fleet: Fleet) -> None:
    """N is fixed when a fleet is created: a worker configured with another N stops at start."""
    env = cli_env(COMMITFLEET_FLEET_SHARDS=str(fleet.settings.fleet.shards * 2))
    res = await cli("worker", "--config", fleet.config, "--id", "wrong-n", env=env, timeout=60)
    assert res.rc == 2, (res.rc, res.out, res.err)
    (line,) = res.err.strip().splitlines()
    assert f"was created with {fleet.settings.fleet.shards} shards" in line, line
    live, _dead = await fleet.registry.members()
    assert "wrong-n" not in live


def config_without_shards(fleet: Fleet, path: Path) -> Path:
    """Write the fleet's config with no ``fleet.shards``: every process must take the fleet's own count."""
    text, n = re.subn(r"(?m)^shards = \d+\n", "", fleet.config.read_text())
    assert n == 1
    path.write_text(text)
    return path


async def test_every_command_takes_the_shard_count_from_the_fleet(fleet: Fleet, tmp_path: Path) -> None:
    """The fleet's record in Redis says N (8 here, not the 64 a new fleet gets); nobody needs to repeat it."""
    cfg = config_without_shards(fleet, tmp_path / "no-shards.toml")
    n = fleet.settings.fleet.shards
    assert n != 64
    c1 = FleetProcess("coordinator", "c1", cfg, fleet.log_dir)
    w1 = FleetProcess("worker", "w1", cfg, fleet.log_dir)
    fleet.procs += [c1, w1]
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all 8 shards")
    await fleet.publisher.publish_many(await good_job(fleet.store, "j1", ["alpha", "beta"], tasks=1))
    await wait_for(lambda: committed(fleet.store, ["alpha", "beta"], "j1"), what="j1 commits")

    res = await cli("status", "--config", cfg, "--json")
    assert res.rc == 0, res.err
    doc = parse_status_json(res.out)
    assert doc["shards"] == n
    assert len(doc["shard_table"]) == n
    assert sorted(s for w in doc["workers"] for s in w["shards"]) == list(range(n))
    res = await cli("status", "--config", cfg)
    assert res.rc == 0, res.err
    assert f"shards {n} " in res.out, res.out

    # Only an explicit setting that disagrees is an error, and it says which count is whose.
    res = await cli("status", "--config", cfg, env=cli_env(COMMITFLEET_FLEET_SHARDS="64"))
    assert res.rc == 2, (res.rc, res.out, res.err)
    (line,) = res.err.splitlines()
    assert line.startswith("commitfleet: config error:"), line
    assert f"was created with {n} shards; this process is configured with 64" in line, line
    res = await cli("status", "--config", cfg, env=cli_env(COMMITFLEET_FLEET_SHARDS=str(n)))
    assert res.rc == 0, res.err

    # A fleet that does not exist is named, not created.
    res = await cli("status", "--config", cfg, env=cli_env(COMMITFLEET_FLEET_NAME="nosuchfleet"))
    assert res.rc == 2, (res.rc, res.out, res.err)
    (line,) = res.err.splitlines()
    assert "fleet nosuchfleet does not exist in Redis" in line, line
    assert not await fleet.redis.exists(Keys("nosuchfleet").meta)
    assert c1.terminate(timeout=60) == 0
    assert w1.terminate(timeout=60) == 0


async def test_status_shows_a_job_record_it_cannot_read(fleet: Fleet) -> None:
    """A job record that does not decode (hand-edited, another version) is listed; status does not fail."""
    key = fleet.keys.shard_state(3, "jobs")
    await fleet.redis.hset(key, "j-bad", b'{"v":99,"job":')
    res = await cli("status", "--config", fleet.config, "--json")
    assert res.rc == 0, res.err
    (u,) = parse_status_json(res.out)["unreadable"]
    assert (u["shard"], u["key"], u["field"]) == (3, key, "j-bad")
    res = await cli("status", "--config", fleet.config)
    assert res.rc == 0, res.err
    assert f"unreadable job record: shard 3 {key} field j-bad" in res.out, res.out
