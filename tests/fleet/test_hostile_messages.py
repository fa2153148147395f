"""Hostile, malformed and replayed messages: dead letters with reasons, no crash,
nothing written outside the store's allowed places."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.events import (
    JobStarted,
    MessageRejected,
    StagedFile,
    TaskFinished,
    sign,
    sign_v2,
)
from shared.queue import read_dead_letters, shard_of
from tests._support.fleet_checks import admin_events, committed, no_staging_left
from tests._support.fleet_jobs import good_job
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for

SECRET = "s3cret-for-tests"


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {"security": {"hmac_secret": SECRET, "max_message_bytes": 65536}}


def _task(dataset: str, **changes: Any) -> dict[str, Any]:
    ev = TaskFinished(
        job="evil",
        dataset=dataset,
        task=0,
        attempt=0,
        files=[StagedFile(path="part-0.bin", size=10)],
        finished_at=time.time(),
    )
    doc: dict[str, Any] = msgspec.to_builtins(ev)
    doc.update(changes)
    return doc


async def _equals(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_hostile_messages_are_dead_lettered(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all")
    shards = fleet.settings.fleet.shards
    ds = "victim"
    shard = shard_of(ds, shards)
    other = next(f"x{i}" for i in range(1000) if shard_of(f"x{i}", shards) != shard)
    secret = SECRET.encode()

    def signed(doc: dict[str, Any] | bytes) -> dict[bytes, bytes]:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return {b"data": data, b"sig": sign(data, secret)}

    def signed_v2(
        doc: dict[str, Any], *, ts_ms: int | None = None, fleet: str | None = None, stream: str | None = None
    ) -> dict[bytes, bytes]:
        data = json.dumps(doc).encode()
        sig = sign_v2(
            data,
            secret,
            fleet=fleet or fleet_name,
            stream=stream or fleet_keys.events(shard),
            ts_ms=ts_ms,
        )
        return {b"data": data, b"sig": sig}

    fleet_name, fleet_keys = fleet.settings.fleet.name, fleet.keys
    escape = tmp_path / "escape.txt"
    hostile: list[tuple[str, dict[bytes, bytes]]] = [
        ("bad_json", signed(b"{not json")),
        ("schema", signed(_task(ds, task="zero"))),
        ("unsupported_version", signed(_task(ds, v=99))),
        ("unknown_type", signed({**_task(ds), "type": "drop_table"})),
        ("unsafe_path", signed(_task(ds, files=[{"path": "../../../escape.txt", "size": 1}]))),
        ("unsafe_path", signed(_task(ds, files=[{"path": str(escape), "size": 1}]))),
        ("bad_dataset", signed(_task("_wal"))),
        ("bad_job", signed(_task(ds, job="../../x"))),
        ("oversized", signed(_task(ds, files=[{"path": f"p{i}.bin", "size": 1} for i in range(4000)]))),
        ("bad_signature", {b"data": json.dumps(_task(ds)).encode(), b"sig": sign(b"other", secret)}),
        ("unsigned", {b"data": json.dumps(_task(ds)).encode()}),
        ("schema", {b"payload": b"no data field"}),
        ("inconsistent", signed(_task(other))),
        # v2: a capture replayed an hour after it was signed, and valid entries of another fleet and shard.
        ("stale", signed_v2(_task(ds), ts_ms=int(time.time() * 1000) - 3_600_000)),
        ("bad_signature", signed_v2(_task(ds), fleet="another-fleet")),
        ("bad_signature", signed_v2(_task(ds), stream=fleet.keys.events((shard + 1) % shards))),
    ]
    for _reason, fields in hostile:
        await fleet.redis.xadd(fleet.keys.events(shard), fields)  # type: ignore[arg-type]

    async def all_dead() -> bool:
        return len(await read_dead_letters(fleet.redis, fleet.keys, shard)) >= len(hostile)

    await wait_for(all_dead, timeout=60, what="every hostile message dead-lettered")
    dead = await read_dead_letters(fleet.redis, fleet.keys, shard)
    assert sorted(d.reason for d in dead) == sorted(r for r, _ in hostile)
    assert all(d.detail for d in dead)

    # Replayed job-level events of a job that ended are dead letters too.
    await fleet.publisher.publish_many(await good_job(fleet.store, "real", [ds], tasks=2))
    await wait_for(lambda: committed(fleet.store, [ds], "real"), timeout=60, what="a real job still commits")
    await wait_for(lambda: no_staging_left(fleet.store, "real"), timeout=60, what="cleanup")

    # The store shows the commit before the worker has recorded the job as ended
    # (it announces first): a start replayed in between is a duplicate, not a replay.
    async def job_ended() -> bool:
        return bool(await fleet.redis.hexists(fleet.keys.shard_state(shard, "ended"), "real"))

    await wait_for(job_ended, timeout=60, what="the job recorded as ended")
    await fleet.publisher.publish(JobStarted(job="real", datasets=[ds], timeout_s=60, started_at=time.time()))

    async def replay_dead() -> bool:
        return (
            sum(d.reason == "replayed" for d in await read_dead_letters(fleet.redis, fleet.keys, shard)) == 1
        )

    await wait_for(replay_dead, timeout=60, what="replayed start dead-lettered")

    async def rejected_events() -> int:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        return sum(isinstance(e, MessageRejected) for e in evs)

    # The admin event follows the dead letter: wait for it, then check there is no extra one.
    await wait_for(
        lambda: _equals(rejected_events(), len(hostile) + 1), timeout=30, what="message_rejected events"
    )
    assert fleet.names["w1"].proc.poll() is None, "the worker crashed"
    # Nothing outside the store root, nothing in the store outside its areas.
    assert not escape.exists()
    assert not (tmp_path.parent / "escape.txt").exists()
    tops = {info.key.split("/", 1)[0] async for info in fleet.store.list("")}
    assert tops <= {ds, "_state", "_locks", "_staging", "_wal"}, tops
