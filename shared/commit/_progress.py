"""The record of one run of a sequence's steps: what was seen done or redone, the first failure, the timings.

Both the executor (:mod:`._execute`) and the publish phase
(:mod:`._publish_phase`) write into one :class:`Progress`; a failure is kept
as the quarantine reason, worded by :func:`step_failure` so that status
displays read the step first. A plain record: no I/O.
"""

from __future__ import annotations

from .._errors import CommitfleetError, OutcomeUnknown, TransientError
from ._publish import PublishFile
from ._steps import CommitStep


def describe_step(step: CommitStep) -> str:
    """Return a short human description of a step, for reasons and logs."""
    if isinstance(step, PublishFile):
        return f"publish {step.src} -> {step.dst}"
    return f"{step.__struct_config__.tag} step"


def step_failure(step: CommitStep, exc: CommitfleetError) -> str:
    """Return the quarantine reason of ``step`` failing with ``exc``."""
    if isinstance(exc, TransientError | OutcomeUnknown):
        return f"{describe_step(step)}: retry budget spent: {type(exc).__name__}: {exc}"
    return f"{describe_step(step)}: {type(exc).__name__}: {exc}"


class Progress:
    """What a run of a sequence saw done and redid, its first failure (quarantine reason), its phase times."""

    def __init__(self) -> None:
        self.done: set[int] = set()
        self.redone = 0
        self.failure: str | None = None
        self.timings: dict[str, float] = {}


__all__ = ["Progress", "describe_step", "step_failure"]
