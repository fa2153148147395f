"""A client of the worker's health endpoint for the tests: one raw HTTP/1.1 request per connection."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class Answer:
    """A response: its status and body (text)."""

    status: int
    body: str


async def probe(port: int, path: str, *, timeout: float = 1.0, method: str = "GET") -> Answer | None:
    """Return the answer to ``method path`` on 127.0.0.1:``port``, or None when none came within
    ``timeout`` seconds (as a kubelet's probe with ``timeoutSeconds``) or the connection failed."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: probe\r\nUser-Agent: kube-probe/1.30\r\n\r\n".encode()
            )
            await writer.drain()
            raw = await reader.read()
    except (TimeoutError, OSError):
        return None
    finally:
        if writer is not None:
            writer.transport.abort()
    head, _sep, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return Answer(status, body.decode(errors="replace"))


async def status_of(port: int, path: str, *, timeout: float = 1.0) -> int | None:
    """Return the status of ``GET path`` (None: no answer within ``timeout``)."""
    answer = await probe(port, path, timeout=timeout)
    return None if answer is None else answer.status


__all__ = ["Answer", "probe", "status_of"]
