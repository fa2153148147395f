"""The publish step: copy one staged file to its published key, then delete the staged one."""

from __future__ import annotations

from typing import ClassVar

from .._errors import NotFound, PreconditionFailed, TransientError
from ..storage import ObjectInfo, ObjectStore
from ._errors import CommitStepFailed
from ._steps import CommitStep, Phase, StepContext


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
        """Copy first, judge by the answers (:meth:`copy_checked`), then delete the source.

        Returns:
            True when a copy was made, False when the file was already published.

        Raises:
            As :meth:`copy_checked`; TransientError / OutcomeUnknown from the delete.
        """
        if not await self.copy_checked(ctx):
            return False
        ctx.lease.check()
        await ctx.store.delete(self.src)
        return True

    async def copy_checked(self, ctx: StepContext) -> bool:
        """Copy first, judge by the answers: the same checks as ``is_done``, fewer requests.

        A copy that finds no source means the file was published (by us
        before a crash, or by another holder): the destination must then be
        right, else the data is lost (:class:`CommitStepFailed`). The copy is
        pinned to the version verified before the publish phase: a source that
        changed since is :class:`CommitStepFailed`. A copy that succeeds is
        checked against the expected size and checksum before the source is
        deleted.

        The source is not deleted here: the caller deletes the sources once
        every copy of the sequence has been judged right.

        Returns:
            True when a right copy was made (the source is still there), False
            when the file was already published (source gone, destination right).

        Raises:
            CommitStepFailed: the source differs from its report (measured on
                the copy, which is removed), changed since it was verified, or is
                gone with the destination missing or wrong (data lost).
            TransientError: the copy came out wrong while the source is right.
        """
        ctx.lease.check()
        copied: ObjectInfo | None
        try:
            # Pinned to the version verified before the publish phase (when
            # there was one): the bytes published are the bytes checked.
            copied = await ctx.store.copy(self.src, self.dst, source=ctx.verified.get(self.src))
        except PreconditionFailed:
            if await _head(ctx.store, self.src) is not None:
                raise CommitStepFailed(
                    f"staged file {self.src} changed after it was verified; nothing copied, not retrying"
                ) from None
            copied = None  # gone since: published by another holder (judged below)
        except NotFound:
            copied = None
        if copied is None:
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
            wrong = None
            if src is not None and not _matches(src, self.size, self.md5):
                wrong = (
                    f"staged file {self.src} is {src.size} bytes (MD5 {src.checksum}), "
                    f"its task reported {self.size} bytes (MD5 {self.md5})"
                )
            elif src is not None and src.checksum is None and copied.size == self.size:
                # The source has no stored MD5 (an S3 multipart upload; local
                # files) but its copy has one: it measures the staged bytes
                # (changed since they were verified, or never checkable before).
                wrong = f"staged file {self.src} has MD5 {copied.checksum}, its task reported {self.md5}"
            if wrong is not None:
                # The copy is ours (this job's own name) and holds bytes that
                # must not be published: remove it; the source stays.
                ctx.lease.check()
                await ctx.store.delete(self.dst)
                raise CommitStepFailed(f"{wrong} (measured on its copy, removed)")
            # The source is right (or vanished: a concurrent holder published
            # it): this copy went wrong; the retry judges again.
            raise TransientError(
                f"copy {self.src} -> {self.dst} gave {copied.size} bytes (MD5 {copied.checksum}), "
                f"expected {self.size} (MD5 {self.md5})"
            )
        return True


__all__ = ["PublishFile"]
