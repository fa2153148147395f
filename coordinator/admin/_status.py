"""The fleet's status, read from Redis (and the store's ``_wal/``): one JSON-able document.

Used by the admin API (``GET /status``), the CLI (``commitfleet status``) and
the Prometheus metrics.

``commitfleet status`` imports this module: it imports only what reading Redis
needs (not the commit core, the storage adapters or the HTTP server), so the
command answers in about the time Python, Typer and redis-py take to start
(tests/unit/test_cli_imports.py, tests/bench/status_latency.py).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
import redis.asyncio
import redis.exceptions as rx

from shared import Settings
from shared.fleet import FleetRegistry
from shared.queue import DEFAULT_GROUP, Keys, as_text, connect, existing_fleet, redis_errors, shard_of
from workers import READS, STATE_VERSION, DatasetState, JobMeta, read_in_flight

if TYPE_CHECKING:
    from shared.storage import ObjectStore

_meta_dec = msgspec.json.Decoder(JobMeta)
_dataset_dec = msgspec.json.Decoder(DatasetState)


def _datasets_of_jobs(
    fields: dict[Any, Any], shard: int, keys: Keys, unreadable: list[dict[str, Any]]
) -> dict[str, dict[str, DatasetState]]:
    """Return job -> its datasets' records from a shard's ``state:datasets`` hash (state v2);
    a record that does not decode, or of another version, is added to ``unreadable``."""
    out: dict[str, dict[str, DatasetState]] = {}
    for field, raw in fields.items():
        job, _, name = as_text(field).partition("/")
        try:
            ds = _dataset_dec.decode(raw)
            if ds.v != STATE_VERSION:
                raise msgspec.ValidationError(f"state record version {ds.v}, this reads {STATE_VERSION}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:
            key = keys.shard_state(shard, "datasets")
            unreadable.append({"shard": shard, "key": key, "field": as_text(field), "error": str(exc)})
            continue
        out.setdefault(job, {})[name] = ds
    return out


async def _shard_rows(r: redis.asyncio.Redis, keys: Keys, shards: int) -> list[dict[str, Any]]:
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.xlen(keys.events(s))
            pipe.xinfo_groups(keys.events(s))
            pipe.xlen(keys.dead(s))
            pipe.hgetall(keys.shard_state(s, "jobs"))
            pipe.hgetall(keys.shard_state(s, "aside"))
            pipe.hgetall(keys.shard_state(s, "quarantined"))
            pipe.xpending(keys.events(s), DEFAULT_GROUP)
            pipe.hgetall(keys.shard_state(s, "datasets"))
        replies = await pipe.execute(raise_on_error=False)
    rows: list[dict[str, Any]] = []
    now_ms = time.time() * 1000
    for s in range(shards):
        length, groups, dead, jobs, aside, quarantined, summary, datasets = replies[8 * s : 8 * s + 8]
        oldest = None
        if isinstance(summary, dict) and summary.get("min"):
            # A stream id starts with the milliseconds at which it was written.
            oldest = round(max(0.0, now_ms - int(as_text(summary["min"]).split("-")[0])) / 1000, 1)
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
                "oldest_pending_s": oldest,
                "_jobs": jobs if isinstance(jobs, dict) else {},
                # Open jobs' datasets, field "<job>/<dataset>" (state v2; v1 kept them in the job record).
                "_datasets": datasets if isinstance(datasets, dict) else {},
                "_quarantined": quarantined if isinstance(quarantined, dict) else {},
                # Set by the shard's owner while its state cannot be read (workers/_aside.py).
                "set_aside": {as_text(k): as_text(v) for k, v in aside.items()} if aside else None,
            }
        )
    return rows


async def fleet_status(
    r: redis.asyncio.Redis, keys: Keys, settings: Settings, store: ObjectStore | None = None
) -> dict[str, Any]:
    """Return the fleet's status document.

    Keys: ``fleet``, ``shards``, ``leader``, ``assignment_epoch``, ``workers``
    (live, with their shards), ``expired_workers``, ``shard_table`` (owner,
    moving_to, stream length, pending, lag, dead letters, ``set_aside``: why
    the shard is set aside, or None), ``open_jobs``,
    ``pending`` (datasets waiting for tasks or being committed/aborted),
    ``quarantined`` (from Redis state and, when ``store`` is given, from the
    store's ``_wal/``), ``in_flight`` (each owner's work under way: state
    queued / running / retrying, since, attempts, last error), ``unreadable``
    (job records of the shard state that do not decode: shard, key, field,
    error), ``counters`` and ``at``.

    ``settings.fleet.shards`` must be the fleet's count (see
    :func:`shared.queue.existing_fleet`).

    Raises:
        TransientError: Redis (or the store) unavailable.
    """
    shards = settings.fleet.shards
    if shards < 1:
        raise ValueError("fleet_status needs the fleet's shard count (settings.fleet.shards is not resolved)")
    registry = FleetRegistry(r, keys)
    with redis_errors("status"):
        live, dead = await registry.members()
        assignment = await registry.assignment(shards)
        leader = await registry.leader()
        rows = await _shard_rows(r, keys, shards)
        counters_raw = await r.hgetall(keys.fleet_key("metrics"))
        # committed / aborted are counted exactly, with their admin events (docs/queue.md).
        outcome_counts = await r.hgetall(keys.outcome_counts)
    in_flight = await read_in_flight(r, keys, shards)  # what each owner has under way, and its state
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
    unreadable: list[dict[str, Any]] = []
    # Work under way per (dataset, job), to tell a queued commit from a running one.
    flight_state = {(f.get("dataset"), f.get("job")): str(f.get("state")) for f in in_flight}
    for row in rows:
        slot = assignment.slots[row["shard"]]
        row["owner"] = slot.owner
        row["moving_to"] = slot.moving_to
        # Recorded by the shard's owner from the WAL it walked at its session start.
        for field, reason in row.pop("_quarantined").items():
            name, _, job = as_text(field).partition("/")
            quarantined[(name, job)] = {"dataset": name, "job": job, "reason": as_text(reason)}
        of_job = _datasets_of_jobs(row.pop("_datasets"), row["shard"], keys, unreadable)
        for field, raw in row.pop("_jobs").items():
            try:
                meta = _meta_dec.decode(raw)
                if meta.v not in READS:
                    raise msgspec.ValidationError(
                        f"state record version {meta.v}, this reads {STATE_VERSION}"
                    )
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:
                # A record this version cannot read (see docs/queue.md): shown, not fatal;
                # its shard is set aside and says so above.
                unreadable.append(
                    {
                        "shard": row["shard"],
                        "key": keys.shard_state(row["shard"], "jobs"),
                        "field": as_text(field),
                        "error": str(exc),
                    }
                )
                continue
            if meta.v == STATE_VERSION:  # v2: the job's datasets are records of their own
                meta = msgspec.structs.replace(meta, datasets=of_job.get(meta.job, {}))
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
                    state: str = ds.status
                    if ds.status in ("committing", "aborting"):
                        # running or retrying when its owner works on it, else queued for a slot
                        state = flight_state.get((name, meta.job), "queued")
                    pending.append(
                        {
                            "dataset": name,
                            "job": meta.job,
                            "shard": row["shard"],
                            "status": ds.status,
                            "state": state,
                            "reason": ds.reason,
                        }
                    )
                elif ds.status == "quarantined":
                    quarantined[(name, meta.job)] = {"dataset": name, "job": meta.job, "reason": ds.reason}
    if store is not None:
        from shared.commit import list_unfinished  # the commit core: only the admin API passes a store

        for u in await list_unfinished(store):
            if u.quarantined is not None:
                quarantined.setdefault(
                    (u.dataset, u.job), {"dataset": u.dataset, "job": u.job, "reason": u.quarantined}
                )
    # Per-shard counts in one pass over each list (not one per shard: 100,000 datasets x 64 shards).
    column = {"waiting": "waiting", "queued": "queued", "blocked": "queued"}
    column.update(running="running", retrying="running")
    counts = [dict.fromkeys(("open_jobs", "waiting", "queued", "running", "quarantined"), 0) for _ in rows]
    for j in open_jobs:
        counts[j["shard"]]["open_jobs"] += 1
    for p in pending:
        if p["state"] in column:
            counts[p["shard"]][column[p["state"]]] += 1
    for q in quarantined.values():
        counts[shard_of(q["dataset"], shards)]["quarantined"] += 1
    for row in rows:
        row.update(counts[row["shard"]])
    counters = {as_text(k): as_text(v) for k, v in counters_raw.items()}
    for k, v in outcome_counts.items():
        counters[as_text(k)] = str(int(counters.get(as_text(k), "0")) + int(v))
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
        "in_flight": in_flight,
        "unreadable": unreadable,
        "counters": {k: (float(v) if "." in v else int(v)) for k, v in counters.items()},
        "at": time.time(),
    }


async def get_status(s: Settings) -> dict[str, Any]:
    """Return the fleet's status document, from Redis only (the workers record quarantines there).

    Raises:
        ConfigError: no such fleet, or ``fleet.shards`` disagrees with the fleet's record.
        TransientError: Redis unavailable.
    """
    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        s = await existing_fleet(r, s)
        return await fleet_status(r, Keys(s.fleet.name), s)
    finally:
        await r.aclose()
