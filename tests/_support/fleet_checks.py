"""Checks on what a test fleet did: its admin stream, the commits in the store, what is left behind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import redis.asyncio

from shared.commit import AuditReport, audit, read_manifest
from shared.events import AdminEvent, Committed
from shared.queue import Keys, read_admin_range
from shared.storage import ObjectStore
from tests._support.wait import wait_for


async def admin_events(r: redis.asyncio.Redis, fleet: str) -> list[AdminEvent]:
    """Return every admin event so far."""
    return [ev for _id, ev in await read_admin_range(r, Keys(fleet))]


async def commit_counts(r: redis.asyncio.Redis, fleet: str) -> Counter[tuple[str, str]]:
    """Return how many ``committed`` events each (dataset, job) has on the admin stream."""
    return Counter((e.dataset, e.job) for e in await admin_events(r, fleet) if isinstance(e, Committed))


async def assert_committed_once(r: redis.asyncio.Redis, fleet: str, expected: set[tuple[str, str]]) -> None:
    """Assert that every commit of ``expected``, and nothing else, is announced, each once.

    A worker announces a commit after its sequence ended (the WAL deleted), so
    a test that waited for the store can be ahead of the admin stream: the
    announcements are waited for (60 s), then checked.
    """

    async def announced() -> bool:
        return expected <= set(await commit_counts(r, fleet))

    await wait_for(announced, timeout=60, what="every commit announced")
    counts = await commit_counts(r, fleet)
    assert set(counts) == expected
    dup = {k: n for k, n in counts.items() if n != 1}
    assert not dup, f"committed more than once: {dup}"


async def committed(store: ObjectStore, datasets: Iterable[str], job: str) -> bool:
    """Return True when every dataset has the job's manifest."""
    for ds in datasets:
        if await read_manifest(store, ds, job) is None:
            return False
    return True


async def nothing_under(store: ObjectStore, prefix: str) -> bool:
    """Return True when no object's key starts with ``prefix``."""
    async for _ in store.list(prefix):
        return False
    return True


async def no_staging_left(store: ObjectStore, job: str) -> bool:
    """Return True when nothing is staged for ``job`` any more."""
    return await nothing_under(store, f"_staging/{job}/")


async def no_wal_left(store: ObjectStore) -> bool:
    """Return True when no commit sequence is under way (the manifest is written before
    the last step, clean-up, and the WAL goes only after it)."""
    return await nothing_under(store, "_wal/")


async def clean_audit(store: ObjectStore) -> AuditReport:
    """Return the audit report (callers assert ``ok``)."""
    return await audit(store)
