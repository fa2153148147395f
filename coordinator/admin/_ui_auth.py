"""Who may talk to the admin API and the web console: pure checks, no I/O.

- The bind check: an API bound to anything but a loopback address needs a
  token (``coordinator.admin_token``), or the coordinator does not start.
- The Host check: a request whose ``Host`` is not a loopback name or one of
  ``coordinator.allowed_hosts`` is refused, so a DNS-rebinding page cannot
  reach an API bound to 127.0.0.1 through a name of its own.
- The token: ``Authorization: Bearer <token>``, or the console's session
  cookie (HttpOnly, SameSite=Strict) set by its login form.
- Cross-site requests: a state-changing request authenticated by the cookie
  must come from the console's own origin (the ``Origin`` header).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from typing import Final

from shared import ConfigError
from shared.settings import CoordinatorSettings, is_loopback_host

SESSION_COOKIE: Final = "commitfleet_session"
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def check_bind(c: CoordinatorSettings) -> None:
    """Refuse a bind address that exposes the API without a token.

    The settings refuse such a pair already; this guards settings built otherwise.

    Raises:
        ConfigError: ``http_host`` is not loopback and ``admin_token`` is empty.
    """
    if not c.admin_token and not is_loopback_host(c.http_host):
        raise ConfigError(
            f"coordinator.admin_token is required to serve the admin API on {c.http_host!r} "
            "(not a loopback address); set COMMITFLEET_COORDINATOR_ADMIN_TOKEN"
        )


def host_name(header: str) -> str:
    """Return the host part of a ``Host`` header value (no port, brackets stripped, lower case)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


def allowed_hosts(c: CoordinatorSettings) -> frozenset[str]:
    """Return the host names the API answers to: the loopback names and ``allowed_hosts``."""
    extra = {host_name(h) for h in c.allowed_hosts.split(",") if h.strip()}
    return LOOPBACK_NAMES | extra


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Return True when the request's ``Host`` header names an allowed host."""
    if not header:
        return False
    name = host_name(header)
    if name in allowed or "*" in allowed:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def session_value(token: str) -> str:
    """Return the session cookie's value for ``token`` (derived: the cookie never holds the token)."""
    return hmac.new(token.encode(), b"commitfleet console session v1", hashlib.sha256).hexdigest()


def _raw(text: str) -> bytes:
    # A header's bytes that are not UTF-8 come in as surrogates: they never
    # match a token, and must not fail the request (surrogatepass encodes any).
    return text.encode("utf-8", "surrogatepass")


def bearer_ok(headers: Mapping[str, str], token: str) -> bool:
    """Return True when the ``Authorization`` header carries ``token`` (any bytes: False, never an error)."""
    scheme, _, given = headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(_raw(given.strip()), token.encode())


def cookie_ok(cookies: Mapping[str, str], token: str) -> bool:
    """Return True when the session cookie was made from ``token`` (any bytes: False, never an error)."""
    return hmac.compare_digest(_raw(cookies.get(SESSION_COOKIE, "")), session_value(token).encode())


def authorized(headers: Mapping[str, str], cookies: Mapping[str, str], token: str) -> bool:
    """Return True when no token is set, or the request carries it (header or cookie)."""
    return not token or bearer_ok(headers, token) or cookie_ok(cookies, token)


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """Return True when a browser request comes from the page's own origin.

    A request with a valid bearer token needs no such check (a page cannot
    make a browser add it); this one stops forged form posts and fetches of
    another site. A request with neither ``Origin`` nor ``Sec-Fetch-Site``
    is not a browser's (curl, scripts) and passes.
    """
    origin = headers.get("Origin")
    if origin is not None:
        return origin.lower() == f"{scheme}://{headers.get('Host', '')}".lower()
    site = headers.get("Sec-Fetch-Site")
    return site is None or site in ("same-origin", "none")
