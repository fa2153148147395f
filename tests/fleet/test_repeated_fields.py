"""An entry that repeats a field name (``XADD s * data A data B``), whichever way the worker reads it,
is dead-lettered ``schema`` naming the field, with every field as sent, and acknowledged; the shard goes on.

The scenario (tests/_support/repeated_fields.py) repeats ``data`` (two events, or the same bytes
twice), ``sig`` (the right signature twice) and a field nobody reads, in entries the worker gets from
its first read of its own pending entries, from a dead consumer it takes over, from a save's
read-ahead under a backlog and from plain reads.
"""

from __future__ import annotations

from pathlib import Path

import redis.asyncio

from tests._support.fleet import fleet_settings, inprocess_fleet
from tests._support.repeated_fields import check_repeated, seed_repeated

SHARD = 5


async def test_repeated_field_names_are_dead_lettered_on_every_read_path(
    redis_url: str, redis_client: redis.asyncio.Redis, fleet_name: str, tmp_path: Path
) -> None:
    settings = fleet_settings(
        redis_url,
        tmp_path / "store",
        fleet_name,
        security={"hmac_secret": "repeat-secret"},
        worker={"read_batch": 3},  # the backlog is read ahead by the saves
    )
    seeded = await seed_repeated(redis_client, settings, shard=SHARD, worker="w1")
    async with inprocess_fleet(redis_client, settings) as fleet:
        await check_repeated(fleet, seeded)
