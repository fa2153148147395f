"""Avro object container files read block by block, and records walked without being built.

For copying records from one file into another of the same schema: the
header (:func:`read_header`), the blocks with their records still encoded
(:func:`iter_blocks`, each decompressed by the file's codec), and a record
scanner compiled from the schema (:func:`compile_scanner`) that finds where
each record ends and decodes only the top-level fields asked for. Malformed
input (a bad magic, a wrong sync marker, a record running past its block) is
a ``ValueError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any, Final, NamedTuple

from ._avro_codecs import Codec, codec
from ._avro_writer import CODEC_KEY, MAGIC, MAX_COMPILED, SCHEMA_KEY, SYNC_SIZE

Skip = Callable[[bytes, int], int]
"""Returns the position just past the datum that starts at the given position."""
Scanner = Callable[[bytes, int], tuple[int, tuple[Any, ...]]]
"""Returns the position just past the record at the given position, and the values of the fields asked for."""


def read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """Return the zig-zag varint at ``pos`` and the position after it. Raises IndexError past the end."""
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    n = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("an Avro varint longer than 10 bytes")


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = read_long(buf, pos)
    end = pos + n
    if n < 0 or end > len(buf):
        raise ValueError("an Avro string runs past its data")
    return buf[pos:end].decode(), end


class Header(NamedTuple):
    """An object container file's header."""

    meta: dict[str, bytes]
    sync: bytes
    end: int
    """The position of the first block."""

    @property
    def schema_json(self) -> str:
        """Return the file's schema, as the JSON text of its header."""
        try:
            return self.meta[SCHEMA_KEY].decode()
        except KeyError:
            raise ValueError("an Avro file without a schema") from None

    @property
    def codec_name(self) -> str:
        """Return the file's codec name (``null`` when the header names none, as Avro says)."""
        return self.meta.get(CODEC_KEY, b"null").decode()


def read_header(data: bytes) -> Header:
    """Return the header of the object container file ``data``.

    Raises:
        ValueError: not an Avro object container file.
    """
    if data[: len(MAGIC)] != MAGIC:
        raise ValueError("not an Avro object container file")
    try:
        pos = len(MAGIC)
        meta: dict[str, bytes] = {}
        while True:
            count, pos = read_long(data, pos)
            if count == 0:
                break
            if count < 0:
                count = -count
                _, pos = read_long(data, pos)
            for _ in range(count):
                key, pos = _read_string(data, pos)
                n, pos = read_long(data, pos)
                meta[key] = data[pos : pos + n]
                pos += n
        sync = data[pos : pos + SYNC_SIZE]
    except IndexError:
        raise ValueError("an Avro header runs past the file") from None
    if len(sync) != SYNC_SIZE:
        raise ValueError("an Avro header runs past the file")
    return Header(meta, sync, pos + SYNC_SIZE)


class Block(NamedTuple):
    """One block of a container file: its record count, its bytes as stored, and those decompressed."""

    entries: int
    stored: bytes
    data: bytes


def iter_blocks(data: bytes, header: Header) -> Iterator[Block]:
    """Yield the blocks of the container file ``data``, each with its records decompressed.

    Raises:
        ValueError: the file's codec is not supported, or a block is malformed.
    """
    c: Codec = codec(header.codec_name)
    pos = header.end
    end = len(data)
    while pos < end:
        try:
            count, pos = read_long(data, pos)
            size, pos = read_long(data, pos)
        except IndexError:
            raise ValueError("an Avro block header runs past the file") from None
        stop = pos + size
        if count < 0 or size < 0 or stop + SYNC_SIZE > end:
            raise ValueError("an Avro block runs past the file")
        stored = data[pos:stop]
        if data[stop : stop + SYNC_SIZE] != header.sync:
            raise ValueError("an Avro block ends without the file's sync marker")
        pos = stop + SYNC_SIZE
        yield Block(count, stored, stored if c.decompress is None else c.decompress(stored))


def _skip_long(buf: bytes, pos: int) -> int:
    while buf[pos] & 0x80:
        pos += 1
    return pos + 1


def _skip_bytes(buf: bytes, pos: int) -> int:
    b = buf[pos]
    if b < 0x80:  # a length below 64: its one byte read here
        return pos + 1 + ((b >> 1) ^ -(b & 1))
    n, pos = read_long(buf, pos)
    return pos + n


def _fixed_skip(size: int) -> Skip:
    def skip(buf: bytes, pos: int) -> int:
        return pos + size

    return skip


def _skip_null(buf: bytes, pos: int) -> int:
    return pos


_SKIPS: Final[dict[str, Skip]] = {
    "null": _skip_null,
    "boolean": _fixed_skip(1),
    "int": _skip_long,
    "long": _skip_long,
    "float": _fixed_skip(4),
    "double": _fixed_skip(8),
    "bytes": _skip_bytes,
    "string": _skip_bytes,
}


_VARINT: Final = rb"[\x80-\xff]*[\x00-\x7f]"
_SHAPES: Final[dict[str, bytes]] = {
    "null": b"",
    "boolean": b".",
    "int": _VARINT,
    "long": _VARINT,
    "float": b".{4}",
    "double": b".{8}",
}


def _shape(schema: Any) -> bytes | None:
    """Return a regular expression matching one datum of ``schema`` if it has a fixed shape, else None.

    Fixed shape: numbers, booleans, null, fixed and enums (their bytes need
    no length read first), and unions of those. A run of such fields is
    walked by one match (in C) instead of a call per field.
    """
    if isinstance(schema, str):
        return _SHAPES.get(schema)
    if isinstance(schema, list):
        branches = [_shape(b) for b in schema]
        if len(branches) > 63 or any(b is None for b in branches):
            return None
        return (
            b"(?:"
            + b"|".join(re.escape(bytes((i << 1,))) + b for i, b in enumerate(branches) if b is not None)
            + b")"
        )
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "fixed":
            return b".{%d}" % int(schema["size"])
        if kind == "enum":
            return _VARINT
        if isinstance(kind, str) and kind in _SHAPES:
            return _SHAPES[kind]
    return None


def _long_of(g: bytes) -> int:
    """Return the long whose whole varint is ``g``."""
    if len(g) == 1:
        b = g[0]
        return (b >> 1) ^ -(b & 1)
    n = 0
    shift = 0
    for b in g:
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1)


def _wanted_read(schema: Any) -> Callable[[bytes], Any]:
    """Return the decoder of a field asked for, from the bytes its match captured: a long, or it or null.

    Raises:
        ValueError: the field is of another type.
    """
    if isinstance(schema, dict) and schema.get("type") in ("int", "long"):
        schema = schema["type"]
    if schema in ("int", "long"):
        return _long_of
    if (
        isinstance(schema, list)
        and len(schema) == 2
        and "null" in schema
        and {*schema} <= {"null", "int", "long"}
    ):
        null_index = schema.index("null")

        def read_option(g: bytes) -> Any:
            index, pos = read_long(g, 0)
            return None if index == null_index else read_long(g, pos)[0]

        return read_option
    raise ValueError(f"a scanned field must be an int or a long, or one of them or null, not {schema!r}")


def _blocks_skip(items: Sequence[Skip]) -> Skip:
    """Skip an array or map: blocks of items (each item a run of ``items``), a block of 0 at the end."""

    def skip(buf: bytes, pos: int) -> int:
        while True:
            count, pos = read_long(buf, pos)
            if count == 0:
                return pos
            if count < 0:
                size, pos = read_long(buf, pos)
                pos += size
                continue
            for _ in range(count):
                for item in items:
                    pos = item(buf, pos)

    return skip


class _SkipCompiler:
    """Builds the skip function of a schema; named types by full name."""

    def __init__(self) -> None:
        self.named: dict[str, Skip | None] = {}

    @staticmethod
    def _fullname(name: str, namespace: str | None) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def compile(self, schema: Any, namespace: str | None = None) -> Skip:
        if isinstance(schema, str):
            if schema in _SKIPS:
                return _SKIPS[schema]
            for full in (self._fullname(schema, namespace), schema):
                if full in self.named:
                    found = self.named[full]
                    if found is None:
                        raise ValueError(f"recursive Avro type {schema!r} is not supported")
                    return found
            raise ValueError(f"unknown Avro type {schema!r}")
        if isinstance(schema, list):
            branches = [self.compile(b, namespace) for b in schema]
            if len(schema) == 2 and schema[0] == "null":
                some = branches[1]

                def skip_option(buf: bytes, pos: int) -> int:
                    # ["null", X]: the branch index is one byte, 0 (null) or 2 (X).
                    b = buf[pos]
                    if b == 0:
                        return pos + 1
                    if b != 2:
                        raise ValueError("an Avro union index out of range")
                    return some(buf, pos + 1)

                return skip_option

            def skip_union(buf: bytes, pos: int) -> int:
                index, pos = read_long(buf, pos)
                return branches[index](buf, pos)

            return skip_union
        kind = schema.get("type")
        if kind in ("record", "error"):
            full = self._fullname(str(schema["name"]), schema.get("namespace", namespace))
            self.named[full] = None
            inner = full.rpartition(".")[0] or None
            steps = _steps(self, schema["fields"], inner)

            def skip_record(buf: bytes, pos: int) -> int:
                for skip, match, _ in steps:
                    if skip is not None:
                        pos = skip(buf, pos)
                        continue
                    m = match(buf, pos)  # type: ignore[misc]
                    if m is None:
                        raise ValueError("an Avro record runs past its block")
                    pos = m.end()
                return pos

            self.named[full] = skip_record
            return skip_record
        if kind == "array":
            return _blocks_skip([self.compile(schema["items"], namespace)])
        if kind == "map":
            return _blocks_skip([_skip_bytes, self.compile(schema["values"], namespace)])
        if kind in ("fixed", "enum"):
            full = self._fullname(str(schema["name"]), schema.get("namespace", namespace))
            found = _fixed_skip(int(schema["size"])) if kind == "fixed" else _skip_long
            self.named[full] = found
            return found
        return self.compile(kind, namespace)


@lru_cache(maxsize=MAX_COMPILED)
def _scanner(schema_json: str, wanted: tuple[str, ...]) -> Scanner:
    schema = json.loads(schema_json)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError("a scanned Avro schema must be a record")
    names = [str(f["name"]) for f in schema["fields"]]
    missing = [w for w in wanted if w not in names]
    if missing:
        raise ValueError(f"the Avro record has no field {missing}")
    compiler = _SkipCompiler()
    full = compiler._fullname(str(schema["name"]), schema.get("namespace"))
    namespace = full.rpartition(".")[0] or None
    compiler.named[full] = None
    steps = _steps(compiler, schema["fields"], namespace, wanted)
    n = len(wanted)

    def scan(buf: bytes, pos: int) -> tuple[int, tuple[Any, ...]]:
        values: list[Any] = [None] * n
        for skip, match, reads in steps:
            if skip is not None:
                pos = skip(buf, pos)
                continue
            m = match(buf, pos)  # type: ignore[misc]
            if m is None:
                raise ValueError("an Avro record runs past its block")
            if reads:
                groups = m.groups()
                for group, slot, read in reads:
                    values[slot] = read(groups[group])
            pos = m.end()
        return pos, tuple(values)

    return scan


_Step = tuple[
    Skip | None,
    Callable[[bytes, int], "re.Match[bytes] | None"] | None,
    list[tuple[int, int, Callable[[bytes], Any]]],
]


def _steps(
    compiler: _SkipCompiler, fields: list[Any], namespace: str | None, wanted: Sequence[str] = ()
) -> list[_Step]:
    """Return the steps that walk a record's ``fields``: a skip, or one match for each run of fixed shapes."""
    steps: list[_Step] = []
    run: list[bytes] = []
    reads: list[tuple[int, int, Callable[[bytes], Any]]] = []

    def close_run() -> None:
        if run:
            steps.append((None, re.compile(b"".join(run), re.DOTALL).match, list(reads)))
            run.clear()
            reads.clear()

    for field in fields:
        name = str(field["name"])
        shape = _shape(field["type"])
        if name in wanted:
            read = _wanted_read(field["type"])
            assert shape is not None  # an int, a long, or one of them or null
            run.append(b"(" + shape + b")")
            reads.append((len(reads), wanted.index(name), read))
        elif shape is not None:
            run.append(shape)
        else:
            close_run()
            steps.append((compiler.compile(field["type"], namespace), None, []))
    close_run()
    return steps


def compile_scanner(schema_json: str, wanted: Sequence[str]) -> Scanner:
    """Return the scanner of a record schema: a record's end and its ``wanted`` top-level fields, decoded.

    The fields asked for must be int, long, boolean or null, or unions of
    those (``["null", "long"]``); every other field is skipped unread.
    Compiled once per schema and fields.

    Raises:
        ValueError: the schema is not a record, lacks a field asked for, or holds a type not walked here.
    """
    try:
        return _scanner(schema_json, tuple(wanted))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an Avro schema this scanner can compile: {exc}") from exc


def split_records(records: bytes, count: int, scan: Scanner) -> Iterator[tuple[int, int, tuple[Any, ...]]]:
    """Yield each of a block's ``count`` records as its start, its end and the values ``scan`` decodes.

    Raises:
        ValueError: the records do not fill the block exactly.
    """
    pos = 0
    end = len(records)
    try:
        for _ in range(count):
            start = pos
            pos, values = scan(records, pos)
            if pos > end:
                raise ValueError("an Avro record runs past its block")
            yield start, pos, values
    except IndexError:
        raise ValueError("an Avro record runs past its block") from None
    if pos != end:
        raise ValueError("an Avro block holds more bytes than its records")
