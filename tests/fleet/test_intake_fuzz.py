"""Fuzz the intake boundary through a real worker and a real redis-server.

Thousands of entries (arbitrary bytes, valid messages mutated: flipped bytes,
invalid UTF-8 inside strings, deleted fields, swapped types, huge numbers,
escapes, duplicate keys, deep nesting, other field names, a field name
repeated; signed and unsigned) go onto one shard's stream, then a valid job.
Every entry must end accepted or dead-lettered with a reason (nothing left
pending), every entry the contract rejects by itself must be dead-lettered
with the reason the decoder gives (``schema`` naming the field for a repeated
name, the dead letter keeping every field as sent), no entry may need the
``internal`` safety net, the worker stays alive, and the valid job commits
after the batch.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from shared.events import InvalidMessage, MessageRejected, RepeatedFields, ValidationLimits, decode_entry
from shared.queue import DEFAULT_GROUP, id_key
from shared.queue._dead_letters import MAX_COPIED_FIELDS
from tests._support.fleet import InProcessFleet, fleet_settings, inprocess_fleet
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.intake_mutations import hostile_entry, repeated_names
from tests._support.routing import dataset_on, datasets_on
from tests._support.wait import wait_for

SHARD = 6
SECRET = "fuzz-secret"


async def _drained(fleet: InProcessFleet, last_id: bytes) -> bool:
    """Return True when the group has delivered up to ``last_id`` and nothing is pending."""
    (group,) = [
        g
        for g in await fleet.redis.xinfo_groups(fleet.keys.events(SHARD))
        if g["name"] == DEFAULT_GROUP.encode()
    ]
    return int(group["pending"]) == 0 and id_key(group["last-delivered-id"]) >= id_key(last_id)


async def _fuzz(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    root: Path,
    *,
    n: int,
    seed: int,
    signed: bool,
) -> None:
    extra: dict[str, Any] = {"security": {"hmac_secret": SECRET}} if signed else {}
    # Every dead letter is looked up at the end: the shard's trim timer must not cap them first
    # (it did on a slow machine, where the run outlasted queue.trim_interval: with more dead
    # letters than queue.dead_letter_maxlen, the oldest were gone and counted as "accepted").
    extra["queue"] = {"dead_letter_maxlen": 2 * n}
    async with inprocess_fleet(redis_client, fleet_settings(redis_url, root, fleet_name, **extra)) as fleet:
        shards = fleet.settings.fleet.shards
        datasets = datasets_on(SHARD, shards, 3, prefix="fz")
        final_ds = dataset_on(SHARD, shards, "final")
        foreign = dataset_on((SHARD + 1) % shards, shards, "fz")
        rng = random.Random(seed)
        secret = SECRET.encode() if signed else None
        entries = [hostile_entry(rng, datasets, foreign, secret)[1] for _ in range(n)]
        stream = fleet.keys.events(SHARD)
        started = time.monotonic()
        async with fleet.redis.pipeline(transaction=False) as pipe:
            for pairs in entries:  # XADD as sent: a field name may repeat
                pipe.execute_command("XADD", stream, "*", *(x for pair in pairs for x in pair))
            ids: list[bytes] = await pipe.execute()
        await fleet.publisher.publish_many(await good_job(fleet.store, "after-fuzz", [final_ds], tasks=2))
        await wait_for(
            lambda: committed(fleet.store, [final_ds], "after-fuzz"), timeout=120, what="valid job"
        )
        await wait_for(lambda: _drained(fleet, ids[-1]), timeout=60, what="every entry handled")
        elapsed = time.monotonic() - started

        dead = await fleet.dead(SHARD)
        by_id = {d.stream_id: d for d in dead}
        sent = set(ids)
        assert len(by_id) == len(dead), "an entry was dead-lettered twice"
        assert set(by_id) <= sent | set(await _final_ids(fleet)), "a dead letter for an entry never sent"
        accepted = sent - set(by_id)
        assert await fleet.redis.xlen(fleet.keys.dead(SHARD)) + len(accepted) == len(sent)
        assert not [d for d in dead if d.reason == "internal"], [
            d.detail for d in dead if d.reason == "internal"
        ]
        assert all(d.detail for d in dead)
        # Every entry the contract rejects on its own is dead-lettered with the decoder's reason.
        limits = ValidationLimits.from_settings(fleet.settings.security)
        repeats = 0
        for entry_id, pairs in zip(ids, entries, strict=True):
            expected = _rejected_as(pairs, limits)
            if expected is not None:
                got = by_id.get(entry_id)
                assert got is not None, f"{entry_id!r} ({expected}) was accepted"
                assert got.reason == expected, (got.reason, expected, got.detail)
            repeated = repeated_names(pairs)
            if repeated:  # named in the detail, every field kept as sent
                repeats += 1
                assert got is not None
                assert all(repr(n.decode("utf-8", "replace")) in got.detail for n in repeated), got.detail
                if len(pairs) <= MAX_COPIED_FIELDS:  # else cut at that many fields (``truncated``)
                    assert isinstance(got.fields, RepeatedFields), got.fields
                    assert sorted(got.fields.pairs) == sorted(pairs)
        assert repeats > n // 50, repeats  # the fuzzer repeated field names
        assert fleet.worker_alive() and SHARD in fleet.worker.running_shards

        async def every_rejection_announced() -> bool:
            evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
            return sum(isinstance(e, MessageRejected) and e.shard == SHARD for e in evs) == len(dead)

        await wait_for(every_rejection_announced, timeout=30, what="one message_rejected per dead letter")
        print(
            f"\nfuzz: {n} entries ({'signed' if signed else 'unsigned'}), {len(dead)} dead-lettered"
            f" ({repeats} repeating a field name), {len(accepted)} accepted, {elapsed:.1f}s"
        )


def _rejected_as(pairs: list[tuple[bytes, bytes]], limits: ValidationLimits) -> str | None:
    if repeated_names(pairs):
        return "schema"  # whatever the values: which one counts is ambiguous
    try:
        decode_entry(dict(pairs), limits=limits)
    except InvalidMessage as exc:
        return exc.reason
    return None


async def _final_ids(fleet: InProcessFleet) -> list[bytes]:
    return [entry_id for entry_id, _ in await fleet.redis.xrange(fleet.keys.events(SHARD))]


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
async def test_fuzzed_entries_end_accepted_or_dead_lettered(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path, signed: bool
) -> None:
    await _fuzz(redis_url, redis_client, fleet_name, tmp_path / "store", n=4000, seed=20261123, signed=signed)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
async def test_fuzzed_entries_stress(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    fleet_name: str,
    tmp_path: Path,
    signed: bool,
    seed: int,
) -> None:
    await _fuzz(redis_url, redis_client, fleet_name, tmp_path / "store", n=20_000, seed=seed, signed=signed)
