"""Read, head, write, delete and key-safety semantics, the same on every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from shared._errors import BadInput, NotFound
from shared.storage import ObjectStore
from shared.storage._local import md5_hex
from tests._support.emulators import StoreTarget


async def test_write_then_read_and_head_agree(any_store: ObjectStore, store_target: StoreTarget) -> None:
    data = b"hello, commitfleet\n"
    written = await any_store.write("a/b/c.txt", data)
    assert written.key == "a/b/c.txt"
    assert written.size == len(data)
    got = await any_store.read("a/b/c.txt")
    head = await any_store.head("a/b/c.txt")
    assert got.data == data
    assert got.info.version == written.version == head.version
    assert got.info.size == head.size == len(data)
    assert got.info.key == head.key == "a/b/c.txt"
    if store_target.backend == "local":
        assert head.checksum is None
    else:
        assert written.checksum == head.checksum == got.info.checksum == md5_hex(data)


async def test_empty_object_round_trips(any_store: ObjectStore) -> None:
    info = await any_store.write("empty", b"")
    assert info.size == 0
    got = await any_store.read("empty")
    assert got.data == b""
    assert got.info.size == 0


async def test_overwrite_replaces_bytes_and_version(any_store: ObjectStore) -> None:
    first = await any_store.write("k", b"one")
    second = await any_store.write("k", b"two!")
    assert second.version != first.version
    got = await any_store.read("k")
    assert got.data == b"two!"
    assert got.info.version == second.version
    assert got.info.size == 4


async def test_missing_key_raises_not_found(any_store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        await any_store.read("nope/missing.json")
    with pytest.raises(NotFound):
        await any_store.head("nope/missing.json")


async def test_delete_removes_and_is_idempotent(any_store: ObjectStore) -> None:
    await any_store.write("d/x", b"x")
    await any_store.delete("d/x")
    with pytest.raises(NotFound):
        await any_store.read("d/x")
    await any_store.delete("d/x")  # a second delete is not an error
    await any_store.delete("never/existed")


async def test_a_prefix_is_not_an_object(any_store: ObjectStore) -> None:
    await any_store.write("dir/file", b"1")
    with pytest.raises(NotFound):
        await any_store.head("dir")
    with pytest.raises(NotFound):
        await any_store.read("dir")


SPECIAL_KEYS = [
    "sp ace/file name.txt",
    "unicodé/ключ/鍵.json",
    "pct/a%2Fb%20c",
    "plus/a+b=c&d?e#f",
    "dots/a.b..c/...d",
    "_staging/job-1/ds/0-0/part-00000.parquet",
]


async def test_unusual_but_safe_keys_round_trip(any_store: ObjectStore) -> None:
    for i, key in enumerate(SPECIAL_KEYS):
        await any_store.write(key, str(i).encode())
    for i, key in enumerate(SPECIAL_KEYS):
        got = await any_store.read(key)
        assert got.data == str(i).encode(), key
    listed = [info.key async for info in any_store.list()]
    assert listed == sorted(SPECIAL_KEYS)


UNSAFE_KEYS = [
    "",
    "/abs",
    "a/../b",
    "..",
    "a//b",
    "./a",
    "a/.",
    "a\\b",
    "a\x00b",
    "tab\tkey",
    ".cf/x",
    "x" * 1025,
]


@pytest.mark.parametrize("key", UNSAFE_KEYS, ids=lambda k: repr(k)[:20])
async def test_unsafe_keys_are_rejected(any_store: ObjectStore, key: str) -> None:
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: any_store.read(key),
        lambda: any_store.head(key),
        lambda: any_store.write(key, b"x"),
        lambda: any_store.write_if_absent(key, b"x"),
        lambda: any_store.write_if_match(key, b"x", "1"),
        lambda: any_store.delete(key),
        lambda: any_store.copy(key, "ok"),
    ]
    for call in calls:
        with pytest.raises(BadInput):
            await call()
    await any_store.write("ok", b"ok")
    with pytest.raises(BadInput):
        await any_store.copy("ok", key)
    assert [i.key async for i in any_store.list()] == ["ok"]


@pytest.mark.parametrize("prefix", ["/", "../", "a/../", "a//", ".cf/"])
async def test_unsafe_list_prefixes_are_rejected(any_store: ObjectStore, prefix: str) -> None:
    with pytest.raises(BadInput):
        [i async for i in any_store.list(prefix)]
