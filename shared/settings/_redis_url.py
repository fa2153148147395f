"""Redis URLs: the password kept out of them, and the Redis Cluster URL form (pure: no I/O, no redis import).

:func:`split_redis_url` moves a password out of a ``redis://`` URL (from
``user:password@``, or a ``password=`` query option) so the URL that remains
can be printed; :func:`masked_url` prints one with the password masked. The
password itself is never parsed, so any character works in it (``#``, ``/``,
``@``, ``:``): the user part ends at the last ``@`` before the host.

``redis+cluster://[user:password@]host:port[,host:port...][/0][?ssl_...=...]``
names the seed nodes of a Redis Cluster; ``rediss+cluster://`` is the same
over TLS. Any reachable seed is enough: the client learns the rest of the
cluster from it. A cluster has only database 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from ._secret import MASK

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

# Query options passed through to redis-py (TLS only; everything else is a setting).
_TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>[0-9]{1,5})$")


def split_redis_url(url: str) -> tuple[str, str | None]:
    """Return ``(url without its password, the password or None)``.

    The password is taken from ``scheme://[user]:password@host...`` (the user
    part ends at the last ``@``, then it is percent-decoded as redis-py does:
    ``#``, ``/``, ``@`` and ``:`` work as they are, ``%`` and ``?`` must be
    encoded) or from a ``password=`` query option. The user name stays in the
    URL.
    Never raises and never echoes the password: a URL that does not parse is
    returned (password removed) for the connection layer to reject.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url, None
    password: str | None = None
    # The authority ends at the first '/' or '?' after the user part; the user
    # part itself ends at the last '@' (a password may hold '@', '/', '#', ':').
    at, q = rest.rfind("@"), rest.find("?")
    if 0 <= q < at and "=" in rest[q:at] and rest.rfind("@", 0, q) >= 0:
        at = rest.rfind("@", 0, q)  # an '@' in a query option's value, after the user part
    if at >= 0:
        userinfo, rest = rest[:at], rest[at + 1 :]
        user, colon, pw = userinfo.partition(":")
        if colon:
            password = unquote(pw)
        rest = (quote(unquote(user), safe="") + "@" + rest) if user else rest
    head, qmark, query = rest.partition("?")
    if qmark:
        pairs = parse_qsl(query, keep_blank_values=True)
        found = [v for k, v in pairs if k == "password"]
        if found:
            password = found[-1]
            kept = [(k, v) for k, v in pairs if k != "password"]
            rest = head + ("?" + urlencode(kept) if kept else "")
    return f"{scheme}://{rest}", (password or None)


def masked_url(url: str, *, has_password: bool = False) -> str:
    """Return ``url`` fit to print: any password replaced by the mask.

    ``has_password``: show the mask even though ``url`` itself holds no
    password (it was moved into a setting of its own).
    """
    clean, password = split_redis_url(url)
    if password is None and not has_password:
        return clean
    scheme, _, rest = clean.partition("://")
    user, at, host = rest.rpartition("@")
    return f"{scheme}://{user}:{MASK}@{host}" if at else f"{scheme}://:{MASK}@{rest}"


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """The parts of a cluster URL: seed nodes, TLS, credentials, TLS options."""

    nodes: tuple[tuple[str, int], ...]
    tls: bool
    username: str | None
    password: str | None
    options: tuple[tuple[str, str], ...]


def is_cluster_url(url: str) -> bool:
    """Return True when ``url`` uses a cluster scheme."""
    return url.startswith(CLUSTER_SCHEMES)


def parse_cluster_url(url: str) -> ClusterUrl:
    """Return the parts of a ``redis+cluster://`` / ``rediss+cluster://`` URL.

    Raises:
        ValueError: not a cluster URL, no seed node, a seed without a port or
            with a bad one, a database other than 0, or an unknown query option
            (the message never repeats the password).
    """
    if not is_cluster_url(url):
        raise ValueError("a cluster url starts with redis+cluster:// or rediss+cluster://")
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, the url names /{path}")
    creds, _, hosts = netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if creds:
        user, has_pw, pw = creds.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if has_pw else None
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        m = _HOST_RE.match(part.strip())
        if m is None:
            raise ValueError(f"bad cluster seed {part.strip()!r}: use host:port[,host:port...]")
        port = int(m["port"])
        if not 0 < port < 65536:
            raise ValueError(f"bad port in cluster seed {part.strip()!r}")
        nodes.append((m["v6"] or m["host"], port))
    options = tuple(parse_qsl(query, keep_blank_values=True, strict_parsing=False))
    unknown = sorted({k for k, _ in options} - _TLS_OPTIONS)
    if unknown:
        raise ValueError(f"unknown cluster url option(s) {unknown}: only {sorted(_TLS_OPTIONS)}")
    return ClusterUrl(
        nodes=tuple(nodes),
        tls=scheme == "rediss+cluster",
        username=username,
        password=password,
        options=options,
    )


__all__ = [
    "CLUSTER_SCHEMES",
    "ClusterUrl",
    "is_cluster_url",
    "masked_url",
    "parse_cluster_url",
    "split_redis_url",
]
