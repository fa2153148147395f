"""The registry of step kinds: which ``kind`` tags a write-ahead log may hold.

The built-in kinds are always there. A deployment adds its own (for example a
step that registers a partition in a catalog) with :func:`register_step_kind`
at import time, in every process that may recover a sequence. A log that holds
a kind its reader does not know is refused as unreadable (the dataset is
blocked), never half executed.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from ._catalog import CommitToTable
from ._delta import CommitToDelta
from ._errors import CommitStepFailed
from ._publish import PublishFile
from ._steps import PHASES, Cleanup, CommitStep, WriteManifest
from ._watermarks import AdvanceWatermarks

BUILTIN_STEPS: tuple[type[CommitStep], ...] = (
    PublishFile,
    AdvanceWatermarks,
    WriteManifest,
    Cleanup,
    CommitToTable,
    CommitToDelta,
)

S = TypeVar("S", bound=type[CommitStep])


class StepRegistry:
    """A set of step kinds, keyed by their ``kind`` tag, and the decoder for them."""

    def __init__(self, kinds: Iterable[type[CommitStep]] = ()) -> None:
        """Start with the built-in kinds plus ``kinds``.

        Raises:
            TypeError: a kind is not a valid step class (see :meth:`register`).
        """
        self._kinds: dict[str, type[CommitStep]] = {}
        self._decoder: msgspec.json.Decoder[list[CommitStep]] | None = None
        for cls in (*BUILTIN_STEPS, *kinds):
            self.register(cls)

    @property
    def kinds(self) -> Mapping[str, type[CommitStep]]:
        """The registered kinds, by tag (read-only view)."""
        return MappingProxyType(self._kinds)

    def copy(self) -> StepRegistry:
        """Return an independent registry with the same kinds."""
        return StepRegistry(self._kinds.values())

    def register(self, cls: S) -> S:
        """Add a step kind; returns ``cls`` so this also works as a class decorator.

        ``cls`` must subclass :class:`CommitStep` (a frozen msgspec Struct with
        ``tag_field="kind"``), give an explicit string ``tag`` (not the
        class name, msgspec's default), override the coroutines
        ``is_done`` and ``execute``, and declare a ``phase`` other than
        ``manifest`` (the manifest is the proof of completion: nothing may
        run between it and the cleanup). Registering the same class twice is
        a no-op.

        Raises:
            TypeError: any of the above does not hold, or the tag is taken by
                another class.
        """
        if not (isinstance(cls, type) and issubclass(cls, CommitStep)):
            raise TypeError(f"{cls!r} is not a subclass of CommitStep")
        config = cls.__struct_config__
        tag = config.tag
        # msgspec defaults the tag to the class name; an explicit tag is required
        # so renaming a class never changes the kind written into logs.
        if config.tag_field != "kind" or not isinstance(tag, str) or not tag or tag == cls.__name__:
            raise TypeError(f"{cls.__name__} must set an explicit tag (class X(CommitStep, tag='x'))")
        if not config.frozen:
            raise TypeError(f"{cls.__name__} must be frozen")
        for name in ("is_done", "execute"):
            method = getattr(cls, name, None)
            if method is getattr(CommitStep, name) or not inspect.iscoroutinefunction(method):
                raise TypeError(f"{cls.__name__}.{name} must be an async method overriding CommitStep's")
        if cls.phase not in PHASES:
            raise TypeError(f"{cls.__name__}.phase must be one of {PHASES}")
        if cls.phase == "manifest" and cls.__module__ != CommitStep.__module__:
            raise TypeError(f"{cls.__name__}: custom steps cannot run in the manifest phase")
        known = self._kinds.get(tag)
        if known is cls:
            return cls
        if known is not None:
            raise TypeError(f"step kind {tag!r} is already registered by {known.__qualname__}")
        self._kinds[tag] = cls
        self._decoder = None
        return cls

    def decode_steps(self, raw: bytes | msgspec.Raw) -> list[CommitStep]:
        """Decode a JSON list of tagged steps.

        Raises:
            CommitStepFailed: malformed, or a kind this registry does not know.
        """
        if self._decoder is None:
            union: Any = typing.Union.__getitem__(tuple(self._kinds.values()))
            self._decoder = msgspec.json.Decoder(list[union])
        try:
            return self._decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise CommitStepFailed(
                f"commit steps unreadable (kinds known here: {sorted(self._kinds)}): {exc}"
            ) from exc


DEFAULT_REGISTRY = StepRegistry()
"""The process-wide registry used when a call is given none."""


def register_step_kind(cls: S, *, registry: StepRegistry | None = None) -> S:
    """Register a custom step kind in ``registry`` (default: :data:`DEFAULT_REGISTRY`).

    Returns ``cls`` (usable as a class decorator). See :meth:`StepRegistry.register`.

    Raises:
        TypeError: ``cls`` is not a valid step kind.
    """
    return (registry or DEFAULT_REGISTRY).register(cls)


__all__ = ["DEFAULT_REGISTRY", "StepRegistry", "register_step_kind"]
