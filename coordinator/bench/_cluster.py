"""``commitfleet bench cluster``: one fleet workload on one Redis node and on a 3-master Redis Cluster.

For each backend (a throwaway ``redis-server``; a throwaway cluster of 3
masters + 3 replicas) and each worker count (2, 4, 8 by default), a fresh
fleet of a coordinator and N worker processes commits the same workload
(:func:`._fleet.run_fleet`), and the table shows datasets committed
per second (the median of ``rounds`` runs), and each rate relative to the
first row (one node, fewest workers), all measured in the same run. Runs
alternate between the backends per worker count (which goes first swaps
every round), so a change of machine load hits both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import redis
from rich.console import Console
from rich.table import Table

from coordinator.demo import ThrowawayRedis, free_port
from shared import Settings

from ._commit import ModeResult, Workload
from ._fleet import fleet_settings, run_fleet

_NODES = 6  # 3 masters + 3 replicas


class ThrowawayRedisCluster:
    """A private Redis Cluster (3 masters, 3 replicas) on free loopback ports, no persistence."""

    def __init__(self, work: Path) -> None:
        """Start six cluster-enabled servers, join them, wait until the cluster is ok and replicas synced.

        Raises:
            RuntimeError: redis-server / redis-cli missing, or the cluster did not form within 30 s.
        """
        exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if exe is None or cli is None:
            raise RuntimeError("redis-server / redis-cli not found: run `make bootstrap`")
        self.ports = [free_port() for _ in range(_NODES)]
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for port in self.ports:
                folder = work / f"cluster-{port}"
                folder.mkdir(parents=True)
                argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                argv += ["--dir", str(folder), "--cluster-enabled", "yes", "--cluster-port", str(free_port())]
                argv += [
                    "--cluster-config-file",
                    str(folder / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                ]
                argv += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
                self.procs.append(
                    subprocess.Popen(
                        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                    )
                )
            self._wait(lambda: all(self._ping(p) for p in self.ports), "the servers to answer")
            create = [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in self.ports]]
            done = subprocess.run(
                [*create, "--cluster-replicas", "1", "--cluster-yes"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-500:]!r}")
            self._wait(lambda: all(self._settled(p) for p in self.ports), "the cluster to settle")
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait(check: object, what: str) -> None:
        deadline = time.monotonic() + 30
        while not check():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.1)

    @staticmethod
    def _ping(port: int) -> bool:
        try:
            with redis.Redis(port=port, socket_timeout=0.5) as r:
                return bool(r.ping())
        except (redis.RedisError, OSError):
            return False

    @staticmethod
    def _settled(port: int) -> bool:
        try:
            with redis.Redis(port=port, socket_timeout=1.0) as r:
                info = r.execute_command("CLUSTER", "INFO")
                repl = r.info("replication")
        except (redis.RedisError, OSError):
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        ok = "cluster_state:ok" in text and "cluster_slots_ok:16384" in text
        return ok and (repl.get("role") != "slave" or repl.get("master_link_status") == "up")

    @property
    def url(self) -> str:
        """The cluster's ``redis+cluster://`` URL (three seeds)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])

    def stop(self) -> None:
        """Stop every server by its process group id (SIGTERM, then SIGKILL); safe to call twice."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


@dataclass(frozen=True, slots=True)
class ScalingRow:
    """One (backend, worker count): the figures of each of its rounds."""

    backend: str
    workers: int
    results: tuple[ModeResult, ...]

    @property
    def rate(self) -> float:
        """Return the median datasets/s over the rounds."""
        return statistics.median(r.rate for r in self.results)


async def run_cluster_bench(
    settings: Settings, w: Workload, *, worker_counts: list[int], console: Console, rounds: int = 1
) -> list[ScalingRow]:
    """Run the fleet mode on one node and on a 3-master cluster for each worker count; print the table.

    Uses the configured store (a temporary local one when none). Returns the rows.

    Raises:
        TimeoutError: a fleet did not commit everything in time.
        RuntimeError: a throwaway server or the cluster did not start.
    """
    work = Path(tempfile.mkdtemp(prefix="commitfleet-bench-cluster-"))
    node: ThrowawayRedis | None = None
    cluster: ThrowawayRedisCluster | None = None
    try:
        if not settings.store.url:
            (work / "store").mkdir()
            store = msgspec.structs.replace(settings.store, url=(work / "store").as_uri())
            settings = msgspec.structs.replace(settings, store=store)
        node = ThrowawayRedis(work)
        cluster = ThrowawayRedisCluster(work)
        backends = {"one node": node.url, "cluster, 3 masters": cluster.url}
        console.print(
            f"cluster benchmark: {w.datasets} datasets x {w.files} files of {w.size} B per run on "
            f"{settings.store.url}, workers {worker_counts}, "
            f"redis.wait_replicas {settings.redis.wait_replicas}"
        )
        runs: dict[tuple[str, int], list[ModeResult]] = {(b, n): [] for n in worker_counts for b in backends}
        limit = max(180.0, w.datasets * w.files * 0.1)
        for i in range(rounds):
            for n in worker_counts:
                order = list(backends.items())
                for backend, url in order if i % 2 == 0 else order[::-1]:
                    run = replace(w, tag=os.urandom(3).hex())
                    result = await run_fleet(fleet_settings(settings, url), run, n, work, limit)
                    runs[(backend, n)].append(result)
                    console.print(f"round {i + 1}: {backend}, {n} workers: {result.rate:.1f} datasets/s")
        rows = [ScalingRow(b, n, tuple(results)) for (b, n), results in runs.items()]
        _print(rows, console)
        return rows
    finally:
        if cluster is not None:
            cluster.stop()
        if node is not None:
            node.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(work)


def _print(rows: list[ScalingRow], console: Console) -> None:
    ordered = sorted(rows, key=lambda r: (r.backend != "one node", r.workers))
    first = ordered[0].rate if ordered else 0.0
    table = Table(
        "backend", "workers", "datasets/s (median)", "x first row", "each round", "worker CPU ms/dataset"
    )
    for row in ordered:
        cpus = [r.cpu_seconds / r.datasets for r in row.results if r.cpu_seconds is not None]
        cpu = f"{1000 * statistics.median(cpus):.1f}" if cpus else "-"
        ratio = f"{row.rate / first:.2f}" if first else "-"
        each = " ".join(f"{r.rate:.1f}" for r in row.results)
        table.add_row(row.backend, str(row.workers), f"{row.rate:.1f}", ratio, each, cpu)
    console.print(table)


__all__ = ["ScalingRow", "ThrowawayRedisCluster", "run_cluster_bench"]
