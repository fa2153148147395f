"""A store wrapper that delays each request like a cloud object store does (benchmarks only).

The emulators answer in a millisecond or two and are CPU-bound on a small
machine, so on them a commit's cost is the client's CPU. On a real cloud the
cost is the round trip: 10-30 ms median for a small request, with a long
tail. :class:`LatencyStore` models that: each request waits a lognormal time
with the given median and 99th percentile before it reaches the wrapped
store. Waits overlap, as concurrent requests to a cloud store do, so the
model rewards parallel requests and punishes sequential rounds exactly as a
cloud would.

Enabled by ``store.model_latency_ms`` (default 0: off), applied the same way
to every side of a benchmark (baseline, commit core, fleet processes). Never
enable this in production.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator

from ._port import ObjectData, ObjectInfo, ObjectStore, StoreLifecycle

# z-score of the 99th percentile of a standard normal distribution.
_Z99 = 2.3263478740408408


class LatencyModel:
    """Lognormal request latency: ``median_s`` and ``p99_s`` (``p99_s >= median_s``)."""

    def __init__(self, median_s: float, p99_s: float, *, seed: int | None = None) -> None:
        """Raises ValueError for a negative median or a p99 below the median."""
        if median_s < 0 or p99_s < median_s:
            raise ValueError("latency model needs 0 <= median <= p99")
        self.median_s = median_s
        self.p99_s = p99_s
        self._mu = math.log(median_s) if median_s > 0 else 0.0
        self._sigma = math.log(p99_s / median_s) / _Z99 if median_s > 0 else 0.0
        self._rng = random.Random(seed)

    def sample(self) -> float:
        """Return one request's latency in seconds."""
        if self.median_s == 0:
            return 0.0
        return self._rng.lognormvariate(self._mu, self._sigma)


class LatencyStore(StoreLifecycle):
    """Wraps an :class:`ObjectStore`, delaying each request by :class:`LatencyModel` samples.

    A listing costs one round trip per page. Cancellation during a wait
    cancels the request before it was sent.
    """

    def __init__(self, inner: ObjectStore, model: LatencyModel) -> None:
        self._inner = inner
        self._model = model

    @property
    def url(self) -> str:
        return self._inner.url

    async def _rtt(self) -> None:
        await asyncio.sleep(self._model.sample())

    async def read(self, key: str) -> ObjectData:
        await self._rtt()
        return await self._inner.read(key)

    async def head(self, key: str) -> ObjectInfo:
        await self._rtt()
        return await self._inner.head(key)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        await self._rtt()
        return await self._inner.write(key, data)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        await self._rtt()
        return await self._inner.write_if_absent(key, data)

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        await self._rtt()
        return await self._inner.write_if_match(key, data, version)

    async def delete(self, key: str) -> None:
        await self._rtt()
        await self._inner.delete(key)

    async def head_md5(self, key: str) -> ObjectInfo:
        await self._rtt()
        return await self._inner.head_md5(key)

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        await self._rtt()
        return await self._inner.copy(src, dst, source=source)

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        await self._rtt()
        n = 0
        async for info in self._inner.list(prefix, page_size=page_size):
            n += 1
            if n % page_size == 0:
                await self._rtt()
            yield info

    async def open(self) -> None:
        await self._inner.__aenter__()

    async def close(self) -> None:
        await self._inner.close()
