"""A real local Redis Cluster for the tests: 3 masters + 3 replicas on free loopback ports.

``RedisCluster.start()`` starts six ``redis-server --cluster-enabled yes``
processes (each in its own process group, its own folder), joins them with
``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`` and
waits (with a deadline) until every node reports ``cluster_state:ok`` and
agrees on the slot map. ``stop()`` signals each server's process group by
its id. ``kill_master_of(key)`` SIGKILLs the master owning a key's slot and
returns its node; the cluster's failover promotes that master's replica
(``cluster-node-timeout`` is short here, so within a few seconds).

Fixtures (registered by tests/conftest.py): ``redis_cluster`` (one cluster
per test module, stopped at its end) and ``redis_cluster_url`` (its
``redis+cluster://`` URL after FLUSHALL on every master).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import redis.cluster

from tests._support.ports import free_port
from tests._support.redis_server import RedisServer

NODE_TIMEOUT_MS = 1500
READY_TIMEOUT = 30.0
_ALL = "16384"  # slots


def _info(port: int) -> dict[str, str]:
    """Return the node's CLUSTER INFO and INFO replication fields, as text.

    redis-py parses INFO into a dict (and may hand CLUSTER INFO back as text or
    as a dict): both shapes are read, so that ``role`` and
    ``master_link_status`` are really seen (reading the dict as text lost
    them, and a replica whose master had just died counted as settled).
    """
    r = redis.Redis(port=port, socket_timeout=2.0)
    try:
        replies = [r.execute_command("CLUSTER", "INFO"), r.execute_command("INFO", "replication")]
    finally:
        r.close()
    out: dict[str, str] = {}
    for reply in replies:
        if isinstance(reply, dict):
            out.update({str(k): v.decode() if isinstance(v, bytes) else str(v) for k, v in reply.items()})
            continue
        raw = reply.decode() if isinstance(reply, bytes) else str(reply)
        out.update(line.split(":", 1) for line in raw.split() if ":" in line)
    if "role" not in out or "cluster_state" not in out:
        raise RuntimeError(f"node {port}: CLUSTER INFO / INFO replication unreadable: {sorted(out)[:10]}")
    return out


def _settled(info: dict[str, str]) -> bool:
    """A node is settled when the cluster is ok and, if a replica, its link to its master is up."""
    ok = info.get("cluster_state") == "ok" and info.get("cluster_slots_ok") == _ALL
    return ok and (info.get("role") != "slave" or info.get("master_link_status") == "up")


def _poll(ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``ready()`` is true (a Redis error counts as not yet); fail the test with
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout}s", pytrace=False)
        time.sleep(0.1)


@dataclass
class LocalRedisCluster:
    """Six cluster-enabled ``redis-server`` processes joined into one cluster."""

    workdir: Path
    masters: int = 3
    servers: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])
        return f"redis+cluster://{seeds}"

    def start(self) -> None:
        """Start the nodes, create the cluster, wait until every live node is settled."""
        if shutil.which("redis-cli") is None:
            pytest.fail("redis-cli is not installed (apt-get install redis-tools)", pytrace=False)
        for i in range(self.masters * 2):
            port = free_port()
            folder = self.workdir / f"node{i}"
            args = ["--cluster-enabled", "yes", "--cluster-config-file", str(folder / "nodes.conf")]
            args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no"]
            # Replicas sync at once (no 5 s diskless-sync delay) so WAIT works soon after start.
            args += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
            # An explicit bus port: the default (port + 10000) may be taken or out of range.
            args += ["--cluster-port", str(free_port())]
            server = RedisServer(folder, extra_args=args, port=port)
            self.servers.append(server)
            server.start()
        argv = ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in self.servers]]
        argv += ["--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
        if done.returncode != 0:
            self.stop()
            pytest.fail(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r}", pytrace=False)
        self.wait_ok()

    def live(self) -> list[RedisServer]:
        return [s for s in self.servers if s.proc is not None and s.proc.poll() is None]

    def wait_ok(self, timeout: float = READY_TIMEOUT) -> None:
        """Return once every live node says ``cluster_state:ok`` (all 16384 slots) and replicas are synced."""
        _poll(self._all_settled, timeout, "redis cluster not ok")

    def _all_settled(self) -> bool:
        return all(_settled(_info(s.port)) for s in self.live())

    def client(self) -> redis.cluster.RedisCluster:
        """Return a blocking cluster client (the caller closes it)."""
        nodes = [redis.cluster.ClusterNode("127.0.0.1", s.port) for s in self.live()]  # type: ignore[no-untyped-call]
        return redis.cluster.RedisCluster(startup_nodes=nodes)

    def flushall(self) -> None:
        """Empty every master."""
        c = self.client()
        try:
            c.flushall(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        finally:
            c.close()

    def master_port_of(self, key: str) -> int:
        """Return the port of the master now serving ``key``'s slot."""
        c = self.client()
        try:
            node = c.get_node_from_key(key)
            return int(node.port)
        finally:
            c.close()

    def kill_master_of(self, key: str) -> RedisServer:
        """SIGKILL the master serving ``key``'s slot (its replica takes over); return its server.

        Call :meth:`wait_failover` before starting it again: a node that has no
        data on disk and comes back before its replica was promoted is still
        the slots' master, empty, and its replica then syncs the emptiness.
        """
        port = self.master_port_of(key)
        server = next(s for s in self.servers if s.port == port)
        server.kill()
        return server

    def wait_failover(self, key: str, killed: RedisServer, timeout: float = READY_TIMEOUT) -> None:
        """Return once ``key``'s slot is served by a node other than ``killed`` (its replica was
        promoted) and every live node is settled; fail the test after ``timeout`` seconds."""
        _poll(
            lambda: self.master_port_of(key) != killed.port and self._all_settled(),
            timeout,
            f"no replica of :{killed.port} promoted",
        )

    def stop(self) -> None:
        """Stop every node (by process group id)."""
        for s in self.servers:
            s.stop()


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """A fresh 3-master + 3-replica cluster for the module, stopped at its end."""
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: LocalRedisCluster) -> str:
    """The cluster's ``redis+cluster://`` URL, every master emptied first."""
    redis_cluster.wait_ok()
    redis_cluster.flushall()
    return redis_cluster.url


__all__ = ["LocalRedisCluster", "redis_cluster", "redis_cluster_url"]
