"""The table step's file IO keeps an Iceberg table's metadata files by name, and nothing else.

Metadata files are written once under a new name and never changed, so a file written or read once is read
from memory after; data files go to the store every time; a metadata file name that pyiceberg did not make
fresh (a random UUID) is not overwritten.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyiceberg")

from shared.commit import TableFileIO


def test_a_metadata_file_is_kept_once_written_and_a_data_file_never(tmp_path: Path) -> None:
    io = TableFileIO({})
    meta = (tmp_path / f"00001-{uuid.uuid4()}.metadata.json").as_uri()
    with io.new_output(meta).create() as out:
        out.write(b'{"a": 1}')
    assert (tmp_path / Path(meta).name).read_bytes() == b'{"a": 1}'  # written through
    (tmp_path / Path(meta).name).unlink()  # gone from the store: still known by its name
    with io.new_input(meta).open() as f:
        assert f.read() == b'{"a": 1}'
    assert len(io.new_input(meta)) == 8 and io.new_input(meta).exists()

    data = tmp_path / "part-0.parquet"
    data.write_bytes(b"one")
    with io.new_input(data.as_uri()).open() as f:
        assert f.read() == b"one"
    data.write_bytes(b"two!")  # a data file is read from the store every time
    with io.new_input(data.as_uri()).open() as f:
        assert f.read() == b"two!"


def test_a_metadata_file_read_once_is_read_from_memory_after(tmp_path: Path) -> None:
    path = tmp_path / "snap-1-0-abc.avro"
    path.write_bytes(b"avro")
    io = TableFileIO({})
    with io.new_input(path.as_uri()).open() as f:
        assert f.read() == b"avro"
    path.unlink()
    with TableFileIO({}).new_input(path.as_uri()).open() as f:  # another instance: the process's memory
        assert f.read() == b"avro"


def test_create_refuses_an_existing_name_unless_it_is_a_fresh_uuid(tmp_path: Path) -> None:
    io = TableFileIO({})
    plain = tmp_path / "v1.metadata.json"
    plain.write_bytes(b"{}")
    with pytest.raises(FileExistsError):
        io.new_output(plain.as_uri()).create()
    with io.new_output(plain.as_uri()).create(overwrite=True) as out:
        out.write(b"[]")
    assert plain.read_bytes() == b"[]"
