"""The one error a rejected message raises, with a closed set of reason codes."""

from __future__ import annotations

from typing import Final, Literal, get_args

from .._errors import BadInput

RejectReason = Literal[
    "oversized",
    "unsigned",
    "bad_signature",
    "stale",
    "bad_json",
    "unknown_type",
    "unsupported_version",
    "schema",
    "bad_job",
    "bad_dataset",
    "unsafe_path",
    "inconsistent",
    "replayed",
    "deleted",
    "internal",
]
"""Why a message was rejected. Dead-letter entries and admin events carry this code.

``stale``: a valid v2 signature made too long before (or after) the entry
reached the stream (``security.signature_max_age``): a replayed capture.
``deleted``: the entry was trimmed or XDEL'ed while pending (no content left).
``internal``: handling the entry raised an error the code did not expect (a
bug); the entry is set aside with the exception type so the shard goes on.
"""

REJECT_REASONS: Final[frozenset[str]] = frozenset(get_args(RejectReason))


MAX_DETAIL: Final = 1000
"""Details are cut to this many characters: they travel to dead-letter entries and logs."""


def one_line(text: str) -> str:
    """Return ``text`` as one line of valid UTF-8 text.

    Line breaks become spaces and what cannot be encoded (lone surrogates)
    is backslash-escaped, so a detail can always be logged, encoded as JSON
    and written to Redis.
    """
    if not text.isprintable():
        text = text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def shown(value: str, limit: int = 160) -> str:
    """Return ``repr(value)``, cut to about ``limit`` characters for error details."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


class InvalidMessage(BadInput):
    """A queue or admin message that can never be processed.

    ``reason`` is one of :data:`RejectReason` (stable, for metrics and
    dead-letter entries); ``detail`` is a one-line human explanation that
    names the offending field (``$.files[0].path``) where there is one.
    """

    def __init__(self, reason: RejectReason, detail: str) -> None:
        if reason not in REJECT_REASONS:  # a programming error, not bad input
            raise ValueError(f"unknown reject reason {reason!r}")
        detail = one_line(detail)
        if len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 3] + "..."
        super().__init__(f"{reason}: {detail}")
        self.reason: RejectReason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[InvalidMessage], tuple[RejectReason, str]]:
        return (InvalidMessage, (self.reason, self.detail))
