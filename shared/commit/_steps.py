"""Commit steps: the units of a commit sequence, each with an idempotent check and action.

The watermarks step lives in :mod:`._watermarks`, the publish step in :mod:`._publish`.

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

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import msgspec

from .._errors import BadInput, NotFound, PreconditionFailed, TransientError
from ..events import manifest_key
from ..locks import Lease
from ..settings import Settings
from ..storage import ObjectInfo, ObjectStore
from ..tracing import NO_TRACER, Tracer
from ._bounded import for_each_bounded
from ._errors import CommitStepFailed
from ._head_start import NO_HEAD_STARTS, HeadStarts
from ._model import Manifest, ManifestFile

Phase = Literal["publish", "apply", "manifest", "cleanup"]
PHASES: tuple[Phase, ...] = ("publish", "apply", "manifest", "cleanup")

CommitProbe = Callable[[str], None]
"""A test's hook into the commit path: called with the name of a point as the path passes it.

It runs where the point is (in the catalog's thread for the Iceberg step's
``table.*`` points, in the event loop for the Delta step's), may block or
raise (a test's simulated crash), and must not change anything. Points:
``table.commit`` just before the table step's catalog transaction (the Delta
step's log create), ``table.committed`` just after it returned.
"""


def no_probe(point: str) -> None:
    """The default probe: does nothing."""


_manifest_decoder = msgspec.json.Decoder(Manifest)
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step may use: the store, the lease it runs under, and the settings.

    ``clock`` gives the timestamps written into documents (a value, so tests
    can fix it). ``verified`` holds the staged sources checked before the
    publish phase, by key: their copies are pinned to those versions.
    ``probe`` is called at the points a test may hook into (default: none).
    ``tracer`` records a span per phase (default: none; docs/tracing.md).
    ``head_starts`` holds the steps' preparations of the run (:mod:`._head_start`).
    """

    store: ObjectStore
    lease: Lease
    settings: Settings = field(default_factory=Settings)
    clock: Callable[[], float] = time.time
    verified: Mapping[str, ObjectInfo] = field(default_factory=dict)
    probe: CommitProbe = no_probe
    tracer: Tracer = NO_TRACER
    head_starts: HeadStarts = NO_HEAD_STARTS


class CommitStep(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Base class of every step kind, built-in or custom.

    Subclasses set ``tag=`` (the ``kind`` written to the log), may set
    ``phase`` (default ``apply``), and implement :meth:`is_done` and
    :meth:`execute`. Custom kinds must be registered
    (:func:`~shared.commit.register_step_kind`) before a log holding them can
    be read.
    """

    phase: ClassVar[Phase] = "apply"
    # The write-ahead log format version a log holding this step is written at (see _wal.WAL_VERSIONS).
    wal_version: ClassVar[int] = 1
    # True when the kind implements :meth:`prepare` (the executor then starts it ahead of the step's turn).
    prepares: ClassVar[bool] = False

    async def is_done(self, ctx: StepContext) -> bool:
        """Return True when the step's effect is already in place in the store."""
        raise NotImplementedError

    async def execute(self, ctx: StepContext) -> None:
        """Bring the effect about; idempotent. Returns None; raises as the module says."""
        raise NotImplementedError

    async def prepare(self, ctx: StepContext) -> object | None:
        """Do ahead of the step's turn what changes nothing anyone reads; return it for :meth:`ensure`.

        The executor runs it beside the steps before this one (see
        :mod:`._head_start`) when the kind sets ``prepares``; the step's
        ``ensure`` takes the result with ``ctx.head_starts.take(self)`` and
        must hold without it (None: not prepared, or failed).

        Raises: CommitfleetError (the preparation is then dropped). Cancelled: with the run.
        """
        return None

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
    except BadInput as exc:  # a link or a non-file in a local store
        raise CommitStepFailed(f"manifest {key} is unreadable: {exc}") from exc
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
        await self.ensure(ctx)

    async def ensure(self, ctx: StepContext) -> bool:
        """Create first, read only when refused: the create-if-absent answer is the check.

        Returns:
            True when this call wrote the manifest, False when an equal one was there.

        Raises:
            CommitStepFailed: a manifest with other content already exists.
            TransientError: the create was refused but no manifest can be read.
        """
        key = manifest_key(self.dataset, self.job)
        ctx.lease.check()
        try:
            await ctx.store.write_if_absent(key, _encoder.encode(self.manifest(ctx.clock())))
        except PreconditionFailed:
            if not await self.is_done(ctx):
                raise TransientError(f"manifest {key} reported existing but cannot be read") from None
            return False
        except BadInput as exc:  # a link or a non-file in a local store
            raise CommitStepFailed(f"manifest {key} cannot be written: {exc}") from exc
        return True


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

    async def ensure(self, ctx: StepContext) -> bool:
        """List and delete; list again only when something was deleted (the usual case: one listing).

        Returns:
            True when something was deleted, False when the prefixes were empty.

        Raises:
            TransientError: something is still there after the deletes.
        """
        if await delete_prefixes(ctx, self.prefixes) == 0:
            return False
        if not await self.is_done(ctx):
            raise TransientError(f"cleanup of {', '.join(self.prefixes)}: objects left after deleting")
        return True


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


__all__ = [
    "PHASES",
    "Cleanup",
    "CommitProbe",
    "CommitStep",
    "Phase",
    "StepContext",
    "WriteManifest",
    "decode_manifest",
    "delete_prefixes",
    "no_probe",
    "read_manifest",
]
