"""Conditional writes: create-if-absent and replace-if-version-matches, on every backend."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

import pytest

from shared._errors import PreconditionFailed
from shared.storage import ObjectInfo, ObjectStore
from tests._support.emulators import StoreTarget

CONTENDERS = 50
StoreFactory = Callable[[], Awaitable[ObjectStore]]


async def test_write_if_absent_creates_once(any_store: ObjectStore) -> None:
    created = await any_store.write_if_absent("lock.json", b"first")
    with pytest.raises(PreconditionFailed):
        await any_store.write_if_absent("lock.json", b"second")
    got = await any_store.read("lock.json")
    assert got.data == b"first"
    assert got.info.version == created.version


async def test_write_if_absent_after_delete_creates_again(any_store: ObjectStore) -> None:
    first = await any_store.write_if_absent("k", b"v1")
    await any_store.delete("k")
    second = await any_store.write_if_absent("k", b"v2")
    assert (await any_store.read("k")).data == b"v2"
    assert second.version != first.version


async def test_write_if_match_replaces_at_current_version(any_store: ObjectStore) -> None:
    v1 = await any_store.write("k", b"one")
    v2 = await any_store.write_if_match("k", b"two", v1.version)
    assert v2.version != v1.version
    got = await any_store.read("k")
    assert (got.data, got.info.version) == (b"two", v2.version)
    v3 = await any_store.write_if_match("k", b"three", got.info.version)
    assert (await any_store.read("k")).info.version == v3.version


async def test_write_if_match_refuses_a_stale_version(any_store: ObjectStore) -> None:
    v1 = await any_store.write("k", b"one")
    await any_store.write("k", b"two")
    with pytest.raises(PreconditionFailed):
        await any_store.write_if_match("k", b"lost update", v1.version)
    assert (await any_store.read("k")).data == b"two"


async def test_write_if_match_on_a_missing_key_fails(any_store: ObjectStore) -> None:
    other = await any_store.write("other", b"x")
    with pytest.raises(PreconditionFailed):
        await any_store.write_if_match("missing", b"y", other.version)
    gone = await any_store.write("gone", b"z")
    await any_store.delete("gone")
    with pytest.raises(PreconditionFailed):
        await any_store.write_if_match("gone", b"again", gone.version)
    assert [i.key async for i in any_store.list()] == ["other"]


@pytest.mark.parametrize("bogus", ["0", "", "not-a-version", '"0x0"', "123456789"])
async def test_write_if_match_with_a_bogus_version_fails(any_store: ObjectStore, bogus: str) -> None:
    await any_store.write("k", b"one")
    with pytest.raises(PreconditionFailed):
        await any_store.write_if_match("k", b"two", bogus)
    assert (await any_store.read("k")).data == b"one"


async def test_rewriting_identical_bytes(any_store: ObjectStore, store_target: StoreTarget) -> None:
    """Local files, GCS and Azure give a new version on every write; S3's ETag is the body's MD5.

    On S3 the same bytes keep the same version (the ABA rule in docs/storage.md): a compare-and-swap
    against the old version still succeeds. Callers therefore put a nonce in every conditionally
    written payload, and then every write changes the version on every backend.
    """
    v1 = await any_store.write("k", b"same bytes")
    v2 = await any_store.write("k", b"same bytes")
    if store_target.backend == "s3":
        assert v2.version == v1.version
        # The hazard, shown for real: a stale holder's swap still wins.
        await any_store.write_if_match("k", b"same bytes", v1.version)
    else:
        assert v2.version != v1.version
        with pytest.raises(PreconditionFailed):
            await any_store.write_if_match("k", b"same bytes", v1.version)
    seen = {(await any_store.head("k")).version}
    for _ in range(5):
        payload = b'{"owner":"w1","nonce":"' + secrets.token_hex(8).encode() + b'"}'
        info = await any_store.write_if_match("k", payload, (await any_store.head("k")).version)
        assert info.version not in seen
        seen.add(info.version)


async def _contend(
    store_factory: StoreFactory, attempt: Callable[[ObjectStore, int], Awaitable[ObjectInfo]]
) -> tuple[list[int], list[BaseException]]:
    # Several independent clients (own connection pools), all released at once.
    stores = [await store_factory() for _ in range(5)]
    gate = asyncio.Event()
    winners: list[int] = []
    failures: list[BaseException] = []

    async def one(i: int) -> None:
        await gate.wait()
        try:
            await attempt(stores[i % len(stores)], i)
        except PreconditionFailed:
            return
        except BaseException as exc:
            failures.append(exc)
            raise
        winners.append(i)

    async with asyncio.TaskGroup() as tg:
        for i in range(CONTENDERS):
            tg.create_task(one(i))
        gate.set()
    return winners, failures


def _create(key: str) -> Callable[[ObjectStore, int], Awaitable[ObjectInfo]]:
    return lambda store, i: store.write_if_absent(key, f"contender {i}".encode())


def _swap(key: str, version: str) -> Callable[[ObjectStore, int], Awaitable[ObjectInfo]]:
    return lambda store, i: store.write_if_match(key, f"contender {i}".encode(), version)


async def test_concurrent_write_if_absent_has_exactly_one_winner(
    any_store: ObjectStore, store_factory: StoreFactory
) -> None:
    for round_ in range(3):
        key = f"race/{round_}"
        winners, failures = await _contend(store_factory, _create(key))
        assert failures == []
        assert len(winners) == 1, winners
        assert (await any_store.read(key)).data == f"contender {winners[0]}".encode()


async def test_concurrent_write_if_match_has_exactly_one_winner(
    any_store: ObjectStore, store_factory: StoreFactory
) -> None:
    for round_ in range(3):
        key = f"cas/{round_}"
        base = await any_store.write(key, b"base")
        winners, failures = await _contend(store_factory, _swap(key, base.version))
        assert failures == []
        assert len(winners) == 1, winners
        assert (await any_store.read(key)).data == f"contender {winners[0]}".encode()
