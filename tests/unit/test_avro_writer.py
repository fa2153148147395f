"""The generic Avro encoder and container files: the specification's encodings, and what the reader walks."""

from __future__ import annotations

import json
import random
import struct
import uuid
import zlib
from decimal import Decimal
from typing import Any

import pytest
from pyiceberg.avro.decoder import new_decoder

from shared.commit._avro_reader import compile_scanner, iter_blocks, read_header, split_records
from shared.commit._avro_writer import AvroContainerWriter, compile_encoder


def enc(schema: Any, value: Any) -> bytes:
    out = bytearray()
    compile_encoder(schema)(out, value)
    return bytes(out)


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        # The Avro specification's examples (zig-zag varints, strings), and the edges of int and long.
        ("long", 0, b"\x00"),
        ("long", -1, b"\x01"),
        ("long", 1, b"\x02"),
        ("long", -2, b"\x03"),
        ("long", -64, b"\x7f"),
        ("long", 64, b"\x80\x01"),
        ("long", 8191, b"\xfe\x7f"),
        ("long", 8192, b"\x80\x80\x01"),
        ("long", 2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
        ("long", -(2**63), b"\xff" * 9 + b"\x01"),
        ("int", 2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
        ("int", -(2**31), b"\xff\xff\xff\xff\x0f"),
        ("string", "foo", b"\x06foo"),
        ("string", "é", b"\x04\xc3\xa9"),
        ("bytes", b"", b"\x00"),
        ("boolean", True, b"\x01"),
        ("null", None, b""),
        ("float", 1.5, struct.pack("<f", 1.5)),
        ("double", -2.25, struct.pack("<d", -2.25)),
        ({"type": "int", "logicalType": "date"}, 19000, b"\xf0\xa8\x02"),
        ({"type": "fixed", "name": "f", "size": 3}, b"abc", b"abc"),
        ({"type": "enum", "name": "e", "symbols": ["A", "B"]}, "B", b"\x02"),
        (["null", "string"], None, b"\x00"),
        (["null", "string"], "a", b"\x02\x02a"),
        (["string", "null"], None, b"\x02"),
        (["int", "string", "null"], "x", b"\x02\x02x"),
        (["int", "string", "null"], 3, b"\x00\x06"),
        (["boolean", "int"], True, b"\x00\x01"),
        (["boolean", "int"], 1, b"\x02\x02"),
        ({"type": "array", "items": "long"}, [], b"\x00"),
        ({"type": "array", "items": "long"}, [3, 27], b"\x04\x06\x36\x00"),
        ({"type": "map", "values": "long"}, {"a": 1}, b"\x02\x02a\x02\x00"),
        (
            {
                "type": "record",
                "name": "r",
                "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],
            },
            (27, "foo"),
            b"\x36\x06foo",
        ),
        (
            {"type": "record", "name": "r", "fields": [{"name": "a", "type": "long", "default": 5}]},
            {},
            b"\x0a",
        ),
        (
            {"type": "fixed", "name": "d", "size": 4, "logicalType": "decimal", "precision": 9, "scale": 2},
            Decimal("-1.5"),
            (-150).to_bytes(4, "big", signed=True),
        ),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            Decimal("1.28"),
            b"\x04\x00\x80",
        ),
        (
            {"type": "fixed", "name": "u", "size": 16, "logicalType": "uuid"},
            uuid.UUID(int=1),
            b"\x00" * 15 + b"\x01",
        ),
    ],
)
def test_encodings(schema: Any, value: Any, expected: bytes) -> None:
    assert enc(schema, value) == expected


def test_iceberg_int_keyed_map_takes_a_dict() -> None:
    item = {
        "type": "record",
        "name": "k1_v2",
        "fields": [{"name": "key", "type": "int"}, {"name": "value", "type": "long"}],
    }
    schema = {"type": "array", "items": item, "logicalType": "map"}
    assert enc(schema, {1: 2, 70000: 2**40}) == enc(
        {"type": "array", "items": item}, [(1, 2), (70000, 2**40)]
    )
    assert enc(schema, {}) == b"\x00"
    byts = {
        **schema,
        "items": {**item, "name": "k3_v4", "fields": [item["fields"][0], {"name": "value", "type": "bytes"}]},
    }  # type: ignore[dict-item]
    assert enc(byts, {5: b"ab"}) == b"\x02\x0a\x04ab\x00"


def test_named_types_are_referenced_by_name() -> None:
    schema = {
        "type": "record",
        "name": "outer",
        "namespace": "ns",
        "fields": [
            {"name": "a", "type": {"type": "fixed", "name": "f2", "size": 2}},
            {"name": "b", "type": "f2"},
            {"name": "c", "type": "ns.f2"},
        ],
    }
    assert enc(schema, (b"ab", b"cd", b"ef")) == b"abcdef"


@pytest.mark.parametrize(
    ("schema", "value", "error"),
    [
        ("int", 2**31, ValueError),
        ("long", -(2**63) - 1, ValueError),
        ("long", 2**64, ValueError),
        ("long", "1", TypeError),
        ({"type": "fixed", "name": "f", "size": 2}, b"abc", ValueError),
        ({"type": "enum", "name": "e", "symbols": ["A"]}, "Z", ValueError),
        (["null", "long"], "x", TypeError),
        (["int", "string"], 1.5, ValueError),
        ({"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}, (), ValueError),
        ({"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}, {}, ValueError),
        (
            {"type": "fixed", "name": "d", "size": 4, "logicalType": "decimal", "precision": 9, "scale": 1},
            Decimal("0.25"),
            ValueError,
        ),
    ],
)
def test_values_that_do_not_fit_are_refused(schema: Any, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        enc(schema, value)


@pytest.mark.parametrize(
    "schema",
    [
        "decimal256",
        {"type": "record", "name": "node", "fields": [{"name": "next", "type": ["null", "node"]}]},
        "{not json",
        {"type": "record", "name": "r"},
    ],
)
def test_schemas_it_cannot_encode_are_a_value_error(schema: Any) -> None:
    with pytest.raises(ValueError):
        compile_encoder(schema)


def test_compiled_once_per_schema() -> None:
    schema = {"type": "array", "items": "string"}
    assert compile_encoder(schema) is compile_encoder(json.dumps(schema, sort_keys=True))


SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "row",
        "fields": [
            {"name": "path", "type": "string"},
            {"name": "n", "type": "long"},
            {"name": "flag", "type": "boolean"},
            {"name": "maybe", "type": ["null", "int"]},
            {"name": "tags", "type": {"type": "map", "values": {"type": "array", "items": "double"}}},
            {"name": "blob", "type": ["null", "bytes"]},
            {"name": "f", "type": {"type": "fixed", "name": "f4", "size": 4}},
            {"name": "e", "type": {"type": "enum", "name": "e", "symbols": ["x", "y"]}},
            {"name": "last", "type": "long"},
        ],
    }
)


def _row(rng: random.Random) -> tuple[Any, ...]:
    return (
        "p" * rng.randint(0, 200),
        rng.randint(-(2**63), 2**63 - 1),
        rng.random() < 0.5,
        rng.choice([None, rng.randint(-(2**31), 2**31 - 1)]),
        {f"k{i}": [rng.random() for _ in range(rng.randint(0, 3))] for i in range(rng.randint(0, 3))},
        rng.choice([None, rng.randbytes(rng.randint(0, 100))]),
        rng.randbytes(4),
        rng.choice(["x", "y"]),
        rng.randint(-5, 5),
    )


@pytest.mark.parametrize("codec", ["null", "deflate", "bzip2", "zstandard"])
def test_container_round_trip_through_the_reader(codec: str) -> None:
    """Written in small blocks, read block by block, each record walked: its end and the fields asked for."""
    rng = random.Random(5)
    rows = [_row(rng) for _ in range(300)]
    chunks: list[bytes] = []
    w = AvroContainerWriter(chunks.append, SCHEMA, codec_name=codec, metadata={"k": "v"}, block_bytes=2000)
    for r in rows:
        w.append(r)
    length = w.close()
    data = b"".join(chunks)
    assert length == len(data) and w.records == len(rows)

    header = read_header(data)
    assert header.schema_json == SCHEMA and header.codec_name == codec and header.meta["k"] == b"v"
    assert list(header.meta) == ["k", "avro.schema", "avro.codec"]
    scan = compile_scanner(SCHEMA, ["last", "n", "maybe"])
    blocks = list(iter_blocks(data, header))
    assert len(blocks) > 5
    seen = []
    for block in blocks:
        for start, end, values in split_records(block.data, block.entries, scan):
            seen.append(values)
            # Each record alone re-encodes to exactly its bytes.
            assert block.data[start:end] == enc(SCHEMA, rows[len(seen) - 1])
    assert seen == [(r[8], r[1], r[3]) for r in rows]


def test_deflate_is_raw_deflate() -> None:
    chunks: list[bytes] = []
    w = AvroContainerWriter(chunks.append, '"string"', codec_name="deflate", sync=b"S" * 16)
    w.append("hello" * 10)
    w.close()
    data = b"".join(chunks)
    dec = new_decoder(data[read_header(data).end :])
    assert dec.read_int() == 1
    assert zlib.decompress(dec.read_bytes(), -15) == enc("string", "hello" * 10)
    assert dec.read(16) == b"S" * 16


def test_a_failed_append_leaves_nothing() -> None:
    chunks: list[bytes] = []
    w = AvroContainerWriter(chunks.append, SCHEMA)
    w.append(_row(random.Random(1)))
    bad = list(_row(random.Random(2)))
    bad[8] = "not a long"
    with pytest.raises(TypeError):
        w.append(tuple(bad))
    w.close()
    header = read_header(b"".join(chunks))
    (block,) = iter_blocks(b"".join(chunks), header)
    assert block.entries == 1 and block.data == enc(SCHEMA, _row(random.Random(1)))


def test_reader_refuses_broken_files() -> None:
    chunks: list[bytes] = []
    w = AvroContainerWriter(chunks.append, '"long"', codec_name="null")
    for i in range(3):
        w.append(i)
    w.close()
    data = b"".join(chunks)
    header = read_header(data)
    with pytest.raises(ValueError, match="sync"):
        list(iter_blocks(data[:-1] + b"?", header))
    with pytest.raises(ValueError):
        list(iter_blocks(data[:-3], header))
    with pytest.raises(ValueError, match="not an Avro"):
        read_header(b"PAR1")
    with pytest.raises(ValueError, match="codec"):
        AvroContainerWriter(chunks.append, '"long"', codec_name="lz4")
    scan = compile_scanner(SCHEMA, ["n"])
    row = enc(SCHEMA, _row(random.Random(3)))
    with pytest.raises(ValueError):
        list(split_records(row[:-1], 1, scan))
    with pytest.raises(ValueError, match="more bytes"):
        list(split_records(row + b"\x00", 1, scan))
    with pytest.raises(ValueError, match="int or a long"):
        compile_scanner(SCHEMA, ["path"])
