"""The commit core's value types: its input (what to commit) and the documents it stores.

Everything here is a frozen msgspec Struct. The stored documents carry a schema
version ``v`` so a newer reader can tell an older writer's format.
"""

from __future__ import annotations

import msgspec

from ..events import StagedFile, StreamBatch

FORMAT_VERSION = 1
"""Version of the manifest, watermarks and write-ahead-log documents written here."""


class WinningAttempt(msgspec.Struct, frozen=True, kw_only=True):
    """The attempt of one task whose output is committed.

    ``files`` name paths relative to the attempt's staging folder
    ``_staging/<job>/<dataset>/<task>-<attempt>/``; ``watermarks`` are the
    source positions the attempt read up to.
    """

    task: int
    attempt: int
    files: list[StagedFile]
    watermarks: dict[str, int] = msgspec.field(default_factory=dict)


class CommitRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker asks the core to commit: one dataset of one finished job.

    ``winners`` holds exactly one attempt for each task index
    ``0..expected_tasks-1``; every other attempt's staged output is cleaned up.
    """

    dataset: str
    job: str
    winners: list[WinningAttempt]
    expected_tasks: int
    stream: StreamBatch | None = None
    """The micro-batch a streaming job commits: recorded with the watermarks, checked under the lock."""
    seq: int = 0
    """The job's sequence for the dataset (the shard's ``fin``; 0: none): a Delta commit's ``txn`` version."""


class ManifestFile(msgspec.Struct, frozen=True, kw_only=True):
    """One published file as the manifest lists it (``md5`` when the producer gave one)."""

    key: str
    size: int
    md5: str | None = None


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """The commit manifest ``<dataset>/_commits/<job>.json``: the proof that a commit is complete.

    ``epoch`` is the lock epoch of the holder that planned the sequence (a
    holder that recovers it writes the planned manifest unchanged); two manifests
    with the same dataset, job, files and watermarks are the same commit
    whatever their epoch and time (see :meth:`same_commit`).
    """

    v: int = FORMAT_VERSION
    dataset: str
    job: str
    files: list[ManifestFile]
    watermarks: dict[str, int]
    epoch: int
    committed_at: float

    @property
    def bytes(self) -> int:
        """Total size of the listed files."""
        return sum(f.size for f in self.files)

    def same_commit(self, other: Manifest) -> bool:
        """Return True when ``other`` records the same commit (epoch and time aside)."""
        return (
            self.dataset == other.dataset
            and self.job == other.job
            and sorted((f.key, f.size, f.md5 or "") for f in self.files)
            == sorted((f.key, f.size, f.md5 or "") for f in other.files)
            and self.watermarks == other.watermarks
        )


class StreamRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The last micro-batch of one streaming app committed to a dataset (docs/streaming.md).

    ``query`` is the Spark query id that committed it, ``job`` the job that did
    (``""`` after an operator's ``skip`` rolled that job's batch back: the
    record then stands for the batch before, whose job is not known).
    """

    batch: int
    query: str
    job: str
    at: float = 0.0


class WatermarksDoc(msgspec.Struct, frozen=True, kw_only=True):
    """``_state/<dataset>/watermarks.json``: the highest committed source positions.

    ``streams`` holds, per streaming app id, the last micro-batch committed
    (written by the same compare-and-swap as the values, in the same commit).
    ``nonce`` changes on every write so that stores whose version is a content
    hash (S3 ETag) still see a new version.
    """

    v: int = FORMAT_VERSION
    dataset: str
    values: dict[str, int]
    updated_at: float
    nonce: str
    streams: dict[str, StreamRecord] = msgspec.field(default_factory=dict)


__all__ = [
    "FORMAT_VERSION",
    "CommitRequest",
    "Manifest",
    "ManifestFile",
    "StagedFile",
    "StreamRecord",
    "WatermarksDoc",
    "WinningAttempt",
]
