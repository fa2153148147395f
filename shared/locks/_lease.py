"""The lease a lock holder carries into the work the lock protects."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Lease(Protocol):
    """Proof of holding a lock, handed to the protected work.

    ``epoch`` is the fencing token: it goes up by one on every acquisition of
    the lock, so a later holder always has a higher epoch than an earlier one.
    """

    @property
    def name(self) -> str:
        """The lock's name (for a dataset lock, the dataset)."""
        ...

    @property
    def epoch(self) -> int:
        """The fencing epoch of this holding."""
        ...

    def check(self) -> None:
        """Return if the lease is still valid locally; raise LockLost otherwise.

        Valid means: not released, not refused on renewal, and the local
        deadline (last successful renewal + validity - drift) not yet passed.
        """
        ...
