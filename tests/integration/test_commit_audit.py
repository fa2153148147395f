"""``audit`` on a hand-broken store: every kind of violation is found, with its key, and nothing else."""

from __future__ import annotations

import hashlib

import msgspec

from shared.commit import Manifest, ManifestFile, audit, commit_dataset, encode_sequence, plan_commit
from shared.events import manifest_key, wal_key, watermarks_key
from shared.storage import ObjectStore
from tests._support.commit import ManualLease, fast_settings, stage_job
from tests._support.fault_store import FaultStore, expect_crash

SETTINGS = fast_settings()


async def _manifest(
    store: ObjectStore, dataset: str, job: str, files: list[ManifestFile], marks: dict[str, int] | None = None
) -> None:
    body = Manifest(dataset=dataset, job=job, files=files, watermarks=marks or {}, epoch=1, committed_at=0.0)
    await store.write(manifest_key(dataset, job), msgspec.json.encode(body))


async def test_a_consistent_store_audits_clean_with_its_totals(any_store: ObjectStore) -> None:
    jobs = [await stage_job(any_store, ds, "job-1", seed=n) for n, ds in enumerate(("a", "b"))]
    for job in jobs:
        assert (await commit_dataset(any_store, job.req, ManualLease(job.req.dataset, 1), SETTINGS)).ok
    report = await audit(any_store)
    assert report.ok and report.violations == []
    assert (report.datasets, report.manifests, report.files) == (2, 2, 8)
    assert report.bytes == sum(len(b) for j in jobs for b in j.winners.values())


async def test_audit_finds_every_kind_of_violation(any_store: ObjectStore) -> None:
    good = await stage_job(any_store, "ds", "job-1")
    assert (await commit_dataset(any_store, good.req, ManualLease("ds", 1), SETTINGS)).ok
    want: set[tuple[str, str]] = set()

    await any_store.write("ds/stray.parquet", b"?")
    want.add(("unlisted_file", "ds/stray.parquet"))

    await _manifest(any_store, "ds2", "j1", [ManifestFile(key="ds2/j1-00000-a", size=1)], {"q": 1})
    want.add(("missing_file", "ds2/j1-00000-a"))
    await any_store.write("ds2/j2-00000-b", b"abc")
    await _manifest(any_store, "ds2", "j2", [ManifestFile(key="ds2/j2-00000-b", size=10)])
    want.add(("wrong_size", "ds2/j2-00000-b"))
    await any_store.write("ds2/j3-00000-c", b"abc")
    await _manifest(
        any_store,
        "ds2",
        "j3",
        [ManifestFile(key="ds2/j3-00000-c", size=3, md5=hashlib.md5(b"xyz").hexdigest())],
    )
    # Every backend: the stored MD5, or (local files) the one the audit computes.
    want.add(("wrong_checksum", "ds2/j3-00000-c"))
    await any_store.write(watermarks_key("ds2"), b"not json")
    want.add(("unreadable_watermarks", watermarks_key("ds2")))

    await any_store.write("ds3/x", b"12")
    await _manifest(any_store, "ds3", "j5", [ManifestFile(key="ds3/x", size=2)], {"p": 50})
    await _manifest(any_store, "ds3", "j6", [ManifestFile(key="ds3/x", size=2)])
    want.add(("listed_twice", "ds3/x"))
    want.add(("watermark_behind", watermarks_key("ds3")))  # no watermarks at all, a manifest says 50
    await any_store.write(manifest_key("ds3", "broken"), b"{")
    want.add(("unreadable_manifest", manifest_key("ds3", "broken")))

    await _manifest(any_store, "ds", "job-0", [], {"p0": 10_000})
    want.add(("watermark_behind", watermarks_key("ds")))

    await any_store.write("_staging/job-1/ds/0-0/left.parquet", b"1")
    want.add(("staged_leftover", "_staging/job-1/ds/0-0/left.parquet"))
    await any_store.write("_staging/aborted/ds/3-0/x", b"1")
    want.add(("staged_leftover", "_staging/aborted/ds/3-0/x"))
    await any_store.write("_staging/running/ds/0-0/y", b"1")  # job not known to have ended: fine

    # An unfinished sequence (crashed right after writing its log): its staged files are not leftovers.
    open_job = await stage_job(any_store, "ds4", "job-1")
    await expect_crash(
        commit_dataset(
            FaultStore(any_store, crash_at=1, crash_when="after"),
            open_job.req,
            ManualLease("ds4", 1),
            SETTINGS,
        )
    )
    want.add(("unfinished_sequence", wal_key("ds4", "job-1")))

    seq = plan_commit(open_job.req, 3)
    await any_store.write(
        wal_key("ds5", "job-1"),
        encode_sequence(msgspec.structs.replace(seq, dataset="ds5", quarantined="publish ...: data lost")),
    )
    want.add(("quarantined_sequence", wal_key("ds5", "job-1")))
    await any_store.write(wal_key("ds6", "job-9"), b"nope")
    want.add(("unreadable_sequence", wal_key("ds6", "job-9")))
    await any_store.write("_locks/ds.json", b"{}")  # locks are fine to leave

    report = await audit(any_store, ended_jobs={"aborted"})
    got = {(v.kind, v.key) for v in report.violations}
    assert got == want, (got - want, want - got)
    assert not report.ok
    assert len(report.violations) == len(want)
    assert all(v.detail for v in report.violations)
    assert report.of_kind("quarantined_sequence")[0].detail.endswith("data lost")
