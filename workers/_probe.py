"""The worker's probe: named points of its commit path and intake a test can watch or stop it at.

The actions (:class:`workers._actions.Actions`) await ``probe(point)`` at
``commit.locked``, ``commit.done``, ``commit.announced``, ``commit.saved``,
``abort.done`` and ``abort.announced``; the intake (:class:`workers._intake.Intake`)
at ``intake.run`` (a run of saves sent ahead sends its first save) and
``intake.judge`` (each batch of such a run is judged). A worker is given its probe when it
is built (``Worker(settings, probe=...)``, kept in its
:class:`~workers._context.WorkerContext`); the default does nothing.
"""

from __future__ import annotations

from typing import Protocol


class Probe(Protocol):
    """Called at each named point (see the module doc); may wait, must not raise."""

    async def __call__(self, point: str, /) -> None:
        """Return when the work may go on past ``point``."""


async def no_probe(point: str, /) -> None:
    """The default probe: returns at once, whatever the point."""
    del point


__all__ = ["Probe", "no_probe"]
