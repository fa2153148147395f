"""A real Sentinel-managed Redis for the tests: a master, two replicas and three Sentinels on loopback.

``LocalSentinelGroup.start()`` starts three ``redis-server`` processes (the
master and two ``replicaof`` it) and three ``redis-server <conf> --sentinel``
processes watching the master group :data:`SERVICE` with a quorum of 2, each
in its own process group and folder, on free loopback ports; it returns once
the replicas are synced and every Sentinel knows the other two and both
replicas. The Sentinels are quick on purpose: a master silent for
:data:`DOWN_AFTER_MS` is down, and a failover is retried after
:data:`FAILOVER_TIMEOUT_MS`, so a failover takes a few seconds.

``kill_master()`` SIGKILLs the master, ``freeze_master()`` SIGSTOPs it and
``thaw(server)`` SIGCONTs it (each signals the server's process group by its
id; ``replicas()`` are the other data nodes, to freeze them the same way);
``cut_replication()`` closes the master's links to its replicas (what it
acknowledges next reaches no replica until they reconnect);
``wait_failover(old)`` returns once every Sentinel names another master
and that master has a synced replica; ``wait_demoted(old)`` once the old
master serves as a replica of the new one. ``stop()`` stops every process.

Options: ``password`` (the data nodes' ``requirepass``, given to the Sentinels
with ``sentinel auth-pass``), ``sentinel_password`` (the Sentinels' own
``requirepass``), ``binary`` (another ``redis-server`` for every process of the
group, data nodes and Sentinels: :func:`~tests._support.redis_server.modern_redis_server`'s
Redis 8.2 for ``WAITAOF``; the machine's 7.0 by default) and ``appendonly``
(every data node with ``appendonly yes``, ``appendfsync everysec``: what the
``aof`` levels need, with Redis's default fsync policy) and ``down_after_ms``
(the Sentinels' ``down-after-milliseconds``, :data:`DOWN_AFTER_MS` by default).

Fixtures (registered by tests/conftest.py): ``redis_sentinel`` (a fresh group
per test: a failover changes it for good) and ``redis_sentinel_url``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from tests._support.redis_server import RedisServer

SERVICE = "cfmaster"
# 2 s, not less: with 1 s a just-promoted master on the loaded 2-core machine once missed the Sentinels'
# pings for a second and they failed over again (a second failover, to the other replica).
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 3000
READY_TIMEOUT = 30.0


def _poll(ready: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once ``ready()`` is true (a Redis or socket error counts as not yet); fail the test with
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout}s", pytrace=False)
        time.sleep(0.1)


@dataclass
class SentinelServer(RedisServer):
    """A ``redis-server <conf> --sentinel`` process (the config file is its own: Sentinel rewrites it)."""

    monitor_port: int = 0
    down_after_ms: int = DOWN_AFTER_MS
    auth_pass: str = ""
    requirepass: str = ""
    conf: Sequence[str] = ()
    """More sentinel.conf lines (``user ...`` ACL lines, say)."""

    def argv(self) -> list[str]:
        binary = self.binary or shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)", pytrace=False)
        conf = self.workdir / "sentinel.conf"
        if not conf.exists():
            lines = [
                f"port {self.port}",
                "bind 127.0.0.1",
                "daemonize no",
                f"dir {self.workdir}",
                f"logfile {self.logfile}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.monitor_port} 2",
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
                f"sentinel parallel-syncs {SERVICE} 2",
            ]
            if self.auth_pass:
                lines.append(f"sentinel auth-pass {SERVICE} {self.auth_pass}")
            if self.requirepass:
                lines.append(f"requirepass {self.requirepass}")
            lines += self.conf
            conf.write_text("\n".join(lines) + "\n")
        return [binary, str(conf), "--sentinel"]


@dataclass
class LocalSentinelGroup:
    """A master, two replicas and three Sentinels watching them."""

    workdir: Path
    password: str = ""
    sentinel_password: str = ""
    binary: str | None = None
    appendonly: bool = False
    down_after_ms: int = DOWN_AFTER_MS
    nodes: list[RedisServer] = field(default_factory=list)
    sentinels: list[SentinelServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The group's ``redis+sentinel://`` URL (credentials left out: add them where wanted)."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> None:
        """Start the data nodes and the Sentinels; return once all of them see the whole group."""
        auth = ["--requirepass", self.password, "--masterauth", self.password] if self.password else []
        # Replicas sync at once (no 5 s diskless-sync delay): WAIT works soon after start and a failover.
        sync = ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        # After RedisServer's own "--appendonly no": the later option wins.
        aof = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.appendonly else []
        master = RedisServer(self.workdir / "node0", extra_args=[*auth, *sync, *aof], binary=self.binary)
        self.nodes.append(master)
        master.start()
        for i in (1, 2):
            replica = RedisServer(
                self.workdir / f"node{i}",
                extra_args=[*auth, *sync, *aof, "--replicaof", "127.0.0.1", str(master.port)],
                binary=self.binary,
            )
            self.nodes.append(replica)
            replica.start()
        for i in range(3):
            sentinel = SentinelServer(
                self.workdir / f"sentinel{i}",
                monitor_port=master.port,
                down_after_ms=self.down_after_ms,
                auth_pass=self.password,
                requirepass=self.sentinel_password,
                binary=self.binary,
            )
            self.sentinels.append(sentinel)
            sentinel.start()
        _poll(self._ready, READY_TIMEOUT, "the sentinel group did not settle")

    def node(self, port: int) -> redis.Redis:
        """Return a blocking client of the data node on ``port`` (the caller closes it)."""
        return self._node(port)

    def _node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password or None, socket_timeout=1.0)

    def _sentinel(self, s: SentinelServer) -> redis.Redis:
        return redis.Redis(port=s.port, password=self.sentinel_password or None, socket_timeout=1.0)

    def _ask(self, s: SentinelServer, *command: Any) -> Any:
        r = self._sentinel(s)
        try:
            return r.execute_command(*command)
        finally:
            r.close()

    def _replication(self, port: int) -> dict[str, Any]:
        r = self._node(port)
        try:
            return dict(r.info("replication"))
        finally:
            r.close()

    def _ready(self) -> bool:
        """Every Sentinel names the same live master, knows 2 other Sentinels and 2 replicas, all synced."""
        port = self.master_port()
        info = self._replication(port)
        if info.get("role") != "master" or info.get("connected_slaves", 0) < 2:
            return False
        for s in self.sentinels:
            state = self._sentinel(s)
            try:
                master = state.sentinel_master(SERVICE)
                replicas = state.sentinel_slaves(SERVICE)
            finally:
                state.close()
            if int(master["port"]) != port or master["num-other-sentinels"] < 2:
                return False
            if len([r for r in replicas if not r["is_sdown"]]) < 2:
                return False
        return True

    def master_port(self) -> int:
        """Return the port the Sentinels name as the master now; fail when they disagree."""
        ports = set()
        for s in self.live_sentinels():
            _host, port = self._ask(s, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            ports.add(int(port))
        if len(ports) != 1:
            raise redis.ConnectionError(f"the sentinels disagree on the master: {sorted(ports)}")
        return ports.pop()

    def live_sentinels(self) -> list[SentinelServer]:
        return [s for s in self.sentinels if s.proc is not None and s.proc.poll() is None]

    def master(self) -> RedisServer:
        """Return the data node the Sentinels name as the master."""
        port = self.master_port()
        return next(n for n in self.nodes if n.port == port)

    def kill_master(self) -> RedisServer:
        """SIGKILL the master (by its process group); return its server."""
        server = self.master()
        server.kill()
        return server

    def freeze_master(self) -> RedisServer:
        """SIGSTOP the master (by its process group); return its server (``thaw`` it later)."""
        server = self.master()
        server.freeze()
        return server

    def replicas(self) -> list[RedisServer]:
        """Return the live data nodes other than the master."""
        port = self.master_port()
        return [n for n in self.nodes if n.port != port and n.proc is not None and n.proc.poll() is None]

    def cut_replication(self) -> int:
        """Close the master's connections to its replicas (``CLIENT KILL TYPE replica``); return how many."""
        r = self._node(self.master_port())
        try:
            return int(r.execute_command("CLIENT", "KILL", "TYPE", "replica"))
        finally:
            r.close()

    def thaw(self, server: RedisServer) -> None:
        """SIGCONT a frozen server."""
        server.thaw()

    def wait_failover(self, old: RedisServer, timeout: float = READY_TIMEOUT) -> RedisServer:
        """Return the new master once every Sentinel names a node other than ``old`` and that node is a
        master with at least one synced replica; fail the test after ``timeout`` seconds."""

        def promoted() -> bool:
            port = self.master_port()
            if port == old.port:
                return False
            info = self._replication(port)
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return info.get("role") == "master" and any(r.get("state") == "online" for r in online)

        _poll(promoted, timeout, f"no replica of :{old.port} promoted")
        return self.master()

    def wait_demoted(self, old: RedisServer, timeout: float = READY_TIMEOUT) -> None:
        """Return once ``old`` serves as a replica of the current master, its link up."""

        def demoted() -> bool:
            info = self._replication(old.port)
            return (
                info.get("role") == "slave"
                and int(info.get("master_port", 0)) == self.master_port()
                and info.get("master_link_status") == "up"
            )

        _poll(demoted, timeout, f"old master :{old.port} not demoted to a replica")

    def role(self, server: RedisServer) -> str:
        """Return what ``server`` says it is (``master`` or ``slave``)."""
        return self.role_of(server.port)

    def role_of(self, port: int) -> str:
        """Return what the data node on ``port`` says it is (``master`` or ``slave``)."""
        return str(self._replication(port).get("role"))

    def stop(self) -> None:
        """Stop every process (by process group id); a frozen one is thawed first."""
        for s in [*self.sentinels, *self.nodes]:
            s.thaw()
            s.stop()


@pytest.fixture
def redis_sentinel(tmp_path: Path) -> Iterator[LocalSentinelGroup]:
    """A fresh master + 2 replicas + 3 Sentinels, stopped at the end of the test."""
    group = LocalSentinelGroup(tmp_path / "sentinel-group")
    try:
        group.start()
        yield group
    finally:
        group.stop()


@pytest.fixture
def redis_sentinel_url(redis_sentinel: LocalSentinelGroup) -> str:
    """The fresh group's ``redis+sentinel://`` URL."""
    return redis_sentinel.url


__all__ = ["SERVICE", "LocalSentinelGroup", "SentinelServer", "redis_sentinel", "redis_sentinel_url"]
