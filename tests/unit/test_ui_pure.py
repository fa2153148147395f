"""The console's pure parts: Host and origin checks, session cookie, commit history."""

from __future__ import annotations

import pytest

from coordinator.admin._ui_auth import (
    LOOPBACK_NAMES,
    authorized,
    host_allowed,
    host_name,
    same_origin,
    session_value,
)
from coordinator.admin._ui_history import WINDOW_MINUTES, CommitHistory, window_start_id
from shared.settings import is_loopback_host

TOKEN = "a-token-of-enough-length"


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8787", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8787", "::1"),
        ("::1", "::1"),
        ("fleet.internal:80", "fleet.internal"),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


def test_host_allowed() -> None:
    allowed = LOOPBACK_NAMES | {"fleet.internal"}
    assert host_allowed("127.0.0.5:1", allowed)  # any loopback address
    assert host_allowed("fleet.internal:8787", allowed)
    bad_hosts = (None, "", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "fleet.internal.x")
    for bad in bad_hosts:
        assert not host_allowed(bad, allowed), bad
    assert host_allowed("anything", frozenset({"*"}))


def test_loopback_bind_addresses() -> None:
    assert all(map(is_loopback_host, ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "a.localhost"]))
    assert not any(map(is_loopback_host, ["0.0.0.0", "::", "", "10.0.0.1", "example.com"]))


def test_token_by_header_or_derived_cookie() -> None:
    cookie = session_value(TOKEN)
    assert TOKEN not in cookie and cookie != session_value(TOKEN + "x")
    assert authorized({}, {}, "")  # no token set: open (loopback only, see the settings)
    assert not authorized({}, {}, TOKEN)
    assert authorized({"Authorization": f"Bearer {TOKEN}"}, {}, TOKEN)
    assert authorized({"Authorization": f"bearer {TOKEN}"}, {}, TOKEN)
    assert not authorized({"Authorization": f"Basic {TOKEN}"}, {}, TOKEN)
    assert not authorized({"Authorization": "Bearer " + TOKEN[:-1]}, {}, TOKEN)
    assert authorized({}, {"commitfleet_session": cookie}, TOKEN)
    assert not authorized({}, {"commitfleet_session": TOKEN}, TOKEN)  # the raw token is not a session


def test_same_origin() -> None:
    host = {"Host": "127.0.0.1:8787"}
    assert same_origin({**host, "Origin": "http://127.0.0.1:8787"}, "http")
    assert not same_origin({**host, "Origin": "http://evil.example"}, "http")
    assert not same_origin({**host, "Origin": "null"}, "http")
    assert not same_origin({**host, "Origin": "https://127.0.0.1:8787"}, "http")
    assert not same_origin({**host, "Sec-Fetch-Site": "cross-site"}, "http")
    assert not same_origin({**host, "Sec-Fetch-Site": "same-site"}, "http")
    assert same_origin({**host, "Sec-Fetch-Site": "same-origin"}, "http")
    assert same_origin(host, "http")  # not a browser (curl): no Origin, no Sec-Fetch-Site


def test_commit_history_window() -> None:
    h = CommitHistory()
    now = 1_000_000 * 60 + 30.0
    h.add(now - 5, 0.2)
    h.add(now - 1, 0.4)
    h.add(now - 120, 1.0)
    h.add(now - WINDOW_MINUTES * 60 - 60, 9.0)  # out of the window
    doc = h.series(now)
    pts = doc["points"]
    assert len(pts) == WINDOW_MINUTES and pts[-1]["t"] == 1_000_000 * 60
    assert doc["commits"] == 3
    last = {"t": 1_000_000 * 60, "commits": 2, "per_s": round(2 / 60, 4), "mean_s": 0.3, "max_s": 0.4}
    assert pts[-1] == last
    assert pts[-3]["commits"] == 1 and pts[-3]["max_s"] == 1.0
    assert pts[-2]["mean_s"] is None
    # Old minutes are forgotten as new ones come: the ring stays bounded.
    for m in range(3 * WINDOW_MINUTES):
        h.add(now + m * 60, 0.1)
    assert len(h._minutes) <= WINDOW_MINUTES + 1
    assert window_start_id(now) == f"{int((now - WINDOW_MINUTES * 60) * 1000)}-0"


def test_the_console_knows_every_admin_event_type() -> None:
    # The events panel's type filter and its live listeners come from one list in app.js.
    import re
    from importlib import resources

    from shared.events import ADMIN_EVENT_TYPES

    js = (resources.files("coordinator.admin") / "ui_static" / "app.js").read_text()
    found = re.search(r"const EVENT_TYPES = \[(.*?)\];", js, re.S)
    assert found, "app.js has no EVENT_TYPES list"
    assert sorted(re.findall(r'"([a-z_]+)"', found.group(1))) == sorted(ADMIN_EVENT_TYPES)
