"""Nothing stays in flight forever, under a loaded CPU and a store that freezes again and again.

A fleet of real processes on the S3 emulator; two busy-loop processes load the CPU; the emulator's
process group is frozen (SIGSTOP) for longer than the lock's validity several times while commits run,
then thawed (SIGCONT). Every dataset must end committed exactly once within a bound (the retry budget
plus the lock validity plus the freezes themselves), no work may be left on any in-flight board, and
the audit must be clean. Runs with ``pytest -m chaos`` (about a minute).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from shared.commit import audit
from shared.events import Committed
from tests._support.emulators import Emulator
from tests._support.fleet_checks import admin_events, committed, no_staging_left, no_wal_left
from tests._support.fleet_jobs import failed_job, good_job
from tests._support.process_fleet import Fleet
from tests._support.wait import wait_for
from workers import read_in_flight

VALIDITY = 3.0
RETRY_BUDGET = 60.0


@pytest.fixture
def fleet_backend() -> str:
    return "s3"


@pytest.fixture
def fleet_overrides() -> dict[str, Any]:
    return {
        "lock": {"validity": VALIDITY, "renew_interval": 0.8, "max_drift": 0.2, "poll_max": 0.5},
        "commit": {"retry": {"attempts": 30, "initial": 0.05, "maximum": 2.0, "budget": RETRY_BUDGET}},
    }


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two busy-loop processes for the length of the test (ended by their pids)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _signal(emu: Emulator, sig: signal.Signals) -> None:
    assert emu.proc is not None
    os.killpg(emu.proc.pid, sig)


@pytest.mark.chaos
@pytest.mark.timeout(600)
async def test_frozen_store_under_cpu_load_leaves_nothing_in_flight(
    fleet: Fleet, s3_emulator: Emulator, cpu_load: None
) -> None:
    if s3_emulator.proc is None:
        pytest.skip("the S3 emulator runs in a container: no process to freeze")
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=90, what="2 workers")
    rng = random.Random(8)
    datasets = [f"fz-{i:03d}" for i in range(24)]
    events = await good_job(fleet.store, "job-f", datasets, tasks=3)
    events += await failed_job(fleet.store, "bad-f", datasets[:4], tasks=2)
    await fleet.publisher.publish_many(events)
    frozen_for = 0.0
    try:
        for _ in range(5):
            # Frozen longer than the lock's validity: renewals and commit steps hang, leases run out.
            pause = rng.uniform(VALIDITY + 0.5, VALIDITY + 2.5)
            _signal(s3_emulator, signal.SIGSTOP)
            await asyncio.sleep(pause)  # the fault itself, not a synchronisation
            frozen_for += pause
            _signal(s3_emulator, signal.SIGCONT)
            await asyncio.sleep(rng.uniform(0.5, 1.5))
    finally:
        _signal(s3_emulator, signal.SIGCONT)
    thawed = time.monotonic()
    bound = RETRY_BUDGET + VALIDITY + 30.0
    await wait_for(
        lambda: committed(fleet.store, datasets, "job-f"), timeout=bound, interval=0.3, what="every commit"
    )
    await wait_for(
        lambda: no_staging_left(fleet.store, "bad-f"), timeout=bound, what="the failed job's abort"
    )
    await wait_for(lambda: no_wal_left(fleet.store), timeout=bound, what="every commit sequence finished")

    async def boards_empty() -> bool:
        return not await read_in_flight(fleet.redis, fleet.keys, fleet.settings.fleet.shards)

    await wait_for(boards_empty, timeout=bound, what="nothing left in flight")
    settled_s = time.monotonic() - thawed
    rep = await audit(fleet.store)
    assert rep.ok, rep.violations[:20]
    assert rep.manifests == len(datasets)
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    counts = Counter(e.dataset for e in evs if isinstance(e, Committed) and e.job == "job-f")
    assert counts == Counter(dict.fromkeys(datasets, 1))
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} died"
    logs = "".join(p.output() for p in fleet.procs)
    sys.stderr.write(
        f"\nfrozen {frozen_for:.1f}s in 5 pauses; settled {settled_s:.1f}s after the last thaw; "
        f"lock losses logged: {logs.count('lock lost')}; retries logged: {logs.count('retrying')}\n"
    )
