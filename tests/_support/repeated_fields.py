"""Entries that repeat a field name, sent raw down every way the intake reads a shard's stream.

:func:`seed_repeated` runs before the fleet starts: it puts entries that
repeat ``data``, ``sig`` or a field nobody reads on one shard's stream, some
already pending to the worker's own consumer (its first read of its pending
entries gets them), some pending to a dead consumer (the worker claims
them), and a backlog among valid entries (read by a save's read-ahead when
``worker.read_batch`` is small). :func:`check_repeated` then sends more one
at a time to the running shard (its plain reads), and checks that every one
is dead-lettered ``schema`` naming its field, with every field as sent, is
acknowledged and announced, that no valid entry was rejected, and that the
shard goes on: a job published after them commits.

Used by tests/fleet/test_repeated_fields.py (one Redis) and
tests/cluster/test_cluster_smoke.py (Redis Cluster: there a save reads ahead
through redis-py's pipeline instead of a raw connection).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis.asyncio

from shared import Settings
from shared.events import (
    JobFailed,
    MessageRejected,
    RepeatedFields,
    entry_fields,
)
from shared.queue import DEFAULT_GROUP, Keys, ensure_fleet, id_key
from tests._support.fleet import InProcessFleet
from tests._support.fleet_checks import admin_events, committed
from tests._support.fleet_jobs import good_job
from tests._support.routing import dataset_on
from tests._support.wait import wait_for

Pairs = list[tuple[bytes, bytes]]


@dataclass
class Seeded:
    """What :func:`seed_repeated` sent: per stream id, the fields as sent and the name that repeats."""

    shard: int
    dataset: str
    repeated: dict[bytes, tuple[Pairs, bytes]] = field(default_factory=dict)
    valid: list[bytes] = field(default_factory=list)
    last_id: bytes = b"0-0"


def _valid(settings: Settings, stream: str, job: str, dataset: str) -> Pairs:
    """A valid entry (signed when the fleet has a secret): a job_failed for a job nobody started."""
    ev = JobFailed(job=job, datasets=[dataset], reason="seeded", failed_at=time.time())
    secret = settings.security.hmac_secret.reveal_bytes() or None
    fields = entry_fields(ev, secret=secret, fleet=settings.fleet.name, stream=stream)
    return [(name.encode(), value) for name, value in fields.items()]


def _repeating(settings: Settings, stream: str, job: str, dataset: str, which: str) -> tuple[Pairs, bytes]:
    """An entry whose fields are all valid but one name occurs twice; and that name."""
    good = _valid(settings, stream, job, dataset)
    other = _valid(settings, stream, job + "-other", dataset)
    data, sig = good[0], good[1:]  # sig only when signing is on
    if which == "data":  # two events in one entry: which one is it?
        return [data, *sig, other[0]], b"data"
    if which == "same_data":  # the same bytes twice: still two fields named data
        return [data, data, *sig], b"data"
    if which == "sig":  # the right signature twice (or, unsigned, an ignored field twice)
        twice = sig * 2 if sig else [(b"sig", b"x"), (b"sig", b"x")]
        return [data, *twice], b"sig"
    return [data, *sig, (b"trace", b"a"), (b"trace", b"b")], b"trace"  # a field nobody reads


KINDS = ("data", "same_data", "sig", "unknown")


async def _xadd(r: redis.asyncio.Redis, stream: str, pairs: Pairs) -> bytes:
    entry_id = await r.execute_command("XADD", stream, "*", *(x for pair in pairs for x in pair))
    assert isinstance(entry_id, bytes)
    return entry_id


async def seed_repeated(r: redis.asyncio.Redis, settings: Settings, *, shard: int, worker: str) -> Seeded:
    """Create the fleet and put repeating entries on ``shard``'s stream before the fleet runs (module doc)."""
    await ensure_fleet(r, settings.fleet.name, settings.fleet.shards)
    keys = Keys(settings.fleet.name)
    stream = keys.events(shard)
    await r.xgroup_create(stream, DEFAULT_GROUP, id="0", mkstream=True)
    seeded = Seeded(shard, dataset_on(shard, settings.fleet.shards))
    n = 0

    async def add(which: str | None) -> bytes:
        nonlocal n
        n += 1
        if which is None:
            entry_id = await _xadd(r, stream, _valid(settings, stream, f"ok{n}", seeded.dataset))
            seeded.valid.append(entry_id)
        else:
            pairs, name = _repeating(settings, stream, f"rep{n}", seeded.dataset, which)
            entry_id = await _xadd(r, stream, pairs)
            seeded.repeated[entry_id] = (pairs, name)
        seeded.last_id = entry_id
        return entry_id

    for consumer in (worker, "ghost"):  # pending to the worker itself, and to a dead consumer
        for which in KINDS:
            await add(which)
        read = await r.xreadgroup(DEFAULT_GROUP, consumer, {stream: ">"})
        assert len(read[0][1]) == len(KINDS)
    for which in (None, None, None, *KINDS, None, None):  # the backlog: the first batch is valid
        await add(which)
    return seeded


async def check_repeated(fleet: InProcessFleet, seeded: Seeded) -> None:
    """Send more repeating entries to the running shard, then check everything (module doc)."""
    r, keys, shard = fleet.redis, fleet.keys, seeded.shard
    stream = keys.events(shard)

    async def dead_at_least(count: int) -> bool:
        return len(await fleet.dead(shard)) >= count

    await wait_for(lambda: dead_at_least(len(seeded.repeated)), timeout=60, what="the seeded entries")
    for i, which in enumerate(KINDS):  # one at a time: each is one plain read
        pairs, name = _repeating(fleet.settings, stream, f"live{i}", seeded.dataset, which)
        entry_id = await _xadd(r, stream, pairs)
        seeded.repeated[entry_id] = (pairs, name)
        seeded.last_id = entry_id
        await wait_for(lambda: dead_at_least(len(seeded.repeated)), timeout=60, what=f"live {which}")

    # The shard goes on: a job published after them commits.
    await fleet.publisher.publish_many(
        await good_job(fleet.store, "after-repeats", [seeded.dataset], tasks=2)
    )
    await wait_for(
        lambda: committed(fleet.store, [seeded.dataset], "after-repeats"), timeout=60, what="the next job"
    )

    dead = {d.stream_id: d for d in await fleet.dead(shard)}
    assert set(dead) == set(seeded.repeated), "only the repeating entries are dead letters, each once"
    for entry_id, (pairs, name) in seeded.repeated.items():
        d = dead[entry_id]
        assert d.reason == "schema", (d.reason, d.detail)
        assert f"repeats the field {name.decode()!r} (2 times)" in d.detail, d.detail
        assert not d.truncated
        assert isinstance(d.fields, RepeatedFields), d.fields  # kept as sent: nothing lost
        assert sorted(d.fields.pairs) == sorted(pairs)

    # Every entry acknowledged: nothing pending, to anybody, and the group read past the last one.
    (group,) = [g for g in await r.xinfo_groups(stream) if g["name"] == DEFAULT_GROUP.encode()]
    assert int(group["pending"]) == 0, group
    assert id_key(group["last-delivered-id"]) > id_key(seeded.last_id)
    assert fleet.worker_alive() and shard in fleet.worker.running_shards

    async def all_announced() -> bool:
        evs = await admin_events(r, fleet.settings.fleet.name)
        rejected = [e for e in evs if isinstance(e, MessageRejected) and e.shard == shard]
        return len(rejected) == len(seeded.repeated) and all(e.reason == "schema" for e in rejected)

    await wait_for(all_announced, timeout=30, what="one message_rejected per repeating entry")
