"""Copies on local files are hard links where they can be, and read exactly as byte copies do.

Checked on real files: the copy is the source's own file (same inode), keeps its bytes when the
source is written again or deleted, replaces an existing destination atomically and leaves no temp
name behind, copying again is a no-op, a durable link fsyncs the source before its folder, and
every case where no link can be made (links off, another owner, a file system that refuses, a
source deleted after it was opened) falls back to copying the bytes with the same answer.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

import shared.storage._local_put as put_mod
from shared._errors import PreconditionFailed
from shared.storage._local import LocalStore
from tests._support.fsyncs import record_fsyncs


def _ino(root: Path, key: str) -> int:
    return (root / key).stat().st_ino


def _md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


async def test_a_copy_is_the_source_file_and_keeps_its_bytes_after_the_source_changes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    src = await store.write("_staging/j/ds/0-0/part-0", b"first bytes")
    info = await store.copy("_staging/j/ds/0-0/part-0", "ds/part-0", source=src)
    assert _ino(tmp_path, "ds/part-0") == _ino(tmp_path, "_staging/j/ds/0-0/part-0")
    assert (info.size, info.version, info.checksum) == (11, src.version, _md5(b"first bytes"))
    assert (await store.head("ds/part-0")).version == info.version
    await store.write("_staging/j/ds/0-0/part-0", b"written again")  # a new file renamed over the source
    assert (await store.read("ds/part-0")).data == b"first bytes"
    await store.delete("_staging/j/ds/0-0/part-0")
    assert (await store.read("ds/part-0")).data == b"first bytes"
    assert os.listdir(tmp_path / ".cf" / "tmp") == []


async def test_a_copy_over_an_existing_object_replaces_it_and_leaves_no_temp_name(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    await store.write("a", b"source")
    await store.write("b", b"the old destination")
    info = await store.copy("a", "b")
    assert (await store.read("b")).data == b"source"
    assert _ino(tmp_path, "b") == _ino(tmp_path, "a") and info.checksum == _md5(b"source")
    assert os.stat(tmp_path / "a").st_nlink == 2  # a and b, no stray name
    # Copied again: the source has two names now, so the bytes are copied (a new file).
    again = await store.copy("a", "b")
    assert again.version != info.version and (await store.read("b")).data == b"source"
    assert os.stat(tmp_path / "a").st_nlink == 1
    assert os.listdir(tmp_path / ".cf" / "tmp") == []


async def test_a_copy_onto_its_own_key_changes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    src = await store.write("a", b"itself")
    info = await store.copy("a", "a", source=src)
    assert info.version == src.version and (await store.read("a")).data == b"itself"
    assert os.stat(tmp_path / "a").st_nlink == 1
    assert os.listdir(tmp_path / ".cf" / "tmp") == []


async def test_a_staged_hard_link_to_a_file_outside_the_root_is_copied_not_linked(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not the store's")
    store = LocalStore(root, durable=False)
    (root / "s").mkdir()
    os.link(outside / "secret", root / "s" / "file")  # planted in the staging area
    await store.copy("s/file", "d/file")
    assert _ino(root, "d/file") != (outside / "secret").stat().st_ino
    assert (outside / "secret").stat().st_nlink == 2  # the planted name only: no third name made
    assert (root / "d" / "file").read_bytes() == b"not the store's"


@pytest.mark.parametrize("mode", [0o755, 0o4644, 0o1644])
async def test_a_source_with_execute_set_id_or_sticky_bits_is_copied_as_a_plain_file(
    tmp_path: Path, mode: int
) -> None:
    store = LocalStore(tmp_path, durable=False)
    await store.write("s/file", b"bits")
    os.chmod(tmp_path / "s" / "file", mode)
    await store.copy("s/file", "d/file")
    assert _ino(tmp_path, "d/file") != _ino(tmp_path, "s/file")
    assert (tmp_path / "d" / "file").stat().st_mode & 0o7111 == 0


async def test_a_pinned_copy_of_a_changed_source_links_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    old = await store.write("a", b"v1")
    await store.write("a", b"v2")
    with pytest.raises(PreconditionFailed):
        await store.copy("a", "b", source=old)
    assert not (tmp_path / "b").exists()


async def _byte_copy_checks(store: LocalStore, root: Path) -> None:
    src = await store.write("s/file", b"payload" * 100)
    info = await store.copy("s/file", "d/file", source=src)
    assert _ino(root, "d/file") != _ino(root, "s/file")
    assert (await store.read("d/file")).data == b"payload" * 100
    assert (info.size, info.checksum) == (700, _md5(b"payload" * 100))
    assert info.version != src.version
    assert os.listdir(root / ".cf" / "tmp") == []


async def test_links_off_copies_the_bytes(tmp_path: Path) -> None:
    await _byte_copy_checks(LocalStore(tmp_path, durable=False, links=False), tmp_path)


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP])
async def test_a_link_refused_by_the_file_system_copies_the_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    store = LocalStore(tmp_path, durable=False)
    assert store._puts.links

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", refuse)
    await _byte_copy_checks(store, tmp_path)


def test_a_store_where_descriptors_cannot_be_linked_turns_links_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOENT, "no /proc here")

    monkeypatch.setattr(os, "link", refuse)
    store = LocalStore(tmp_path, durable=False)
    assert not store._puts.links
    assert os.listdir(tmp_path / ".cf" / "tmp") == []  # the probe cleaned up


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
async def test_a_source_owned_by_another_user_is_copied_not_linked(tmp_path: Path) -> None:
    store = LocalStore(tmp_path, durable=False)
    await store.write("s/file", b"theirs")
    os.chown(tmp_path / "s" / "file", 4242, 4242)
    await store.copy("s/file", "d/file")
    assert _ino(tmp_path, "d/file") != _ino(tmp_path, "s/file")
    assert (tmp_path / "d" / "file").stat().st_uid == 0


async def test_a_source_deleted_after_it_was_opened_is_copied_from_the_open_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path, durable=False)
    src = await store.write("s/file", b"still readable")
    real_link = put_mod.Puts.link

    def delete_first(self: put_mod.Puts, root_fd: int, fd: int, source: os.stat_result, dst: str) -> bool:
        os.unlink(tmp_path / "s" / "file")  # the source goes between the open and the link
        return real_link(self, root_fd, fd, source, dst)

    monkeypatch.setattr(put_mod.Puts, "link", delete_first)
    info = await store.copy("s/file", "d/file", source=src)
    assert (await store.read("d/file")).data == b"still readable"
    assert info.checksum == _md5(b"still readable")
    assert os.listdir(tmp_path / ".cf" / "tmp") == []


async def test_a_durable_link_fsyncs_the_source_then_the_folder_and_the_parents_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path, durable=True)
    await store.write("s/file", b"bytes")
    synced = record_fsyncs(monkeypatch)
    await store.copy("s/file", "d1/file")
    ino = {p: (tmp_path / p).stat().st_ino for p in ("", "d1", "s/file")}
    # The source's file first (its bytes on disk before a name points at them), the root for the
    # folder made, the folder after the link.
    assert synced[0] == ino["s/file"]
    assert sorted(synced) == sorted(ino.values()), (synced, ino)
    assert synced[-1] == ino["d1"]
