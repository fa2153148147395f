"""The one error of the commit core that callers must tell apart."""

from __future__ import annotations

from .._errors import CommitfleetError


class CommitStepFailed(CommitfleetError):
    """A commit step can never succeed by retrying: the sequence must be quarantined.

    Raised when the store contradicts the plan: a staged file is gone while its
    destination is missing or different (data lost), a staged file differs
    from what its task reported, a manifest with other content already exists,
    or the write-ahead log cannot be read. Nothing is deleted on a guess when
    this is raised; an operator decides (``retry`` or ``skip``).
    """
