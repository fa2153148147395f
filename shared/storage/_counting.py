"""A store wrapper that counts requests and sequential rounds (tests and benchmarks).

``requests`` counts each request by kind (a listing counts one per page).
``rounds`` counts busy periods: a request that starts while no other request
is in flight opens a new round. For one commit run alone, that is the number
of sequential round trips on its critical path: requests sent together (the
parallel copies) overlap and share one round, each request that waits for
the previous one's answer opens another. ``widths`` holds, for each round,
the most requests it had in flight at once (a parallel round waits for the
slowest of them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from ._port import ObjectData, ObjectInfo, ObjectStore, StoreLifecycle

T = TypeVar("T")


class CountingStore(StoreLifecycle):
    """Wraps an :class:`ObjectStore`, counting its requests (see the module doc)."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner
        self.requests: Counter[str] = Counter()
        self.rounds = 0
        self.widths: list[int] = []
        self._in_flight = 0

    @property
    def url(self) -> str:
        return self._inner.url

    @property
    def total(self) -> int:
        """Return the number of requests counted so far."""
        return sum(self.requests.values())

    def reset(self) -> None:
        """Forget what was counted."""
        self.requests.clear()
        self.rounds = 0
        self.widths.clear()

    def _start(self, kind: str) -> None:
        self.requests[kind] += 1
        if self._in_flight == 0:
            self.rounds += 1
            self.widths.append(0)
        self._in_flight += 1
        self.widths[-1] = max(self.widths[-1], self._in_flight)

    async def _count(self, kind: str, call: Awaitable[T]) -> T:
        self._start(kind)
        try:
            return await call
        finally:
            self._in_flight -= 1

    async def read(self, key: str) -> ObjectData:
        return await self._count("read", self._inner.read(key))

    async def head(self, key: str) -> ObjectInfo:
        return await self._count("head", self._inner.head(key))

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._count("write", self._inner.write(key, data))

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._count("write_if_absent", self._inner.write_if_absent(key, data))

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return await self._count("write_if_match", self._inner.write_if_match(key, data, version))

    async def delete(self, key: str) -> None:
        await self._count("delete", self._inner.delete(key))

    async def head_md5(self, key: str) -> ObjectInfo:
        return await self._count("head_md5", self._inner.head_md5(key))

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        return await self._count("copy", self._inner.copy(src, dst, source=source))

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        self._start("list")
        try:
            n = 0
            async for info in self._inner.list(prefix, page_size=page_size):
                n += 1
                if n % page_size == 0:
                    self.requests["list"] += 1
                yield info
        finally:
            self._in_flight -= 1

    async def open(self) -> None:
        await self._inner.__aenter__()

    async def close(self) -> None:
        await self._inner.close()
