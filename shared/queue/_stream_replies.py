"""redis-py's parsing of stream replies, replaced so that a repeated field name is seen.

Redis keeps every field of an entry as sent: ``XADD s * data A data B`` stores
both. redis-py turns each entry's field list into a dict (``pairs_to_dict``),
which keeps the last value of a repeated name and drops the others, silently.
:func:`keep_repeated_fields` replaces the response callbacks of the commands
that return entries (XRANGE, XREVRANGE, XREAD, XREADGROUP, XCLAIM, XAUTOCLAIM)
on one client with parsers that build each entry's fields with
:func:`~._entry.fields_of`: the same reply shapes as redis-py's (RESP2 shapes,
also for its default RESP3 wire protocol), the same dicts for every entry
whose names are unique, and an empty :class:`~shared.events.RepeatedFields`
(every field as sent in ``pairs``) for an entry that repeats a name.

Every client ``connect`` returns is set up so, and every reader of entries
here sets up the client it is given (idempotent): the shard consumer, the
shard state store's read-ahead, the dead-letter and admin stream readers.
:func:`~._entry.entries_from_reply` refuses rows parsed any other way.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Final, TypeVar

from ._entry import StreamRows, fields_of

_C = TypeVar("_C")


def _rows(response: Any, **options: Any) -> StreamRows | None:
    """XRANGE, XREVRANGE (and XCLAIM's entries): ``[[id, [f, v, ...]], ...]`` -> ``[(id, fields), ...]``."""
    if response is None:
        return None
    out = StreamRows()
    add = out.append  # per entry: bound once
    extra = "claim_min_idle_time" in options  # XREADGROUP ... CLAIM: delivery details follow the fields
    for row in response:
        if row is None:
            add((None, None))
        elif extra:
            add((row[0], fields_of(row[1]), *row[2:]))
        else:
            add((row[0], fields_of(row[1])))
    return out


def _streams(response: Any, **options: Any) -> list[list[Any]]:
    """XREAD, XREADGROUP: ``{stream: rows}`` (RESP3) or ``[[stream, rows]]`` (RESP2) -> the latter."""
    if not response:
        return []
    items = response.items() if isinstance(response, dict) else response
    return [[stream, _rows(rows, **options)] for stream, rows in items]


def _claimed(response: Any, **options: Any) -> Any:
    """XCLAIM: its entries, or their ids with JUSTID."""
    if options.get("parse_justid", False):
        return response
    return _rows(response)


def _auto_claimed(response: Any, **options: Any) -> Any:
    """XAUTOCLAIM: ``[next id, entries, deleted ids]``, or the ids alone with JUSTID."""
    if options.get("parse_justid", False):
        return response[1]
    response[1] = _rows(response[1])
    return response


_PARSERS: Final[dict[str, Callable[..., Any]]] = {
    "XRANGE": _rows,
    "XREVRANGE": _rows,
    "XREAD": _streams,
    "XREADGROUP": _streams,
    "XCLAIM": _claimed,
    "XAUTOCLAIM": _auto_claimed,
}

# The redis-py parsers each one replaces, by name (redis-py 5 to 8, RESP2 shapes, also
# for the RESP3 wire protocol that redis-py 8 speaks by default). Any other parser
# (a client made with protocol=3 or legacy_responses=False returns other shapes) is
# refused rather than replaced: its callers expect another shape.
_REPLACES: Final[dict[str, frozenset[str]]] = {
    "XRANGE": frozenset({"parse_stream_list"}),
    "XREVRANGE": frozenset({"parse_stream_list"}),
    "XREAD": frozenset({"parse_xread", "parse_xread_resp3_to_resp2_legacy"}),
    "XREADGROUP": frozenset({"parse_xread", "parse_xread_resp3_to_resp2_legacy"}),
    "XCLAIM": frozenset({"parse_xclaim"}),
    "XAUTOCLAIM": frozenset({"parse_xautoclaim"}),
}


def keep_repeated_fields(client: _C) -> _C:
    """Return ``client``, its stream replies parsed so that a repeated field name is seen (module doc).

    For redis-py's asyncio and blocking ``Redis`` and its asyncio
    ``RedisCluster`` (their pipelines use the client's parsers). Changes
    only how an entry that repeats a field name comes back; idempotent, no I/O.

    Raises:
        TypeError: the client has no response callbacks to replace (redis-py's
            blocking ``RedisCluster`` parses on each node's own client), or one
            of them is not redis-py's default parser for its command.
    """
    callbacks: MutableMapping[str, Callable[..., Any]] | None = getattr(client, "response_callbacks", None)
    if callbacks is None:
        raise TypeError(f"cannot set up how a {type(client).__name__} parses stream entries")
    for command, parser in _PARSERS.items():
        current = callbacks.get(command)
        if current is parser:
            continue
        if getattr(current, "__name__", None) not in _REPLACES[command]:
            raise TypeError(
                f"{type(client).__name__} parses {command} replies with {current!r}, not redis-py's default:"
                " entries that repeat a field name could not be seen"
            )
        callbacks[command] = parser
    return client


__all__ = ["keep_repeated_fields"]
