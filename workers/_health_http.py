"""The worker's health endpoint: a minimal HTTP/1.1 server on the worker's own event loop.

``GET /livez``, ``/readyz``, ``/startupz`` (200 or 503 and a one-line text
body: ``workers/_core/_health.py`` decides) and ``/metrics`` (Prometheus
text, ``workers/_health_metrics.py``); ``HEAD`` of each; anything else is
404 (unknown path), 405 (another method) or 400 (not HTTP). Off unless
``worker.http_port`` is set; bound to ``worker.http_host``. Nothing served
is a secret, so there is no token.

Hostile input cannot hurt the worker: a request head is read within
:data:`READ_TIMEOUT_S` and :data:`MAX_HEAD_BYTES` (else 408 / 431, or the
connection is just closed), a request body is never read, each answer is
written within :data:`WRITE_TIMEOUT_S`, one request per connection
(``Connection: close``), at most :data:`MAX_CLIENTS` connections at once (the
next is closed at once), and no error of a connection reaches the worker.

Being on the worker's event loop is the point: a loop that is blocked
cannot answer, so the kubelet's probe times out and fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from shared import ConfigError, cancel_until_done, kv

from ._core import Verdict, livez, readyz, startupz
from ._health import HealthMonitor
from ._health_metrics import CONTENT_TYPE, WorkerMetrics

log = logging.getLogger("workers.health")

MAX_HEAD_BYTES: Final = 8192
READ_TIMEOUT_S: Final = 5.0
WRITE_TIMEOUT_S: Final = 5.0
MAX_CLIENTS: Final = 16
REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
PATHS: Final = ("/livez", "/readyz", "/startupz", "/metrics")
_TEXT: Final = "text/plain; charset=utf-8"


def parse_request_line(head: bytes) -> tuple[str, str] | int:
    """Return ``(method, path)`` of a request head (the query string dropped), or the status to
    answer a head that is not an HTTP/1.x request with (400). Pure."""
    line, _sep, _rest = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return 400
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return 400
    if not method.isalpha() or not target.startswith("/") or not target.isprintable():
        return 400
    return method, target.partition("?")[0]


def response(status: int, body: bytes, content_type: str = _TEXT, *, head_only: bool = False) -> bytes:
    """Return the bytes of a complete HTTP/1.1 response that closes the connection."""
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head_only else body)


class HealthServer:
    """Serves the health endpoint (see the module doc) until :meth:`stop`."""

    def __init__(self, host: str, port: int, monitor: HealthMonitor, metrics: WorkerMetrics) -> None:
        self.host = host
        self.port = port
        self.monitor = monitor
        self.metrics = metrics
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    def answer(self, method: str, path: str) -> bytes:
        """Return the response to ``method`` ``path`` (reads no Redis and no store)."""
        if path not in PATHS:
            return response(404, b"not found\n")
        if method not in ("GET", "HEAD"):
            return response(405, b"method not allowed\n")
        head_only = method == "HEAD"
        if path == "/metrics":
            return response(200, self.metrics.render(), CONTENT_TYPE, head_only=head_only)
        m = self.monitor
        marks, now = m.marks(), m.now()
        verdict: Verdict
        if path == "/livez":
            verdict = livez(marks, m.limits, now)
        elif path == "/readyz":
            verdict = readyz(marks, m.limits, now)
        else:
            verdict = startupz(marks)
        return response(verdict.status, (verdict.body + "\n").encode(), head_only=head_only)

    async def start(self) -> None:
        """Bind and serve; ``port`` becomes the bound one.

        Raises:
            ConfigError: the address cannot be bound.
        """
        try:
            self._server = await asyncio.start_server(
                self._client, self.host, self.port, limit=MAX_HEAD_BYTES, reuse_address=True
            )
        except OSError as exc:
            raise ConfigError(f"cannot serve the health endpoint on {self.host}:{self.port}: {exc}") from None
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("health endpoint serving", extra=kv(host=self.host, port=self.port))

    async def stop(self) -> None:
        """Stop listening and end every connection; return once each has ended (safe to call twice)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._clients):
            await cancel_until_done(task)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request on one connection, then close it; never raises but CancelledError."""
        task = asyncio.current_task()
        assert task is not None
        if len(self._clients) >= MAX_CLIENTS or self._server is None:
            writer.transport.abort()
            return
        self._clients.add(task)
        try:
            await self._serve_one(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            log.debug("health connection ended", extra=kv(error=repr(exc)))
        except Exception:  # a connection's bug must not reach the worker
            log.exception("health endpoint: unexpected error answering a request")
            with contextlib.suppress(Exception):
                writer.write(response(500, b"internal error\n"))
        finally:
            self._clients.discard(task)
            writer.transport.abort()  # no lingering close handshake with a hostile client

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            out = response(431, b"request head too large\n")
        except TimeoutError:
            out = response(408, b"request timeout\n")
        else:
            parsed = parse_request_line(head)
            out = response(parsed, b"bad request\n") if isinstance(parsed, int) else self.answer(*parsed)
        writer.write(out)
        async with asyncio.timeout(WRITE_TIMEOUT_S):
            await writer.drain()


__all__ = [
    "MAX_CLIENTS",
    "MAX_HEAD_BYTES",
    "PATHS",
    "READ_TIMEOUT_S",
    "HealthServer",
    "parse_request_line",
    "response",
]
