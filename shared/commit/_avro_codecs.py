"""Avro object container block codecs by their Avro names: compress and decompress one block's bytes.

The Avro specification's ``deflate`` is raw deflate (RFC 1951: no zlib header,
no checksum). ``null``, ``deflate`` and ``bzip2`` need only the standard
library; ``zstandard`` needs the ``zstandard`` module (a dependency of
pyiceberg) and ``snappy`` the ``snappy`` module (python-snappy), with the
big-endian CRC-32 of the uncompressed bytes after each block as Avro asks.
A codec that is unknown, or whose module is missing, is a ``ValueError``.
"""

from __future__ import annotations

import bz2
import importlib
import zlib
from collections.abc import Callable
from typing import Any, Final, NamedTuple

NULL_CODEC: Final = "null"


class Codec(NamedTuple):
    """One Avro codec: its name and its block compressor and decompressor (``None`` for ``null``)."""

    name: str
    compress: Callable[[bytes], bytes] | None
    decompress: Callable[[bytes], bytes] | None


def _deflate(data: bytes) -> bytes:
    # Raw deflate (negative window bits) at zlib's default level, as Avro's own writers use.
    c = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def _inflate(data: bytes) -> bytes:
    return zlib.decompress(data, -15)


def _optional_module(name: str, codec: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"Avro codec {codec!r} needs the {name!r} module, which is not installed") from exc


def _zstandard() -> Codec:
    zstd = _optional_module("zstandard", "zstandard")

    def compress(data: bytes) -> bytes:
        return bytes(zstd.ZstdCompressor().compress(data))

    def decompress(data: bytes) -> bytes:
        # A frame written without its content size (streamed) cannot be decompressed in one call.
        out = bytearray()
        with zstd.ZstdDecompressor().stream_reader(data) as reader:
            while chunk := reader.read(1 << 16):
                out += chunk
        return bytes(out)

    return Codec("zstandard", compress, decompress)


def _snappy() -> Codec:
    snappy = _optional_module("snappy", "snappy")

    def compress(data: bytes) -> bytes:
        return bytes(snappy.compress(data)) + zlib.crc32(data).to_bytes(4, "big")

    def decompress(data: bytes) -> bytes:
        out = bytes(snappy.decompress(data[:-4]))
        if zlib.crc32(out).to_bytes(4, "big") != data[-4:]:
            raise ValueError("Avro snappy block fails its CRC-32 check")
        return out

    return Codec("snappy", compress, decompress)


def codec(name: str) -> Codec:
    """Return the Avro codec ``name``: ``null``, ``deflate``, ``bzip2``, ``zstandard`` or ``snappy``.

    Raises:
        ValueError: the codec is unknown, or the module it needs is not installed.
    """
    if name == NULL_CODEC:
        return Codec(NULL_CODEC, None, None)
    if name == "deflate":
        return Codec("deflate", _deflate, _inflate)
    if name == "bzip2":
        return Codec("bzip2", bz2.compress, bz2.decompress)
    if name == "zstandard":
        return _zstandard()
    if name == "snappy":
        return _snappy()
    raise ValueError(f"unsupported Avro codec {name!r}")
