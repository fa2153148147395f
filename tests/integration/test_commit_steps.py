"""Each built-in commit step on every storage backend: idempotent, judged by the store, never guessing."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random

import msgspec
import pytest

from shared.commit import (
    AdvanceWatermarks,
    Cleanup,
    CommitStepFailed,
    ManifestFile,
    PublishFile,
    StepContext,
    WriteManifest,
    read_manifest,
    read_watermarks,
)
from shared.events import manifest_key, watermarks_key
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, fast_settings, keys


def _ctx(store: ObjectStore) -> StepContext:
    return StepContext(store=store, lease=ManualLease("ds", 1), settings=fast_settings())


async def test_publish_is_idempotent_and_done_only_when_dst_right_and_src_gone(
    any_store: ObjectStore,
) -> None:
    ctx = _ctx(any_store)
    body = b"x" * 123
    src, dst = "_staging/j/ds/0-0/a.parquet", "ds/j-00000-a.parquet"
    await any_store.write(src, body)
    step = PublishFile(src=src, dst=dst, size=len(body), md5=hashlib.md5(body).hexdigest())
    assert not await step.is_done(ctx)
    await step.execute(ctx)
    assert await step.is_done(ctx)
    assert (await any_store.read(dst)).data == body
    assert await keys(any_store, "_staging/") == []
    await step.execute(ctx)  # again: nothing to do, no error
    assert await step.is_done(ctx)
    assert (await any_store.read(dst)).data == body


async def test_a_copy_present_while_the_source_remains_is_not_done(any_store: ObjectStore) -> None:
    # Crash between copy and delete: destination right, source still there.
    ctx = _ctx(any_store)
    src, dst = "_staging/j/ds/0-0/a", "ds/j-00000-a"
    await any_store.write(src, b"abc")
    await any_store.write(dst, b"abc")
    step = PublishFile(src=src, dst=dst, size=3)
    assert not await step.is_done(ctx)
    await step.execute(ctx)
    assert await step.is_done(ctx)


async def test_partial_copy_is_not_done_and_is_redone_from_the_source(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    src, dst = "_staging/j/ds/0-0/a", "ds/j-00000-a"
    await any_store.write(src, b"0123456789")
    await any_store.write(dst, b"0123")  # right name, wrong size
    step = PublishFile(src=src, dst=dst, size=10)
    assert not await step.is_done(ctx)
    await step.execute(ctx)
    assert await step.is_done(ctx)
    assert (await any_store.read(dst)).data == b"0123456789"


async def test_source_gone_and_destination_wrong_is_data_loss_never_a_guess(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    src, dst = "_staging/j/ds/0-0/a", "ds/j-00000-a"
    await any_store.write(dst, b"0123")
    step = PublishFile(src=src, dst=dst, size=10)
    assert not await step.is_done(ctx)
    with pytest.raises(CommitStepFailed, match="data lost"):
        await step.execute(ctx)
    assert (await any_store.read(dst)).data == b"0123"  # nothing deleted
    missing = PublishFile(src=src, dst="ds/j-00000-b", size=1)
    with pytest.raises(CommitStepFailed, match="missing"):
        await missing.execute(ctx)


async def test_same_size_other_content_is_caught_where_the_store_gives_checksums(
    any_store: ObjectStore,
) -> None:
    ctx = _ctx(any_store)
    src, dst = "_staging/j/ds/0-0/a", "ds/j-00000-a"
    info = await any_store.write(dst, b"AAAA")
    step = PublishFile(src=src, dst=dst, size=4, md5=hashlib.md5(b"BBBB").hexdigest())
    if info.checksum is None:
        # The local store gives no checksum: size is all it can check.
        assert await step.is_done(ctx)
    else:
        assert not await step.is_done(ctx)
        with pytest.raises(CommitStepFailed):
            await step.execute(ctx)


async def test_a_staged_file_that_differs_from_its_report_is_refused(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    src, dst = "_staging/j/ds/0-0/a", "ds/j-00000-a"
    await any_store.write(src, b"short")
    step = PublishFile(src=src, dst=dst, size=999)
    with pytest.raises(CommitStepFailed, match="reported"):
        await step.execute(ctx)
    # The staged file is kept for the operator; the copy (if any) is not published: not done.
    assert (await any_store.read(src)).data == b"short"
    assert not await step.is_done(ctx)


async def test_watermarks_only_move_forward_and_are_idempotent(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    up = AdvanceWatermarks(dataset="ds", values={"a": 10, "b": 5})
    assert not await up.is_done(ctx)
    await up.execute(ctx)
    assert await up.is_done(ctx)
    version = (await any_store.head(watermarks_key("ds"))).version
    await up.execute(ctx)  # already there: no write at all
    assert (await any_store.head(watermarks_key("ds"))).version == version
    back = AdvanceWatermarks(dataset="ds", values={"a": 3, "c": 1})
    assert not await back.is_done(ctx)  # "c" is new
    await back.execute(ctx)
    assert await read_watermarks(any_store, "ds") == {"a": 10, "b": 5, "c": 1}


async def test_watermarks_never_move_back_under_concurrent_advancing(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    rng = random.Random(7)
    rounds = [{k: rng.randrange(1000) for k in rng.sample("abcd", 2)} for _ in range(24)]
    seen: list[dict[str, int]] = []
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            seen.append(await read_watermarks(any_store, "ds"))
            await asyncio.sleep(0)

    async def advance(values: dict[str, int]) -> None:
        await AdvanceWatermarks(dataset="ds", values=values).execute(ctx)

    async with asyncio.TaskGroup() as tg:
        watcher = tg.create_task(observe())
        async with asyncio.TaskGroup() as writers:
            for values in rounds:
                writers.create_task(advance(values))
        stop.set()
        await watcher
    final = await read_watermarks(any_store, "ds")
    want: dict[str, int] = {}
    for values in rounds:
        for k, v in values.items():
            want[k] = max(want.get(k, v), v)
    assert final == want
    history = [*seen, final]
    assert len(history) > 3  # the observer really watched the race
    for earlier, later in itertools.pairwise(history):
        for k, v in earlier.items():
            assert later[k] >= v, (earlier, later)


def _manifest_step(size: int = 3) -> WriteManifest:
    return WriteManifest(
        dataset="ds",
        job="j",
        files=[ManifestFile(key="ds/j-00000-a", size=size)],
        watermarks={"a": 1},
        epoch=2,
    )


async def test_manifest_is_create_if_absent_and_an_equal_one_counts_as_done(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    step = _manifest_step()
    assert not await step.is_done(ctx)
    await step.execute(ctx)
    assert await step.is_done(ctx)
    version = (await any_store.head(manifest_key("ds", "j"))).version
    # Another holder (another epoch, another time) with the same content: done, not rewritten.
    await msgspec.structs.replace(step, epoch=9).execute(ctx)
    assert (await any_store.head(manifest_key("ds", "j"))).version == version
    manifest = await read_manifest(any_store, "ds", "j")
    assert manifest is not None and manifest.epoch == 2 and manifest.bytes == 3


async def test_a_different_manifest_already_there_is_a_conflict_not_overwritten(
    any_store: ObjectStore,
) -> None:
    ctx = _ctx(any_store)
    await _manifest_step(size=3).execute(ctx)
    other = _manifest_step(size=4)
    with pytest.raises(CommitStepFailed, match="other content"):
        await other.is_done(ctx)
    with pytest.raises(CommitStepFailed, match="other content"):
        await other.execute(ctx)
    manifest = await read_manifest(any_store, "ds", "j")
    assert manifest is not None and manifest.files[0].size == 3


async def test_cleanup_deletes_everything_under_its_prefixes_idempotently(any_store: ObjectStore) -> None:
    ctx = _ctx(any_store)
    for key in ("_staging/j/ds/0-0/a", "_staging/j/ds/0-1/b/c", "_staging/j/other/0-0/keep"):
        await any_store.write(key, b"1")
    step = Cleanup(prefixes=["_staging/j/ds/"])
    assert not await step.is_done(ctx)
    await step.execute(ctx)
    assert await step.is_done(ctx)
    await step.execute(ctx)
    assert await keys(any_store) == ["_staging/j/other/0-0/keep"]
