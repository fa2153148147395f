"""Commit steps: the units of a commit sequence, each with an idempotent check and action.

Every step kind is a frozen msgspec Struct tagged by ``kind`` (so a sequence
serialises as a list of tagged objects) with two coroutines:

- ``is_done(ctx)``: look at the store and say whether the step's effect is in
  place. It never trusts anything but the store.
- ``execute(ctx)``: bring the effect about. Safe to run again, after a crash at
  any point, and concurrently with a stale holder running the same step.

A step raises :class:`~shared._errors.TransientError` (retry),
:class:`~shared._errors.OutcomeUnknown` (re-check, then retry),
:class:`~shared.commit.CommitStepFailed` (never retry: quarantine) or
:class:`~shared._errors.LockLost` (stop).

``phase`` orders the steps of a sequence: all ``publish`` steps (run in
parallel, bounded), then ``apply`` steps in order (watermarks, custom steps),
then the ``manifest``, then ``cleanup``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import msgspec

from .._errors import NotFound, PreconditionFailed, TransientError
from .._settings import Settings
from ..events import manifest_key, watermarks_key
from ..locks import Lease
from ..storage import ObjectInfo, ObjectStore
from ._bounded import for_each_bounded
from ._errors import CommitStepFailed
from ._model import Manifest, ManifestFile, WatermarksDoc

Phase = Literal["publish", "apply", "manifest", "cleanup"]
PHASES: tuple[Phase, ...] = ("publish", "apply", "manifest", "cleanup")

# A compare-and-swap that loses this many races in a row is reported as
# transient: with one lock holder per dataset, more than a handful means a
# stale holder or an operator is writing at the same time.
_CAS_ROUNDS = 32

_manifest_decoder = msgspec.json.Decoder(Manifest)
_watermarks_decoder = msgspec.json.Decoder(WatermarksDoc)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step may use: the store, the lease it runs under, and the settings.

    ``clock`` gives the timestamps written into documents (a value, so tests
    can fix it).
    """

    store: ObjectStore
    lease: Lease
    settings: Settings = field(default_factory=Settings)
    clock: Callable[[], float] = time.time


class CommitStep(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base class of every step kind, built-in or custom.

    Subclasses set ``tag=`` (the ``kind`` written to the log), may set
    ``phase`` (default ``apply``), and implement :meth:`is_done` and
    :meth:`execute`. Custom kinds must be registered
    (:func:`~shared.commit.register_step_kind`) before a log holding them can
    be read.
    """

    phase: ClassVar[Phase] = "apply"

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when the step's effect is already in place in the store."""
        raise NotImplementedError

    async def execute(self, ctx: StepContext) -> None:
        """Bring the effect about; idempotent. Returns None; raises as the module says."""
        raise NotImplementedError

    async def ensure(self, ctx: StepContext) -> bool:
        """Make sure the effect is in place: verify, and execute only if it is not.

        This is what the executor and recovery call. The default is
        ``is_done`` -> ``execute`` -> ``is_done`` again (a step whose execute
        does not do its job is caught as a transient failure). A kind may
        override it with a cheaper order that judges the same store state.

        Returns:
            True when the step had to be executed, False when it was done.
        """
        if await self.is_done(ctx):
            return False
        ctx.lease.check()
        await self.execute(ctx)
        if not await self.is_done(ctx):
            raise TransientError(f"{self.__struct_config__.tag} step is not done after executing it")
        return True


def _matches(info: ObjectInfo, size: int, md5: str | None) -> bool:
    if info.size != size:
        return False
    return md5 is None or info.checksum is None or info.checksum.lower() == md5.lower()


async def _head(store: ObjectStore, key: str) -> ObjectInfo | None:
    try:
        return await store.head(key)
    except NotFound:
        return None


class PublishFile(CommitStep, frozen=True, kw_only=True, tag="publish"):
    """Copy a staged file to its published key, then delete the staged one.

    Done means: the destination exists with the expected size (and checksum,
    where both the store and the producer know it) AND the source is gone. A
    destination with the right name but another size (a partial copy) is not
    done.
    """

    phase: ClassVar[Phase] = "publish"

    src: str
    dst: str
    size: int
    md5: str | None = None

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when the source is gone and the destination is right."""
        if await _head(ctx.store, self.src) is not None:
            return False
        dst = await _head(ctx.store, self.dst)
        return dst is not None and _matches(dst, self.size, self.md5)

    async def execute(self, ctx: StepContext) -> None:
        """Copy (server side), verify, delete the source.

        Raises:
            CommitStepFailed: the source differs from what its task reported,
                or the source is gone and the destination is missing or wrong
                (the data is lost: nothing is deleted, an operator decides).
            TransientError: the copy did not produce the expected object.
        """
        await self.ensure(ctx)

    async def ensure(self, ctx: StepContext) -> bool:
        """Copy first, judge by the answers: the same checks as ``is_done``, fewer requests.

        A copy that finds no source means the file was published (by us
        before a crash, or by another holder): the destination must then be
        right, else the data is lost (:class:`CommitStepFailed`). A copy that
        succeeds is checked against the expected size and checksum before the
        source is deleted.

        Returns:
            True when a copy was made, False when the file was already published.
        """
        ctx.lease.check()
        try:
            copied = await ctx.store.copy(self.src, self.dst)
        except NotFound:
            dst = await _head(ctx.store, self.dst)
            if dst is None or not _matches(dst, self.size, self.md5):
                found = "missing" if dst is None else f"{dst.size} bytes (checksum {dst.checksum})"
                raise CommitStepFailed(
                    f"staged file {self.src} is gone and {self.dst} is {found}, "
                    f"expected {self.size} bytes: data lost, not retrying"
                ) from None
            return False
        if not _matches(copied, self.size, self.md5):
            src = await _head(ctx.store, self.src)
            if src is not None and not _matches(src, self.size, self.md5):
                raise CommitStepFailed(
                    f"staged file {self.src} is {src.size} bytes (checksum {src.checksum}), "
                    f"its task reported {self.size} bytes (md5 {self.md5})"
                )
            # The source is right (or vanished: a concurrent holder published
            # it): this copy went wrong; the retry judges again.
            raise TransientError(
                f"copy {self.src} -> {self.dst} gave {copied.size} bytes, expected {self.size}"
            )
        ctx.lease.check()
        await ctx.store.delete(self.src)
        return True


def merge_watermarks(current: Mapping[str, int], new: Mapping[str, int]) -> dict[str, int]:
    """Return the per-key maximum of ``current`` and ``new`` (a watermark never moves back)."""
    merged = dict(current)
    for key, value in new.items():
        if key not in merged or value > merged[key]:
            merged[key] = value
    return merged


def _decode_watermarks(data: bytes, key: str) -> WatermarksDoc:
    try:
        return _watermarks_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CommitStepFailed(f"watermarks {key} are unreadable: {exc}") from exc


async def read_watermarks(store: ObjectStore, dataset: str) -> dict[str, int]:
    """Return the dataset's committed watermarks ({} when none were ever written).

    Raises:
        CommitStepFailed: the watermarks document is unreadable.
    """
    key = watermarks_key(dataset)
    try:
        obj = await store.read(key)
    except NotFound:
        return {}
    return dict(_decode_watermarks(obj.data, key).values)


class AdvanceWatermarks(CommitStep, frozen=True, kw_only=True, tag="watermarks"):
    """Move the dataset's watermarks forward to at least ``values`` (per-key max, by compare-and-swap)."""

    dataset: str
    values: dict[str, int]

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when every watermark is already at or past ``values``."""
        current = await read_watermarks(ctx.store, self.dataset)
        return all(k in current and current[k] >= v for k, v in self.values.items())

    async def execute(self, ctx: StepContext) -> None:
        """Read, merge by max, write back conditionally; repeat on a lost race.

        Raises:
            TransientError: the race was lost too many times in a row.
            CommitStepFailed: the stored document is unreadable.
        """
        key = watermarks_key(self.dataset)
        for _ in range(_CAS_ROUNDS):
            try:
                obj = await ctx.store.read(key)
            except NotFound:
                current: dict[str, int] = {}
                version: str | None = None
            else:
                current = dict(_decode_watermarks(obj.data, key).values)
                version = obj.info.version
            merged = merge_watermarks(current, self.values)
            if version is not None and merged == current:
                return
            body = _encoder.encode(
                WatermarksDoc(
                    dataset=self.dataset, values=merged, updated_at=ctx.clock(), nonce=secrets.token_hex(8)
                )
            )
            ctx.lease.check()
            try:
                if version is None:
                    await ctx.store.write_if_absent(key, body)
                else:
                    await ctx.store.write_if_match(key, body, version)
            except PreconditionFailed:
                continue  # someone else moved them (or our retried write landed): re-read
            return
        raise TransientError(f"watermarks {key}: compare-and-swap lost {_CAS_ROUNDS} races in a row")


def decode_manifest(data: bytes, key: str) -> Manifest:
    """Return the manifest in ``data`` (read from ``key``). Raises CommitStepFailed when unreadable."""
    try:
        return _manifest_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise CommitStepFailed(f"manifest {key} is unreadable: {exc}") from exc


async def read_manifest(store: ObjectStore, dataset: str, job: str) -> Manifest | None:
    """Return the job's manifest for the dataset, or None when the commit is not complete.

    Raises:
        CommitStepFailed: a manifest exists but is unreadable.
    """
    key = manifest_key(dataset, job)
    try:
        obj = await store.read(key)
    except NotFound:
        return None
    return decode_manifest(obj.data, key)


class WriteManifest(CommitStep, frozen=True, kw_only=True, tag="manifest"):
    """Create ``<dataset>/_commits/<job>.json`` if absent: from then on the commit is complete."""

    phase: ClassVar[Phase] = "manifest"

    dataset: str
    job: str
    files: list[ManifestFile]
    watermarks: dict[str, int]
    epoch: int

    def manifest(self, committed_at: float) -> Manifest:
        """Return the manifest this step writes."""
        return Manifest(
            dataset=self.dataset,
            job=self.job,
            files=list(self.files),
            watermarks=dict(self.watermarks),
            epoch=self.epoch,
            committed_at=committed_at,
        )

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when the manifest exists with this commit's content.

        Raises:
            CommitStepFailed: a manifest with other content (or unreadable) exists.
        """
        existing = await read_manifest(ctx.store, self.dataset, self.job)
        if existing is None:
            return False
        if not existing.same_commit(self.manifest(0.0)):
            raise CommitStepFailed(
                f"manifest {manifest_key(self.dataset, self.job)} exists with other content "
                f"({len(existing.files)} files, epoch {existing.epoch}); not overwriting it"
            )
        return True

    async def execute(self, ctx: StepContext) -> None:
        """Write the manifest with create-if-absent; an equal existing one counts as done.

        Raises:
            CommitStepFailed: a manifest with other content already exists.
        """
        key = manifest_key(self.dataset, self.job)
        ctx.lease.check()
        try:
            await ctx.store.write_if_absent(key, _encoder.encode(self.manifest(ctx.clock())))
        except PreconditionFailed:
            if not await self.is_done(ctx):
                raise TransientError(f"manifest {key} reported existing but cannot be read") from None


class Cleanup(CommitStep, frozen=True, kw_only=True, tag="cleanup"):
    """Delete everything under ``prefixes`` (the job's staging folder for the dataset).

    That folder also holds every losing attempt's files. Runs last, so the
    winners' staged files are already gone (published) when it starts.
    """

    phase: ClassVar[Phase] = "cleanup"

    prefixes: list[str]

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when nothing is left under any prefix."""
        for prefix in self.prefixes:
            async for _ in ctx.store.list(prefix):
                return False
        return True

    async def execute(self, ctx: StepContext) -> None:
        """List and delete, ``settings.commit.publish_concurrency`` deletes at a time."""
        await delete_prefixes(ctx, self.prefixes)


async def delete_prefixes(ctx: StepContext, prefixes: list[str]) -> int:
    """Delete every object under ``prefixes``, a bounded number at a time.

    Returns:
        How many objects were deleted (listed, then deleted).

    Raises:
        LockLost: the lease was lost (checked before each delete).
        TransientError / OutcomeUnknown: from the store; deletes are idempotent,
            so the caller may simply run this again.
    """
    count = 0

    async def one(key: str) -> None:
        ctx.lease.check()
        await ctx.store.delete(key)

    async def listed() -> AsyncIterator[str]:
        nonlocal count
        for prefix in prefixes:
            async for info in ctx.store.list(prefix):
                count += 1
                yield info.key

    await for_each_bounded(listed(), one, ctx.settings.commit.publish_concurrency)
    return count


BUILTIN_STEPS: tuple[type[CommitStep], ...] = (PublishFile, AdvanceWatermarks, WriteManifest, Cleanup)

__all__ = [
    "BUILTIN_STEPS",
    "PHASES",
    "AdvanceWatermarks",
    "Cleanup",
    "CommitStep",
    "Phase",
    "PublishFile",
    "StepContext",
    "WriteManifest",
    "decode_manifest",
    "delete_prefixes",
    "merge_watermarks",
    "read_manifest",
    "read_watermarks",
]
