"""The fleet's status, read from Redis (and the store's ``_wal/``): one JSON-able document.

Used by the admin API (``GET /status``), the CLI (``commitfleet status``) and
the Prometheus metrics.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import redis.asyncio
import redis.exceptions as rx

from shared import Settings
from shared.commit import list_unfinished
from shared.fleet import FleetRegistry
from shared.queue import DEFAULT_GROUP, Keys, as_text, redis_errors
from shared.storage import ObjectStore
from workers import JobMeta

_meta_dec = msgspec.json.Decoder(JobMeta)


async def _shard_rows(r: redis.asyncio.Redis, keys: Keys, shards: int) -> list[dict[str, Any]]:
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.xlen(keys.events(s))
            pipe.xinfo_groups(keys.events(s))
            pipe.xlen(keys.dead(s))
            pipe.hgetall(keys.shard_state(s, "jobs"))
        replies = await pipe.execute(raise_on_error=False)
    rows: list[dict[str, Any]] = []
    for s in range(shards):
        length, groups, dead, jobs = replies[4 * s : 4 * s + 4]
        pending = lag = 0
        if not isinstance(groups, rx.ResponseError):
            for g in groups:
                if as_text(g["name"]) == DEFAULT_GROUP:
                    pending = int(g["pending"])
                    lag = int(g.get("lag") or 0)
        rows.append(
            {
                "shard": s,
                "length": int(length) if not isinstance(length, rx.ResponseError) else 0,
                "pending": pending,
                "lag": lag,
                "dead_letters": int(dead) if not isinstance(dead, rx.ResponseError) else 0,
                "_jobs": jobs if isinstance(jobs, dict) else {},
            }
        )
    return rows


async def fleet_status(
    r: redis.asyncio.Redis, keys: Keys, settings: Settings, store: ObjectStore | None = None
) -> dict[str, Any]:
    """Return the fleet's status document.

    Keys: ``fleet``, ``shards``, ``leader``, ``assignment_epoch``, ``workers``
    (live, with their shards), ``expired_workers``, ``shard_table`` (owner,
    moving_to, stream length, pending, lag, dead letters), ``open_jobs``,
    ``pending`` (datasets waiting for tasks or being committed/aborted),
    ``quarantined`` (from Redis state and, when ``store`` is given, from the
    store's ``_wal/``), ``counters`` and ``at``.

    Raises:
        TransientError: Redis (or the store) unavailable.
    """
    shards = settings.fleet.shards
    registry = FleetRegistry(r, keys)
    with redis_errors("status"):
        live, dead = await registry.members()
        assignment = await registry.assignment(shards)
        leader = await registry.leader()
        rows = await _shard_rows(r, keys, shards)
        counters_raw = await r.hgetall(keys.fleet_key("metrics"))
    owners = assignment.owners()
    workers = [
        {
            "id": w,
            "host": info.host,
            "pid": info.pid,
            "started_at": info.started_at,
            "heartbeat_at": info.heartbeat_at,
            "shards": owners.get(w, []),
        }
        for w, info in sorted(live.items())
    ]
    open_jobs: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    quarantined: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        slot = assignment.slots[row["shard"]]
        row["owner"] = slot.owner
        row["moving_to"] = slot.moving_to
        for raw in row.pop("_jobs").values():
            meta = _meta_dec.decode(raw)
            open_jobs.append(
                {
                    "job": meta.job,
                    "shard": row["shard"],
                    "opened_at": meta.opened_at,
                    "deadline": meta.deadline,
                    "datasets": {n: d.status for n, d in meta.datasets.items()},
                }
            )
            for name, ds in meta.datasets.items():
                if ds.status in ("waiting", "committing", "aborting", "blocked"):
                    pending.append(
                        {"dataset": name, "job": meta.job, "status": ds.status, "reason": ds.reason}
                    )
                elif ds.status == "quarantined":
                    quarantined[(name, meta.job)] = {"dataset": name, "job": meta.job, "reason": ds.reason}
    if store is not None:
        for u in await list_unfinished(store):
            if u.quarantined is not None:
                quarantined.setdefault(
                    (u.dataset, u.job), {"dataset": u.dataset, "job": u.job, "reason": u.quarantined}
                )
    counters = {as_text(k): as_text(v) for k, v in counters_raw.items()}
    return {
        "fleet": settings.fleet.name,
        "shards": shards,
        "leader": leader,
        "assignment_epoch": assignment.epoch,
        "workers": workers,
        "expired_workers": sorted(dead),
        "shard_table": rows,
        "open_jobs": open_jobs,
        "pending": pending,
        "quarantined": sorted(quarantined.values(), key=lambda q: (q["dataset"], q["job"])),
        "counters": {k: (float(v) if "." in v else int(v)) for k, v in counters.items()},
        "at": time.time(),
    }
