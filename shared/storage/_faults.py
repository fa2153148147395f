"""Fault injection for chaos testing: a store wrapper that fails some requests on purpose.

Enabled only by the setting ``store.chaos_fault_rate`` (default 0: off). Each
request then fails with that probability, in one of the ways real stores
fail:

- ``Throttled`` before the request is sent (429 / SlowDown);
- ``TransientError`` before the request is sent (a 5xx, a reset connection);
- ``OutcomeUnknown`` *after* a write or delete took effect (the reply was lost:
  a timeout after sending) — the hardest case, which callers must settle by
  re-reading, never by guessing.

Reads never take effect twice, so they only get the first two kinds. Never
enable this in production.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from .._errors import OutcomeUnknown, Throttled, TransientError
from ._port import ObjectData, ObjectInfo, ObjectStore, StoreLifecycle

T = TypeVar("T")
log = logging.getLogger("shared.storage.chaos")


class FaultyStore(StoreLifecycle):
    """Wraps an :class:`ObjectStore`, failing a fraction of its requests (see the module doc)."""

    def __init__(self, inner: ObjectStore, rate: float, *, seed: int | None = None) -> None:
        if not 0.0 <= rate < 1.0:
            raise ValueError("fault rate must be in [0, 1)")
        self._inner = inner
        self._rate = rate
        self._rng = random.Random(seed)

    @property
    def url(self) -> str:
        return self._inner.url

    def _before(self, what: str) -> None:
        if self._rng.random() < self._rate / 2:
            kind = Throttled if self._rng.random() < 0.5 else TransientError
            log.info("chaos fault injected: %s %s", kind.__name__, what)
            raise kind(f"chaos: {what} failed before sending")

    async def _mutate(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        self._before(what)
        result = await call()
        if self._rng.random() < self._rate / 2:
            log.info("chaos fault injected: OutcomeUnknown %s (after it took effect)", what)
            raise OutcomeUnknown(f"chaos: {what} took effect but its reply was lost")
        return result

    async def read(self, key: str) -> ObjectData:
        self._before(f"read {key}")
        return await self._inner.read(key)

    async def head(self, key: str) -> ObjectInfo:
        self._before(f"head {key}")
        return await self._inner.head(key)

    async def head_md5(self, key: str) -> ObjectInfo:
        self._before(f"checksum {key}")
        return await self._inner.head_md5(key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._mutate(f"write {key}", lambda: self._inner.write(key, data))

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._mutate(f"create {key}", lambda: self._inner.write_if_absent(key, data))

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._mutate(f"swap {key}", lambda: self._inner.write_if_match(key, data, version))

    async def delete(self, key: str) -> None:
        await self._mutate(f"delete {key}", lambda: self._inner.delete(key))

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        return await self._mutate(f"copy {src}", lambda: self._inner.copy(src, dst, source=source))

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        self._before(f"list {prefix}")
        async for info in self._inner.list(prefix, page_size=page_size):
            yield info

    async def open(self) -> None:
        await self._inner.__aenter__()

    async def close(self) -> None:
        await self._inner.close()
