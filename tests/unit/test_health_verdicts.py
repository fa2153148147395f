"""The health endpoint's pure verdicts (workers/_core/_health.py) and its request-line parser."""

from __future__ import annotations

import random

import pytest

from workers._core import LAG_WINDOW_S, HealthMarks, Limits, livez, readyz, startupz
from workers._health import HealthMonitor
from workers._health_http import parse_request_line, response

LIMITS = Limits(lease=15.0, heartbeat=3.0, max_loop_lag=5.0, redis_timeout=10.0)
NOW = 1000.0


def member(**changes: object) -> HealthMarks:
    """Marks of a worker that joined at 900 and renewed its lease a second ago, its loop keeping up."""
    base: dict[str, object] = {
        "last_tick": NOW - 0.2,
        "worst_lag": 0.01,
        "reached": 890.0,
        "joined": 900.0,
        "renewed": NOW - 1.0,
        "attempted": NOW - 1.0,
    }
    base.update(changes)
    return HealthMarks(**base)  # type: ignore[arg-type]


def test_a_healthy_member_is_live_ready_and_started() -> None:
    m = member()
    assert livez(m, LIMITS, NOW).status == 200
    assert readyz(m, LIMITS, NOW).status == 200
    assert startupz(m).status == 200


def test_a_silent_or_late_loop_fails_liveness_only() -> None:
    silent = member(last_tick=NOW - 5.1)
    assert livez(silent, LIMITS, NOW).status == 503
    assert "silent" in livez(silent, LIMITS, NOW).body
    late = member(worst_lag=5.5)
    assert livez(late, LIMITS, NOW).status == 503
    assert "behind" in livez(late, LIMITS, NOW).body
    assert livez(member(last_tick=NOW - 4.9, worst_lag=4.9), LIMITS, NOW).status == 200
    assert readyz(late, LIMITS, NOW).status == 200


def test_a_redis_outage_fails_readiness_not_liveness() -> None:
    # Redis down for long past the lease; the heartbeat keeps trying (and failing) every beat.
    down = member(renewed=NOW - 60.0, attempted=NOW - 0.5, redis_down=True)
    assert livez(down, LIMITS, NOW).status == 200
    assert readyz(down, LIMITS, NOW).status == 503
    # Just failed once, lease still valid: not ready either (Redis is what it needs).
    assert readyz(member(redis_down=True), LIMITS, NOW).status == 503


def test_a_heartbeat_that_stopped_trying_fails_liveness() -> None:
    # The lease ran out and no attempt ended since: a stuck or dead heartbeat.
    stuck = member(renewed=NOW - 16.0, attempted=NOW - 16.0)
    assert livez(stuck, LIMITS, NOW).status == 503
    assert "lease" in livez(stuck, LIMITS, NOW).body
    # Failing against Redis, but its last attempt ended longer ago than one attempt may take.
    gone = member(renewed=NOW - 60.0, attempted=NOW - 29.0, redis_down=True)
    assert livez(gone, LIMITS, NOW).status == 503
    assert livez(member(renewed=NOW - 60.0, attempted=NOW - 27.0, redis_down=True), LIMITS, NOW).ok


def test_before_redis_and_before_joining() -> None:
    fresh = HealthMarks(last_tick=NOW)
    assert startupz(fresh).status == 503
    assert readyz(fresh, LIMITS, NOW).status == 503
    assert livez(fresh, LIMITS, NOW).status == 200  # waiting for Redis is no reason to restart
    reached = HealthMarks(last_tick=NOW, reached=NOW)
    assert startupz(reached).status == 200
    assert readyz(reached, LIMITS, NOW).status == 503


def test_shutting_down_is_not_ready_but_live() -> None:
    m = member(stopping=True)
    assert readyz(m, LIMITS, NOW).status == 503
    assert livez(m, LIMITS, NOW).status == 200


def test_the_monitor_keeps_late_ticks_for_a_window() -> None:
    now = [0.0]
    mon = HealthMonitor(LIMITS, clock=lambda: now[0])
    mon.tick(0.0)
    now[0] = 6.0
    mon.tick(5.8)
    assert mon.marks().worst_lag == pytest.approx(5.8)
    assert livez(mon.marks(), LIMITS, now[0]).status == 503
    now[0] = 6.0 + LAG_WINDOW_S + 0.1
    mon.tick(0.0)
    assert mon.marks().worst_lag == 0.0
    assert livez(mon.marks(), LIMITS, now[0]).status == 200
    mon.reached()
    mon.joined()
    now[0] += 20.0
    mon.tick(0.0)
    assert livez(mon.marks(), LIMITS, now[0]).status == 503  # joined, never renewed since
    mon.heartbeat_failed()
    assert livez(mon.marks(), LIMITS, now[0]).status == 200
    assert readyz(mon.marks(), LIMITS, now[0]).status == 503
    mon.renewed()
    assert readyz(mon.marks(), LIMITS, now[0]).status == 200
    assert mon.lease_age() == 0.0
    mon.left()
    assert mon.lease_age() is None


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", ("GET", "/livez")),
        (b"HEAD /readyz?verbose=1 HTTP/1.0\r\n\r\n", ("HEAD", "/readyz")),
        (b"GET /livez\r\n\r\n", 400),
        (b"GET  /livez HTTP/1.1\r\n\r\n", 400),
        (b"GET livez HTTP/1.1\r\n\r\n", 400),
        (b"GET /livez HTTP/2.0\r\n\r\n", 400),
        (b"G\xc3\xa9T /livez HTTP/1.1\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"GET /a\x00b HTTP/1.1\r\n\r\n", 400),
        (b"\r\n\r\n", 400),
    ],
)
def test_request_line(head: bytes, expected: object) -> None:
    assert parse_request_line(head) == expected


def test_the_parser_never_raises_on_random_bytes() -> None:
    rng = random.Random(30)
    for _ in range(5000):
        out = parse_request_line(rng.randbytes(rng.randint(0, 200)) + b"\r\n\r\n")
        assert out == 400 or isinstance(out, tuple)


def test_a_response_is_complete_and_closes() -> None:
    raw = response(503, b"failed: x\n")
    head, body = raw.split(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"Content-Length: 10" in head and b"Connection: close" in head
    assert body == b"failed: x\n"
    head_only = response(200, b"abc", head_only=True)
    assert head_only.endswith(b"\r\n\r\n") and b"Content-Length: 3" in head_only
