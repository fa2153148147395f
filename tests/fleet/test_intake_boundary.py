"""The intake boundary through a real worker and redis-server: entries that once crashed a
shard or vanished in silence now end in the dead-letter stream with a reason, and the shard goes on."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import redis.asyncio

from shared import TransientError
from shared.events import (
    DatasetExpectation,
    JobFinished,
    JobStarted,
    MessageRejected,
    encode_event,
    sign,
)
from shared.queue import DEFAULT_GROUP, ShardConsumer
from tests._support.fleet import InProcessFleet, fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job, stage_task
from tests._support.routing import dataset_on
from tests._support.wait import wait_for

SECRET = "intake-secret"


async def _reasons(fleet: InProcessFleet, shard: int) -> list[str]:
    return [d.reason for d in await fleet.dead(shard)]


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
async def test_invalid_utf8_entry_is_dead_lettered_and_the_shard_goes_on(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path, signed: bool
) -> None:
    extra = {"security": {"hmac_secret": SECRET}} if signed else {}
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name, **extra)
    ) as fleet:
        shards = fleet.settings.fleet.shards
        ds = dataset_on(2, shards)
        # The entry of the issue: invalid UTF-8 inside a JSON string (signed correctly when signing is on).
        bad = (
            b'{"type":"task_finished","v":1,"job":"j","dataset":"d\xe9","task":0,"attempt":0,'
            b'"files":[],"finished_at":1717229100.25}'
        )
        fields = {b"data": bad}
        if signed:
            fields[b"sig"] = sign(bad, SECRET.encode())
        bad_id = await fleet.redis.xadd(fleet.keys.events(2), fields)  # type: ignore[arg-type]
        await fleet.publisher.publish_many(await good_job(fleet.store, "after-bad", [ds], tasks=2))
        await wait_for(
            lambda: committed(fleet.store, [ds], "after-bad"), timeout=60, what="the next job commits"
        )
        (dl,) = await fleet.dead(2)
        assert (dl.reason, dl.stream_id, dl.fields[b"data"]) == ("bad_json", bad_id, bad)
        assert "UTF-8" in dl.detail
        assert fleet.worker_alive() and 2 in fleet.worker.running_shards
        pending = await fleet.redis.xpending(fleet.keys.events(2), DEFAULT_GROUP)
        assert pending["pending"] == 0

        async def rejected_event() -> bool:
            evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
            return any(isinstance(e, MessageRejected) and e.reason == "bad_json" for e in evs)

        await wait_for(rejected_event, timeout=30, what="message_rejected event")


async def test_formerly_silent_drops_get_dead_letters(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    """A second job_finished with other winners, one naming another shard's dataset, and
    pending entries deleted with XDEL (re-read by their consumer, or claimed from another)."""
    shards = 8
    shard = 3
    keys_events = f"cf:{fleet_name}:{{s{shard}}}:events"
    # Before the worker starts: an entry pending to "w1" (the worker's own name) is deleted, so
    # the worker's first read of its own pending entries finds it without content.
    await redis_client.xgroup_create(keys_events, DEFAULT_GROUP, id="0", mkstream=True)
    own_id = await redis_client.xadd(keys_events, {b"data": b"{}"})
    await redis_client.xreadgroup(DEFAULT_GROUP, "w1", {keys_events: ">"}, count=1)
    await redis_client.xdel(keys_events, own_id)
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name)
    ) as fleet:
        ds = dataset_on(shard, shards)
        other = dataset_on((shard + 1) % shards, shards, "other")
        stream = fleet.keys.events(shard)
        await wait_for(lambda: _has(fleet, shard, "deleted", 1), timeout=60, what="own deleted entry")

        # A ghost consumer (a previous owner) read two entries; one is deleted before the
        # worker claims them: the claim dead-letters it, the other is processed.
        ghost_ids = [
            await fleet.redis.xadd(stream, {b"data": b"{}"}),
            await fleet.redis.xadd(stream, {b"data": b"[]"}),
        ]
        await fleet.redis.xreadgroup(DEFAULT_GROUP, "ghost", {stream: ">"}, count=2)
        # (the worker may have read them first; then they are simply rejected as schema)
        await fleet.redis.xdel(stream, ghost_ids[0])

        # job_finished with winners [0, 0], then one with other winners, then the same again.
        job = "twice"
        await fleet.publisher.publish(
            JobStarted(job=job, datasets=[ds], timeout_s=600, started_at=time.time())
        )
        await fleet.publisher.publish(await stage_task(fleet.store, job, ds, 0, 0))
        await fleet.publisher.publish(await stage_task(fleet.store, job, ds, 0, 1))
        first = JobFinished(
            job=job, datasets={ds: DatasetExpectation(tasks=2, winners=[0, 0])}, finished_at=time.time()
        )
        other_winners = msgspec.structs.replace(
            first, datasets={ds: DatasetExpectation(tasks=2, winners=[1, 0])}
        )
        await fleet.publisher.publish(first)
        await fleet.publisher.publish(other_winners)
        await fleet.publisher.publish(first)  # a repeated delivery: no effect, no dead letter
        # A job_finished naming a dataset of another shard, sent (wrongly) to this shard only.
        foreign = JobFinished(
            job="mixed",
            datasets={ds: DatasetExpectation(tasks=1), other: DatasetExpectation(tasks=1)},
            finished_at=time.time(),
        )
        await fleet.redis.xadd(stream, {b"data": encode_event(foreign)})
        await fleet.publisher.publish(await stage_task(fleet.store, job, ds, 1, 0))
        await wait_for(
            lambda: committed(fleet.store, [ds], job), timeout=60, what="the first job_finished stands"
        )
        await wait_for(lambda: _has(fleet, shard, "inconsistent", 2), timeout=30, what="inconsistent x2")

        dead = await fleet.dead(shard)
        inconsistent = sorted((d.detail for d in dead if d.reason == "inconsistent"), key=len)
        assert any("first stands" in d and "winners=[1, 0]" in d for d in inconsistent), inconsistent
        assert any("other shards" in d and other in d for d in inconsistent), inconsistent
        deleted = [d for d in dead if d.reason == "deleted"]
        assert {d.stream_id for d in deleted} >= {own_id}
        # The ghost's deleted entry: dead-lettered by the claim, or (if the worker read it
        # before the ghost did) it was processed then as a normal entry.
        ghost_deleted = [d for d in deleted if d.stream_id == ghost_ids[0]]
        ghost_seen = any(d.stream_id == ghost_ids[0] for d in dead)
        assert len(ghost_deleted) <= 1 and ghost_seen
        # The first job_finished's winners were committed: attempt 0 of task 0.
        manifest_files = [p async for p in _published(fleet, ds)]
        assert any(f"{job}~00000-" in p for p in manifest_files)
        assert fleet.worker_alive()
        pending = await fleet.redis.xpending(stream, DEFAULT_GROUP)
        assert pending["pending"] == 0


async def test_entry_deleted_while_pending_to_a_dead_consumer_is_dead_lettered_by_the_claim(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    from shared.queue import Keys, read_dead_letters

    keys = Keys(fleet_name)
    ghost = ShardConsumer(redis_client, keys, 1, consumer="ghost")
    heir = ShardConsumer(redis_client, keys, 1, consumer="heir")
    await ghost.ensure_group()
    ids = [await redis_client.xadd(keys.events(1), {b"data": f"{i}".encode()}) for i in range(3)]
    assert len(await ghost.read(10, 10)) == 3
    await redis_client.xdel(keys.events(1), ids[1])
    claimed = await heir.claim_from(["ghost"])
    assert [e.id for e in claimed] == [ids[0], ids[2]]
    (dl,) = await read_dead_letters(redis_client, keys, 1)
    assert (dl.reason, dl.stream_id, dl.consumer, dl.shard) == ("deleted", ids[1], "heir", 1)
    assert (await heir.lag()).pending == 2
    assert await heir.claim_from(["ghost"]) == []  # retried: nothing more, no second dead letter
    assert len(await read_dead_letters(redis_client, keys, 1)) == 1


async def _has(fleet: InProcessFleet, shard: int, reason: str, n: int) -> bool:
    return (await _reasons(fleet, shard)).count(reason) >= n


async def _published(fleet: InProcessFleet, ds: str):  # type: ignore[no-untyped-def]
    async for info in fleet.store.list(f"{ds}/"):
        if "/_commits/" not in info.key:
            yield info.key


async def test_unexpected_error_on_one_entry_dead_letters_it_as_internal(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug met while judging one entry costs that entry (reason internal), not the shard; a
    session-level error (TransientError) is not mistaken for a bad entry: the session restarts
    and the entry is processed."""
    import workers._intake as intake

    real = intake.decide
    transient_left = [1]

    def flaky_decide(state, ev, *, now, default_timeout):  # type: ignore[no-untyped-def]
        if ev.job == "poison":
            raise RuntimeError("boom")
        if ev.job == "hiccup" and transient_left[0]:
            transient_left[0] -= 1
            raise TransientError("redis went away (injected)")
        return real(state, ev, now=now, default_timeout=default_timeout)

    monkeypatch.setattr(intake, "decide", flaky_decide)
    async with inprocess_fleet(
        redis_client, fleet_settings(redis_url, tmp_path / "store", fleet_name)
    ) as fleet:
        shards = fleet.settings.fleet.shards
        ds = dataset_on(5, shards)
        poison_ids = await fleet.publisher.publish(
            JobStarted(job="poison", datasets=[ds], timeout_s=600, started_at=time.time())
        )
        await fleet.publisher.publish(
            JobStarted(job="hiccup", datasets=[ds], timeout_s=600, started_at=time.time())
        )
        await fleet.publisher.publish_many(await good_job(fleet.store, "after-poison", [ds], tasks=2))
        await wait_for(
            lambda: committed(fleet.store, [ds], "after-poison"), timeout=60, what="next job commits"
        )
        (dl,) = await fleet.dead(5)
        assert (dl.reason, dl.stream_id) == ("internal", poison_ids[0])
        assert dl.detail == "RuntimeError: boom"
        assert transient_left == [0]  # the injected TransientError happened, and cost no dead letter
        assert fleet.worker_alive() and 5 in fleet.worker.running_shards
        pending = await fleet.redis.xpending(fleet.keys.events(5), DEFAULT_GROUP)
        assert pending["pending"] == 0
