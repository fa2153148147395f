"""Local processes of a demo or benchmark run: workers and coordinators as real OS processes, a
throwaway redis-server, and the guard that stops them all (the tests' harness builds on it).

Each process gets its own process group so its owner can SIGKILL, SIGSTOP,
SIGCONT or SIGTERM it precisely, and its output goes to a log file the owner
prints when something fails.

Because they run in their own groups, a Ctrl-C at the terminal or a SIGTERM
to the CLI does not reach them: the CLI must stop them itself, on every exit
path. :func:`children_stopped` does that for a command: SIGTERM and SIGINT
become an exception (:class:`Interrupted`) so the command's own ``finally``
blocks run, and whatever is still alive at the end is stopped there.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from shared import Settings


class _Stoppable(Protocol):
    def stop_now(self) -> None: ...


# Every process this module started and has not seen stopped: the last line of
# defence of children_stopped(), whatever path the command took.
_LIVE: set[_Stoppable] = set()
_LIVE_LOCK = threading.Lock()


def _started(p: _Stoppable) -> None:
    with _LIVE_LOCK:
        _LIVE.add(p)


def _ended(p: _Stoppable) -> None:
    with _LIVE_LOCK:
        _LIVE.discard(p)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT reached a command running under :func:`children_stopped`.

    A KeyboardInterrupt, so everything that already cleans up on Ctrl-C
    (``finally``, ExitStack, asyncio.run cancelling its tasks) does the same
    on SIGTERM.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The conventional exit code: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def stop_all_started() -> None:
    """Stop (SIGTERM, then SIGKILL) every process this module started that is still alive."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for p in live:
        p.stop_now()


def _descendants(root: int) -> list[int]:
    """Return the pids of ``root``'s live descendants (Linux ``/proc``; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # exited meanwhile
            continue
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    stack = [root]
    while stack:
        kids = children.get(stack.pop(), [])
        found += kids
        stack += kids
    return found


def stop_descendants(grace: float = 5.0) -> list[int]:
    """SIGTERM every live descendant of this process, SIGKILL those left after ``grace`` seconds.

    For what a library started on our behalf and will not stop once its
    caller was interrupted (the Spark JVM while its gateway is starting).
    Returns the pids it signalled.
    """
    pids = _descendants(os.getpid())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = pids
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        for pid in left:
            try:  # reap our own children, so they do not linger as zombies
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        alive = set(_descendants(os.getpid()))
        left = [p for p in left if p in alive]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@contextmanager
def children_stopped() -> Iterator[None]:
    """Run a block that starts processes; on any exit every one of them is stopped.

    Inside the block SIGTERM and SIGINT raise :class:`Interrupted` (once: a
    second signal while the block cleans up is noted, not raised, so the
    cleanup finishes; SIGKILL still ends everything). Main thread only.

    Raises:
        Interrupted: a signal arrived (after the block's cleanup and ours ran).
    """
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise Interrupted(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        if not received:
            received.append(0)  # from now on a signal only waits for the cleanup below
        try:
            stop_all_started()
            stop_descendants()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(settings: Settings, path: Path) -> Path:
    """Write ``settings`` as a TOML file the CLI reads with ``--config``."""
    import msgspec

    from shared.settings import secret_enc_hook

    # The file is the child processes' only source of their credentials: written
    # in full (the folder is private to the run), never printed.
    doc = msgspec.to_builtins(settings, enc_hook=secret_enc_hook)
    lines: list[str] = []

    def section(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars:
            lines.append(f"[{prefix}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in table.items():
            if isinstance(v, dict):
                section(f"{prefix}.{k}", v)

    for name, table in doc.items():
        section(name, table)
    # Owner-only from the start: the file holds the credentials.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _killpg(pid: int, sig: signal.Signals) -> None:
    """Signal a child's process group; a group that is already gone is not an error."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayRedis:
    """A private ``redis-server`` on a free loopback port, in its own process group (no persistence)."""

    def __init__(self, work: Path, *, binary: str | None = None, args: Sequence[str] = ()) -> None:
        """Start it and wait until it answers PING.

        ``binary``: another ``redis-server`` than the one on the PATH; ``args``: more
        configuration (``--appendonly yes``, ``--replicaof 127.0.0.1 PORT``), after the defaults.

        Raises:
            RuntimeError: redis-server is not installed or did not start within 15 s.
        """
        self.port = free_port()
        exe = binary or shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: run `make bootstrap` or set REDIS_URL")
        argv = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [*argv, "--dir", str(work), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _started(self)
        deadline = time.monotonic() + 15
        while not self._pong():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                c.sendall(b"PING\r\n")
                return c.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        """The server's redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL); safe to call twice."""
        try:
            if self.proc.poll() is None:
                _killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    _killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(5)
        finally:
            _ended(self)

    def stop_now(self) -> None:
        """Stop the server (the last-resort path of :func:`children_stopped`)."""
        self.stop()


class FleetProcess:
    """One ``commitfleet worker|coordinator`` process."""

    def __init__(
        self,
        kind: str,
        name: str,
        config: Path,
        log_dir: Path,
        extra: list[str] | None = None,
        *,
        module: str = "coordinator",
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``python -m <module> <kind> --config CONFIG --id NAME [extra]``.

        ``module`` is the CLI's module; a test may name a launcher of its own
        that plants a fault and then runs the same CLI. ``env``: variables set
        for the process on top of ours (e.g. ``OTEL_*`` for its tracer).
        """
        self.kind = kind
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in close()
        child_env = {
            k: v for k, v in os.environ.items() if not k.startswith("COMMITFLEET_") and k != "REDIS_URL"
        }
        child_env.update(env or {})
        child_env["PYTHONUNBUFFERED"] = "1"
        argv = [
            sys.executable,
            "-m",
            module,
            kind,
            "--config",
            str(config),
            "--id",
            name,
            *(extra or []),
        ]
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True
        )
        _started(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process's group."""
        if self.proc.poll() is None:
            _killpg(self.proc.pid, sig)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the exit code."""
        self.signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (and reap)."""
        self.signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        """Kill if still running, close the log."""
        try:
            if self.proc.poll() is None:
                self.signal(signal.SIGCONT)
                self.kill()
        finally:
            _ended(self)
            self._log.close()

    def stop_now(self) -> None:
        """SIGTERM, SIGKILL after 30 s, close (the last-resort path of :func:`children_stopped`)."""
        try:
            if self.proc.poll() is None:
                self.signal(signal.SIGCONT)  # a stopped process would never see the SIGTERM
                self.terminate(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # close() kills it
        finally:
            self.close()

    def output(self) -> str:
        """Return the process's log so far."""
        return self.log_path.read_text(errors="replace")


__all__ = [
    "FleetProcess",
    "Interrupted",
    "ThrowawayRedis",
    "children_stopped",
    "free_port",
    "write_config",
]
