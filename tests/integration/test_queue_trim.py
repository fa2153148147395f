"""Trimming the shard streams against a real redis-server: acknowledged entries go, nothing else does."""

from __future__ import annotations

import asyncio
import secrets

import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.queue import Keys, ShardConsumer, cap_dead_letters, id_key, trim_acknowledged
from shared.queue._entry import Entry

GROUPS = ("workers", "audit")
CONSUMERS = ("w1", "w2")

# One step: ("add", n) | ("read", group, consumer, n) | ("ack", group, i) | ("claim", group, i, consumer)
step = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 4)),
    st.tuples(st.just("read"), st.sampled_from(GROUPS), st.sampled_from(CONSUMERS), st.integers(1, 3)),
    st.tuples(st.just("ack"), st.sampled_from(GROUPS), st.integers(0, 20)),
    st.tuples(st.just("claim"), st.sampled_from(GROUPS), st.integers(0, 20), st.sampled_from(CONSUMERS)),
)


async def _play(url: str, groups: int, steps: list[tuple[object, ...]]) -> None:
    r = redis.asyncio.Redis.from_url(url)
    stream = "trim-" + secrets.token_hex(6)
    try:
        ids: list[bytes] = []
        delivered: dict[str, set[bytes]] = {g: set() for g in GROUPS[:groups]}
        pending: dict[str, dict[bytes, str]] = {g: {} for g in GROUPS[:groups]}
        await r.xadd(stream, {"v": "0"})
        ids.append((await r.xrange(stream))[0][0])
        for g in delivered:
            await r.xgroup_create(stream, g, id="0")
        for s in steps:
            kind = s[0]
            if kind == "add":
                for _ in range(int(s[1])):  # type: ignore[call-overload]
                    ids.append(await r.xadd(stream, {"v": "x"}))
            elif s[1] not in delivered:
                continue
            elif kind == "read":
                g, c, n = str(s[1]), str(s[2]), int(s[3])  # type: ignore[call-overload]
                reply = await r.xreadgroup(g, c, {stream: ">"}, count=n)
                for _name, entries in reply:
                    for eid, _fields in entries:
                        delivered[g].add(eid)
                        pending[g][eid] = c
            elif kind == "ack":
                g = str(s[1])
                if pending[g]:
                    eid = sorted(pending[g], key=id_key)[int(s[2]) % len(pending[g])]  # type: ignore[call-overload]
                    await r.xack(stream, g, eid)
                    del pending[g][eid]
            elif kind == "claim":
                g, c = str(s[1]), str(s[3])
                if pending[g]:
                    eid = sorted(pending[g], key=id_key)[int(s[2]) % len(pending[g])]  # type: ignore[call-overload]
                    await r.xclaim(stream, g, c, 0, [eid])
                    pending[g][eid] = c
        # Expected: every id below the lowest id that some group still needs.
        needed = [eid for g in delivered for eid in ids if eid not in delivered[g] or eid in pending[g]]
        floor = min(needed, key=id_key) if needed else None
        expected_gone = [eid for eid in ids if floor is None or id_key(eid) < id_key(floor)]
        if not delivered:
            expected_gone = []
        out = await trim_acknowledged(r, stream)
        left = {eid for eid, _ in await r.xrange(stream)}
        assert out.removed == len(expected_gone)
        assert left == set(ids) - set(expected_gone)
        # The class of the bug: never an entry still pending to anyone, or not yet delivered to some group.
        for g in delivered:
            assert set(pending[g]) <= left
            assert {eid for eid in ids if eid not in delivered[g]} <= left
        # Pending entries stay readable by their consumer (a new owner can still claim them).
        for g in delivered:
            for c in CONSUMERS:
                mine = [eid for eid, who in pending[g].items() if who == c]
                reply = await r.xreadgroup(g, c, {stream: "0"}, count=1000)
                got = [eid for _n, entries in reply for eid, fields in entries if fields]
                assert sorted(got, key=id_key) == sorted(mine, key=id_key)
        again = await trim_acknowledged(r, stream)
        assert again.removed == 0
    finally:
        await r.delete(stream)
        await r.aclose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.integers(0, 2), steps=st.lists(step, max_size=40))
def test_trim_removes_exactly_the_prefix_every_group_acknowledged(
    redis_url: str, groups: int, steps: list[tuple[object, ...]]
) -> None:
    asyncio.run(_play(redis_url, groups, steps))


async def test_trim_of_a_missing_stream_is_a_no_op(redis_client: redis.asyncio.Redis) -> None:
    out = await trim_acknowledged(redis_client, "no-such-stream")
    assert out.removed == 0 and out.floor is None


async def test_shard_consumer_flow_trims_acknowledged_entries(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    old = ShardConsumer(redis_client, keys, 0, consumer="old-owner")
    new = ShardConsumer(redis_client, keys, 0, consumer="new-owner")
    await old.ensure_group()
    for i in range(10):
        await redis_client.xadd(keys.events(0), {"data": str(i)})
    taken = await old.read(4, 10)  # a previous owner stopped with 4 entries pending
    mine = await new.read(6, 10)
    await new.ack([e.id for e in mine])
    out = await trim_acknowledged(redis_client, keys.events(0))
    assert out.removed == 0  # the oldest entries are still pending to the previous owner
    claimed = await new.claim_from(["old-owner"])
    assert [e.id for e in claimed] == [e.id for e in taken]
    await new.ack([e.id for e in claimed[:2]])
    out = await trim_acknowledged(redis_client, keys.events(0))
    assert out.removed == 2
    await new.ack([e.id for e in claimed[2:]])
    out = await trim_acknowledged(redis_client, keys.events(0))
    assert out.removed == 8 and await redis_client.xlen(keys.events(0)) == 0
    # New entries after a full trim are still delivered (the group's position is kept).
    await redis_client.xadd(keys.events(0), {"data": "late"})
    late: list[Entry] = await new.read(10, 10)
    assert [e.fields[b"data"] for e in late] == [b"late"]


async def test_dead_letters_are_capped_by_count_and_age(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    dead = keys.dead(3)
    day_ms = 86_400_000
    now_ms = 100 * day_ms
    for day in range(80, 100):  # one dead letter a day, days 80..99
        await redis_client.xadd(dead, {"reason": "bad_json"}, id=f"{day * day_ms}-0")
    removed = await cap_dead_letters(redis_client, keys, 3, maxlen=1000, max_age_s=10 * 86400, now_ms=now_ms)
    assert removed == 10
    left = [eid for eid, _ in await redis_client.xrange(dead)]
    assert left[0] == f"{90 * day_ms}-0".encode() and len(left) == 10
    removed = await cap_dead_letters(redis_client, keys, 3, maxlen=4, max_age_s=10 * 86400, now_ms=now_ms)
    assert removed == 6
    left = [eid for eid, _ in await redis_client.xrange(dead)]
    assert left == [f"{d * day_ms}-0".encode() for d in range(96, 100)]
    assert await cap_dead_letters(redis_client, keys, 3, maxlen=4, max_age_s=10 * 86400, now_ms=now_ms) == 0
    # A shard that never had a dead letter: nothing to do, no error.
    assert await cap_dead_letters(redis_client, keys, 2, maxlen=4, max_age_s=1, now_ms=now_ms) == 0
