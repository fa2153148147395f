"""Job ids, dataset names and reasons as the driver makes and checks them (pure)."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterable

from .._errors import BadInput
from ..events import DEFAULT_DATASET_PATTERN, check_dataset_segment

_DATASET_RE = re.compile(DEFAULT_DATASET_PATTERN)
_MAX_REASON = 2000


def new_job_id(app: str = "") -> str:
    """Return a fresh job id: ``<app>-<UTC time>-<random>`` (matches the contract's job pattern)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", app)[:60].strip("-._") or "job"
    return f"{stem}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{secrets.token_hex(4)}"


def check_datasets(datasets: Iterable[str]) -> tuple[str, ...]:
    """Return the job's dataset names, checked.

    Raises:
        BadInput: none given, a repeat, or a name outside the contract's
            default dataset pattern.
    """
    names = tuple(datasets)
    if not names:
        raise BadInput("a job needs at least one dataset")
    if len(set(names)) != len(names):
        raise BadInput(f"datasets repeat a name: {list(names)}")
    for name in names:
        check_dataset_segment(name)
        if not _DATASET_RE.fullmatch(name):
            raise BadInput(f"dataset {name!r} does not match {DEFAULT_DATASET_PATTERN}")
    return names


def reason_text(exc: BaseException) -> str:
    """Return ``"<Type>: <message>"`` for an event's ``reason``, cut to 2000 characters."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


__all__ = ["check_datasets", "new_job_id", "reason_text"]
