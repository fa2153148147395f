"""Checkpoint gates: probes that hold a worker's work at a named point (``commit.locked``...).

A worker awaits its probe (``Worker(settings, probe=...)``, see
:mod:`workers._probe`; ``inprocess_fleet(..., probe=...)`` gives it to every
worker) at each step of a commit or an abort. The gates below are the probes
the tests share; each is a callable ``gate(point)``.
"""

from __future__ import annotations

import asyncio

from workers import Probe


class PauseFirst:
    """The first work to reach ``point`` waits there until ``go`` is set; later arrivals pass at once.

    ``paused`` is set when that work arrives. Never setting ``go`` freezes that
    work for good (until the worker's shutdown cancels it).
    """

    def __init__(self, point: str) -> None:
        self.point = point
        self.paused = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, at: str) -> None:
        if at == self.point and not self.paused.is_set():
            self.paused.set()
            await self.go.wait()


def pause_first_at(point: str) -> tuple[asyncio.Event, asyncio.Event, Probe]:
    """Return a :class:`PauseFirst` at ``point`` as ``(paused, go, probe)``.

    ``paused`` is set when the first work arrives at ``point``; it goes on once
    the test sets ``go``; give ``probe`` to the worker.
    """
    gate = PauseFirst(point)
    return gate.paused, gate.go, gate


class HoldAt:
    """Every work reaching ``point`` while ``open`` is not set waits there until it is.

    ``waiting`` counts the works held now; ``held`` is set when the first one
    arrives. Clearing ``open`` again holds later arrivals.
    """

    def __init__(self, point: str) -> None:
        self.point = point
        self.open = asyncio.Event()
        self.held = asyncio.Event()
        self.waiting = 0

    async def __call__(self, at: str) -> None:
        if at == self.point and not self.open.is_set():
            self.held.set()
            self.waiting += 1
            try:
                await self.open.wait()
            finally:
                self.waiting -= 1


class PermitsAt:
    """Every work reaching ``point`` waits for a permit the test hands out with :meth:`release`.

    ``waiting`` counts the works waiting for one now.
    """

    def __init__(self, point: str) -> None:
        self.point = point
        self.permits = asyncio.Semaphore(0)
        self.waiting = 0

    def release(self, n: int = 1) -> None:
        """Hand out ``n`` permits (to the works waiting now, or to the next to arrive)."""
        for _ in range(n):
            self.permits.release()

    async def __call__(self, at: str) -> None:
        if at == self.point:
            self.waiting += 1
            try:
                await self.permits.acquire()
            finally:
                self.waiting -= 1
