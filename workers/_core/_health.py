"""The health endpoint's decisions: what the worker knows at one moment -> each probe's status and body.

Pure: the caller passes the moment (``now``, a monotonic clock) and the marks
it recorded (:class:`HealthMarks`); ``workers/_health.py`` records them and
``workers/_health_http.py`` serves the answers.

- ``/livez``: the event loop keeps up (the ticker ticked within
  ``max_loop_lag`` and no tick of the last :data:`LAG_WINDOW_S` was later than
  that) and, once joined, the heartbeat keeps the membership: the lease was
  renewed within its validity, or the heartbeat is alive but Redis is
  unreachable (a Redis outage must not restart every worker at once; readiness
  says it). A heartbeat that stopped trying (stuck, ended) fails it.
- ``/readyz``: joined and a member now (the last heartbeat renewed the lease
  within its validity), Redis answering, not shutting down. Owning shards is
  not required: a worker waiting for an assignment is ready.
- ``/startupz``: the settings loaded (the server runs) and Redis reached once
  (the fleet's record read).
"""

from __future__ import annotations

from dataclasses import dataclass

LAG_WINDOW_S = 10.0
"""Seconds a late tick counts against liveness (about one kubelet probe period)."""


@dataclass(frozen=True, slots=True)
class HealthMarks:
    """What the worker recorded, as monotonic times (None: never).

    ``last_tick``: the loop ticker's last tick; ``worst_lag``: the largest
    lateness of a tick within the last :data:`LAG_WINDOW_S`; ``reached``:
    Redis first reached (the fleet's record read); ``joined``: registered in
    the fleet (None again once it left); ``renewed``: the lease last written
    (registered or renewed); ``attempted``: the heartbeat's last attempt
    ended, whatever its outcome; ``redis_down``: that attempt failed because
    Redis could not be reached; ``stopping``: shutdown has begun.
    """

    last_tick: float | None = None
    worst_lag: float = 0.0
    reached: float | None = None
    joined: float | None = None
    renewed: float | None = None
    attempted: float | None = None
    redis_down: bool = False
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class Limits:
    """The thresholds of the decisions: ``lease`` and ``heartbeat`` (``worker.*``), ``max_loop_lag``,
    and ``redis_timeout`` (``redis.socket_timeout``: how long one heartbeat attempt may take)."""

    lease: float
    heartbeat: float
    max_loop_lag: float
    redis_timeout: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """An HTTP status (200 or 503) and a one-line body saying why."""

    status: int
    body: str

    @property
    def ok(self) -> bool:
        """Return True for a 200."""
        return self.status == 200


def _ok(why: str) -> Verdict:
    return Verdict(200, f"ok: {why}")


def _fail(why: str) -> Verdict:
    return Verdict(503, f"failed: {why}")


def loop_verdict(marks: HealthMarks, limits: Limits, now: float) -> Verdict:
    """Return whether the event loop keeps up: its ticker ticked lately and was never late by more
    than ``max_loop_lag`` within :data:`LAG_WINDOW_S`."""
    if marks.last_tick is None:
        return _ok("loop ticker not started yet")
    since = now - marks.last_tick
    if since > limits.max_loop_lag:
        return _fail(f"event loop ticker silent for {since:.1f}s (limit {limits.max_loop_lag:g}s)")
    if marks.worst_lag > limits.max_loop_lag:
        return _fail(f"event loop {marks.worst_lag:.1f}s behind within {LAG_WINDOW_S:g}s")
    return _ok("event loop keeps up")


def livez(marks: HealthMarks, limits: Limits, now: float) -> Verdict:
    """Return the liveness verdict (see the module doc)."""
    loop = loop_verdict(marks, limits, now)
    if not loop.ok or marks.joined is None:
        return loop
    if marks.renewed is not None and now - marks.renewed <= limits.lease:
        return _ok("event loop keeps up, lease renewed")
    # One attempt may take up to the socket timeout; the next starts a heartbeat later.
    patience = limits.lease + limits.heartbeat + limits.redis_timeout
    if marks.redis_down and marks.attempted is not None and now - marks.attempted <= patience:
        return _ok("event loop keeps up; Redis unreachable, the heartbeat keeps trying")
    age = now - (marks.renewed if marks.renewed is not None else marks.joined)
    return _fail(f"membership lease not renewed for {age:.1f}s (lease {limits.lease:g}s) and not retrying")


def readyz(marks: HealthMarks, limits: Limits, now: float) -> Verdict:
    """Return the readiness verdict (see the module doc)."""
    if marks.stopping:
        return _fail("shutting down")
    if marks.reached is None:
        return _fail("Redis not reached yet")
    if marks.joined is None:
        return _fail("not registered in the fleet")
    if marks.redis_down:
        return _fail("Redis unreachable")
    if marks.renewed is None or now - marks.renewed > limits.lease:
        return _fail("membership lease not renewed within its validity")
    return _ok("registered in the fleet")


def startupz(marks: HealthMarks) -> Verdict:
    """Return the startup verdict: settings loaded (always, when asked) and Redis reached once."""
    if marks.reached is None:
        return _fail("Redis not reached yet")
    return _ok("settings loaded, Redis reached")


__all__ = ["LAG_WINDOW_S", "HealthMarks", "Limits", "Verdict", "livez", "loop_verdict", "readyz", "startupz"]
