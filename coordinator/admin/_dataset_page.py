"""The dataset page: one dataset's shard, commits, open work, lock and quarantine
(``GET /datasets/{name}``, ``commitfleet dataset``).

What it holds:

- ``shard``: :func:`shared.queue.shard_of` of the name, and that shard's owner;
- ``open_work``: the open jobs' records of the dataset on its shard, the
  first page of :func:`~coordinator.admin.open_work_page` with
  ``dataset=<name>`` (at most :data:`OPEN_WORK`; ``open_work_next`` is the
  cursor of ``GET /status/datasets`` for the rest, or None);
- ``quarantined``: the sequences its shard's owner set aside
  (``state:quarantined``, ``<name>/*``) and the store's ``_wal/<name>/`` logs
  that are quarantined or unreadable, each with the operator ``actions`` the
  console offers (``retry``, ``skip``);
- from the store, when one is given: ``lock`` (its lock object as stored:
  holder, epoch, acquired, expiry, released, and whether it holds now; read,
  never taken), ``commits`` (the newest :data:`COMMITS_DEFAULT` manifests:
  job, files, bytes, watermarks, epoch, when) and ``watermarks`` (the
  dataset's watermarks document).

Which commits are the newest: the jobs of the dataset's ``committed`` events
still in the capped admin stream (newest first, at most
:data:`EVENTS_SCAN` entries read), then, when they are fewer than asked,
manifests from a listing of ``<name>/_commits/`` that stops after
:data:`COMMITS_LISTED` keys (key order: job ids, not time); every manifest
read is sorted by its ``committed_at``. ``commits_listed_all`` is False when
the listing stopped early: older commits exist that the page does not show.
A page reads at most ``commits`` manifests, one lock object, one watermarks
document and the dataset's ``_wal/`` logs (one per unfinished sequence).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Final

import msgspec
import redis.asyncio

from shared import BadInput, NotFound, Settings, TaskGroup
from shared.events import (
    Committed,
    InvalidMessage,
    check_dataset_segment,
    commits_prefix,
    lock_name,
    manifest_key,
    watermarks_key,
)
from shared.queue import Keys, as_text, read_admin_recent, redis_errors, shard_of

from ._open_work import OpenWorkFilter, glob_escape, open_work_page

if TYPE_CHECKING:
    from shared.storage import ObjectStore

COMMITS_DEFAULT: Final = 10
COMMITS_MAX: Final = 100
COMMITS_LISTED: Final = 1000
"""Manifest keys listed at most when the admin stream names fewer commits than asked for."""
EVENTS_SCAN: Final = 10_000
OPEN_WORK: Final = 100
"""Open work shown at most (the rest: ``GET /status/datasets?dataset=<name>&cursor=<open_work_next>``)."""
SCAN_CALLS: Final = 16
SCAN_COUNT: Final = 1000
OPS: Final = ("retry", "skip")


def check_dataset_name(name: str) -> str:
    """Return ``name`` when it is a dataset name.

    Raises:
        BadInput: it is not one safe segment of 1..128 characters.
    """
    try:
        return check_dataset_segment(name)
    except InvalidMessage as exc:
        raise BadInput(exc.detail) from None


async def _hscan_bounded(r: redis.asyncio.Redis, key: str, match: str) -> tuple[dict[Any, Any], bool]:
    """Return the fields of ``key`` matching ``match`` and whether the scan reached the end.

    Reads at most SCAN_CALLS batches of SCAN_COUNT.
    """
    found: dict[Any, Any] = {}
    cursor = 0
    for _ in range(SCAN_CALLS):
        with redis_errors("HSCAN"):
            reply: Any = await r.hscan(key, cursor, match=match, count=SCAN_COUNT)
        cursor, fields = reply
        found.update(fields)
        if cursor == 0:
            return found, True
    return found, False


async def _newest_jobs(r: redis.asyncio.Redis, keys: Keys, name: str, n: int) -> list[str]:
    """Return the jobs of the dataset's newest ``committed`` events in the admin stream, newest first."""

    def match(ev: Any) -> bool:
        return isinstance(ev, Committed) and ev.dataset == name

    page = await read_admin_recent(r, keys, limit=n, scan=EVENTS_SCAN, match=match)
    jobs: list[str] = []
    for _id, ev in page.events:
        job = getattr(ev, "job", "")
        if job and job not in jobs:
            jobs.append(job)
    return jobs


async def _listed_jobs(store: ObjectStore, name: str) -> tuple[list[str], bool]:
    """Return the jobs of the first COMMITS_LISTED manifests under ``<name>/_commits/`` and whether
    that was all of them."""
    prefix = commits_prefix(name)
    jobs: list[str] = []
    listing = store.list(prefix, page_size=COMMITS_LISTED)
    async with contextlib.aclosing(listing) as infos:  # type: ignore[type-var]
        async for info in infos:
            rest = info.key[len(prefix) :]
            if "/" in rest or not rest.endswith(".json"):
                continue
            if len(jobs) >= COMMITS_LISTED:
                return jobs, False
            jobs.append(rest[: -len(".json")])
    return jobs, True


async def _read_manifest(store: ObjectStore, name: str, job: str) -> dict[str, Any] | None:
    from shared.commit import Manifest

    try:
        obj = await store.read(manifest_key(name, job))
    except NotFound:
        return None
    except BadInput as exc:  # a bad job id in a listed key, a link where a file should be
        return {"job": job, "error": str(exc)}
    try:
        m = msgspec.json.decode(obj.data, type=Manifest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return {"job": job, "error": f"unreadable manifest: {exc}"}
    return {
        "job": m.job,
        "files": len(m.files),
        "bytes": m.bytes,
        "watermarks": m.watermarks,
        "epoch": m.epoch,
        "committed_at": m.committed_at,
        "manifest": manifest_key(name, job),
    }


async def _commits(
    r: redis.asyncio.Redis, keys: Keys, store: ObjectStore, name: str, n: int
) -> tuple[list[dict[str, Any]], bool]:
    jobs = await _newest_jobs(r, keys, name, n)
    listed_all = True
    if len(jobs) < n:
        listed, listed_all = await _listed_jobs(store, name)
        for job in reversed(listed):  # the last keys first: often the newest ids
            if len(jobs) >= n:
                break
            if job not in jobs:
                jobs.append(job)
    sem = asyncio.Semaphore(8)

    async def one(job: str) -> dict[str, Any] | None:
        async with sem:
            return await _read_manifest(store, name, job)

    async with TaskGroup() as tg:
        tasks = [tg.create_task(one(j)) for j in jobs[:n]]
    found = [m for t in tasks if (m := t.result()) is not None]
    found.sort(key=lambda m: -float(m.get("committed_at", 0.0)))
    return found, listed_all


async def _store_parts(
    r: redis.asyncio.Redis, keys: Keys, settings: Settings, store: ObjectStore, name: str, commits: int
) -> dict[str, Any]:
    from shared.commit import WatermarksDoc, list_unfinished
    from shared.locks import held_until, is_held, read_lock

    now = time.time()
    lock: dict[str, Any] | None = None
    try:
        rec = await read_lock(store, lock_name(name))
    except BadInput as exc:
        lock = {"error": str(exc)}
    else:
        if rec is not None:
            lock = {
                "holder": rec.owner,
                "epoch": rec.epoch,
                "acquired_at": rec.acquired_at,
                "expires_at": rec.expires_at,
                "released": rec.released,
                "held": is_held(rec, now, settings.lock),
                "held_until": held_until(rec, settings.lock),
            }
    watermarks: dict[str, Any] | None = None
    try:
        obj = await store.read(watermarks_key(name))
        doc = msgspec.json.decode(obj.data, type=WatermarksDoc)
        watermarks = {"values": doc.values, "updated_at": doc.updated_at}
    except NotFound:
        pass
    except (BadInput, msgspec.DecodeError, msgspec.ValidationError) as exc:
        watermarks = {"error": str(exc)}
    wal = [
        {"job": u.job, "reason": u.quarantined, "key": u.key}
        for u in await list_unfinished(store, name)
        if u.quarantined is not None
    ]
    found, listed_all = await _commits(r, keys, store, name, commits)
    return {
        "lock": lock,
        "watermarks": watermarks,
        "commits": found,
        "commits_listed_all": listed_all,
        "_wal": wal,
    }


async def dataset_page(
    r: redis.asyncio.Redis,
    keys: Keys,
    settings: Settings,
    name: str,
    *,
    store: ObjectStore | None = None,
    commits: int = COMMITS_DEFAULT,
) -> dict[str, Any]:
    """Return the dataset page of ``name`` (see the module doc): ``dataset``, ``shard``, ``owner``,
    ``open_work``, ``open_work_next``, ``quarantined`` (each: ``job``, ``reason``, ``source``
    ``redis``/``store``, ``actions``), and ``store`` (None without a store, else ``lock``,
    ``watermarks``, ``commits``, ``commits_listed_all``).

    ``settings.fleet.shards`` must be the fleet's count.

    Raises:
        BadInput: ``name`` is not a dataset name, ``commits`` not from 1 to COMMITS_MAX.
        NotFound: nothing is known of the dataset (no open work, quarantine, lock,
            watermarks or commit).
        TransientError, OutcomeUnknown: Redis or the store unavailable.

    On cancel: stops at once (reads only).
    """
    check_dataset_name(name)
    if not 1 <= commits <= COMMITS_MAX:
        raise BadInput(f"commits {commits}: give a whole number from 1 to {COMMITS_MAX}")
    shard = shard_of(name, settings.fleet.shards)
    with redis_errors("read shard owner"):
        owner = await r.get(keys.shard_state(shard, "owner"))
    work = await open_work_page(r, keys, settings, OpenWorkFilter(dataset=name), None, OPEN_WORK)
    open_work = sorted(work.items, key=lambda w: w["job"])
    fields, _complete = await _hscan_bounded(
        r, keys.shard_state(shard, "quarantined"), f"{glob_escape(name)}/*"
    )
    quarantined: dict[str, dict[str, Any]] = {}
    for field, reason in fields.items():
        ds_name, _, job = as_text(field).partition("/")
        if ds_name == name:
            quarantined[job] = {
                "job": job,
                "reason": as_text(reason),
                "source": "redis",
                "actions": list(OPS),
            }
    for w in open_work:
        if w["status"] == "quarantined" and w["job"] not in quarantined:
            quarantined[w["job"]] = {
                "job": w["job"],
                "reason": w["reason"],
                "source": "redis",
                "actions": list(OPS),
            }
    doc: dict[str, Any] = {
        "dataset": name,
        "shard": shard,
        "owner": None if owner is None else as_text(owner),
        "open_work": open_work,
        "open_work_next": work.next,
    }
    parts: dict[str, Any] | None = None
    if store is not None:
        parts = await _store_parts(r, keys, settings, store, name, commits)
        for w in parts.pop("_wal"):
            if w["job"] not in quarantined:
                quarantined[w["job"]] = {**w, "source": "store", "actions": list(OPS)}
    doc["quarantined"] = sorted(quarantined.values(), key=lambda q: q["job"])
    doc["store"] = parts
    doc["at"] = time.time()
    if (
        not open_work
        and not quarantined
        and (
            parts is None
            or (
                (parts["lock"] or {}).get("holder") is None
                and parts["watermarks"] is None
                and not parts["commits"]
            )
        )
    ):
        raise NotFound(f"no such dataset {name!r}: no open work, quarantine, lock or commit")
    return doc


__all__ = ["COMMITS_DEFAULT", "COMMITS_MAX", "check_dataset_name", "dataset_page"]
