"""Recording every command a Redis server receives (MONITOR) and checking each touches one slot.

:class:`CommandRecorder` reads a raw MONITOR connection in a thread and
keeps every line. :func:`cross_slot_violations` then asks the server itself
which arguments are keys (``COMMAND GETKEYS``), computes each key's cluster
slot (CRC16, as a cluster would) and returns the commands, transactions
(WATCH .. MULTI .. EXEC of one client) and Lua scripts whose keys span more
than one slot.
"""

from __future__ import annotations

import re
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import redis
from redis.crc import key_slot

_LINE = re.compile(r"^\+?(?P<ts>[0-9.]+) \[(?P<db>\d+) (?P<client>[^\]]+)\] (?P<args>.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESC = {"n": b"\n", "r": b"\r", "t": b"\t", "a": b"\a", "b": b"\b", '"': b'"', "\\": b"\\"}


def _unescape(text: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "x" and i + 3 < len(text):
                out.append(int(text[i + 2 : i + 4], 16))
                i += 4
                continue
            out += _ESC.get(nxt, nxt.encode())
            i += 2
            continue
        out += c.encode("utf-8", "surrogateescape")
        i += 1
    return bytes(out)


@dataclass(frozen=True)
class Command:
    """One recorded command: who sent it (``lua`` inside a script) and its arguments."""

    client: str
    args: tuple[bytes, ...]

    @property
    def name(self) -> str:
        return self.args[0].decode().upper() if self.args else ""


def parse_line(line: str) -> Command | None:
    """Return the command of one MONITOR line (None for anything else)."""
    m = _LINE.match(line)
    if m is None:
        return None
    args = tuple(_unescape(a) for a in _ARG.findall(m["args"]))
    return Command(m["client"], args) if args else None


@dataclass
class CommandRecorder:
    """A MONITOR connection read by a thread until :meth:`stop`."""

    port: int
    commands: list[Command] = field(default_factory=list)
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._sock = socket.create_connection(("127.0.0.1", self.port), timeout=5.0)
        self._sock.sendall(b"MONITOR\r\n")
        self._sock.settimeout(None)
        self._thread = threading.Thread(target=self._read, name="monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._sock is not None
        buf = b""
        while True:
            try:
                chunk = self._sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            for raw in lines:
                cmd = parse_line(raw.decode("utf-8", "surrogateescape"))
                if cmd is not None:
                    self.commands.append(cmd)

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            self._thread.join(10)


KeysOf = dict[tuple[bytes, ...], tuple[bytes, ...]]

_KEYLESS = frozenset(
    {
        "PING",
        "HELLO",
        "CLIENT",
        "INFO",
        "MULTI",
        "EXEC",
        "DISCARD",
        "UNWATCH",
        "SCRIPT",
        "WAIT",
        "SELECT",
        "AUTH",
    }
    | {"COMMAND", "TIME", "DBSIZE", "CLUSTER", "READONLY", "ECHO", "FLUSHALL", "CONFIG", "MONITOR", "XINFO"}
    # Classic pub/sub (the lock release notices) names channels, not keys: a cluster broadcasts it.
    | {"PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE"}
)


def command_keys(client: redis.Redis, commands: list[Command]) -> KeysOf:
    """Return the key arguments of every distinct command, as the server sees them (COMMAND GETKEYS)."""
    distinct = list(dict.fromkeys(c.args for c in commands))
    out: KeysOf = {}
    errors: set[str] = set()
    for start in range(0, len(distinct), 500):
        chunk = distinct[start : start + 500]
        pipe = client.pipeline(transaction=False)
        for args in chunk:
            pipe.command_getkeys(*args)
        for args, reply in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                out[args] = ()
                errors.add(args[0].decode().upper())
            else:
                out[args] = tuple(
                    k.encode("utf-8", "surrogateescape") if isinstance(k, str) else k for k in reply
                )
    # GETKEYS refuses keyless commands; a keyed command refused would hide its keys.
    assert errors <= _KEYLESS, sorted(errors - _KEYLESS)
    return out


def _as_bytes(k: str | bytes) -> bytes:
    return k.encode("utf-8", "surrogateescape") if isinstance(k, str) else k


def _slots(keys: tuple[bytes, ...]) -> set[int]:
    return {key_slot(k) for k in keys}


_SCRIPTS = ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL")


def cross_slot_violations(
    commands: list[Command], keys: dict[tuple[bytes, ...], tuple[bytes, ...]]
) -> list[str]:
    """Return a description of every command, transaction or script whose keys span two slots."""
    bad: list[str] = []
    txn: dict[str, set[int]] = defaultdict(set)
    open_txn: set[str] = set()
    script_slots: set[int] = set()
    for cmd in commands:
        slots = _slots(keys[cmd.args])
        if len(slots) > 1:
            bad.append(f"{cmd.client}: {cmd.name} {keys[cmd.args][:4]!r}")
        if cmd.name in _SCRIPTS:
            script_slots = slots
        if cmd.client == "lua":
            # A script's EVAL / EVALSHA is logged just before the calls it makes.
            if not slots <= script_slots:
                bad.append(f"lua call {cmd.name} {keys[cmd.args][:2]!r} outside its script's slot")
            continue
        if cmd.name in ("WATCH", "MULTI"):
            if cmd.name == "MULTI":
                open_txn.add(cmd.client)
            txn[cmd.client] |= slots
        elif cmd.name in ("EXEC", "DISCARD", "UNWATCH"):
            if len(txn[cmd.client]) > 1:
                bad.append(f"{cmd.client}: a transaction over slots {sorted(txn[cmd.client])}")
            txn.pop(cmd.client, None)
            open_txn.discard(cmd.client)
        elif cmd.client in open_txn:
            txn[cmd.client] |= slots
    return bad


__all__ = ["Command", "CommandRecorder", "command_keys", "cross_slot_violations", "parse_line"]
