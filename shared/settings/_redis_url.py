"""Redis URLs: the password kept out of them, the Cluster and Sentinel URL forms (pure: no I/O, no redis).

:func:`split_redis_url` moves a password out of a ``redis://`` URL (from
``user:password@``, or a ``password=`` query option) so the URL that remains
can be printed; :func:`masked_url` prints one with the password masked. The
password itself is never parsed, so any character works in it (``#``, ``/``,
``@``, ``:``): the user part ends at the last ``@`` before the host.

``redis+cluster://[user:password@]host:port[,host:port...][/0][?ssl_...=...]``
names the seed nodes of a Redis Cluster; ``rediss+cluster://`` is the same
over TLS. Any reachable seed is enough: the client learns the rest of the
cluster from it. A cluster has only database 0.

``redis+sentinel://[user:password@]host[:port][,host[:port]...]/SERVICE[/db][?...]``
names the Sentinels watching the master group ``SERVICE`` (port 26379 when
left out); ``rediss+sentinel://`` speaks TLS to the Sentinels and to the
master. The credentials authenticate to the master (and so to the replica
that replaces it); the Sentinels are asked without credentials unless
``?sentinel_auth=same`` says to send them the same ones. Cluster and
Sentinel do not combine: a Redis Cluster fails over by itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode

from ._secret import MASK

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
SENTINEL_PORT = 26379

# Query options passed through to redis-py (TLS only; everything else is a setting).
_TLS_OPTIONS = frozenset(
    {"ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)
_HOST_RE = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+)):(?P<port>[0-9]{1,5})$")
_SENTINEL_HOST_RE = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?$"
)
# A Sentinel master group's name: what `sentinel monitor <name> ...` accepts in practice.
_SERVICE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# How the Sentinels are authenticated: not at all (redis-py's default), or with the URL's credentials.
SENTINEL_AUTH = ("none", "same")


def _credentials(creds: str) -> tuple[str | None, str | None]:
    """Return (username, password) of a URL's ``user:password`` part, percent-decoded (None when absent)."""
    if not creds:
        return None, None
    user, has_pw, pw = creds.partition(":")
    return unquote(user) or None, (unquote(pw) if has_pw else None)


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
    username, password = _credentials(creds)
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


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """The parts of a Sentinel URL: the Sentinels, the master group, db, TLS, credentials, options."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    tls: bool
    username: str | None
    password: str | None
    sentinel_auth: bool
    """Send ``username`` / ``password`` to the Sentinels too (``?sentinel_auth=same``)."""
    options: tuple[tuple[str, str], ...]
    """TLS options (``ssl_*``), for the Sentinels and the master alike."""


def is_sentinel_url(url: str) -> bool:
    """Return True when ``url`` uses a Sentinel scheme."""
    return url.startswith(SENTINEL_SCHEMES)


def _refuse_cluster_and_sentinel(url: str) -> None:
    scheme = url.partition("://")[0].lower()
    if "cluster" in scheme and "sentinel" in scheme:
        raise ValueError(
            "Redis Cluster and Sentinel do not combine (a cluster fails over by itself): "
            "use redis+cluster:// for a cluster or redis+sentinel:// for a Sentinel-managed master"
        )


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Return the parts of a ``redis+sentinel://`` / ``rediss+sentinel://`` URL.

    Raises:
        ValueError: not a Sentinel URL, no Sentinel, a bad host or port, no
            service name or a bad one, a database that is not a number, an
            unknown query option (the message never repeats the password).
    """
    _refuse_cluster_and_sentinel(url)
    if not is_sentinel_url(url):
        raise ValueError("a sentinel url starts with redis+sentinel:// or rediss+sentinel://")
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    creds, _, rest = rest.rpartition("@")
    netloc, _, path = rest.partition("/")
    username, password = _credentials(creds)
    sentinels: list[tuple[str, int]] = []
    for part in netloc.split(","):
        m = _SENTINEL_HOST_RE.match(part.strip())
        if m is None:
            raise ValueError(f"bad sentinel {part.strip()!r}: use host[:port][,host[:port]...]/SERVICE")
        port = int(m["port"]) if m["port"] else SENTINEL_PORT
        if not 0 < port < 65536:
            raise ValueError(f"bad port in sentinel {part.strip()!r}")
        sentinels.append((m["v6"] or m["host"], port))
    service, _, db_text = unquote(path).partition("/")
    if not service:
        raise ValueError(
            "a sentinel url names the master group after the hosts: redis+sentinel://h:26379/SERVICE"
        )
    if _SERVICE_RE.match(service) is None:
        raise ValueError(f"bad sentinel service name {service!r}: letters, digits, '_', '.', ':', '-'")
    if db_text and not (db_text.isdigit() and int(db_text) < 1_000_000):
        raise ValueError(f"bad database {db_text!r} in the sentinel url: a number (/SERVICE/db)")
    pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
    auth = [v for k, v in pairs if k == "sentinel_auth"]
    if auth and auth[-1] not in SENTINEL_AUTH:
        raise ValueError(f"sentinel_auth must be one of {list(SENTINEL_AUTH)}, got {auth[-1]!r}")
    options = tuple((k, v) for k, v in pairs if k != "sentinel_auth")
    unknown = sorted({k for k, _ in options} - _TLS_OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown sentinel url option(s) {unknown}: only sentinel_auth and {sorted(_TLS_OPTIONS)}"
        )
    return SentinelUrl(
        sentinels=tuple(sentinels),
        service=service,
        db=int(db_text or 0),
        tls=scheme == "rediss+sentinel",
        username=username,
        password=password,
        sentinel_auth=bool(auth) and auth[-1] == "same",
        options=options,
    )


def check_redis_url(url: str) -> None:
    """Check that ``url`` (its password already moved out) is a Redis URL commitfleet can use.

    Raises:
        ValueError: one line saying what is wrong (never repeating a password).
    """
    _refuse_cluster_and_sentinel(url)
    if is_cluster_url(url):
        parse_cluster_url(url)
    elif is_sentinel_url(url):
        parse_sentinel_url(url)
    elif not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(
            "redis.url must start with redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
            "redis+sentinel:// or rediss+sentinel://"
        )


__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_PORT",
    "SENTINEL_SCHEMES",
    "ClusterUrl",
    "SentinelUrl",
    "check_redis_url",
    "is_cluster_url",
    "is_sentinel_url",
    "masked_url",
    "parse_cluster_url",
    "parse_sentinel_url",
    "split_redis_url",
]
