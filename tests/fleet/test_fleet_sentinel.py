"""The multi-process fleet through real Sentinel failovers: ``pytest -m ha`` (``make redis-ha``).

A master, two replicas and three Sentinels (tests/_support/redis_sentinel.py);
every process of the fleet (a coordinator, three workers) and the test's
producer reach the master through the ``redis+sentinel://`` URL. A steady
producer publishes 21 jobs of 10 datasets (210 datasets, each with a retried
task and a duplicate delivery) and a failed job of 10, one job about every 0.3 s,
and the master fails after the sixth job:

- ``killed``: SIGKILL; the Sentinels promote a replica;
- ``frozen``: SIGSTOP for longer than the Sentinels' down-after plus failover
  timeout (the replica is promoted meanwhile), then SIGCONT: the old master comes
  back believing it is the master until the Sentinels demote it;
- ``lagging``: the replicas cut off (SIGSTOPped, and the master's links to
  them closed, so that nothing reaches them: a network hiccup shorter than the
  Sentinels' down-after) while the producer publishes its next job (at most
  0.8 s), then the master SIGKILLed and the replicas thawed: the promoted
  replica lacks what the master acknowledged in that window. On loopback a
  replica is otherwise a fraction of a millisecond behind (and what the master
  wrote to its socket before dying still arrives), so ``killed`` alone rarely
  loses anything even without WAIT: this is the case that shows what "memory"
  risks.

With ``redis.durability = "replicas"`` (every publish, state save and admin
outcome waits for one replica: ``WAIT 1``) every dataset is committed exactly
once, every outcome event is on the admin stream exactly once, the audit is
clean and every process is still alive: no acknowledged event was lost. The
same holds, and is asserted, with ``"aof+replicas"`` (``WAITAOF 1 1``: the
master and one replica fsynced it to their append-only files), run on Redis
8.2 (:func:`~tests._support.redis_server.modern_redis_server`: the machine's
7.0 has no ``WAITAOF``) with ``appendonly yes`` on every data node, data nodes
and Sentinels alike from that binary. With ``"memory"`` the same run is made
(on 7.0) and what was lost is reported (``[figure]`` lines): a write
acknowledged by the master and not yet copied when it died is gone. What must
hold even then is asserted: nothing committed or announced twice, the audit
clean, every job published after the failover committed and announced once
(unless the Sentinels failed over twice), every process alive.

Reported: the Sentinels' promotion time, the time from the fault to the first
commit of a job published after it, and for the frozen master how long it took
writes after it was thawed before the Sentinels demoted it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio

from shared import RetryPolicy
from shared.commit import audit, read_manifest
from shared.events import Aborted, Committed, JobStarted
from shared.queue import AsyncPublisher, connect
from shared.settings import RedisSettings
from tests._support.fleet_checks import admin_events, committed, no_staging_left, no_wal_left
from tests._support.fleet_jobs import failed_job, good_job
from tests._support.process_fleet import Fleet, assert_exactly_once, report
from tests._support.redis_sentinel import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, LocalSentinelGroup
from tests._support.redis_server import modern_redis_server
from tests._support.wait import wait_for

pytestmark = pytest.mark.ha

JOBS = 21
PER_JOB = 10
FAULT_AFTER = 6  # jobs published before the master fails
JOB_TIMEOUT = 30.0
SOCKET_TIMEOUT = 2.0  # a command on a frozen master gives up after this
# Frozen for longer than the Sentinels need to declare it down and fail over.
FREEZE_S = (DOWN_AFTER_MS + FAILOVER_TIMEOUT_MS) / 1000 + 1.0
LAG_S = 0.8  # the replicas' hiccup before the master dies, at most (shorter than DOWN_AFTER_MS)


LEVELS = ["replicas", "aof+replicas", "memory"]
# WAITAOF's replica part waits for the replica's once-a-second acknowledgement (docs/queue.md, "Durability").
WAIT_TIMEOUT = {"replicas": 2.0, "aof+replicas": 3.0, "memory": 2.0}


@pytest.fixture
def level(request: pytest.FixtureRequest) -> str:
    """``redis.durability``: "replicas", "aof+replicas" or "memory"; parametrized indirectly."""
    return str(request.param)


@pytest.fixture
def redis_sentinel(tmp_path: Path, level: str) -> Iterator[LocalSentinelGroup]:
    """A fresh group per test; for the ``aof`` level on Redis 8.2 with ``appendonly yes`` everywhere."""
    aof = level.startswith("aof")
    group = LocalSentinelGroup(
        tmp_path / "sentinel-group", binary=modern_redis_server() if aof else None, appendonly=aof
    )
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def redis_url(redis_sentinel_url: str) -> str:
    """The fleet fixture's Redis: the Sentinel group."""
    return redis_sentinel_url


@pytest.fixture
async def redis_client(redis_sentinel_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """The test's own client (its reads and the producer's publishes), through the Sentinels."""
    client = connect(RedisSettings(url=redis_sentinel_url, socket_timeout=SOCKET_TIMEOUT))
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fleet_overrides(level: str) -> dict[str, Any]:
    """The durability level as asked; retries that outlast a failover (a few seconds here); a short job
    timeout."""
    retry = {"attempts": 30, "initial": 0.05, "maximum": 0.5, "budget": 30.0}
    return {
        "redis": {"durability": level, "wait_timeout": WAIT_TIMEOUT[level], "socket_timeout": SOCKET_TIMEOUT},
        "commit": {"retry": retry},
        "worker": {"job_timeout": JOB_TIMEOUT},
    }


class Run:
    """What the producer published and when (monotonic seconds)."""

    def __init__(self) -> None:
        self.jobs = {f"j{k:02d}": [f"j{k:02d}-ds{i}" for i in range(PER_JOB)] for k in range(JOBS)}
        self.bad = [f"bad-ds{i}" for i in range(PER_JOB)]
        self.started: dict[str, float] = {}
        self.acked: dict[str, float] = {}
        self.retries = 0
        self.faulted = asyncio.Event()
        # "lagging": the replicas are cut off (window), the next job is published inside it (in_window).
        self.window = asyncio.Event()
        self.in_window = asyncio.Event()
        self.window_job = ""
        self.promoted_at = 0.0  # when the Sentinels' new master was serving (monotonic)
        self.new_master = 0  # its port
        self.final_master = 0  # the master's port once the fleet is done (another one: a second failover)

    def expected(self) -> set[tuple[str, str]]:
        return {(ds, job) for job, names in self.jobs.items() for ds in names}


async def produce(fleet: Fleet, run: Run, fault: str) -> None:
    """Publish the jobs one by one (the failed one in the middle); after FAULT_AFTER jobs and j00's commit,
    set ``run.faulted`` (and, for "lagging", publish the next job inside the replicas' window)."""

    def counted(_attempt: int, _exc: BaseException) -> None:
        run.retries += 1

    publisher = AsyncPublisher(
        fleet.redis,
        fleet.settings.fleet.name,
        fleet.settings.fleet.shards,
        durability=fleet.settings.redis.durable,
        policy=RetryPolicy(attempts=200, initial=0.05, maximum=0.5, budget=60.0),
        on_retry=counted,
    )
    for k, (job, names) in enumerate(run.jobs.items()):
        evs = await good_job(fleet.store, job, names, tasks=2)
        assert isinstance(evs[0], JobStarted)
        evs[0] = msgspec.structs.replace(evs[0], timeout_s=JOB_TIMEOUT)
        if k == JOBS // 2:
            bad = await failed_job(fleet.store, "bad", run.bad, tasks=2)
            evs += bad
        if k == FAULT_AFTER and fault == "lagging":
            await run.window.wait()
            run.window_job = job
        run.started[job] = time.monotonic()
        await publisher.publish_many(evs)
        run.acked[job] = time.monotonic()
        if run.window_job == job:
            run.in_window.set()
        if k + 1 == FAULT_AFTER:
            await wait_for(lambda: committed(fleet.store, run.jobs["j00"], "j00"), timeout=60, what="j00")
            run.faulted.set()
        await asyncio.sleep(0.3)  # a steady producer, not a burst


async def first_commit_after(fleet: Fleet, run: Run, fault_at: float) -> float:
    """Return when a dataset of a job whose publish started after ``fault_at`` was first committed."""
    while True:
        for job, started in list(run.started.items()):
            if started > fault_at and await read_manifest(fleet.store, run.jobs[job][0], job) is not None:
                return time.monotonic()
        await asyncio.sleep(0.05)


# What a master serves that is not the fleet's: the Sentinels, replication, our own probes.
_NOT_THE_FLEET = {
    "publish",
    "ping",
    "info",
    "role",
    "client",
    "hello",
    "auth",
    "replconf",
    "psync",
    "sync",
    "subscribe",
    "command",
    "config",
    "slaveof",
    "replicaof",
    "multi",
    "exec",
}


def fleet_commands(group: LocalSentinelGroup, port: int) -> Counter[str]:
    """Return how many times the node on ``port`` ran each command of the fleet (INFO commandstats)."""
    client = group.node(port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    out: Counter[str] = Counter()
    for name, stat in stats.items():
        command = name.removeprefix("cmdstat_").split("|")[0]
        if command not in _NOT_THE_FLEET:
            out[command] += int(stat["calls"])
    return out


async def watch_thawed(group: LocalSentinelGroup, port: int, until: float) -> tuple[float, Counter[str]]:
    """Sample the thawed old master until it is a replica; return (seconds it still said it was the
    master, the fleet's commands it ran as such, counted from its last sample as a master)."""
    start = time.monotonic()
    seen: Counter[str] = Counter()
    while time.monotonic() < until:
        try:
            role = await asyncio.to_thread(group.role_of, port)
            if role != "master":
                break
            seen = await asyncio.to_thread(fleet_commands, group, port)
        except redis.RedisError:
            pass
        await asyncio.sleep(0.05)
    return time.monotonic() - start, seen


async def through_a_failover(fleet: Fleet, group: LocalSentinelGroup, fault: str, level: str) -> Run:
    """Run the fleet and the producer, fail the master after FAULT_AFTER jobs; return the run."""
    fleet.start("coordinator", "c1")
    for i in (1, 2, 3):
        fleet.start("worker", f"w{i}")
    await wait_for(
        lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="3 workers own all shards"
    )
    run = Run()
    began = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        producing = tg.create_task(produce(fleet, run, fault))
        await run.faulted.wait()
        if fault == "lagging":
            lagging = group.replicas()
            for r in lagging:
                r.freeze()
            assert group.cut_replication() == len(lagging)
            run.window.set()
            # The hiccup lasts until the producer's next job is published (acknowledged without WAIT;
            # with WAIT its publish waits for replicas it cannot have) or LAG_S, whichever comes first.
            try:
                await asyncio.wait_for(run.in_window.wait(), LAG_S)
            except TimeoutError:
                pass
        fault_at = time.monotonic()
        before = fleet_commands(group, group.master_port()) if fault == "frozen" else Counter()
        old = group.freeze_master() if fault == "frozen" else group.kill_master()
        if fault == "lagging":
            for r in lagging:
                r.thaw()
        first = tg.create_task(first_commit_after(fleet, run, fault_at))
        new = await asyncio.to_thread(group.wait_failover, old)
        run.promoted_at = time.monotonic()
        run.new_master = new.port
        promoted = run.promoted_at - fault_at
        if fault == "frozen":
            await asyncio.sleep(max(0.0, fault_at + FREEZE_S - time.monotonic()))  # the freeze's length
            group.thaw(old)
            thawed = time.monotonic()
            as_master, seen = await watch_thawed(group, old.port, thawed + 60)
            await asyncio.to_thread(group.wait_demoted, old)
            took = +(seen - before)
            report(
                f"[{level}] old master :{old.port} thawed after {thawed - fault_at:.1f}s, still a master for "
                f"{as_master:.1f}s, ran {sum(took.values())} commands of the fleet meanwhile {dict(took)}, "
                f"then a replica of :{new.port}"
            )
            assert group.role(old) == "slave"
        first_at = await asyncio.wait_for(first, timeout=120)
        report(
            f"[{level}] master :{old.port} {fault}: :{new.port} promoted after {promoted:.1f}s, "
            "first commit of "
            f"a job published after the fault {first_at - fault_at:.1f}s after it"
        )
    producing.result()
    final = await asyncio.to_thread(group.master_port)
    report(
        f"[{level}] {len(run.acked)} jobs published in {time.monotonic() - began:.1f}s, "
        f"{run.retries} publish retries"
        + (f"; the Sentinels failed over again, to :{final}" if final != new.port else "")
    )
    return run


async def all_resolved(fleet: Fleet, run: Run) -> tuple[set[str], Counter[tuple[str, str]], Counter[str]]:
    """Return (datasets committed in the store, Committed events per (dataset, job), aborts per job)."""
    done = set()
    for job, names in run.jobs.items():
        for ds in names:
            if await read_manifest(fleet.store, ds, job) is not None:
                done.add(ds)
    evs = await admin_events(fleet.redis, fleet.settings.fleet.name)
    commits = Counter((e.dataset, e.job) for e in evs if isinstance(e, Committed))
    aborts = Counter(e.job for e in evs if isinstance(e, Aborted))
    return done, commits, aborts


async def check_replicas(fleet: Fleet, run: Run) -> None:
    """With "replicas" or "aof+replicas": everything committed once, every outcome announced once."""
    for job, names in run.jobs.items():
        await wait_for(
            lambda j=job, n=names: committed(fleet.store, n, j), timeout=180, interval=0.5, what=job
        )
    for job in [*run.jobs, "bad"]:
        await wait_for(lambda j=job: no_staging_left(fleet.store, j), timeout=60, what=f"{job} staging gone")

    async def bad_aborted() -> bool:
        _done, _commits, aborts = await all_resolved(fleet, run)
        return aborts["bad"] >= PER_JOB

    await wait_for(bad_aborted, timeout=60, what="the failed job's aborts")
    await assert_exactly_once(fleet, run.expected())
    _done, _commits, aborts = await all_resolved(fleet, run)
    assert aborts == Counter({"bad": PER_JOB}), aborts
    await wait_for(
        lambda: fleet.owners_settled({"w1", "w2", "w3"}), timeout=60, what="3 workers own all shards again"
    )
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited after the failover"


async def check_memory(fleet: Fleet, group: LocalSentinelGroup, run: Run, fault: str) -> None:
    """With "memory": report what was lost and how the fleet came back; assert what holds anyway.

    A write the master acknowledged and died with is gone: a job whose every event was lost is
    unknown to the fleet (only its producer, waiting for the outcome, can notice); one that lost
    some ends at its timeout (aborted); an announcement lost after the worker saved the dataset's
    status is never made again. Asserted: nothing committed or announced twice, the audit clean,
    every job published after the failover committed and announced once (unless the Sentinels
    failed over a second time: a write the first promoted master took can be lost then too),
    every process alive.
    """
    after = [job for job in run.jobs if run.started[job] > run.promoted_at]
    run.final_master = await asyncio.to_thread(group.master_port)
    second = run.final_master != run.new_master  # the Sentinels failed over once more: more can be lost
    for job in [] if second else after:
        names = run.jobs[job]
        await wait_for(
            lambda j=job, n=names: committed(fleet.store, n, j), timeout=120, interval=0.5, what=job
        )

    async def ended() -> bool:
        done, _commits, aborts = await all_resolved(fleet, run)
        return all(set(names) <= done or aborts[job] for job, names in run.jobs.items())

    try:  # a job that lost some of its events ends at its timeout
        await wait_for(ended, timeout=JOB_TIMEOUT + 10, interval=0.5, what="every job committed or aborted")
    except AssertionError:
        pass  # reported below: a job the fleet never heard of

    async def announced() -> bool:  # a commit is announced after its sequence ended: wait for it
        done, commits, _aborts = await all_resolved(fleet, run)
        return await no_wal_left(fleet.store) and all(
            commits[(ds, job)] for job, names in run.jobs.items() for ds in names if ds in done
        )

    try:
        await wait_for(announced, timeout=20, interval=0.5, what="every commit announced")
    except AssertionError:
        pass  # reported below: an announcement lost with the master
    done, commits, aborts = await all_resolved(fleet, run)
    expected = run.expected()
    unannounced = sorted(job for ds, job in expected if ds in done and commits[(ds, job)] == 0)
    doubled = {k: n for k, n in commits.items() if n > 1}
    never = [job for job, names in run.jobs.items() if not set(names) & done and not aborts[job]]
    partly = [job for job, names in run.jobs.items() if set(names) & done and not set(names) <= done]
    report(
        f"[memory] {fault}: {len(done)} of {len(expected)} datasets committed; jobs aborted "
        f"{dict(aborts)}; jobs never ended (unknown to the fleet) {never}; jobs partly committed {partly}; "
        f"committed but never announced: {dict(Counter(unannounced))}; announced twice {doubled}; "
        f"the job published while the replicas were cut off: {run.window_job or '-'}"
        + (f"; a second failover (:{run.new_master} -> :{run.final_master})" if second else "")
    )
    rep = await audit(fleet.store)
    assert rep.ok, rep.violations[:20]
    assert not doubled, doubled
    assert set(commits) <= expected, set(commits) - expected
    for job in [] if second else after:
        assert all(commits[(ds, job)] == 1 for ds in run.jobs[job]), (job, unannounced)
    for p in fleet.procs:
        assert p.proc.poll() is None, f"{p.name} exited after the failover"


@pytest.mark.parametrize("level", LEVELS, indirect=True)
@pytest.mark.parametrize("fault", ["killed", "lagging"])
async def test_master_killed(
    fleet: Fleet, redis_sentinel: LocalSentinelGroup, level: str, fault: str
) -> None:
    run = await through_a_failover(fleet, redis_sentinel, fault, level)
    if level == "memory":
        await check_memory(fleet, redis_sentinel, run, fault)
    else:
        await check_replicas(fleet, run)


@pytest.mark.parametrize("level", LEVELS, indirect=True)
async def test_master_frozen_past_the_failover_then_thawed(
    fleet: Fleet, redis_sentinel: LocalSentinelGroup, level: str
) -> None:
    run = await through_a_failover(fleet, redis_sentinel, "frozen", level)
    if level == "memory":
        await check_memory(fleet, redis_sentinel, run, "frozen")
    else:
        await check_replicas(fleet, run)
