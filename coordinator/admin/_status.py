"""The fleet's status summary, read from Redis: one JSON-able document whose size and cost do not
grow with the open work (the open work itself is paged: ``_open_work.py``).

Used by the admin API (``GET /status``), the CLI (``commitfleet status``) and
the Prometheus metrics.

``commitfleet status`` imports this module: it imports only what reading Redis
needs (not the commit core, the storage adapters or the HTTP server), so the
command answers in about the time Python, Typer and redis-py take to start
(tests/unit/test_cli_imports.py, tests/bench/status_latency.py).
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec
import redis.asyncio
import redis.exceptions as rx

from shared import Settings
from shared.fleet import FleetRegistry
from shared.queue import DEFAULT_GROUP, Keys, as_text, connect, existing_fleet, redis_errors
from workers import COUNTS, READS, STATE_VERSION, STATUSES, JobMeta, read_in_flight

QUARANTINED_SHOWN: Final = 100
"""Quarantined sequences listed in the summary at most (``totals.quarantined`` counts them all)."""
UNREADABLE_SHOWN: Final = 20
"""Unreadable job records listed at most (``unreadable_count`` counts them all)."""
TEXT_SHOWN: Final = 300
"""Characters of a quarantine reason or a decoding error the summary keeps (the summary stays
well under 100 KB: 100 reasons of 300 characters, whatever the open work)."""

_meta_dec = msgspec.json.Decoder(JobMeta)


class OpenJobs:
    """The fleet's count of distinct open jobs, and its unreadable job records, recounted only where
    a shard's job records changed.

    A job has a record on every shard holding one of its datasets and nothing tells one shard of
    the others, so the count walks the job records' names (HSCAN of each shard's ``state:jobs``):
    Redis work and memory in proportion to the (job, shard) records; never the datasets. Each
    shard's ``gen`` (``state:counts``) moves whenever a job record comes or goes there: only the
    shards whose gen moved since the last walk are walked again, their first HSCANs pipelined in
    one round trip (while jobs end on a busy fleet a gen moves on some shard at nearly every
    summary; walking all 64 shards one HSCAN at a time cost 100-200 ms there).
    """

    def __init__(self) -> None:
        # shard -> (its gen at the walk, its open job names, its unreadable records, how many)
        self._shards: dict[int, tuple[object, frozenset[str], list[dict[str, Any]], int]] = {}
        self._value: tuple[int, list[dict[str, Any]], int] | None = None  # the last count, while no gen moved

    async def count(
        self, r: redis.asyncio.Redis, keys: Keys, shards: int, gens: tuple[object, ...]
    ) -> tuple[int, list[dict[str, Any]], int]:
        """Return (distinct open jobs, unreadable job records (at most :data:`UNREADABLE_SHOWN`), how
        many are unreadable), walking again the shards whose gen is not that of their last walk.
        A shard without a gen (no counts yet) is walked every time.

        Raises:
            TransientError: Redis unavailable.
        """
        for gone in [s for s in self._shards if s >= shards]:
            del self._shards[gone]
        stale = [
            s
            for s in range(shards)
            if gens[s] is None or s not in self._shards or self._shards[s][0] != gens[s]
        ]
        if not stale and self._value is not None:
            return self._value
        names_of: dict[int, set[str]] = {s: set() for s in stale}
        unreadable_of: dict[int, list[dict[str, Any]]] = {s: [] for s in stale}
        bad_of = dict.fromkeys(stale, 0)
        todo = {s: 0 for s in stale}  # shard -> its HSCAN cursor
        while todo:
            with redis_errors("HSCAN open jobs"):
                async with r.pipeline(transaction=False) as pipe:
                    for shard, cursor in todo.items():
                        pipe.hscan(keys.shard_state(shard, "jobs"), cursor, count=1000)
                    replies = await pipe.execute()
            going: dict[int, int] = {}
            for (shard, _), (cursor, fields) in zip(todo.items(), replies, strict=True):
                assert isinstance(fields, dict), "HSCAN without NOVALUES answers fields and values"
                bad_of[shard] += _read_jobs(shard, keys, fields, names_of[shard], unreadable_of[shard])
                if cursor != 0:
                    going[shard] = cursor
            todo = going
        for shard in stale:
            self._shards[shard] = (
                gens[shard],
                frozenset(names_of[shard]),
                unreadable_of[shard],
                bad_of[shard],
            )
        every: set[str] = set()
        shown: list[dict[str, Any]] = []
        bad_total = 0
        for shard in range(shards):
            _gen, names, unreadable, bad = self._shards[shard]
            every |= names
            shown += unreadable[: UNREADABLE_SHOWN - len(shown)]
            bad_total += bad
        self._value = (len(every), shown, bad_total)
        return self._value


def _read_jobs(
    shard: int, keys: Keys, fields: dict[Any, Any], names: set[str], unreadable: list[dict[str, Any]]
) -> int:
    """Add one HSCAN reply's job names to ``names`` and its undecodable records to ``unreadable`` (at
    most :data:`UNREADABLE_SHOWN`); return how many did not decode."""
    bad = 0
    for field, raw in fields.items():
        try:
            meta = _meta_dec.decode(raw)
            if meta.v not in READS:
                raise msgspec.ValidationError(f"state record version {meta.v}, this reads {STATE_VERSION}")
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:
            bad += 1
            if len(unreadable) < UNREADABLE_SHOWN:
                key = keys.shard_state(shard, "jobs")
                unreadable.append(
                    {"shard": shard, "key": key, "field": as_text(field), "error": str(exc)[:TEXT_SHOWN]}
                )
            continue
        names.add(meta.job)
    return bad


def _int(value: object) -> int:
    try:
        return int(as_text(value))  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeError):
        return 0


async def _shard_rows(r: redis.asyncio.Redis, keys: Keys, shards: int) -> list[dict[str, Any]]:
    """Return each shard's row: stream figures, its counts, set-aside marker and the first
    quarantined sequences of its record (``_quarantined``, at most QUARANTINED_SHOWN)."""
    async with r.pipeline(transaction=False) as pipe:
        for s in range(shards):
            pipe.xlen(keys.events(s))
            pipe.xinfo_groups(keys.events(s))
            pipe.xlen(keys.dead(s))
            pipe.hgetall(keys.shard_state(s, COUNTS))
            pipe.hgetall(keys.shard_state(s, "aside"))
            pipe.hlen(keys.shard_state(s, "quarantined"))
            pipe.hscan(keys.shard_state(s, "quarantined"), 0, count=QUARANTINED_SHOWN)
            pipe.xpending(keys.events(s), DEFAULT_GROUP)
        replies = await pipe.execute(raise_on_error=False)
    rows: list[dict[str, Any]] = []
    now_ms = time.time() * 1000
    for s in range(shards):
        length, groups, dead, counts, aside, q_len, q_scan, summary = replies[8 * s : 8 * s + 8]
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
        c = {as_text(k): _int(v) for k, v in counts.items()} if isinstance(counts, dict) else {}
        quarantined = q_scan[1] if isinstance(q_scan, (list, tuple)) and isinstance(q_scan[1], dict) else {}
        rows.append(
            {
                "shard": s,
                "length": int(length) if not isinstance(length, rx.ResponseError) else 0,
                "pending": pending,
                "lag": lag,
                "dead_letters": int(dead) if not isinstance(dead, rx.ResponseError) else 0,
                "oldest_pending_s": oldest,
                # Set by the shard's owner while its state cannot be read (workers/_aside.py).
                "set_aside": {as_text(k): as_text(v) for k, v in aside.items()} if aside else None,
                "_counts": c,
                "_quarantined_n": q_len if isinstance(q_len, int) else 0,
                "_quarantined": quarantined,
            }
        )
    return rows


async def fleet_summary(
    r: redis.asyncio.Redis, keys: Keys, settings: Settings, jobs: OpenJobs | None = None
) -> dict[str, Any]:
    """Return the fleet's status summary (``GET /status``): its size is bounded by the shards,
    the workers and the owners' slots, never by the open work (paged by :func:`open_work_page`).

    Keys: ``fleet``, ``shards``, ``leader``, ``assignment_epoch``, ``workers`` (live, with their
    shards), ``expired_workers``, ``shard_table`` (per shard: owner, moving_to, stream length,
    pending, lag, dead letters, oldest pending entry's age, ``set_aside`` (why, or None),
    ``open_jobs`` (job records on the shard), ``datasets`` (open dataset records), ``statuses``
    (dataset records per status), ``waiting``, ``queued``, ``running``, ``blocked``,
    ``quarantined``), ``totals`` (``open_jobs``: distinct jobs, ``datasets`` and the same columns
    summed), ``quarantined`` (the first :data:`QUARANTINED_SHOWN` quarantined sequences with their
    reason), ``in_flight`` (each owner's work under way), ``unreadable`` (job records that do not
    decode, at most :data:`UNREADABLE_SHOWN`) and ``unreadable_count``, ``counters`` and ``at``.

    The per-shard figures come from the shard's counts (``state:counts``, kept by its owner's
    saves); ``running`` from the in-flight boards, ``queued`` is the rest of the commits and aborts
    due. ``quarantined`` is the larger of the shard's quarantine record (from the WAL) and its
    datasets whose status is quarantined. ``jobs`` keeps the distinct job count between calls
    (:class:`OpenJobs`; a new one is used when None).

    ``settings.fleet.shards`` must be the fleet's count (see :func:`shared.queue.existing_fleet`).

    Raises:
        TransientError: Redis unavailable.
    """
    shards = settings.fleet.shards
    if shards < 1:
        raise ValueError(
            "fleet_summary needs the fleet's shard count (settings.fleet.shards is not resolved)"
        )
    registry = FleetRegistry(r, keys)
    with redis_errors("status"):
        live, dead = await registry.members()
        assignment = await registry.assignment(shards)
        leader = await registry.leader()
        rows = await _shard_rows(r, keys, shards)
        counters_raw = await r.hgetall(keys.fleet_key("metrics"))
        # committed / aborted are counted exactly, with their admin events (docs/queue.md).
        outcome_counts = await r.hgetall(keys.outcome_counts)
    in_flight = await read_in_flight(r, keys, shards)  # bounded by the owners' slots
    gens = tuple(row["_counts"].get("gen") for row in rows)
    distinct, unreadable, unreadable_count = await (jobs or OpenJobs()).count(r, keys, shards, gens)
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
    running = [0] * shards
    for f in in_flight:
        if f.get("state") in ("running", "retrying") and 0 <= int(f.get("shard", -1)) < shards:
            running[int(f["shard"])] += 1
    quarantined: list[dict[str, Any]] = []
    totals = dict.fromkeys(COLUMNS, 0)
    for row in rows:
        slot = assignment.slots[row["shard"]]
        row["owner"] = slot.owner
        row["moving_to"] = slot.moving_to
        c = row.pop("_counts")
        statuses = {st: max(0, c.get(st, 0)) for st in STATUSES}
        due = statuses["committing"] + statuses["aborting"]
        run = min(running[row["shard"]], due)
        row.update(
            open_jobs=max(0, c.get("jobs", 0)),
            datasets=sum(n for st, n in statuses.items() if st not in ("committed", "aborted")),
            statuses=statuses,
            waiting=statuses["waiting"],
            queued=due - run,
            running=run,
            blocked=statuses["blocked"],
            quarantined=max(row.pop("_quarantined_n"), statuses["quarantined"]),
        )
        for col in COLUMNS:
            if col != "open_jobs":
                totals[col] += row[col]
        for field, reason in row.pop("_quarantined").items():
            # Recorded by the shard's owner from the WAL it walked at its session start.
            name, _, job = as_text(field).partition("/")
            if len(quarantined) < QUARANTINED_SHOWN:
                quarantined.append({"dataset": name, "job": job, "reason": as_text(reason)[:TEXT_SHOWN]})
    totals["open_jobs"] = distinct
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
        "totals": totals,
        "quarantined": sorted(quarantined, key=lambda q: (q["dataset"], q["job"])),
        "in_flight": in_flight,
        "unreadable": unreadable,
        "unreadable_count": unreadable_count,
        "counters": {k: (float(v) if "." in v else int(v)) for k, v in counters.items()},
        "at": time.time(),
    }


COLUMNS: Final = ("open_jobs", "datasets", "waiting", "queued", "running", "blocked", "quarantined")
"""The columns of ``totals``."""


async def get_status(s: Settings) -> dict[str, Any]:
    """Return the fleet's status summary, from Redis only (the workers record quarantines there).

    Raises:
        ConfigError: no such fleet, or ``fleet.shards`` disagrees with the fleet's record.
        TransientError: Redis unavailable.
    """
    r = connect(s.redis, client_name="commitfleet-cli")
    try:
        s = await existing_fleet(r, s)
        return await fleet_summary(r, Keys(s.fleet.name), s)
    finally:
        await r.aclose()
