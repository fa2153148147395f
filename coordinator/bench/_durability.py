"""``commitfleet bench intake|commit --durability LEVELS``: each durability level against ``memory``, one run.

The bench starts a throwaway master and one replica of it (both with
``appendonly yes`` when an ``aof`` level is measured, so that ``memory``
runs on the same servers as the levels it is compared with), then, round
after round, measures every level on them: the worker's intake (events/s
through one worker, as ``bench intake``) or the fleet's commits (datasets/s
through a coordinator and worker processes, as ``bench commit``'s fleet
mode, plus the p50 from ``job_finished`` to ``committed`` of a dataset
alone). The levels' order turns round each round, and the table gives each
level's median and its ratio to ``memory``'s median of the same run.

The ``aof`` levels need ``WAITAOF`` (Redis 7.2+): ``--redis-server PATH``
names such a server (by default the ``redis-server`` on the PATH);
``--appendfsync`` is both servers' (``everysec``, Redis's default, or ``always``). A level
the server cannot give stops the bench with the fleet's own one-line refusal.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import redis
from rich.console import Console
from rich.table import Table

from coordinator.demo import ThrowawayRedis
from shared import ConfigError, Settings
from shared.settings import LEVELS, resolve_durability

from ._commit import Workload
from ._fleet import fleet_settings, run_fleet
from ._intake import _bench_settings, measure_intake_cpu

BENCH_WAIT_TIMEOUT = 5.0
"""``redis.wait_timeout`` of the bench's fleets: a replica acknowledges ``WAITAOF`` about once a second."""

_LATENCY_SAMPLES = 3


@dataclass(frozen=True, slots=True)
class LevelRow:
    """One level: the figures of each round (events/s or datasets/s; latency p50 for commits)."""

    level: str
    rates: tuple[float, ...]
    latencies: tuple[float, ...] = ()

    @property
    def rate(self) -> float:
        """Return the median rate over the rounds."""
        return statistics.median(self.rates)


def parse_levels(text: str) -> list[str]:
    """Return ``memory`` and the levels of ``text`` (comma-separated, or ``all``), in order, once each.

    Raises:
        ConfigError: an unknown level (one line).
    """
    asked = list(LEVELS) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    for level in asked:
        if level not in LEVELS:
            raise ConfigError(f"--durability takes {', '.join(LEVELS)} or all, got {level!r}")
    return list(dict.fromkeys(["memory", *asked]))


class ReplicatedRedis:
    """A throwaway master and one replica, synced, on free loopback ports (AOF on both when asked)."""

    def __init__(self, work: Path, *, binary: str | None, aof: bool, appendfsync: str = "everysec") -> None:
        """Start both and wait until the replica is online (``appendfsync``: both servers', with ``aof``).

        Raises:
            RuntimeError: a server did not start, or the replica did not sync within 30 s.
        """
        persist = ["--appendonly", "yes", "--appendfsync", appendfsync] if aof else []
        (work / "master").mkdir(parents=True)
        (work / "replica").mkdir(parents=True)
        self.master = ThrowawayRedis(work / "master", binary=binary, args=persist)
        try:
            replica_args = [*persist, "--replicaof", "127.0.0.1", str(self.master.port)]
            replica_args += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
            self.replica = ThrowawayRedis(work / "replica", binary=binary, args=replica_args)
        except BaseException:
            self.master.stop()
            raise
        try:
            self._wait_synced()
        except BaseException:
            self.stop()
            raise

    def _wait_synced(self) -> None:
        deadline = time.monotonic() + 30
        with (
            redis.Redis(port=self.master.port, socket_timeout=2.0) as m,
            redis.Redis(port=self.replica.port, socket_timeout=2.0) as r,
        ):
            while True:
                online = int(m.info("replication").get("connected_slaves", 0))
                if online >= 1 and r.info("replication").get("master_link_status") == "up":
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench's replica did not sync with its master within 30 s")
                time.sleep(0.05)
            self.version = str(m.info("server").get("valkey_version") or m.info("server")["redis_version"])

    @property
    def url(self) -> str:
        """The master's URL."""
        return self.master.url

    def stop(self) -> None:
        """Stop both servers; safe to call twice."""
        self.replica.stop()
        self.master.stop()


def _with_level(settings: Settings, level: str) -> Settings:
    replicas = 1 if level in ("replicas", "aof+replicas") else 0
    redis_settings = msgspec.structs.replace(
        settings.redis, durability=level, wait_replicas=replicas, wait_timeout=BENCH_WAIT_TIMEOUT
    )
    resolve_durability(level, replicas, BENCH_WAIT_TIMEOUT)
    return msgspec.structs.replace(settings, redis=redis_settings)


async def run_durability_bench(
    settings: Settings,
    what: str,
    levels: Sequence[str],
    *,
    console: Console,
    rounds: int = 3,
    events: int = 20_000,
    workload: Workload | None = None,
    workers: int = 2,
    redis_server: str | None = None,
    appendfsync: str = "everysec",
) -> list[LevelRow]:
    """Measure ``what`` (intake or commit) at each level of ``levels`` (``memory`` first); print a table.

    Uses the configured store for commits (a temporary local one when none).
    Returns one row per level.

    Raises:
        ConfigError: the server cannot give a level (the fleet's refusal).
        TimeoutError: a run did not finish in time.
        RuntimeError: a throwaway server did not start.
    """
    work = Path(tempfile.mkdtemp(prefix="commitfleet-bench-durability-"))
    servers: ReplicatedRedis | None = None
    w = workload or Workload(datasets=200, files=4, size=4096)
    try:
        if not settings.store.url:
            (work / "store").mkdir()
            store = msgspec.structs.replace(settings.store, url=(work / "store").as_uri())
            settings = msgspec.structs.replace(settings, store=store)
        aof = any(level.startswith("aof") for level in levels)
        servers = ReplicatedRedis(work / "redis", binary=redis_server, aof=aof, appendfsync=appendfsync)
        size = (
            f"{events} events"
            if what == "intake"
            else f"{w.datasets} datasets x {w.files} files, {workers} workers"
        )
        console.print(
            f"durability benchmark ({what}): {size}; a master and one replica ({servers.version}, "
            f"appendonly {'yes, appendfsync ' + appendfsync if aof else 'no'}), redis.wait_timeout "
            f"{BENCH_WAIT_TIMEOUT} s, {rounds} rounds, levels in turned order each round"
        )
        rates: dict[str, list[float]] = {level: [] for level in levels}
        latencies: dict[str, list[float]] = {level: [] for level in levels}
        for i in range(rounds):
            order = list(levels) if i % 2 == 0 else list(levels)[::-1]
            for level in order:
                if what == "intake":
                    s = _with_level(_bench_settings(servers.url, work / f"store-{i}-{level}"), level)
                    rate, _cpu = await measure_intake_cpu(s, events)
                    console.print(f"round {i + 1}: {level}: intake {rate:,.0f} events/s")
                else:
                    s = _with_level(fleet_settings(settings, servers.url), level)
                    run = replace(w, tag=f"{i}{level.replace('+', '')}")
                    limit = max(300.0, w.datasets * w.files * 0.2)
                    result = await run_fleet(s, run, workers, work, limit, samples=_LATENCY_SAMPLES)
                    rate = result.rate
                    latencies[level].append(result.latency_p50_s or 0.0)
                    console.print(
                        f"round {i + 1}: {level}: {rate:.1f} datasets/s, one dataset alone "
                        f"job_finished -> committed p50 {1000 * (result.latency_p50_s or 0):.0f} ms"
                    )
                rates[level].append(rate)
        rows = [LevelRow(level, tuple(rates[level]), tuple(latencies[level])) for level in levels]
        _print(rows, what, console)
        return rows
    finally:
        if servers is not None:
            servers.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)


def _print(rows: list[LevelRow], what: str, console: Console) -> None:
    unit = "events/s" if what == "intake" else "datasets/s"
    base = rows[0].rate if rows else 0.0
    columns = ["level", f"{unit} (median)", "x memory", "each round"]
    if what == "commit":
        columns.append("alone: job_finished -> committed p50 (ms)")
    table = Table(*columns)
    for row in rows:
        cells = [row.level, f"{row.rate:,.1f}", f"{row.rate / base:.2f}" if base else "-"]
        cells.append(" ".join(f"{r:,.1f}" for r in row.rates))
        if what == "commit":
            cells.append(f"{1000 * statistics.median(row.latencies):.0f}" if row.latencies else "-")
        table.add_row(*cells)
    console.print(table)


__all__ = ["LevelRow", "ReplicatedRedis", "parse_levels", "run_durability_bench"]
