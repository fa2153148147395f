"""Fleet membership against the coordinator's read-then-forget: a worker back in time stays a member.

The coordinator reads the members and their leases, then forgets those whose
lease had expired. A Redis failover can outlast a worker's lease: the worker
re-registers while the coordinator is between those two steps. Forgetting it
anyway left a live worker outside the member set for good (its renewals kept
succeeding), so no shard was ever assigned to it again (seen as a stalled
fleet after a cluster failover).
"""

from __future__ import annotations

import redis.asyncio

from shared.fleet import FleetRegistry, worker_info
from shared.queue import Keys


async def test_forget_keeps_a_worker_that_re_registered_after_members_was_read(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    registry = FleetRegistry(redis_client, Keys(fleet_name))
    await registry.register(worker_info("w1", 0.0), lease=30)
    await registry.register(worker_info("w2", 0.0), lease=30)
    # Both leases expire (the worker was cut off from Redis longer than its lease).
    await redis_client.delete(registry._lease_key("w1"), registry._lease_key("w2"))
    live, dead = await registry.members()
    assert (live, dead) == ({}, {"w1", "w2"})
    # w1 comes back before the coordinator acts on what it read.
    await registry.register(worker_info("w1", 0.0), lease=30)
    assert await registry.forget(dead) == {"w2"}
    live, dead = await registry.members()
    assert set(live) == {"w1"}
    assert dead == set()


async def test_renew_puts_a_live_worker_back_in_the_member_set(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    registry = FleetRegistry(redis_client, Keys(fleet_name))
    await registry.register(worker_info("w1", 0.0), lease=30)
    await redis_client.srem(registry.keys.workers, "w1")  # taken out by whatever means
    assert await registry.renew(worker_info("w1", 0.0), lease=30)
    live, _dead = await registry.members()
    assert set(live) == {"w1"}
    # An expired lease is not renewed, and membership is not restored behind the caller's back.
    await registry.deregister("w1")
    assert not await registry.renew(worker_info("w1", 0.0), lease=30)
    assert await registry.members() == ({}, set())


async def test_one_departure_is_removed_once_by_the_worker_or_by_the_coordinator(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    """A crashing worker whose lease the coordinator already forgot must not announce its departure again.

    Seen under load: ``worker_left`` twice for one crash (``lease_expired`` from the coordinator, then
    ``crashed`` from the worker). Whoever's ``SREM`` removes the member announces it; the other learns
    it from the result.
    """
    registry = FleetRegistry(redis_client, Keys(fleet_name))
    await registry.register(worker_info("w1", 0.0), lease=30)
    await redis_client.delete(registry._lease_key("w1"))  # the lease ran out
    assert await registry.forget({"w1"}) == {"w1"}  # the coordinator forgot it (and announced it)
    assert await registry.deregister("w1") is False  # the worker's own leave: not a member any more
    await registry.register(worker_info("w2", 0.0), lease=30)
    assert await registry.deregister("w2") is True
    assert await registry.forget({"w2"}) == set()
