"""Sources are verified before anything is published: a false MD5, a wrong size, a missing file or
(local files) a symbolic link in staging quarantines the sequence with nothing in the dataset
folder, on every backend. Every check reads the real store back."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.commit import (
    CommitRequest,
    StagedFile,
    WinningAttempt,
    audit,
    commit_dataset,
    read_manifest,
    read_sequence,
    retry_quarantined,
    skip_quarantined,
)
from shared.events import staged_key
from shared.storage import ObjectInfo, ObjectStore
from shared.storage._local import LocalStore
from tests._support.commit import ManualLease, StagedJob, assert_exactly_once, fast_settings, keys, stage_job
from tests._support.emulators import MakeTarget, StoreTarget
from tests._support.fault_store import FaultStore
from tests._support.uploads import upload_without_md5

SETTINGS = fast_settings()


def _alter(job: StagedJob, task: int, index: int, **changes: object) -> StagedJob:
    """Return ``job`` with one reported file changed (the staged bytes stay as they are)."""
    winners = []
    for w in job.req.winners:
        files = list(w.files)
        if w.task == task:
            files[index] = msgspec.structs.replace(files[index], **changes)
        winners.append(msgspec.structs.replace(w, files=files))
    return StagedJob(
        req=msgspec.structs.replace(job.req, winners=winners), winners=job.winners, losers=job.losers
    )


async def _nothing_published(store: ObjectStore, job: StagedJob) -> None:
    dataset = job.req.dataset
    assert await keys(store, f"{dataset}/") == []  # no file, no manifest
    assert await read_manifest(store, dataset, job.req.job) is None
    # Every staged file is still there, untouched, for the operator.
    for key, body in {**job.winners, **job.losers}.items():
        assert (await store.read(key)).data == body


@pytest.mark.parametrize("what", ["md5", "size"])
async def test_a_false_report_quarantines_with_nothing_in_the_dataset_folder(
    any_store: ObjectStore, what: str
) -> None:
    staged = await stage_job(any_store, "ds", "job-1", tasks=3)
    # The last file of the last task: with publishing in parallel, the others would go first.
    last = staged.req.winners[-1].files[-1]
    if what == "md5":
        job = _alter(staged, 2, -1, md5=hashlib.md5(b"not these bytes").hexdigest())
    else:
        job = _alter(staged, 2, -1, size=last.size + 1)
    good = await stage_job(any_store, "other", "job-1", seed=4)
    async with asyncio.TaskGroup() as tg:
        bad_task = tg.create_task(commit_dataset(any_store, job.req, ManualLease("ds", 1), SETTINGS))
        good_task = tg.create_task(commit_dataset(any_store, good.req, ManualLease("other", 1), SETTINGS))
    res = bad_task.result()
    assert res.status == "quarantined" and res.quarantined is not None
    assert res.quarantined.startswith("publish _staging/job-1/ds/2-1/") and ": verify: " in res.quarantined
    assert ("MD5" if what == "md5" else "bytes, its task reported") in res.quarantined
    assert "CommitStepFailed" in res.quarantined
    await _nothing_published(any_store, job)
    seq = await read_sequence(any_store, "ds", "job-1")
    assert seq is not None and seq.quarantined == res.quarantined and seq.done == []
    assert good_task.result().ok  # the other dataset is not held up

    # A retry verifies again (same verdict); skip rolls back; the store audits clean.
    again = await retry_quarantined(any_store, "ds", "job-1", ManualLease("ds", 2), SETTINGS)
    assert again.status == "quarantined" and again.quarantined == res.quarantined
    skipped = await skip_quarantined(any_store, "ds", "job-1", ManualLease("ds", 3), SETTINGS)
    assert (skipped.outcome, skipped.published_deleted) == ("rolled_back", 0)
    assert await keys(any_store, "_staging/job-1/ds/") == []
    assert (await audit(any_store)).ok
    await assert_exactly_once(any_store, good)


async def test_a_missing_source_quarantines_before_anything_is_published(any_store: ObjectStore) -> None:
    job = await stage_job(any_store, "ds", "job-1", tasks=3)
    gone = sorted(job.winners)[-1]
    await any_store.delete(gone)
    res = await commit_dataset(any_store, job.req, ManualLease("ds", 1), SETTINGS)
    assert res.status == "quarantined" and res.quarantined is not None
    assert (
        res.quarantined.startswith(f"publish {gone} -> ") and ": verify: CommitStepFailed" in res.quarantined
    )
    assert "data lost" in res.quarantined
    assert await keys(any_store, "ds/") == []


class _WatchesCopies(FaultStore):
    """Records the version each copy is pinned to, by source key."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.pins: dict[str, str | None] = {}

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        self.pins[src] = None if source is None else source.version
        return await super().copy(src, dst, source=source)


async def test_every_source_is_verified_on_one_listing_and_every_copy_is_pinned(
    any_store: ObjectStore,
) -> None:
    job = await stage_job(any_store, "ds", "job-1", tasks=3, files_per_task=3)
    listed = {i.key: i.version async for i in any_store.list("_staging/job-1/ds/")}
    watched = _WatchesCopies(any_store)
    assert (await commit_dataset(watched, job.req, ManualLease("ds", 1), SETTINGS)).ok
    # No source is read one by one: the listing judged them (sizes, MD5 where the store lists it),
    # and each copy is pinned to the version listed, so the bytes published are the bytes judged
    # (their MD5 is checked again on the copy's answer).
    assert not [
        k for op, k in watched.ops if op in ("read", "head", "head_md5") and k.startswith("_staging/")
    ]
    assert watched.pins == {k: listed[k] for k in job.winners}  # every winner, and only winners
    await assert_exactly_once(any_store, job)


class _Rendezvous(FaultStore):
    """Holds each copy, and each delete of a staged file, until ``n`` of its kind are in flight at once
    (fails if that never happens)."""

    def __init__(self, inner: ObjectStore, n: int) -> None:
        super().__init__(inner)
        self.barriers = {"copy": asyncio.Barrier(n), "delete": asyncio.Barrier(n)}

    async def _meet(self, kind: str) -> None:
        barrier = self.barriers[kind]
        if barrier.n_waiting < barrier.parties and not barrier.broken:
            async with asyncio.timeout(10):
                await barrier.wait()

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        await self._meet("copy")
        return await super().copy(src, dst, source=source)

    async def delete(self, key: str) -> None:
        if key.startswith("_staging/") and "loser" not in key:
            await self._meet("delete")
        await super().delete(key)


async def test_copies_run_in_parallel_then_the_deletes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s", durable=False)
    job = await stage_job(store, "ds", "job-1", tasks=4, files_per_task=1)
    # publish_concurrency 4: the four copies, then the four deletes, must be in flight together,
    # or a barrier times out.
    res = await commit_dataset(
        _Rendezvous(store, 4), job.req, ManualLease("ds", 1), fast_settings(concurrency=4)
    )
    assert res.ok and res.phase_seconds.keys() >= {"verify", "publish"}
    await assert_exactly_once(store, job)


def _one_file(job: str, body: bytes, *, size: int | None = None, md5: str | None = None) -> CommitRequest:
    files = [StagedFile(path="part-0.parquet", size=len(body) if size is None else size, md5=md5)]
    return CommitRequest(
        dataset="ds", job=job, expected_tasks=1, winners=[WinningAttempt(task=0, attempt=0, files=files)]
    )


@pytest.mark.parametrize("backend", ["s3", "azure"])
async def test_files_the_store_keeps_no_md5_for(make_target: MakeTarget, backend: str) -> None:
    """S3 multipart uploads and Azure block-list blobs: the documented limits of the MD5 check."""
    body = b"big parquet bytes" * 50
    claimed = hashlib.md5(b"a false claim").hexdigest()
    async with make_target(backend).open() as store:
        for job in ("job-1", "job-2"):
            await upload_without_md5(store, backend, staged_key(job, "ds", 0, 0, "part-0.parquet"), body)
        # The size is checked before anything is published, as everywhere.
        refused = await commit_dataset(
            store, _one_file("job-2", body, size=len(body) - 1), ManualLease("ds", 1), SETTINGS
        )
        assert refused.status == "quarantined" and refused.quarantined is not None
        assert ": verify: " in refused.quarantined and "bytes, its task reported" in refused.quarantined
        assert await keys(store, "ds/") == []
        await skip_quarantined(store, "ds", "job-2", ManualLease("ds", 2), SETTINGS)

        res = await commit_dataset(
            store, _one_file("job-1", body, md5=claimed), ManualLease("ds", 3), SETTINGS
        )
        if backend == "s3":
            # The source has no MD5, but S3's copy is a single-part object whose ETag is the MD5 of
            # the bytes: the claim is caught at the copy, and the copy is removed again.
            assert res.status == "quarantined" and res.quarantined is not None
            assert "measured on its copy, removed" in res.quarantined and claimed in res.quarantined
            assert await keys(store, "ds/") == []
            return
        # Azure keeps no MD5 for the blob nor for its copy: only the size could be checked. The file
        # is published and the manifest lists the producer's MD5, unverified; the audit cannot
        # compare it either.
        assert res.ok, res
        manifest = await read_manifest(store, "ds", "job-1")
        assert manifest is not None and [f.md5 for f in manifest.files] == [claimed]
        assert (await store.read(manifest.files[0].key)).data == body
        assert (await audit(store)).ok


# -- links in a local store's staging area (issue: a link published outside content) -------------


def _outside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "outside"
    (out / "dir").mkdir(parents=True)
    files = {"secret": b"secret outside the root", "dir/part-0.parquet": b"x" * 40}
    for name, body in files.items():
        (out / name).write_bytes(body)
    return out, files


def _untouched(out: Path, files: dict[str, bytes]) -> None:
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(files)
    for name, body in files.items():
        assert (out / name).read_bytes() == body


@pytest.mark.parametrize("kind", ["linked_folder", "linked_file", "linked_attempt", "dangling"])
async def test_a_link_in_staging_quarantines_touches_nothing_outside_and_skip_cleans_up(
    tmp_path: Path, kind: str
) -> None:
    out, files = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    attempt_dir = root / "_staging" / "job-1" / "ds" / "1-0"
    attempt_dir.mkdir(parents=True)
    if kind == "linked_folder":  # the winner's file sits in a folder that is a link to outside
        (attempt_dir / "date=1").symlink_to(out / "dir")
        path, size = "date=1/part-0.parquet", 40
    elif kind == "linked_file":
        (attempt_dir / "part-0.parquet").symlink_to(out / "secret")
        path, size = "part-0.parquet", len(files["secret"])
    elif kind == "linked_attempt":  # the whole attempt folder is a link
        attempt_dir.rmdir()
        attempt_dir.symlink_to(out / "dir")
        path, size = "part-0.parquet", 40
    else:
        (attempt_dir / "part-0.parquet").symlink_to(out / "gone")
        path, size = "part-0.parquet", 1
    good = b"task zero's real bytes"
    await store.write(staged_key("job-1", "ds", 0, 0, "part-0.parquet"), good)
    req = CommitRequest(
        dataset="ds",
        job="job-1",
        expected_tasks=2,
        winners=[
            WinningAttempt(task=0, attempt=0, files=[StagedFile(path="part-0.parquet", size=len(good))]),
            WinningAttempt(task=1, attempt=0, files=[StagedFile(path=path, size=size)]),
        ],
    )
    res = await commit_dataset(store, req, ManualLease("ds", 1), SETTINGS)
    assert res.status == "quarantined" and res.quarantined is not None
    assert "LinkRefused" in res.quarantined and "symbolic link" in res.quarantined
    assert res.quarantined.startswith("publish _staging/job-1/ds/1-0/") and ": verify: " in res.quarantined
    assert await keys(store, "ds/") == []
    _untouched(out, files)
    skipped = await skip_quarantined(store, "ds", "job-1", ManualLease("ds", 2), SETTINGS)
    assert skipped.outcome == "rolled_back"
    assert await keys(store, "_staging/") == []  # the real file is gone; links are never listed
    _untouched(out, files)
    assert (await audit(store)).ok


async def test_a_link_in_a_losing_attempt_does_not_stop_the_commit(tmp_path: Path) -> None:
    out, files = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    job = await stage_job(store, "ds", "job-1")
    loser_dir = root / "_staging" / "job-1" / "ds" / "0-5"
    loser_dir.mkdir()
    (loser_dir / "x.parquet").symlink_to(out / "secret")
    (root / "_staging" / "job-1" / "ds" / "1-7").symlink_to(out / "dir")
    res = await commit_dataset(store, job.req, ManualLease("ds", 1), SETTINGS)
    assert res.ok
    _untouched(out, files)
    # The links stay where they were planted (never followed, never listed); the rest is published.
    assert os.path.islink(loser_dir / "x.parquet")
    manifest = await read_manifest(store, "ds", "job-1")
    assert manifest is not None and len(manifest.files) == len(job.winners)
    for key, body in job.published().items():
        assert (await store.read(key)).data == body


@pytest.mark.parametrize("where", ["wal_folder", "manifest", "watermarks"])
async def test_a_link_in_a_service_area_stops_the_dataset_with_a_reason_not_a_crash(
    tmp_path: Path, where: str
) -> None:
    out, files = _outside(tmp_path)
    root = tmp_path / "root"
    store = LocalStore(root, durable=False)
    job = await stage_job(store, "ds", "job-1")
    if where == "wal_folder":
        (root / "_wal").mkdir()
        (root / "_wal" / "ds").symlink_to(out / "dir")
    elif where == "manifest":
        (root / "ds" / "_commits").mkdir(parents=True)
        (root / "ds" / "_commits" / "job-1.json").symlink_to(out / "secret")
    else:
        (root / "_state" / "ds").mkdir(parents=True)
        (root / "_state" / "ds" / "watermarks.json").symlink_to(out / "secret")
    res = await commit_dataset(store, job.req, ManualLease("ds", 1), SETTINGS)
    assert res.quarantined is not None and "symbolic link" in res.quarantined, res
    if where in ("watermarks", "manifest"):
        # Met by a step after the files were published: quarantined there (skip or retry decide).
        # (The manifest is not read before planning when the listing shows the staged files: a
        # manifest cannot exist while they do. A link planted there is met when it is written.)
        assert res.status == "quarantined" and res.quarantined.startswith(f"{where} step: CommitStepFailed")
    else:
        # Met while reading the dataset's log or manifest, before planning: the dataset is blocked.
        assert res.status == "blocked" and "unreadable" in res.quarantined
        assert await keys(store, "ds/") == []
    _untouched(out, files)


class _RewritesBeforeCopy(FaultStore):
    """A producer that rewrites one staged file (same size, other bytes) after it was verified."""

    def __init__(self, inner: ObjectStore, victim: str) -> None:
        super().__init__(inner)
        self.victim = victim

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        if src == self.victim:
            body = (await self.inner.read(src)).data
            await self.inner.write(src, bytes(b ^ 0xFF for b in body))
        return await super().copy(src, dst, source=source)


async def test_a_source_rewritten_after_verification_is_caught_at_the_copy(
    any_store: ObjectStore, store_target: StoreTarget
) -> None:
    job = await stage_job(any_store, "ds", "job-1", tasks=1, files_per_task=1)
    victim = next(iter(job.winners))
    res = await commit_dataset(
        _RewritesBeforeCopy(any_store, victim), job.req, ManualLease("ds", 1), SETTINGS
    )
    assert res.status == "quarantined" and res.quarantined is not None
    assert res.quarantined.startswith(f"publish {victim} ->")
    if store_target.backend in ("local", "azure"):
        # The copy is pinned to the verified version: refused, nothing copied.
        assert "changed after it was verified" in res.quarantined
    else:
        # moto and fake-gcs-server ignore the pin (S3 and GCS enforce it): the copy's MD5 catches it.
        assert "measured on its copy, removed" in res.quarantined
    assert await keys(any_store, "ds/") == []  # the copy of the rewritten bytes is gone again
    assert (await any_store.read(victim)).data == bytes(b ^ 0xFF for b in job.winners[victim])


# -- the class: any mix of right and wrong reports -------------------------------------------------

_FAULTS = st.sampled_from(["ok", "ok", "ok", "size", "md5", "missing", "link", "no_md5"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(faults=st.lists(_FAULTS, min_size=1, max_size=6), concurrency=st.integers(1, 4))
async def test_fuzz_any_wrong_report_publishes_nothing_and_right_ones_commit(
    tmp_path_factory: pytest.TempPathFactory, faults: list[str], concurrency: int
) -> None:
    base = tmp_path_factory.mktemp("verify")
    out, files = _outside(base)
    root = base / "root"
    store = LocalStore(root, durable=False)
    job = await stage_job(store, "ds", "job-1", tasks=len(faults), files_per_task=1)
    winners = []
    for w, fault in zip(job.req.winners, faults, strict=True):
        f = w.files[0]
        src = root / staged_key("job-1", "ds", w.task, w.attempt, f.path)
        if fault == "size":
            f = msgspec.structs.replace(f, size=f.size + 1)
        elif fault == "md5":
            f = msgspec.structs.replace(f, md5=hashlib.md5(b"other").hexdigest())
        elif fault == "missing":
            src.unlink()
        elif fault == "link":
            src.unlink()
            src.symlink_to(out / "secret")
            f = msgspec.structs.replace(f, size=len(files["secret"]), md5=None)
        elif fault == "no_md5":
            f = msgspec.structs.replace(f, md5=None)
        winners.append(msgspec.structs.replace(w, files=[f]))
    req = msgspec.structs.replace(job.req, winners=winners)
    res = await commit_dataset(store, req, ManualLease("ds", 1), fast_settings(concurrency=concurrency))
    if set(faults) <= {"ok", "no_md5"}:
        assert res.ok, res
        await assert_exactly_once(store, job)
    else:
        assert res.status == "quarantined" and res.quarantined is not None and ": verify: " in res.quarantined
        assert await keys(store, "ds/") == []
        assert await read_manifest(store, "ds", "job-1") is None
    _untouched(out, files)
