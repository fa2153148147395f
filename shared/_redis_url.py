"""Parsing the Redis Cluster URL form (pure: no I/O, no redis import).

``redis+cluster://[user:password@]host:port[,host:port...][/0][?ssl_...=...]``
names the seed nodes of a Redis Cluster; ``rediss+cluster://`` is the same
over TLS. Any reachable seed is enough: the client learns the rest of the
cluster from it. A cluster has only database 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

# Query options passed through to redis-py (TLS only; everything else is a setting).
_TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>[0-9]{1,5})$")


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


__all__ = ["CLUSTER_SCHEMES", "ClusterUrl", "is_cluster_url", "parse_cluster_url"]
