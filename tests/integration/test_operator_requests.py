"""The one writer of operator requests (CLI and console) and the reader the shard's owner uses."""

from __future__ import annotations

import pytest
import redis.asyncio

from shared import BadInput, NotFound, Settings, load_settings
from shared.events import SignatureCheck, verify_operator_request
from shared.queue import (
    Keys,
    quarantine_reason,
    queue_operator_request,
    read_operator_requests,
    shard_of,
)

SHARDS = 4
SECRET = "s" * 32


def _settings(fleet_name: str, *, secret: str = "") -> Settings:
    return load_settings(
        env={},
        overrides={"fleet": {"name": fleet_name, "shards": SHARDS}, "security": {"hmac_secret": secret}},
    )


async def test_a_request_is_queued_only_for_a_quarantined_sequence(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    s = _settings(fleet_name)
    shard = shard_of("sales", SHARDS)
    assert await quarantine_reason(redis_client, keys, shard, "sales", "j1") is None
    with pytest.raises(NotFound, match="sales / j1 is not quarantined"):
        await queue_operator_request(redis_client, keys, s, "sales", "j1", "retry")
    assert await read_operator_requests(redis_client, keys, shard) == []

    # What the owner records when a sequence is quarantined.
    await redis_client.hset(keys.shard_state(shard, "quarantined"), "sales/j1", "publish failed")
    assert await quarantine_reason(redis_client, keys, shard, "sales", "j1") == "publish failed"
    got = await queue_operator_request(redis_client, keys, s, "sales", "j1", "retry")
    assert got == shard
    (req,) = await read_operator_requests(redis_client, keys, shard)
    assert (req.dataset, req.job, req.op) == ("sales", "j1", "retry")
    # The field the worker reads and drops.
    assert await redis_client.hgetall(keys.shard_state(shard, "operator")) == {b"sales/j1": b"retry"}


async def test_bad_names_and_operations_are_refused_before_anything_is_read(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    s = _settings(fleet_name)
    for dataset, job, op in (
        ("../etc", "j1", "retry"),
        ("sales", "bad job", "skip"),
        ("sales", "j1", "drop"),
    ):
        with pytest.raises(BadInput):
            await queue_operator_request(redis_client, keys, s, dataset, job, op)


async def test_a_request_is_signed_when_the_fleet_signs(
    redis_client: redis.asyncio.Redis, fleet_name: str
) -> None:
    keys = Keys(fleet_name)
    s = _settings(fleet_name, secret=SECRET)
    shard = shard_of("orders", SHARDS)
    await redis_client.hset(keys.shard_state(shard, "quarantined"), "orders/j2", "quarantined")
    await queue_operator_request(redis_client, keys, s, "orders", "j2", "skip")
    (req,) = await read_operator_requests(redis_client, keys, shard)
    assert req.op != "skip"  # signed
    check = SignatureCheck(SECRET.encode(), fleet=fleet_name)
    assert verify_operator_request(req.op, check, dataset="orders", job="j2") == "skip"
