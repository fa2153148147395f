"""The commit core under the real storage lock: the lease's epoch fences, a frozen holder stops."""

from __future__ import annotations

import asyncio
import contextlib

from shared import LockLost, OutcomeUnknown, TransientError
from shared.commit import commit_dataset, read_manifest
from shared.locks import StorageLock
from shared.settings import LockSettings
from shared.storage import ObjectStore
from tests._support.commit import assert_exactly_once, fast_settings, stage_job
from tests._support.fault_store import FaultStore

SETTINGS = fast_settings()
# Short leases so a takeover happens within about a second.
SHORT = LockSettings(validity=1.0, renew_interval=0.3, max_drift=0.05, poll_min=0.02, poll_max=0.1)


async def test_commit_under_the_real_lock_records_its_epoch(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    async with StorageLock(any_store, "ds", owner="worker-a", settings=SHORT).hold(timeout=10) as lease:
        res = await commit_dataset(any_store, job.req, lease, SETTINGS)
    assert res.ok
    manifest = await read_manifest(any_store, "ds", "job-1")
    assert manifest is not None and manifest.epoch == lease.epoch
    await assert_exactly_once(any_store, job)


async def test_a_frozen_holder_loses_the_lock_and_stops_while_the_next_one_recovers(
    any_store: ObjectStore,
) -> None:
    job = await stage_job(any_store, "ds", "job-1")
    frozen = False
    # Worker A's lock traffic: once A is "frozen", none of its lock writes get through.
    a_lock_store = FaultStore(any_store, throttle=lambda key, op: frozen)
    lock_a = StorageLock(a_lock_store, "ds", owner="worker-a", settings=SHORT)
    lease_a = await lock_a.acquire(timeout=10)
    gated = FaultStore(any_store, gate_at=4)  # A stops inside its publish phase
    a_task = asyncio.create_task(commit_dataset(gated, job.req, lease_a, SETTINGS))
    try:
        await gated.parked.wait()
        frozen = True
        async with StorageLock(any_store, "ds", owner="worker-b", settings=SHORT).hold(timeout=10) as lease_b:
            assert lease_b.epoch > lease_a.epoch
            assert lease_b.took_over_from == "worker-a"
            res = await commit_dataset(any_store, job.req, lease_b, SETTINGS)
            assert res.ok and res.recovered
        # A wakes up: its lease has run out locally, so it stops before its next step.
        gated.gate.set()
        try:
            await a_task
        except LockLost:
            pass
        else:
            raise AssertionError("the frozen holder carried on without its lock")
    finally:
        gated.gate.set()
        frozen = False
        with contextlib.suppress(LockLost, TransientError, OutcomeUnknown):
            await lease_a.release()
        if not a_task.done():
            a_task.cancel()
            with contextlib.suppress(BaseException):
                await a_task
    # The manifest records the epoch that planned the commit (A's): B finished A's sequence.
    manifest = await read_manifest(any_store, "ds", "job-1")
    assert manifest is not None and manifest.epoch == lease_a.epoch
    await assert_exactly_once(any_store, job)
