"""The fleet as real processes: scale, kills, freezes, coordinator failover.

Each test starts coordinators and workers as separate OS processes
(``python -m coordinator worker|coordinator``) against a real redis-server and
a local-files store, publishes jobs through the real publisher, and checks the
real outcome: manifests and files in the store, the audit, admin events.
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from shared.commit import audit
from shared.events import (
    CommitStarted,
    ShardsAssigned,
)
from shared.queue import shard_of
from tests._support.fleet_checks import (
    admin_events,
    committed,
    no_staging_left,
    no_wal_left,
)
from tests._support.fleet_checks import commit_counts as committed_counts
from tests._support.fleet_jobs import good_job
from tests._support.process_fleet import (
    Fleet,
    assert_exactly_once,
    report,
    three_workers_200_datasets,
)
from tests._support.wait import wait_for


async def commit_counts(fleet: Fleet) -> Counter[tuple[str, str]]:
    return await committed_counts(fleet.redis, fleet.settings.fleet.name)


async def test_three_workers_200_datasets(fleet: Fleet) -> None:
    await three_workers_200_datasets(fleet)


async def test_scale_out_and_in(fleet: Fleet) -> None:
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers")
    expected: set[tuple[str, str]] = set()

    async def wave(n: int) -> None:
        datasets = [f"s{n}-{i:02d}" for i in range(30)]
        await fleet.publisher.publish_many(await good_job(fleet.store, f"wave{n}", datasets, tasks=3))
        expected.update((ds, f"wave{n}") for ds in datasets)

    await wave(1)
    fleet.start("worker", "w3")
    await wave(2)
    await wait_for(lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="w3 joined")
    await wave(3)
    assert fleet.names["w1"].terminate(timeout=60) == 0
    await wave(4)
    await wait_for(lambda: fleet.owners_settled({"w2", "w3"}), timeout=60, what="w1 left")
    await wave(5)
    for n in range(1, 6):
        ds = [d for d, j in expected if j == f"wave{n}"]
        await wait_for(
            lambda ds=ds, n=n: committed(fleet.store, ds, f"wave{n}"), timeout=120, what=f"wave {n}"
        )
    await assert_exactly_once(fleet, expected)
    a = await fleet.registry.assignment(fleet.settings.fleet.shards)
    counts = sorted(len(v) for v in a.owners().values())
    assert counts[-1] - counts[0] <= 1, a.owners()


async def test_sigkill_worker_mid_commit(fleet: Fleet) -> None:
    fleet.start("coordinator", "c1")
    fleet.start("worker", "w1")
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers")
    datasets = [f"k{i:03d}" for i in range(80)]
    await fleet.publisher.publish_many(await good_job(fleet.store, "killjob", datasets, tasks=4))
    a = await fleet.registry.assignment(fleet.settings.fleet.shards)
    victims = [ds for ds in datasets if a.slots[shard_of(ds, fleet.settings.fleet.shards)].owner == "w1"]

    async def w1_committing() -> bool:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        return any(isinstance(e, CommitStarted) and e.worker == "w1" for e in evs)

    await wait_for(w1_committing, timeout=60, interval=0.01, what="w1 commits under way")
    fleet.names["w1"].kill()
    killed_at = time.monotonic()
    await wait_for(
        lambda: committed(fleet.store, victims, "killjob"),
        timeout=120,
        interval=0.2,
        what="w1's datasets committed by w2",
    )
    takeover = time.monotonic() - killed_at
    report(
        f"SIGKILL takeover: w1's {len(victims)} datasets committed by w2 {takeover:.1f}s after the kill "
        f"(lease {fleet.settings.worker.lease}s, lock validity {fleet.settings.lock.validity}s)"
    )
    await wait_for(lambda: committed(fleet.store, datasets, "killjob"), timeout=60, what="all commits")
    await wait_for(lambda: no_staging_left(fleet.store, "killjob"), timeout=60, what="no staging left")
    await wait_for(lambda: no_wal_left(fleet.store), timeout=60, what="every commit sequence finished")
    rep = await audit(fleet.store)
    assert rep.ok, rep.violations[:20]
    assert rep.manifests == len(datasets)
    counts = await commit_counts(fleet)
    # w1 may have committed some before dying; no dataset is committed twice.
    assert max(counts.values()) == 1
    assert set(counts) <= {(ds, "killjob") for ds in datasets}


# On the S3 emulator, as on any object store, a frozen client holds nothing on
# the server. (With the local-files store a process frozen inside a
# conditional write keeps that one key's stripe lock: others get a transient
# error for that key until it resumes; see docs/storage.md.)
#
# Which shards the frozen worker gets after its resume depends on which worker
# joined first (the assignment is sticky: w2, holding all 8, gives up its
# highest 4): w1 joining first holds 0-3 before and 4-7 after (its old shard
# runners are fenced), w1 joining second holds 4-7 both times (its old shard
# runners, still running, start new sessions under new owner tokens).
@pytest.mark.parametrize("fleet_backend", ["s3"])
@pytest.mark.parametrize("frozen_gets", ["other shards", "its own shards back"])
async def test_sigstop_worker_is_fenced(fleet: Fleet, frozen_gets: str) -> None:
    fleet.start("coordinator", "c1")
    first, second = ("w1", "w2") if frozen_gets == "other shards" else ("w2", "w1")
    fleet.start("worker", first)
    await wait_for(lambda: fleet.owners_settled({first}), timeout=60, what=f"{first} owns all")
    fleet.start("worker", second)
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="2 workers")
    w1_before = await _shards_of(fleet, "w1")
    datasets = [f"f{i:03d}" for i in range(60)]
    await fleet.publisher.publish_many(await good_job(fleet.store, "frozen", datasets, tasks=4))

    async def w1_committing() -> bool:
        evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
        return any(isinstance(e, CommitStarted) and e.worker == "w1" for e in evs)

    await wait_for(w1_committing, timeout=60, interval=0.01, what="w1 commits under way")
    fleet.names["w1"].signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    # The fleet moves on: w2 owns everything and finishes every commit.
    await wait_for(lambda: fleet.owners_settled({"w2"}), timeout=60, what="shards moved to w2")
    await wait_for(lambda: committed(fleet.store, datasets, "frozen"), timeout=120, what="w2 committed all")
    validity = fleet.settings.lock.validity + fleet.settings.lock.max_drift
    # Past the frozen worker's lock validity: its leases ran out locally.
    await wait_for(lambda: _elapsed(frozen_at, validity), timeout=validity + 5, what="lock validity passed")
    before = await commit_counts(fleet)
    fleet.names["w1"].signal(signal.SIGCONT)
    # More work after the resume: the stale worker must not take part in anything it no longer owns.
    more = [f"g{i:03d}" for i in range(20)]
    await fleet.publisher.publish_many(await good_job(fleet.store, "after", more, tasks=2))
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="w1 back in the fleet")
    w1_after = await _shards_of(fleet, "w1")
    assert (w1_after == w1_before) == (frozen_gets == "its own shards back"), (w1_before, w1_after)
    await wait_for(lambda: committed(fleet.store, more, "after"), timeout=120, what="post-resume commits")
    for job in ("frozen", "after"):
        await wait_for(lambda job=job: no_staging_left(fleet.store, job), timeout=60, what=f"{job} cleanup")
    await wait_for(lambda: no_wal_left(fleet.store), timeout=60, what="every commit sequence finished")
    rep = await audit(fleet.store)
    assert rep.ok, rep.violations[:20]
    counts = await commit_counts(fleet)
    assert max(counts.values()) == 1, {k: v for k, v in counts.items() if v > 1}
    for key, n in before.items():
        assert counts[key] == n
    log = fleet.names["w1"].output()
    assert "lost" in log.lower() or "fenced" in log.lower() or "expired" in log.lower(), log[-3000:]


async def _shards_of(fleet: Fleet, worker: str) -> set[int]:
    a = await fleet.registry.assignment(fleet.settings.fleet.shards)
    return {i for i, slot in enumerate(a.slots) if slot.owner == worker}


async def _elapsed(since: float, seconds: float) -> bool:
    return time.monotonic() - since >= seconds


async def test_coordinator_leader_killed_standby_takes_over(fleet: Fleet) -> None:
    fleet.start("coordinator", "c1")
    await wait_for(lambda: _leader_is(fleet, "c1"), timeout=30, what="c1 leads")
    fleet.start("coordinator", "c2")
    fleet.start("worker", "w1")
    await wait_for(lambda: fleet.owners_settled({"w1"}), timeout=60, what="w1 owns all")
    fleet.names["c1"].kill()
    killed = time.monotonic()
    await wait_for(lambda: _leader_is(fleet, "c2"), timeout=60, what="c2 leads")
    report(
        f"coordinator failover: standby leading {time.monotonic() - killed:.1f}s after SIGKILL "
        f"(lock validity {fleet.settings.lock.validity}s)"
    )
    fleet.start("worker", "w2")
    await wait_for(lambda: fleet.owners_settled({"w1", "w2"}), timeout=60, what="c2 rebalanced onto w2")
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    assert any(isinstance(e, ShardsAssigned) and e.worker == "c2" for e in evs)
    datasets = [f"c{i:02d}" for i in range(16)]
    await fleet.publisher.publish_many(await good_job(fleet.store, "afterfailover", datasets, tasks=2))
    await wait_for(lambda: committed(fleet.store, datasets, "afterfailover"), timeout=60, what="commits")


async def _leader_is(fleet: Fleet, name: str) -> bool:
    return await fleet.registry.leader() == name
