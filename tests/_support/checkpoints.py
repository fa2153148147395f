"""Checkpoint gates: hold a worker's work at one of its named checkpoints (``commit.locked``...).

A worker's actions await ``checkpoint(point)`` at each step of a commit or an
abort. :func:`install_checkpoint` is the one place where a test's hook is put
in its stead; the gates below are the hooks the tests share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import workers._actions as actions

Checkpoint = Callable[[str], Awaitable[None]]


def install_checkpoint(monkeypatch: pytest.MonkeyPatch, hook: Checkpoint) -> None:
    """Make every checkpoint a worker's actions reach in this test await ``hook(point)``."""
    monkeypatch.setattr(actions, "checkpoint", hook)


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


def pause_first_at(monkeypatch: pytest.MonkeyPatch, point: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Install a :class:`PauseFirst` at ``point``; return its ``(paused, go)`` events."""
    gate = PauseFirst(point)
    install_checkpoint(monkeypatch, gate)
    return gate.paused, gate.go


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
