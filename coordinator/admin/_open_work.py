"""Open work, one page at a time: the datasets of open jobs, filtered, and the open jobs, read with HSCAN.

``GET /status/datasets``, ``commitfleet status`` (its first page, ``--all``) and the console's
pending table read open work through :func:`open_work_page`. Each call's Redis work and memory
are bounded (:data:`SCAN_CALLS` HSCANs of :data:`SCAN_COUNT`, one reply held at a time), whatever
the fleet holds: a filter that matches little may come back with a short (even empty) page and a
cursor to go on with.

The cursor is opaque to callers: the shard, the HSCAN cursor of the reply the page stopped in
and the last field taken from that reply (a reply's matches are taken in field order, so that
the same reply read again continues where the page stopped). Over a state that does not change,
the pages return each entry exactly once. While it changes, an entry present from the first page
to the last is returned at least once (HSCAN's guarantee; a resized hash may repeat one), except
when the hash shrinks between two pages that split one reply: the reply read again then covers
more buckets, and those of its entries that sort before the page's last field are skipped.

Kept free of aiohttp and the commit core: the CLI imports it.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import msgspec
import redis.asyncio

from shared import BadInput, Settings
from shared.queue import Keys, as_text, redis_errors, shard_of
from workers import STATE_VERSION, DatasetState, JobMeta, read_in_flight

SCAN_COUNT: Final = 500
"""The COUNT hint of each HSCAN (a hash of up to 128 fields, stored compactly, answers whole)."""
SCAN_CALLS: Final = 32
"""HSCANs per page at most: a page examines about ``SCAN_CALLS * SCAN_COUNT`` fields at most."""
MAX_LIMIT: Final = 1000
"""The largest page (``limit``)."""
DEFAULT_LIMIT: Final = 100
JOBS_MAX_LIMIT: Final = 200
"""The largest page of open jobs."""
JOB_SCAN_COUNT: Final = 100
JOB_SCAN_CALLS: Final = 4
"""A page of open jobs reads at most ``JOB_SCAN_CALLS`` HSCANs of ``JOB_SCAN_COUNT``."""

PENDING: Final = frozenset({"waiting", "committing", "aborting", "blocked"})
"""Statuses of datasets waiting for tasks, for their commit or abort, or blocked (``state=pending``)."""
STATES: Final = frozenset(
    {"pending", "open", "waiting", "committing", "aborting", "queued", "running", "retrying", "blocked"}
    | {"quarantined", "committed", "aborted"}
)
"""The values of the ``state`` filter: a status, a state of a commit or abort under way
(queued / running / retrying), or ``pending``."""

_dec = msgspec.json.Decoder(DatasetState)
_meta_dec = msgspec.json.Decoder(JobMeta)


class OpenWorkFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which open work to list (None = any): the job, the dataset (exact), a dataset name prefix,
    a state (see :data:`STATES`), a shard."""

    job: str | None = None
    dataset: str | None = None
    prefix: str | None = None
    state: str | None = None
    shard: int | None = None


class OpenWorkPage(msgspec.Struct, frozen=True):
    """One page: ``items`` (dataset, job, shard, status, state, reason) and the cursor of the next
    page (None: there is none)."""

    items: list[dict[str, Any]]
    next: str | None


class _Cursor(msgspec.Struct, array_like=True, frozen=True):
    shard: int
    scan: int  # the HSCAN cursor of the reply to (re)read
    after: str | None  # the last field taken from that reply (None: none yet)


_cursor_dec = msgspec.json.Decoder(_Cursor)
_enc = msgspec.json.Encoder()


def glob_escape(text: str) -> str:
    """Return ``text`` with Redis glob characters (``* ? [ ] \\``) escaped, to match it literally."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _encode_cursor(c: _Cursor) -> str:
    return base64.urlsafe_b64encode(_enc.encode(c)).decode("ascii").rstrip("=")


def _decode_cursor(text: str, shards: Iterable[int]) -> _Cursor:
    try:
        c = _cursor_dec.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise BadInput(f"cursor {text[:40]!r} is not one this API returned") from None
    if c.shard not in set(shards) or c.scan < 0:
        raise BadInput(f"cursor {text[:40]!r} does not fit this filter")
    return c


def check_filter(flt: OpenWorkFilter, shards: int) -> None:
    """Return None when ``flt`` can match something in a fleet of ``shards`` shards.

    Raises:
        BadInput: an unknown state, or a shard out of range.
    """
    if flt.state is not None and flt.state not in STATES:
        raise BadInput(f"unknown state {flt.state[:40]!r}; known: {', '.join(sorted(STATES))}")
    if flt.shard is not None and not 0 <= flt.shard < shards:
        raise BadInput(f"shard {flt.shard} is not one of the fleet's {shards}")


def _shards(flt: OpenWorkFilter, shards: int) -> list[int]:
    """Return the shards that can hold what ``flt`` names, in order."""
    if flt.dataset is not None:
        home = shard_of(flt.dataset, shards)
        return [home] if flt.shard in (None, home) else []
    return [flt.shard] if flt.shard is not None else list(range(shards))


def _match(flt: OpenWorkFilter) -> str:
    """Return the HSCAN MATCH pattern of ``flt``'s names (fields are ``<job>/<dataset>``)."""
    job = glob_escape(flt.job) if flt.job is not None else "*"
    if flt.dataset is not None:
        return f"{job}/{glob_escape(flt.dataset)}"
    return f"{job}/{glob_escape(flt.prefix or '')}*"


def _wanted(flt: OpenWorkFilter, job: str, name: str) -> bool:
    # MATCH does the work; this makes it exact whatever the pattern let through.
    if flt.job is not None and job != flt.job:
        return False
    if flt.dataset is not None and name != flt.dataset:
        return False
    return flt.prefix is None or name.startswith(flt.prefix)


def _item(shard: int, field: str, ds: DatasetState, flight: dict[tuple[str, str], str]) -> dict[str, Any]:
    job, _, name = field.partition("/")
    state: str = ds.status
    if ds.status in ("committing", "aborting"):
        # running or retrying when its owner works on it, else queued for a slot
        state = flight.get((name, job), "queued")
    return {
        "dataset": name,
        "job": job,
        "shard": shard,
        "status": ds.status,
        "state": state,
        "reason": ds.reason,
    }


def _state_matches(want: str | None, item: dict[str, Any]) -> bool:
    if want is None:
        return item["status"] not in ("committed", "aborted")
    if want == "pending":
        return item["status"] in PENDING
    return want in (item["status"], item["state"])


async def open_work_page(
    r: redis.asyncio.Redis,
    keys: Keys,
    settings: Settings,
    flt: OpenWorkFilter,
    cursor: str | None,
    limit: int = DEFAULT_LIMIT,
) -> OpenWorkPage:
    """Return one page of open work matching ``flt``, from ``cursor`` (None: the first page).

    Open work is each dataset record of an open job (``state:datasets``) whose status is not
    committed or aborted, unless ``flt.state`` asks for those. Items come shard by shard; a record
    that does not decode is left out (its shard's owner sets the shard aside when it loads it).
    ``settings.fleet.shards`` must be the fleet's count.

    Raises:
        BadInput: ``limit`` out of 1..:data:`MAX_LIMIT`, a cursor this API did not return for this
            filter, an unknown state or a shard out of range.
        TransientError: Redis unavailable.
    """
    shards = settings.fleet.shards
    if shards < 1:
        raise ValueError("open_work_page needs the fleet's shard count (settings.fleet.shards)")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadInput(f"limit must be 1..{MAX_LIMIT}, got {limit}")
    check_filter(flt, shards)
    order = _shards(flt, shards)
    if not order:
        return OpenWorkPage([], None)
    at = _decode_cursor(cursor, order) if cursor is not None else _Cursor(order[0], 0, None)
    flight: dict[tuple[str, str], str] = {}
    if flt.state in (None, "pending", "committing", "aborting", "queued", "running", "retrying"):
        # Bounded by the owners' slots: tells a queued commit from a running one.
        flight = {
            (str(f.get("dataset")), str(f.get("job"))): str(f.get("state"))
            for f in await read_in_flight(r, keys, shards)
        }
    if flt.job is not None and flt.dataset is not None:
        return await _one(r, keys, order[0], flt, flight)
    dataset_key = functools.partial(keys.shard_state, name="datasets")

    async def take(shard: int, batch: list[tuple[str, Any]], room: int) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for field, raw in batch:
            if len(out) > room:
                break
            job, _, name = field.partition("/")
            if not _wanted(flt, job, name):
                continue
            try:
                ds = _dec.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            item = _item(shard, field, ds, flight)
            if ds.v == STATE_VERSION and _state_matches(flt.state, item):
                out.append((field, item))
        return out

    return await _scan_page(r, dataset_key, order, at, _match(flt), limit, take)


Take = Callable[[int, list[tuple[str, Any]], int], Awaitable[list[tuple[str, dict[str, Any]]]]]
"""Turns one HSCAN reply of a shard (fields after the cursor's, in field order) into the items it
holds, each with its field, in field order: at least the first ``room`` + 1 of them (all when fewer),
so that the page knows whether it ends inside the reply."""


async def _scan_page(
    r: redis.asyncio.Redis,
    key_of: Callable[[int], str],
    order: list[int],
    at: _Cursor,
    match: str,
    limit: int,
    take: Take,
    *,
    count: int = SCAN_COUNT,
    calls: int = SCAN_CALLS,
) -> OpenWorkPage:
    """Return up to ``limit`` items of the hashes ``key_of(shard)``, shard by shard in ``order``
    from ``at``, with at most ``calls`` HSCANs of ``count``; the cursor says where the next page starts.

    Raises:
        TransientError: Redis unavailable.
    """
    items: list[dict[str, Any]] = []
    left = order[order.index(at.shard) :]
    scan, after = at.scan, at.after
    while left and calls > 0 and len(items) < limit:
        shard = left[0]
        with redis_errors("HSCAN open work"):
            nxt, fields = await r.hscan(key_of(shard), scan, match=match, count=count)
        calls -= 1
        assert isinstance(fields, dict), "HSCAN without NOVALUES answers fields and values"
        batch = sorted(
            (f, v) for f, v in ((as_text(f), v) for f, v in fields.items()) if after is None or f > after
        )
        room = limit - len(items)
        got = await take(shard, batch, room)
        if len(got) > room:
            # The page ends inside this reply: the next one reads it again, after the last field taken.
            items += [item for _, item in got[:room]]
            return OpenWorkPage(items, _encode_cursor(_Cursor(shard, scan, got[room - 1][0])))
        items += [item for _, item in got]
        after = None
        if nxt == 0:
            left, scan = left[1:], 0
        else:
            scan = int(nxt)
    if not left:
        return OpenWorkPage(items, None)
    return OpenWorkPage(items, _encode_cursor(_Cursor(left[0], scan, None)))


async def open_jobs_page(
    r: redis.asyncio.Redis, keys: Keys, settings: Settings, cursor: str | None, limit: int = DEFAULT_LIMIT
) -> OpenWorkPage:
    """Return one page of open jobs, from ``cursor`` (None: the first page): each job once, as
    ``{job, shards, opened_at, deadline}`` (``shards``: those holding a record of it).

    A job is listed with the lowest shard that holds it: the job records read on shard s cost one
    HMGET per lower shard, and the jobs listed one per higher shard (pipelined); a page reads at
    most :data:`JOB_SCAN_CALLS` HSCANs of :data:`JOB_SCAN_COUNT` job records; ``limit`` is
    1..:data:`JOBS_MAX_LIMIT`. A record that does
    not decode is left out (``GET /status`` lists it among ``unreadable``).

    Raises:
        BadInput: ``limit`` out of range, or a cursor this API did not return.
        TransientError: Redis unavailable.
    """
    shards = settings.fleet.shards
    if shards < 1:
        raise ValueError("open_jobs_page needs the fleet's shard count (settings.fleet.shards)")
    if not 1 <= limit <= JOBS_MAX_LIMIT:
        raise BadInput(f"limit must be 1..{JOBS_MAX_LIMIT}, got {limit}")
    order = list(range(shards))
    at = _decode_cursor(cursor, order) if cursor is not None else _Cursor(0, 0, None)
    jobs_key = functools.partial(keys.shard_state, name="jobs")

    async def take(shard: int, batch: list[tuple[str, Any]], room: int) -> list[tuple[str, dict[str, Any]]]:
        metas: list[tuple[str, JobMeta]] = []
        for field, raw in batch:
            try:
                metas.append((field, _meta_dec.decode(raw)))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        # A job is listed with its lowest shard: one HMGET per lower shard tells (none on shard 0).
        lower = order[: order.index(shard)]
        held = await _held(r, [jobs_key(s) for s in lower], [field for field, _ in metas])
        first = [m for m, on_lower in zip(metas, held, strict=True) if not any(on_lower)][: room + 1]
        # Its other shards, for those on this page only.
        higher = order[order.index(shard) + 1 :]
        held = await _held(r, [jobs_key(s) for s in higher], [field for field, _ in first])
        return [
            (
                field,
                {
                    "job": field,
                    "shards": [shard, *(s for s, h in zip(higher, on, strict=True) if h)],
                    "opened_at": meta.opened_at,
                    "deadline": meta.deadline,
                },
            )
            for (field, meta), on in zip(first, held, strict=True)
        ]

    return await _scan_page(
        r, jobs_key, order, at, "*", limit, take, count=JOB_SCAN_COUNT, calls=JOB_SCAN_CALLS
    )


async def _held(r: redis.asyncio.Redis, keys: list[str], fields: list[str]) -> list[list[bool]]:
    """Return, per field, whether each of ``keys`` (hashes) holds it: one pipelined HMGET per key
    (a command per shard, not per record and shard).

    Raises:
        TransientError: Redis unavailable.
    """
    if not keys or not fields:
        return [[False] * len(keys) for _ in fields]
    with redis_errors("HMGET open jobs"):
        async with r.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(key, fields)
            replies = await pipe.execute()
    return [[reply[i] is not None for reply in replies] for i in range(len(fields))]


async def _one(
    r: redis.asyncio.Redis, keys: Keys, shard: int, flt: OpenWorkFilter, flight: dict[tuple[str, str], str]
) -> OpenWorkPage:
    """Return the page of the one dataset record ``flt`` names (job and dataset), if open."""
    assert flt.job is not None and flt.dataset is not None
    field = f"{flt.job}/{flt.dataset}"
    with redis_errors("HGET open work"):
        raw = await r.hget(keys.shard_state(shard, "datasets"), field)
    if raw is None:
        return OpenWorkPage([], None)
    try:
        ds = _dec.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return OpenWorkPage([], None)
    item = _item(shard, field, ds, flight)
    return OpenWorkPage([item] if ds.v == STATE_VERSION and _state_matches(flt.state, item) else [], None)


__all__ = [
    "DEFAULT_LIMIT",
    "JOBS_MAX_LIMIT",
    "MAX_LIMIT",
    "PENDING",
    "STATES",
    "OpenWorkFilter",
    "OpenWorkPage",
    "check_filter",
    "glob_escape",
    "open_jobs_page",
    "open_work_page",
]
