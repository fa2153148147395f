"""``head_md5``: the MD5 each store gives for an object, and the objects it cannot give one for.

Observed on the emulators (and documented for the real services): S3 (moto) gives the MD5 as the
ETag of single-part uploads and copies, and ``<md5 of part md5s>-<parts>`` for multipart ones;
GCS (fake-gcs-server) gives ``md5Hash``; Azure (Azurite) gives Content-MD5 for single-shot uploads
and copies, none for a blob committed from a block list; the local store computes it.
"""

from __future__ import annotations

import hashlib

import pytest

from shared import NotFound, PreconditionFailed
from shared.storage import ObjectStore
from tests._support.emulators import MakeTarget, StoreTarget
from tests._support.uploads import upload_without_md5


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


async def test_head_md5_is_the_md5_of_the_content_on_every_backend(any_store: ObjectStore) -> None:
    data = b"checksummed bytes\n" * 7
    written = await any_store.write("c/a.bin", data)
    got = await any_store.head_md5("c/a.bin")
    assert got.checksum == md5(data)
    assert (got.key, got.size, got.version) == ("c/a.bin", len(data), written.version)
    copied = await any_store.copy("c/a.bin", "c/b.bin")
    assert (await any_store.head_md5("c/b.bin")).checksum == md5(data)
    assert copied.size == len(data)
    await any_store.write("c/a.bin", b"other")
    assert (await any_store.head_md5("c/a.bin")).checksum == md5(b"other")
    await any_store.write("c/empty", b"")
    assert (await any_store.head_md5("c/empty")).checksum == md5(b"")
    with pytest.raises(NotFound):
        await any_store.head_md5("c/missing")


@pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")
async def test_head_md5_of_a_large_object(any_store: ObjectStore, store_target: StoreTarget) -> None:
    data = bytes(range(256)) * (3 * 4096 + 17)  # ~3 MiB: several read chunks on local files
    await any_store.write("big/x", data)
    assert (await any_store.head_md5("big/x")).checksum == md5(data)
    head = await any_store.head("big/x")
    # head gives the stored MD5 only; the local store computes none there.
    assert head.checksum == (None if store_target.backend == "local" else md5(data))


@pytest.mark.parametrize("backend", ["s3", "azure"])
async def test_objects_without_a_stored_md5_report_none(make_target: MakeTarget, backend: str) -> None:
    data = b"uploaded in parts" * 100
    async with make_target(backend).open() as store:
        await upload_without_md5(store, backend, "big/part-0", data)
        for info in (
            await store.head("big/part-0"),
            await store.head_md5("big/part-0"),
            *[i async for i in store.list("big/")],
        ):
            assert info.size == len(data)
            assert info.checksum is None  # not the MD5, and not something that looks like one
        assert (await store.read("big/part-0")).data == data


async def test_a_pinned_copy_copies_exactly_the_version_it_was_given(
    any_store: ObjectStore, store_target: StoreTarget
) -> None:
    await any_store.write("pin/src", b"first bytes")
    first = await any_store.head_md5("pin/src")
    copied = await any_store.copy("pin/src", "pin/a", source=first)
    assert (copied.size, copied.checksum) == (first.size, md5(b"first bytes"))
    assert (await any_store.read("pin/a")).data == b"first bytes"

    await any_store.write("pin/src", b"other bytes")  # same size, moved on
    if store_target.backend in ("s3", "gcs"):
        # S3 enforces CopySourceIfMatch and GCS ifSourceGenerationMatch; moto 5.2 and
        # fake-gcs-server ignore them and copy the new bytes. What the commit core relies on still
        # holds there: the answer's MD5 is the MD5 of the bytes copied.
        got = await any_store.copy("pin/src", "pin/b", source=first)
        assert got.checksum == md5(b"other bytes")
    else:
        with pytest.raises(PreconditionFailed):
            await any_store.copy("pin/src", "pin/b", source=first)
        with pytest.raises(NotFound):
            await any_store.head("pin/b")  # nothing was copied

    await any_store.delete("pin/src")
    with pytest.raises((NotFound, PreconditionFailed)):
        # A pinned source that is gone: NotFound, or (where the store checks the pin first) refused.
        await any_store.copy("pin/src", "pin/c", source=first)
    with pytest.raises(NotFound):
        await any_store.head("pin/c")
