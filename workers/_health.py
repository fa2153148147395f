"""What the worker's health endpoint judges from: the marks the worker records, and the loop ticker.

The worker records its progress here as it happens (Redis reached, joined,
each heartbeat's outcome, shutdown begun, left); :meth:`HealthMonitor.marks`
hands a snapshot to the pure decisions of ``workers/_core/_health.py``.

The loop ticker (:meth:`HealthMonitor.tick_forever`) wakes every
:data:`TICK_S` and records how late it woke. An HTTP server on the same event
loop cannot answer while the loop is blocked (the kubelet's probe times out,
which is what fails it), but a loop that is starved rather than blocked (one
callback after another hogging it) may still answer a probe now and then; the
ticker's lateness catches that too.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ._core import LAG_WINDOW_S, HealthMarks, Limits

TICK_S = 0.25
"""Seconds between two ticks of the loop ticker."""
_LATE_S = 0.05  # a tick later than this is remembered (for the window's worst lag)


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What the worker knows cheaply, for ``/metrics``: shards with a live runner, work running
    (in flight) and queued over those shards."""

    shards_owned: int = 0
    inflight: int = 0
    queued: int = 0


class HealthMonitor:
    """The worker's health marks (see the module doc); all times are ``time.monotonic()``."""

    def __init__(self, limits: Limits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._last_tick: float | None = None
        self._late: deque[tuple[float, float]] = deque(maxlen=256)  # (when, how late) of late ticks
        self.last_lag = 0.0
        self._reached: float | None = None
        self._joined: float | None = None
        self._renewed: float | None = None
        self._attempted: float | None = None
        self._redis_down = False
        self._stopping = False

    def now(self) -> float:
        """Return the monitor's clock."""
        return self._clock()

    def reached(self) -> None:
        """Redis was reached (the fleet's record read): start-up is done."""
        if self._reached is None:
            self._reached = self._clock()

    def joined(self) -> None:
        """Registered in the fleet (the lease written)."""
        now = self._clock()
        self._joined = self._renewed = self._attempted = now
        self._redis_down = False

    def renewed(self) -> None:
        """A heartbeat renewed (or re-registered) the lease."""
        now = self._clock()
        self._renewed = self._attempted = now
        self._redis_down = False

    def heartbeat_failed(self) -> None:
        """A heartbeat could not reach Redis (it tries again at the next beat)."""
        self._attempted = self._clock()
        self._redis_down = True

    def stopping(self) -> None:
        """Shutdown has begun (readiness fails from now on)."""
        self._stopping = True

    def left(self) -> None:
        """The worker left the fleet (deregistered, or gave up)."""
        self._joined = None

    def marks(self) -> HealthMarks:
        """Return a snapshot of the marks now (the worst lag over the last ``LAG_WINDOW_S``)."""
        now = self._clock()
        while self._late and now - self._late[0][0] > LAG_WINDOW_S:
            self._late.popleft()
        return HealthMarks(
            last_tick=self._last_tick,
            worst_lag=max((lag for _t, lag in self._late), default=0.0),
            reached=self._reached,
            joined=self._joined,
            renewed=self._renewed,
            attempted=self._attempted,
            redis_down=self._redis_down,
            stopping=self._stopping,
        )

    def lease_age(self) -> float | None:
        """Return the seconds since the lease was last written (None: never, or left)."""
        if self._joined is None or self._renewed is None:
            return None
        return self._clock() - self._renewed

    def tick(self, lag: float) -> None:
        """Record one tick of the loop ticker, ``lag`` seconds later than it was due."""
        now = self._clock()
        self._last_tick = now
        self.last_lag = max(lag, 0.0)
        if lag > _LATE_S:
            self._late.append((now, lag))

    async def tick_forever(self, interval: float = TICK_S) -> None:
        """Tick every ``interval`` seconds, recording how late each tick woke; never returns.

        Cancellation: ends the loop.
        """
        self.tick(0.0)
        while True:
            before = self._clock()
            await asyncio.sleep(interval)
            self.tick(self._clock() - before - interval)


__all__ = ["TICK_S", "HealthMonitor", "WorkerStats"]
