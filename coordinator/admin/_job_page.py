"""The job page: one job across the fleet's shards, from Redis (``GET /jobs/{job}``, ``commitfleet job``).

What it holds:

- ``shards``: every shard that knows the job: open there (its ``state:jobs``
  record: opened, timeout), ended there (``state:ended``: status, when), and
  how many results its ``result:<job>`` hash keeps; one pipelined round trip
  of a few commands per shard, whatever the job's size;
- ``liveness``: the driver's liveness keys (``alive:<job>``, refreshed by the
  driver with a TTL, :mod:`shared.queue._job_outcome`) on the shards where the
  job is open: ``alive`` when one is there, ``silent`` when none is (the owner
  aborts the job once it has been silent for ``timeout_s``), ``ended`` when the
  job is open nowhere;
- ``datasets``: a page of the job's datasets, each with its status, its
  state (for a commit or abort under way: ``queued``, ``running`` or
  ``retrying``, from the owners' in-flight boards) and, when the fleet has
  decided it, its result (files, bytes, manifest). On a shard
  where the job is open they come from ``state:datasets`` (HSCAN ``MATCH
  <job>/*``) with their results beside them (one HMGET); on a shard where it
  has ended, from the job's result hash (HSCAN). A page holds at most
  ``limit`` datasets and reads at most :data:`SCAN_CALLS` HSCAN batches, so
  it may come back short (or empty) with a ``next`` cursor: a job with
  100,000 datasets is read page by page;
- ``events``: the job's newest admin events (first page only), by the reader
  behind ``GET /events/recent``.

A dataset whose job ends on its shard while a client pages may be shown twice
or not at all (the page switches from the open records to the results).
Nothing here reads the store.
"""

from __future__ import annotations

import base64
import re
import time
from typing import Any, Final

import msgspec
import redis.asyncio

from shared import BadInput, NotFound, Settings
from shared.events import InvalidMessage, check_job, encode_admin
from shared.queue import Keys, as_text, read_admin_recent, redis_errors
from workers import STATE_VERSION, DatasetState, JobMeta, read_in_flight

from ._filter import event_matches

PAGE_DEFAULT: Final = 100
PAGE_MAX: Final = 1000
SCAN_CALLS: Final = 64
"""HSCAN batches one page reads at most (each examines about DATASETS_COUNT fields at most)."""
ROUND_MAX: Final = 16
"""HSCAN batches read in one pipelined round trip at most."""
DATASETS_COUNT: Final = 5000
"""HSCAN COUNT of a shard's ``state:datasets`` (every open job's datasets, the job's matched): a
shard of 100,000 open datasets over 64 shards (about 1,600 each) is read in one batch."""
RESULT_COUNT: Final = 250
"""HSCAN COUNT of a job's result hash (this job's datasets only)."""
EVENTS_DEFAULT: Final = 20
EVENTS_SCAN: Final = 10_000
"""Admin entries read at most for a job's events (as ``GET /events/recent``)."""
# <shard>.<HSCAN cursor>[.<last name taken, base64url>]: a dataset name is at most 128 characters.
_CURSOR: Final = re.compile(r"([0-9]{1,5})\.([0-9]{1,20})(?:\.([A-Za-z0-9_-]{1,700}))?")
Cursor = tuple[int, int, str | None]

# A commit or abort under way: queued for a slot, or running / retrying on its owner.
_UNDER_WAY: Final = frozenset({"committing", "aborting"})

_meta_dec = msgspec.json.Decoder(JobMeta)
_ds_dec = msgspec.json.Decoder(DatasetState)
_result_dec = msgspec.json.Decoder(dict[str, Any])


def check_job_name(job: str) -> str:
    """Return ``job`` when it is a job id.

    Raises:
        BadInput: it is not (the message says why, the name cut short).
    """
    try:
        return check_job(job)
    except InvalidMessage as exc:
        raise BadInput(exc.detail) from None


def check_limit(limit: int) -> int:
    """Return ``limit`` when it is from 1 to :data:`PAGE_MAX`; raises BadInput otherwise."""
    if not 1 <= limit <= PAGE_MAX:
        raise BadInput(f"limit {limit}: give a whole number from 1 to {PAGE_MAX}")
    return limit


def parse_cursor(cursor: str | None, shards: int) -> Cursor:
    """Return (shard, HSCAN cursor, last name taken or None) of a page cursor (None: the first page).

    Raises:
        BadInput: not a cursor of this fleet's pages.
    """
    if cursor is None:
        return 0, 0, None
    m = _CURSOR.fullmatch(cursor)
    if m is None or int(m[1]) >= shards or int(m[2]) >= 2**64:
        raise BadInput(f"bad cursor {cursor[:40]!r}: use the 'next' of an earlier page")
    after = None
    if m[3] is not None:
        try:
            after = base64.urlsafe_b64decode(m[3] + "=" * (-len(m[3]) % 4)).decode()
        except (ValueError, UnicodeError):
            raise BadInput(f"bad cursor {cursor[:40]!r}: use the 'next' of an earlier page") from None
    return int(m[1]), int(m[2]), after


def format_cursor(cursor: Cursor) -> str:
    """Return the text of a page cursor (see :func:`parse_cursor`)."""
    shard, scan, after = cursor
    if after is None:
        return f"{shard}.{scan}"
    return f"{shard}.{scan}.{base64.urlsafe_b64encode(after.encode()).decode().rstrip('=')}"


def _decode_result(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        return _result_dec.decode(raw)
    except msgspec.DecodeError as exc:
        return {"status": "unreadable", "reason": str(exc)}


def _shard_rows(replies: list[Any], shards: int) -> list[dict[str, Any]]:
    """Return the shards that know the job, from 5 replies per shard (job record, ended record,
    liveness value, its TTL in ms, result count)."""
    rows: list[dict[str, Any]] = []
    for s in range(shards):
        meta_raw, ended_raw, beat, pttl, results = replies[5 * s : 5 * s + 5]
        if meta_raw is None and ended_raw is None and not results:
            continue
        row: dict[str, Any] = {"shard": s, "state": "results", "results": int(results)}
        if meta_raw is not None:
            try:
                meta = _meta_dec.decode(meta_raw)
                row.update(
                    state="open",
                    opened_at=meta.opened_at,
                    timeout_s=meta.timeout_s,
                    record_version=meta.v,
                    alive=None,
                )
                if beat is not None:
                    row["alive"] = {"beat_at": _float(beat), "ttl_s": max(0, int(pttl)) / 1000}
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                row.update(state="unreadable", error=str(exc))
        elif ended_raw is not None:
            try:
                ended = msgspec.json.decode(ended_raw)
                row.update(state="ended", ended={"status": ended.get("status"), "at": ended.get("at")})
            except msgspec.DecodeError as exc:
                row.update(state="ended", ended=None, error=str(exc))
        rows.append(row)
    return rows


def _float(raw: Any) -> float | None:
    try:
        return float(as_text(raw))
    except ValueError:
        return None


def liveness(rows: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """Return the job's liveness from its shard rows (pure): state ``alive`` / ``silent`` / ``ended``.

    ``beat_at`` is the newest beat seen (the driver's clock), ``silent_s`` how long
    since (or since the job opened, when no key is there), ``timeout_s`` the
    silence after which the shards' owners abort the job.
    """
    open_rows = [r for r in rows if r["state"] == "open"]
    if not open_rows:
        return {"state": "ended", "beat_at": None, "silent_s": None, "timeout_s": None}
    beats = [r["alive"]["beat_at"] for r in open_rows if r["alive"] and r["alive"]["beat_at"] is not None]
    alive = any(r["alive"] for r in open_rows)
    since = max(beats) if beats else min(r["opened_at"] for r in open_rows)
    return {
        "state": "alive" if alive else "silent",
        "beat_at": max(beats) if beats else None,
        "silent_s": round(max(0.0, now - since), 3),
        "timeout_s": min(r["timeout_s"] for r in open_rows),
    }


def _open_rows(shard: int, fields: list[tuple[str, bytes]], results: list[Any]) -> list[dict[str, Any]]:
    """Return page rows from ``state:datasets`` records (name, raw) and their results (or None)."""
    rows: list[dict[str, Any]] = []
    for (name, raw), res in zip(fields, results, strict=True):
        try:
            ds = _ds_dec.decode(raw)
            row: dict[str, Any] = {"status": ds.status, "reason": ds.reason}
            if ds.v != STATE_VERSION:
                row.update(status="unreadable", reason=f"state record version {ds.v}")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            row = {"status": "unreadable", "reason": str(exc)}
        rows.append({"dataset": name, "shard": shard, **row, "result": _decode_result(res)})
    return rows


def _result_rows(shard: int, fields: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
    """Return page rows from a job's result hash (name, raw result)."""
    rows: list[dict[str, Any]] = []
    for name, raw in fields:
        res = _decode_result(raw) or {}
        status, reason = res.get("status", "unreadable"), res.get("reason", "")
        rows.append({"dataset": name, "shard": shard, "status": status, "reason": reason, "result": res})
    return rows


async def _hscan_round(
    r: redis.asyncio.Redis, keys: Keys, job: str, known: dict[int, bool], scans: list[tuple[int, int]]
) -> list[tuple[int, list[tuple[str, bytes]]]]:
    """Return, for each (shard, HSCAN cursor) of ``scans``, the next cursor and the batch it read
    (name, raw record), in name order: one pipelined round trip."""
    replies: list[Any]
    with redis_errors("HSCAN job datasets"):
        async with r.pipeline(transaction=False) as pipe:
            for shard, scan in scans:
                if known[shard]:
                    pipe.hscan(
                        keys.shard_state(shard, "datasets"), scan, match=f"{job}/*", count=DATASETS_COUNT
                    )
                else:
                    # The result hash holds this job's datasets only: smaller batches. A batch is read
                    # again with the same COUNT when a page ends inside it (another COUNT, another batch).
                    pipe.hscan(keys.job_result(shard, job), scan, count=RESULT_COUNT)
            replies = await pipe.execute()
    out: list[tuple[int, list[tuple[str, bytes]]]] = []
    prefix = len(job) + 1
    for (shard, _), (nxt, fields) in zip(scans, replies, strict=True):
        cut = prefix if known[shard] else 0
        out.append((int(nxt), sorted((as_text(f)[cut:], v) for f, v in fields.items())))
    return out


async def _datasets_page(
    r: redis.asyncio.Redis,
    keys: Keys,
    job: str,
    shards: int,
    known: dict[int, bool],
    start: Cursor,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None]:
    """Return up to ``limit`` of the job's datasets from ``start`` and the next cursor (None: done).

    ``known``: the shards that know the job, True where it is open there (the
    others are passed without a read). The shards are read in rounds, one
    pipelined round trip each, of 1, 2, 4... up to :data:`ROUND_MAX` shards'
    next HSCAN batches (a big job fills a page from one shard; a small one
    spread over 64 shards takes a few round trips, not 64), at most
    :data:`SCAN_CALLS` batches a page. A batch is taken in name order; when a
    page ends inside one, the cursor names the batch and the last name taken,
    and the next page reads that batch again and goes on after the name.
    """
    shard, scan, after = start
    items: list[dict[str, Any]] = []
    calls, width = 0, 1
    while len(items) < limit and calls < SCAN_CALLS:
        while shard < shards and shard not in known:
            shard, scan, after = shard + 1, 0, None
        if shard >= shards:
            break
        scans = [(shard, scan)]
        s = shard + 1
        while s < shards and len(scans) < min(width, SCAN_CALLS - calls):
            if s in known:
                scans.append((s, 0))
            s += 1
        calls += len(scans)
        width = min(2 * width, ROUND_MAX)
        takes: list[tuple[int, list[tuple[str, bytes]]]] = []
        stop: Cursor | None = None  # where the page ends inside a batch
        for (at, _), (nxt, batch) in zip(scans, await _hscan_round(r, keys, job, known, scans), strict=True):
            # (shard, scan, after) is where this batch starts when ``at`` is ``shard``, else (at, 0, None).
            first = at == shard
            if first and after is not None:
                batch = [b for b in batch if b[0] > after]
            room = limit - len(items) - sum(len(t) for _, t in takes)
            take = batch[:room]
            if not take and batch:  # the page is full: the next one starts with this batch
                stop = (at, scan, after) if first else (at, 0, None)
                break
            takes.append((at, take))
            if len(take) < len(batch):
                stop = (at, scan if first else 0, take[-1][0])
                break
            shard, scan, after = (at + 1, 0, None) if nxt == 0 else (at, nxt, None)
            if nxt != 0:
                break  # this shard has more: the next round goes on with it (later batches are dropped)
        open_takes = [(at, take) for at, take in takes if known[at] and take]
        results: list[Any] = []
        if open_takes:
            with redis_errors("HMGET results"):
                async with r.pipeline(transaction=False) as pipe:
                    for at, take in open_takes:
                        pipe.hmget(keys.job_result(at, job), [name for name, _ in take])
                    results = await pipe.execute()
        found = dict(zip([at for at, _ in open_takes], results, strict=True))
        for at, take in takes:
            items.extend(_open_rows(at, take, found.get(at, [])) if known[at] else _result_rows(at, take))
        if stop is not None:
            return items, format_cursor(stop)
    while shard < shards and shard not in known:  # no cursor that leads to nothing more
        shard, scan, after = shard + 1, 0, None
    return items, (None if shard >= shards else format_cursor((shard, scan, after)))


async def job_page(
    r: redis.asyncio.Redis,
    keys: Keys,
    settings: Settings,
    job: str,
    *,
    cursor: str | None = None,
    limit: int = PAGE_DEFAULT,
    events: int = EVENTS_DEFAULT,
) -> dict[str, Any]:
    """Return the job page of ``job`` (see the module doc): ``job``, ``shards``, ``liveness``,
    ``datasets``, ``next`` (the cursor of the next page, or None) and, on the first page
    (``cursor`` None, ``events`` > 0), ``events`` (newest first: ``id``, ``event``).

    ``settings.fleet.shards`` must be the fleet's count. Cost: one pipelined round trip of
    five commands per shard, at most SCAN_CALLS HSCAN batches (each with one HMGET), and
    at most EVENTS_SCAN admin entries read.

    Raises:
        BadInput: ``job`` is not a job id, a bad ``cursor`` or ``limit``.
        NotFound: no shard knows the job (open, ended or with results) and no recent event names it.
        TransientError: Redis unavailable.

    On cancel: stops at once (reads only).
    """
    check_job_name(job)
    check_limit(limit)
    shards = settings.fleet.shards
    start = parse_cursor(cursor, shards)
    with redis_errors("read job"):
        async with r.pipeline(transaction=False) as pipe:
            for s in range(shards):
                pipe.hget(keys.shard_state(s, "jobs"), job)
                pipe.hget(keys.shard_state(s, "ended"), job)
                pipe.get(keys.job_alive(s, job))
                pipe.pttl(keys.job_alive(s, job))
                pipe.hlen(keys.job_result(s, job))
            replies = await pipe.execute()
    now = time.time()
    rows = _shard_rows(replies, shards)
    doc: dict[str, Any] = {"job": job, "shards": rows, "liveness": liveness(rows, now)}
    if cursor is None and events > 0:

        def match(ev: Any) -> bool:
            return event_matches(ev, types=set(), dataset=None, job=job)

        page = await read_admin_recent(r, keys, limit=events, scan=EVENTS_SCAN, match=match)
        doc["events"] = [
            {"id": i.decode(), "event": msgspec.json.decode(encode_admin(ev))} for i, ev in page.events
        ]
        if not rows and not page.events:
            raise NotFound(f"no such job {job!r}: no shard knows it and no recent event names it")
    elif not rows:
        raise NotFound(f"no such job {job!r}: no shard knows it")
    known = {row["shard"]: row["state"] == "open" for row in rows}
    items, doc["next"] = await _datasets_page(r, keys, job, shards, known, start, limit)
    flight: dict[tuple[str, str], str] = {}
    if any(i["status"] in _UNDER_WAY for i in items):
        # Bounded by the owners' slots: tells a queued commit from a running one.
        flight = {
            (str(f.get("dataset")), str(f.get("job"))): str(f.get("state"))
            for f in await read_in_flight(r, keys, shards)
        }
    for i in items:
        i["state"] = flight.get((i["dataset"], job), "queued") if i["status"] in _UNDER_WAY else i["status"]
    doc["datasets"] = items
    doc["at"] = now
    return doc


__all__ = [
    "EVENTS_DEFAULT",
    "PAGE_DEFAULT",
    "PAGE_MAX",
    "check_job_name",
    "check_limit",
    "job_page",
    "liveness",
]
