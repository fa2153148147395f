"""Operator requests (``retry`` / ``skip`` of a quarantined sequence): the one writer and the one reader.

A request is a field ``<dataset>/<job>`` of the owning shard's ``operator``
hash (``Keys.shard_state(shard, "operator")``); its value is the operation,
signed when the fleet signs v2 (docs/contract.md section 5). The CLI
(``commitfleet retry`` / ``skip``) and the console write it with
:func:`queue_operator_request`; the shard's owner reads the hash with
:func:`read_operator_requests`, verifies each value, acts under the dataset's
lock, announces ``operator_action`` and drops the field.

The precondition of a request, for every writer, is :func:`quarantine_reason`:
the sequence is quarantined in the fleet's Redis state (the shard's
``quarantined`` record, which its owner keeps from the WAL it walks at its
session start and updates as quarantines start and end). It is the record
``commitfleet status`` and the admin API show, it needs no store, and it is
what an owner acts on.
"""

from __future__ import annotations

from typing import NamedTuple

import redis.asyncio

from .._errors import BadInput, NotFound
from ..events import check_dataset_segment, check_job, operator_request_value
from ..settings import Settings
from ._connect import redis_errors
from ._entry import as_text
from ._keys import Keys
from ._routing import shard_of

_OPERATIONS = ("retry", "skip")


class OperatorRequest(NamedTuple):
    """One request read from a shard's ``operator`` hash."""

    dataset: str
    job: str
    # As stored: the bare operation, or its signed form (the owner verifies it).
    op: str


def check_request_names(dataset: str, job: str) -> None:
    """Check a request's dataset and job names. Returns None.

    Raises:
        BadInput: not a dataset name segment or not a job id.
    """
    try:
        check_dataset_segment(dataset)
        check_job(job)
    except ValueError as exc:  # InvalidMessage is already a BadInput, not a ValueError
        raise BadInput(str(exc)) from None


def _field(dataset: str, job: str) -> str:
    return f"{dataset}/{job}"


async def quarantine_reason(
    redis_client: redis.asyncio.Redis, keys: Keys, shard: int, dataset: str, job: str
) -> str | None:
    """Return why ``dataset`` / ``job`` is quarantined per the fleet's Redis state, or None when it is not.

    ``shard`` is the dataset's shard. One HGET of the shard's ``quarantined`` record.

    Raises:
        TransientError: Redis is unreachable.
    """
    with redis_errors("read quarantined"):
        reason = await redis_client.hget(keys.shard_state(shard, "quarantined"), _field(dataset, job))
    return None if reason is None else as_text(reason)


async def queue_operator_request(
    redis_client: redis.asyncio.Redis, keys: Keys, settings: Settings, dataset: str, job: str, op: str
) -> int:
    """Queue ``op`` (``retry`` or ``skip``) of a quarantined sequence for the dataset's owner.

    ``settings.fleet.shards`` must be the fleet's count (see
    :func:`shared.queue.existing_fleet`). The value is signed when
    ``settings.security.sign_version`` is 2. The owner acts on its next tick
    and reports on the admin stream (``operator_action``, and ``quarantined``
    again when a retry fails).

    Returns:
        The dataset's shard.

    Raises:
        BadInput: bad dataset or job name, or an operation other than retry or skip.
        NotFound: the sequence is not quarantined (:func:`quarantine_reason`); nothing is written.
        TransientError: Redis is unreachable.
    """
    check_request_names(dataset, job)
    if op not in _OPERATIONS:
        raise BadInput(f"unknown operator request {op!r} (retry or skip)")
    shards = settings.fleet.shards
    if shards < 1:
        raise ValueError("an operator request needs the fleet's shard count (settings.fleet.shards)")
    shard = shard_of(dataset, shards)
    if await quarantine_reason(redis_client, keys, shard, dataset, job) is None:
        raise NotFound(f"{dataset} / {job} is not quarantined")
    s = settings
    secret = s.security.hmac_secret.reveal_bytes() if s.security.sign_version == 2 else None
    value = operator_request_value(op, secret, fleet=s.fleet.name, dataset=dataset, job=job)
    with redis_errors("HSET operator request"):
        await redis_client.hset(keys.shard_state(shard, "operator"), _field(dataset, job), value)
    return shard


async def read_operator_requests(
    redis_client: redis.asyncio.Redis, keys: Keys, shard: int
) -> list[OperatorRequest]:
    """Return the requests queued in ``shard``'s ``operator`` hash (values as stored, unverified).

    Raises:
        TransientError: Redis is unreachable.
    """
    with redis_errors("read operator requests"):
        raw = await redis_client.hgetall(keys.shard_state(shard, "operator"))
    out: list[OperatorRequest] = []
    for field, op in raw.items():
        dataset, _, job = as_text(field).partition("/")
        out.append(OperatorRequest(dataset=dataset, job=job, op=as_text(op)))
    return out


async def drop_operator_request(
    redis_client: redis.asyncio.Redis, keys: Keys, shard: int, dataset: str, job: str
) -> None:
    """Remove ``dataset`` / ``job``'s request from ``shard``'s ``operator`` hash (done or refused).

    Raises:
        TransientError: Redis is unreachable (the request stays, read again on the next tick).
    """
    with redis_errors("HDEL operator request"):
        await redis_client.hdel(keys.shard_state(shard, "operator"), _field(dataset, job))


__all__ = [
    "OperatorRequest",
    "drop_operator_request",
    "check_request_names",
    "quarantine_reason",
    "queue_operator_request",
    "read_operator_requests",
]
