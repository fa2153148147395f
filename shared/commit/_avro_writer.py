"""Avro binary encoding compiled once from a schema, and the object container file writer around it.

:func:`compile_encoder` turns an Avro schema (JSON text, or its parsed form)
into one closure per schema node, cached by schema (:data:`MAX_COMPILED`
schemas, least recently used first out). An encoder appends one datum to a
``bytearray``. The values it takes:

- record: a sequence of the field values in the schema's field order (a
  tuple, a list, a pyiceberg ``Record``), or a ``dict`` by field name (a
  missing field takes its default);
- ``["null", X]`` (either order): ``None`` or a value of X; a general union
  takes the first branch whose Python type fits the value;
- array: a sequence; map: a ``dict`` with ``str`` keys; an Iceberg int-keyed
  map (an array of key/value records marked ``"logicalType": "map"``): a
  ``dict`` (or, as the plain array, a sequence of key/value pairs);
- int, long (also under date, time and timestamp logical types): ``int``,
  checked against the type's range; float, double: ``float`` (or ``int``);
  boolean; bytes: a bytes-like; string: ``str``; fixed: bytes of its size;
  enum: the symbol; decimal (on fixed or bytes): a ``Decimal`` (rescaled to
  the schema's scale, which must be exact) or its two's complement bytes;
  uuid on fixed: a ``UUID`` or 16 bytes.

A schema this module cannot encode (a recursive named type, an unknown type
name) is a ``ValueError`` when compiled, so a caller can fall back. A value
that does not fit its schema is a ``ValueError`` or ``TypeError`` when
encoded, and leaves nothing of itself in the output.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import Any, Final
from uuid import UUID

from ._avro_codecs import Codec, codec

Encoder = Callable[[bytearray, Any], None]
"""Appends one datum's Avro binary encoding to the buffer."""

MAGIC: Final = b"Obj\x01"
SYNC_SIZE: Final = 16
MAX_COMPILED: Final = 64
DEFAULT_BLOCK_BYTES: Final = 256 * 1024
"""A block is closed once this many uncompressed bytes are in it (Avro's own writers use 64 KiB to 1 MiB)."""

SCHEMA_KEY: Final = "avro.schema"
CODEC_KEY: Final = "avro.codec"

# Varints 14 bits at a time: the last one to two bytes of a varint (0..2^14-1, so the whole of a small one)
# and two bytes with the continuation bit for each 14 bits before them. Built once (about 1 MiB).
_SMALL: Final = tuple(bytes((z,)) if z < 0x80 else bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(1 << 14))
_CONT: Final = tuple(bytes(((z & 0x7F) | 0x80, (z >> 7) | 0x80)) for z in range(1 << 14))
_FLOAT: Final = struct.Struct("<f")
_DOUBLE: Final = struct.Struct("<d")


def _put_varint(out: bytearray, z: int) -> None:
    """Append the varint of a non-negative ``z`` (already zig-zagged), 14 bits a step."""
    while z >= 0x4000:
        out += _CONT[z & 0x3FFF]
        z >>= 14
    out += _SMALL[z]


def _write_long(out: bytearray, n: int) -> None:
    z = (n << 1) ^ (n >> 63)
    if 0 <= z < 0x4000:
        out += _SMALL[z]
    elif 0 <= z < (1 << 64) and n >= -(1 << 63):
        _put_varint(out, z)
    else:
        raise ValueError(f"{n} does not fit a 64-bit Avro long")


def _write_int(out: bytearray, n: int) -> None:
    z = (n << 1) ^ (n >> 31)
    if 0 <= z < 0x4000:
        out += _SMALL[z]
    elif -(1 << 31) <= n < (1 << 31):
        _put_varint(out, z)
    else:
        raise ValueError(f"{n} does not fit a 32-bit Avro int")


def _write_string(out: bytearray, s: str) -> None:
    b = s.encode()
    n = len(b)
    if n < 0x2000:
        out += _SMALL[n << 1]
    else:
        _put_varint(out, n << 1)
    out += b


def _write_bytes(out: bytearray, b: bytes) -> None:
    n = len(b)
    if n < 0x2000:
        out += _SMALL[n << 1]
    else:
        _put_varint(out, n << 1)
    out += b


def _write_boolean(out: bytearray, v: bool) -> None:
    out += b"\x01" if v else b"\x00"


def _write_float(out: bytearray, v: float) -> None:
    out += _FLOAT.pack(v)


def _write_double(out: bytearray, v: float) -> None:
    out += _DOUBLE.pack(v)


def _write_null(out: bytearray, v: None) -> None:
    if v is not None:
        raise ValueError(f"Avro null takes None, not {v!r}")


_PRIMITIVES: Final[dict[str, Encoder]] = {
    "null": _write_null,
    "boolean": _write_boolean,
    "int": _write_int,
    "long": _write_long,
    "float": _write_float,
    "double": _write_double,
    "bytes": _write_bytes,
    "string": _write_string,
}

# What a general union's branch takes, by the branch's type: the Python types that pick it.
_BRANCH_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "null": (type(None),),
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (float, int),
    "double": (float, int),
    "bytes": (bytes, bytearray, memoryview, Decimal),
    "string": (str,),
    "fixed": (bytes, bytearray, memoryview, Decimal, UUID),
    "enum": (str,),
    "array": (list, tuple),
    "map": (dict,),
    "record": (tuple, list, dict),
}


def _unscaled(value: Decimal, scale: int) -> int:
    scaled = value.scaleb(scale)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{value} does not fit a decimal of scale {scale}")
    return int(scaled)


def _decimal_fixed(size: int, scale: int) -> Encoder:
    def encode(out: bytearray, v: Any) -> None:
        if isinstance(v, Decimal):
            try:
                v = _unscaled(v, scale).to_bytes(size, "big", signed=True)
            except OverflowError as exc:
                raise ValueError(f"decimal {v} does not fit {size} bytes") from exc
        _fixed(size)(out, v)

    return encode


def _decimal_bytes(scale: int) -> Encoder:
    def encode(out: bytearray, v: Any) -> None:
        if isinstance(v, Decimal):
            n = _unscaled(v, scale)
            v = n.to_bytes(max(1, (n + (n < 0)).bit_length() // 8 + 1), "big", signed=True)
        _write_bytes(out, v)

    return encode


def _uuid_fixed(out: bytearray, v: Any) -> None:
    _FIXED16(out, v.bytes if isinstance(v, UUID) else v)


def _fixed(size: int) -> Encoder:
    def encode(out: bytearray, v: bytes) -> None:
        if len(v) != size:
            raise ValueError(f"Avro fixed of {size} bytes given {len(v)} bytes")
        out += v

    return encode


_FIXED16: Final = _fixed(16)


def _option(inner: Encoder, null_first: bool) -> Encoder:
    null, some = (b"\x00", b"\x02") if null_first else (b"\x02", b"\x00")

    def encode(out: bytearray, v: Any) -> None:
        if v is None:
            out += null
        else:
            out += some
            inner(out, v)

    return encode


def _union(branches: list[tuple[str, Encoder]]) -> Encoder:
    picks = [(_BRANCH_TYPES[kind], _SMALL[i << 1], enc) for i, (kind, enc) in enumerate(branches)]

    def encode(out: bytearray, v: Any) -> None:
        for types, index, enc in picks:
            # bool is an int: an int branch takes no bool unless nothing else does (boolean comes first here).
            if isinstance(v, types) and not (isinstance(v, bool) and bool not in types):
                out += index
                enc(out, v)
                return
        raise ValueError(f"no branch of the Avro union takes {type(v).__name__}")

    return encode


def _array(item: Encoder) -> Encoder:
    def encode(out: bytearray, v: Sequence[Any]) -> None:
        if n := len(v):
            _write_long(out, n)
            for x in v:
                item(out, x)
        out += b"\x00"

    return encode


def _map(value: Encoder) -> Encoder:
    def encode(out: bytearray, v: Mapping[str, Any]) -> None:
        if n := len(v):
            _write_long(out, n)
            for k, x in v.items():
                _write_string(out, k)
                value(out, x)
        out += b"\x00"

    return encode


def _keyed_map(key: Encoder, value: Encoder, as_array: Encoder) -> Encoder:
    """An Iceberg map with non-string keys: an array of key/value records, given a dict."""
    if key is _write_int and value is _write_long:
        # Iceberg's metrics maps (column id to count or size): the hot path, inlined.
        def encode_counts(out: bytearray, v: Any) -> None:
            if type(v) is not dict:
                as_array(out, v)
                return
            if n := len(v):
                _write_long(out, n)
                small = _SMALL
                for k, x in v.items():
                    z = (k << 1) ^ (k >> 31)
                    if 0 <= z < 0x4000:
                        out += small[z]
                    else:
                        _write_int(out, k)
                    z = (x << 1) ^ (x >> 63)
                    if 0 <= z < 0x4000:
                        out += small[z]
                    else:
                        _write_long(out, x)
            out += b"\x00"

        return encode_counts

    def encode(out: bytearray, v: Any) -> None:
        if type(v) is not dict:
            as_array(out, v)
            return
        if n := len(v):
            _write_long(out, n)
            for k, x in v.items():
                key(out, k)
                value(out, x)
        out += b"\x00"

    return encode


_NO_DEFAULT: Final = object()
"""The default of a record field that has none: a ``dict`` without that field is refused."""


def _record(names: list[str], fields: list[Encoder], defaults: list[Any]) -> Encoder:
    count = len(fields)

    def encode(out: bytearray, v: Any) -> None:
        if type(v) is dict:
            v = [v.get(name, default) for name, default in zip(names, defaults, strict=True)]
            for name, x in zip(names, v, strict=True):
                if x is _NO_DEFAULT:
                    raise ValueError(f"record lacks field {name!r}, which has no default")
        elif len(v) != count:
            raise ValueError(f"record of {count} fields given {len(v)} values")
        for enc, x in zip(fields, v, strict=False):
            enc(out, x)

    return encode


class _Compiler:
    """Compiles one schema; holds its named types (records, enums, fixed) by full name."""

    def __init__(self) -> None:
        self.named: dict[str, Encoder | None] = {}
        self.kinds: dict[str, str] = {}

    def _fullname(self, name: str, namespace: str | None) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def _define(self, fullname: str, enc: Encoder) -> Encoder:
        self.named[fullname] = enc
        return enc

    def kind(self, schema: Any, namespace: str | None) -> str:
        """Return the Avro type name of ``schema`` (a named type's reference resolves to its kind)."""
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            return str(schema.get("type"))
        if schema in _PRIMITIVES:
            return str(schema)
        return self.kinds.get(self._fullname(schema, namespace), self.kinds.get(schema, "?"))

    def compile(self, schema: Any, namespace: str | None = None) -> Encoder:
        """Return the encoder of ``schema``.

        Raises:
            ValueError: a type this module cannot encode, or a recursive named type.
        """
        if isinstance(schema, str):
            if schema in _PRIMITIVES:
                return _PRIMITIVES[schema]
            for full in (self._fullname(schema, namespace), schema):
                if full in self.named:
                    enc = self.named[full]
                    if enc is None:
                        raise ValueError(f"recursive Avro type {schema!r} is not supported")
                    return enc
            raise ValueError(f"unknown Avro type {schema!r}")
        if isinstance(schema, list):
            return self._union(schema, namespace)
        if not isinstance(schema, dict):
            raise ValueError(f"not an Avro schema: {schema!r}")  # noqa: TRY004 (the one error a caller expects)
        kind = schema.get("type")
        logical = schema.get("logicalType")
        if kind == "record" or kind == "error":
            return self._record(schema, namespace)
        if kind == "array":
            items = self.compile(schema["items"], namespace)
            as_array = _array(items)
            if logical == "map":
                return self._iceberg_map(schema["items"], namespace, as_array)
            return as_array
        if kind == "map":
            return _map(self.compile(schema["values"], namespace))
        if kind == "fixed":
            size = int(schema["size"])
            full = self._name(schema, namespace)
            if logical == "decimal":
                return self._define(full, _decimal_fixed(size, int(schema.get("scale", 0))))
            if logical == "uuid" and size == 16:
                return self._define(full, _uuid_fixed)
            return self._define(full, _fixed(size))
        if kind == "enum":
            full = self._name(schema, namespace)
            index = {symbol: _SMALL[i << 1] for i, symbol in enumerate(schema["symbols"])}

            def encode_enum(out: bytearray, v: str) -> None:
                try:
                    out += index[v]
                except KeyError:
                    raise ValueError(f"{v!r} is not a symbol of this Avro enum") from None

            return self._define(full, encode_enum)
        if kind == "bytes" and logical == "decimal":
            return _decimal_bytes(int(schema.get("scale", 0)))
        if isinstance(kind, str) and kind in _PRIMITIVES:
            # date, time-*, timestamp-* and the like annotate int or long: the value is the number.
            return _PRIMITIVES[kind]
        return self.compile(kind, namespace)

    def _name(self, schema: dict[str, Any], namespace: str | None) -> str:
        full = self._fullname(str(schema["name"]), schema.get("namespace", namespace))
        self.kinds[full] = str(schema["type"])
        return full

    def _record(self, schema: dict[str, Any], namespace: str | None) -> Encoder:
        full = self._name(schema, namespace)
        inner_ns = full.rpartition(".")[0] or None
        self.named[full] = None  # a reference to it from its own fields is recursion
        names: list[str] = []
        fields: list[Encoder] = []
        defaults: list[Any] = []
        for field in schema["fields"]:
            names.append(str(field["name"]))
            fields.append(self.compile(field["type"], inner_ns))
            defaults.append(field.get("default", _NO_DEFAULT))
        return self._define(full, _record(names, fields, defaults))

    def _union(self, branches: list[Any], namespace: str | None) -> Encoder:
        kinds = [self.kind(b, namespace) for b in branches]
        if len(branches) == 2 and "null" in kinds and kinds[0] != kinds[1]:
            other = branches[1] if kinds[0] == "null" else branches[0]
            return _option(self.compile(other, namespace), null_first=kinds[0] == "null")
        encoders = [self.compile(b, namespace) for b in branches]
        unknown = [k for k in kinds if k not in _BRANCH_TYPES]
        if unknown:
            raise ValueError(f"Avro union of {unknown} is not supported")
        return _union(list(zip(kinds, encoders, strict=True)))

    def _iceberg_map(self, item: Any, namespace: str | None, as_array: Encoder) -> Encoder:
        if not isinstance(item, dict) or item.get("type") != "record" or len(item.get("fields", ())) != 2:
            raise ValueError("an Avro array marked as a map must hold key/value records")
        ns = self._fullname(str(item["name"]), item.get("namespace", namespace)).rpartition(".")[0] or None
        key_field, value_field = item["fields"]
        return _keyed_map(
            self.compile(key_field["type"], ns), self.compile(value_field["type"], ns), as_array
        )


@lru_cache(maxsize=MAX_COMPILED)
def _compiled(schema_json: str) -> Encoder:
    return _Compiler().compile(json.loads(schema_json))


def compile_encoder(schema: str | Mapping[str, Any] | Sequence[Any]) -> Encoder:
    """Return the encoder of an Avro schema (JSON text, parsed, or a primitive's name), compiled once.

    Raises:
        ValueError: the schema is not valid JSON or holds a type this module cannot encode.
    """
    if isinstance(schema, str):
        # A primitive type's bare name ("long") is a schema too, though not JSON text.
        text = json.dumps(schema) if schema in _PRIMITIVES else schema
    else:
        text = json.dumps(schema, sort_keys=True)
    try:
        return _compiled(text)
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an Avro schema this encoder can compile: {exc}") from exc


def encode_header(schema_json: str, codec_name: str, metadata: Mapping[str, str], sync: bytes) -> bytes:
    """Return an object container file's header: magic, metadata (``metadata``, then schema and codec), sync.

    The metadata keys keep ``metadata``'s order; ``avro.schema`` and
    ``avro.codec`` replace a value given there in place, else come last.
    """
    meta = {**metadata, SCHEMA_KEY: schema_json, CODEC_KEY: codec_name}
    out = bytearray(MAGIC)
    _write_long(out, len(meta))
    for k, v in meta.items():
        _write_string(out, k)
        _write_string(out, v)
    out += b"\x00"
    out += sync
    return bytes(out)


class AvroContainerWriter:
    """Writes one Avro object container file through ``write``: the header at once, then blocks of records.

    Records go in as values (:meth:`append`, through the schema's compiled
    encoder) or already encoded (:meth:`append_encoded`, e.g. copied from
    another file of the same schema); a block is written once it holds
    ``block_bytes`` uncompressed bytes, and at :meth:`close`.
    """

    def __init__(
        self,
        write: Callable[[bytes], Any],
        schema_json: str,
        *,
        codec_name: str = "null",
        metadata: Mapping[str, str] | None = None,
        sync: bytes | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ) -> None:
        """Raises: ValueError: the codec or the schema is not supported (nothing was written then)."""
        self._codec: Codec = codec(codec_name)
        self._encode = compile_encoder(schema_json)
        # Only needs to differ from the data around it, not to be unguessable: os.urandom cost
        # ~0.1 ms a call here (two per table commit).
        self._sync = random.randbytes(SYNC_SIZE) if sync is None else sync
        if len(self._sync) != SYNC_SIZE:
            raise ValueError(f"an Avro sync marker has {SYNC_SIZE} bytes")
        self._write = write
        self._block_bytes = block_bytes
        self._buf = bytearray()
        self._count = 0
        self.tap: bytearray | None = None
        """When set (a bytearray), every record's encoded bytes are also added to it, uncompressed."""
        self.records = 0
        """Records written so far (in closed blocks and the open one)."""
        self.length = 0
        """Bytes written so far through ``write``."""
        self._emit(encode_header(schema_json, self._codec.name, metadata or {}, self._sync))

    @property
    def sync(self) -> bytes:
        """Return the file's sync marker."""
        return self._sync

    def _emit(self, data: bytes) -> None:
        self._write(data)
        self.length += len(data)

    def append(self, datum: Any) -> None:
        """Encode one record into the open block.

        Raises:
            ValueError, TypeError: the datum does not fit the schema (nothing of it is kept).
        """
        mark = len(self._buf)
        try:
            self._encode(self._buf, datum)
        except BaseException:
            del self._buf[mark:]
            raise
        self._count += 1
        self.records += 1
        if self.tap is not None:
            self.tap += self._buf[mark:]
        if len(self._buf) >= self._block_bytes:
            self.flush()

    def append_encoded(self, data: bytes | bytearray | memoryview, count: int) -> None:
        """Add ``count`` records already encoded in this file's schema (their bytes, back to back)."""
        self._buf += data
        self._count += count
        self.records += count
        if self.tap is not None:
            self.tap += data
        if len(self._buf) >= self._block_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the open block, if it holds a record."""
        if not self._count:
            return
        payload = bytes(self._buf)
        if self._codec.compress is not None:
            payload = self._codec.compress(payload)
        head = bytearray()
        _write_long(head, self._count)
        _write_long(head, len(payload))
        self._emit(bytes(head))
        self._emit(payload)
        self._emit(self._sync)
        self._buf.clear()
        self._count = 0

    def close(self) -> int:
        """Write the last block; return the file's length in bytes (the sink is the caller's to close)."""
        self.flush()
        return self.length
