"""A real Spark standalone cluster from the installed pyspark: a master and two workers, and spark-submit.

The daemons run as a real cluster's would: started with ``spark-class`` (no
``sbin`` scripts: the pip package has none for the master), each in its own
process group, with an empty environment except ``JAVA_HOME``, ``PATH``,
``SPARK_HOME``, ``SPARK_LOCAL_IP`` and a marker variable, so they inherit
nothing from the test (no ``PYTHONPATH``, no credentials). The master and the
first worker listen on 127.0.0.1, the second worker on 127.0.0.2: two hosts as
far as Spark knows, so it can launch a speculative copy of a task (it never
runs one on the host of the original).

Every process is cleaned up by process group, and then by a ``/proc`` scan for
the marker (executors' Python daemons make their own process group), also when
the test fails. Nothing downloads jars: the cluster runs from the jars pyspark
ships.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests._support.ports import free_port

HOSTS = ("127.0.0.1", "127.0.0.2")
MARKER = "COMMITFLEET_SPARK_CLUSTER"
START_TIMEOUT = 60.0
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -Xss4m"


def spark_home() -> Path:
    """Return the installed pyspark's folder (it holds ``bin/spark-class`` and ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def java_home() -> Path:
    """Return the JAVA_HOME of the ``java`` on PATH (or ``$JAVA_HOME``)."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: Spark needs Java 17")
    return Path(os.path.realpath(java)).parent.parent


def clean_env(token: str, local_ip: str, scratch: Path, **extra: str) -> dict[str, str]:
    """Return the whole environment of a cluster process: nothing from the test's own environment.

    ``scratch`` takes the JVMs' temporary files and Spark's local dirs (not /tmp).
    """
    jh = java_home()
    scratch.mkdir(parents=True, exist_ok=True)
    return {
        "JAVA_HOME": str(jh),
        "PATH": f"{jh / 'bin'}:/usr/bin:/bin",
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": local_ip,
        "SPARK_LOCAL_DIRS": str(scratch),
        "SPARK_DAEMON_JAVA_OPTS": f"{JAVA_OPTS} -Djava.io.tmpdir={scratch}",
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        MARKER: token,
        **extra,
    }


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Daemon:
    """One process started in its own process group, its output in a log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGTERM the process group, SIGKILL it after 10 s; safe to call twice."""
        if self.proc.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        else:
            # The leader is gone; children it left in its group go too.
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def spawn(
    name: str, argv: Sequence[str], env: Mapping[str, str], work: Path, cwd: Path | None = None
) -> Daemon:
    """Start ``argv`` in a new session (its own process group) with exactly ``env``."""
    log = work / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd or work,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Daemon(name, proc, log)


def marked_pids(token: str) -> list[int]:
    """Return the pids of every process whose environment carries the cluster's marker."""
    needle = f"{MARKER}={token}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(entry))
    return out


def cmdline(pid: int) -> list[str]:
    """Return a process's argv ([] when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@dataclass
class Cluster:
    """A running standalone cluster: master URL, daemons, the marker of all its processes."""

    work: Path
    token: str
    master_port: int
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://{HOSTS[0]}:{self.master_port}"

    def executors(self, host: str | None = None) -> list[int]:
        """Return the pids of the executor JVMs now running (on ``host`` if given)."""
        out = []
        for pid in marked_pids(self.token):
            argv = cmdline(pid)
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in argv:
                continue
            if host is None or (("--hostname" in argv) and argv[argv.index("--hostname") + 1] == host):
                out.append(pid)
        return out

    def logs(self) -> str:
        return "".join(f"\n===== {d.name} =====\n{d.tail()}" for d in self.daemons)

    def submit(
        self, name: str, script: Path, args: Sequence[str], py_files: Path, conf: Mapping[str, str]
    ) -> Daemon:
        """Start ``spark-submit --master spark://... --deploy-mode client`` as a user would (own group)."""
        argv = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            self.master_url,
            "--deploy-mode",
            "client",
            "--py-files",
            str(py_files),
        ]
        for key, value in conf.items():
            argv += ["--conf", f"{key}={value}"]
        argv += [str(script), *args]
        py = sys.executable
        env = clean_env(
            self.token, HOSTS[0], self.work / f"{name}-tmp", PYSPARK_PYTHON=py, PYSPARK_DRIVER_PYTHON=py
        )
        d = spawn(name, argv, env, self.work)
        self.daemons.append(d)
        return d

    def stop(self) -> None:
        """Kill every daemon by process group, then anything else that carries the marker."""
        for d in reversed(self.daemons):
            d.kill()
        deadline = time.monotonic() + 20
        while (left := marked_pids(self.token)) and time.monotonic() < deadline:
            for pid in left:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)


def _wait_until(what: str, ready: object, cluster: Cluster, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        dead = [d.name for d in cluster.daemons if not d.alive()]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up (dead: {dead}){cluster.logs()}")
        time.sleep(0.1)


@contextmanager
def standalone_cluster(work: Path, *, cores: int = 2, memory: str = "1g") -> Iterator[Cluster]:
    """Start a master and two workers (127.0.0.1 and 127.0.0.2); stop them all on exit.

    Yields once both workers registered with the master (the master's log says so).

    Raises:
        RuntimeError: a daemon died or did not come up within a minute (with the logs).
    """
    work.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    cluster = Cluster(work, token, free_port())
    spark_class = str(spark_home() / "bin" / "spark-class")
    try:
        master = spawn(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOSTS[0],
                "--port",
                str(cluster.master_port),
                "--webui-port",
                str(free_port()),
            ],
            clean_env(token, HOSTS[0], work / "master-tmp"),
            work,
        )
        cluster.daemons.append(master)
        # The workers start at once: they retry until the master listens.
        for i, host in enumerate(HOSTS):
            wdir = work / f"worker{i + 1}"
            wdir.mkdir(exist_ok=True)
            cluster.daemons.append(
                spawn(
                    f"worker{i + 1}",
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        host,
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--work-dir",
                        str(wdir),
                        cluster.master_url,
                    ],
                    clean_env(token, host, wdir / "tmp"),
                    work,
                )
            )
        _wait_until("the master", lambda: _port_open(HOSTS[0], cluster.master_port), cluster)
        _wait_until(
            "two registered workers",
            lambda: master.tail(200_000).count("Registering worker") >= 2,
            cluster,
        )
        yield cluster
    finally:
        cluster.stop()


__all__ = [
    "HOSTS",
    "MARKER",
    "Cluster",
    "Daemon",
    "clean_env",
    "marked_pids",
    "spark_home",
    "standalone_cluster",
]
