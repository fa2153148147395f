"""Stream entries and stream ids (plain values, no I/O)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ..events import RepeatedFields


# A msgspec Struct: intake builds one per event, and a Struct is built in C (a
# slots dataclass runs a Python __init__: about 1.7x the time). Nothing changes
# an entry after it is read. gc=False: an entry holds bytes and a dict of bytes,
# never a cycle.
class Entry(msgspec.Struct, gc=False):
    """One stream entry as read: its id and its fields (bytes to bytes).

    An entry whose fields are empty was deleted from the stream (trimmed)
    while it was still pending: Redis remembers that it was delivered but
    no longer has its content. Such an entry can only be acknowledged or
    dead-lettered. An entry that repeats a field name has empty fields too,
    of type :class:`~shared.events.RepeatedFields` (every field as sent is in
    its ``pairs``): no value of a repeated name is the right one, so none is
    offered (see :func:`fields_of`).
    """

    id: bytes
    fields: dict[bytes, bytes]

    @property
    def deleted(self) -> bool:
        """Return True when the entry's content is gone from the stream (see class doc)."""
        return not self.fields and type(self.fields) is not RepeatedFields


def as_text(value: bytes | str) -> str:
    """Return a Redis reply value as text (bytes are decoded as UTF-8, bad bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def as_bytes(value: object) -> bytes:
    """Return a Redis reply value as bytes (clients here never decode responses).

    Raises:
        TypeError: the value is neither bytes nor str.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"expected bytes from Redis, got {type(value).__name__}")


def id_key(stream_id: bytes | str) -> tuple[int, int]:
    """Return a stream id (``b"<ms>-<seq>"``) as a tuple that sorts like Redis sorts ids.

    Raises:
        ValueError: not a complete stream id.
    """
    text = stream_id.decode("ascii") if isinstance(stream_id, bytes) else stream_id
    ms, sep, seq = text.partition("-")
    if not sep:
        raise ValueError(f"not a complete stream id: {text!r}")
    return int(ms), int(seq)


def max_id(current: bytes | None, ids: Iterable[bytes]) -> bytes | None:
    """Return the greatest of ``current`` and ``ids`` (None when both are empty)."""
    best = current
    best_key = id_key(best) if best is not None else None
    for candidate in ids:
        key = id_key(candidate)
        if best_key is None or key > best_key:
            best, best_key = candidate, key
    return best


def fields_of(flat: Sequence[bytes] | None) -> dict[bytes, bytes]:
    """Return the fields of one stream entry from its field list as Redis sends it, ``[name, value, ...]``.

    Every reader of entries builds their fields here (:func:`entries_from_raw`,
    and redis-py's replies through :mod:`._stream_replies`), so that a name
    that occurs more than once is always seen: the fields are then an empty
    :class:`~shared.events.RepeatedFields` holding every field as sent, never
    a dict with one of the values. None or an empty list (an entry deleted
    while pending) gives an empty dict.
    """
    if not flat:
        return {}
    if len(flat) == 2:  # the usual entry: one field (data)
        return {flat[0]: flat[1]}
    names, values = flat[::2], flat[1::2]
    fields = dict(zip(names, values, strict=True))
    if len(fields) == len(names):
        return fields
    return RepeatedFields(zip(names, values, strict=True))


class StreamRows(list[tuple[Any, ...]]):
    """The ``(id, fields)`` rows of a stream reply whose fields :func:`fields_of` built.

    redis-py's own parsers build each entry's fields with ``dict(zip(...))``,
    keeping the last value of a repeated name; the parsers installed by
    :func:`~shared.queue.keep_repeated_fields` return this type instead, and
    :func:`entries_from_reply` refuses rows of any other type.
    """

    __slots__ = ()


def entries_from_reply(reply: Any) -> list[Entry]:
    """Return the entries of a parsed XREADGROUP/XREAD reply for ONE stream (redis-py RESP2 shape).

    ``reply`` is ``[[stream, [(id, {field: value}), ...]]]`` or empty, from a
    client set up by :func:`~shared.queue.keep_repeated_fields` (every client
    ``shared.queue.connect`` returns is).

    Raises:
        TypeError: the rows were parsed by redis-py's own stream parser, which
            drops all but the last value of a repeated field name.
    """
    if not reply:
        return []
    rows = reply[0][1]
    if type(rows) is not StreamRows and rows:
        raise TypeError(
            "this stream reply was parsed by redis-py's own parser, which keeps only the last value of a"
            " repeated field name: read entries with a client from shared.queue.connect, or pass the client"
            " through shared.queue.keep_repeated_fields first"
        )
    return [Entry(entry_id, {} if fields is None else fields) for entry_id, fields in rows]


def entries_from_raw(raw: Any) -> list[Entry]:
    """Return the entries of an unparsed stream reply ``[[id, [f, v, f, v, ...]], ...]`` (from Lua)."""
    out: list[Entry] = []
    add = out.append  # per event: bound once
    for item in raw or ():
        entry_id, flat = item[0], item[1]
        if flat and len(flat) == 2:  # the usual entry: one field (data); fields_of spelled out
            add(Entry(entry_id, {flat[0]: flat[1]}))
        else:
            add(Entry(entry_id, fields_of(flat)))
    return out


__all__ = [
    "Entry",
    "StreamRows",
    "as_text",
    "as_bytes",
    "entries_from_raw",
    "entries_from_reply",
    "fields_of",
    "id_key",
    "max_id",
]
