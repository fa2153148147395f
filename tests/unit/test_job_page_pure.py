"""The job page's pure parts: the driver's liveness from the shard rows, and the page cursor."""

from __future__ import annotations

import pytest

from coordinator.admin._job_page import format_cursor, liveness, parse_cursor
from shared import BadInput


def _open(shard: int, opened_at: float, beat_at: float | None) -> dict[str, object]:
    alive = None if beat_at is None else {"beat_at": beat_at, "ttl_s": 3.0}
    return {"shard": shard, "state": "open", "opened_at": opened_at, "timeout_s": 30.0, "alive": alive}


def test_liveness_alive_silent_and_ended() -> None:
    now = 1000.0
    live = liveness([_open(0, 900.0, 990.0), _open(1, 900.0, None)], now)
    assert live == {"state": "alive", "beat_at": 990.0, "silent_s": 10.0, "timeout_s": 30.0}
    # No key on any open shard: silent since the job opened (its opening counts as a sign of life).
    assert liveness([_open(0, 950.0, None)], now)["state"] == "silent"
    assert liveness([_open(0, 950.0, None)], now)["silent_s"] == 50.0
    assert liveness([{"shard": 2, "state": "ended"}], now)["state"] == "ended"
    assert liveness([], now)["state"] == "ended"


@pytest.mark.parametrize("after", [None, "d00001", "s*l?s[b]", "ü" * 128])
def test_cursor_round_trips(after: str | None) -> None:
    assert parse_cursor(format_cursor((3, 12345, after)), 4) == (3, 12345, after)


@pytest.mark.parametrize(
    "text", ["", "x", "4.0", "1", "1.-1", "1.0.!!", "1.0.a.b", "1." + "9" * 21, "0.0.gA"]
)
def test_bad_cursors_are_refused(text: str) -> None:
    with pytest.raises(BadInput):
        parse_cursor(text, 4)
