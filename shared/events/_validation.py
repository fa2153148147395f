"""Checks a decoded queue event must pass before a worker acts on it.

Pure functions over typed events; the codec runs them after decoding. Each
failure raises :class:`InvalidMessage` with one reason code and a detail that
names the offending field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Self

from .._errors import ConfigError
from .._recent import GUESS_LIMIT
from ..settings import SecuritySettings
from ._file_stats import check_file_stats
from ._invalid import InvalidMessage, shown
from ._layout import (
    MAX_KEY_BYTES,
    MAX_SEGMENT_BYTES,
    STAGING,
    check_dataset_segment,
    check_job,
    check_rel_path,
)
from ._queue_events import (
    DEFAULT_DATASET_PATTERN,
    INT32_MAX,
    REL_PATH_PATTERN,
    SCHEMA_VERSION,
    DatasetExpectation,
    JobFinished,
    QueueEvent,
    TaskFinished,
)
from ._signing import SignatureCheck

# Names already validated (skips the regex for the next message of the same
# dataset). Sized for the open work, not the history: a tracemalloc diff across
# a soak run showed this memo as the one structure that grew with every dataset
# a worker ever handled (about 100 B each, up to the cap).
_MEMO_SIZE: Final = GUESS_LIMIT


@dataclass(frozen=True, slots=True)
class ValidationLimits:
    """What a consumer accepts: message size, dataset names, and the signing secret.

    ``secret`` None means signing is off (a ``sig`` field, if present, is
    ignored); otherwise every message must carry a valid signature: v2 for
    ``fleet`` (``signature_max_age`` seconds of window), or v1 while
    ``accept_v1`` (see :mod:`._signing`).
    """

    max_message_bytes: int = 1_048_576
    dataset_pattern: str = DEFAULT_DATASET_PATTERN
    secret: bytes | None = field(default=None, repr=False)
    fleet: str = ""
    signature_max_age: float = 300.0
    accept_v1: bool = True
    signing: SignatureCheck | None = field(init=False, repr=False, compare=False, default=None)
    _dataset_re: re.Pattern[str] = field(init=False, repr=False, compare=False)
    # Names already accepted: a fleet sees few datasets and jobs, and two
    # regexes per message are a good part of the validation cost. Bounded.
    _accepted: dict[str, None] = field(init=False, repr=False, compare=False, default_factory=dict)
    # Job ids accepted, apart from the dataset names: a job id is looked up as it
    # came (its hash, computed here, is then reused by every later lookup of the
    # same string), where a prefixed key was a new string, copied and hashed per event.
    _accepted_jobs: dict[str, None] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ConfigError("security.max_message_bytes must be >= 1")
        if self.secret is not None and not self.secret:
            raise ConfigError("the signing secret must not be empty (use None to turn signing off)")
        try:
            compiled = re.compile(self.dataset_pattern)
        except re.error as exc:
            raise ConfigError(f"security.dataset_pattern is not a valid regex: {exc}") from None
        object.__setattr__(self, "_dataset_re", compiled)
        if self.secret is not None:
            check = SignatureCheck(self.secret, self.fleet, self.signature_max_age, self.accept_v1)
            object.__setattr__(self, "signing", check)

    @classmethod
    def from_settings(cls, security: SecuritySettings, *, fleet: str = "") -> Self:
        """Return the limits configured in ``security`` for ``fleet`` (an empty secret turns signing off).

        Raises:
            ConfigError: invalid pattern or size.
        """
        return cls(
            max_message_bytes=security.max_message_bytes,
            dataset_pattern=security.dataset_pattern,
            secret=security.hmac_secret.reveal_bytes(),
            fleet=fleet,
            signature_max_age=security.signature_max_age,
            accept_v1=security.accept_v1,
        )

    def check_dataset(self, name: str, where: str = "$.dataset") -> str:
        """Return ``name`` when it matches the configured pattern and is one safe segment.

        Raises:
            InvalidMessage: ``bad_dataset``.
        """
        if name in self._accepted:
            return name
        if not self._dataset_re.fullmatch(name):
            raise InvalidMessage(
                "bad_dataset", f"dataset {shown(name)} does not match {self.dataset_pattern} - at `{where}`"
            )
        try:
            check_dataset_segment(name)
        except InvalidMessage as exc:
            raise InvalidMessage("bad_dataset", f"{exc.detail} - at `{where}`") from None
        self._remember(name)
        return name

    def check_job(self, job: str) -> str:
        """Return ``job`` when it matches the job id pattern.

        Raises:
            InvalidMessage: ``bad_job``.
        """
        if job in self._accepted_jobs:
            return job
        try:
            check_job(job)
        except InvalidMessage as exc:
            raise InvalidMessage("bad_job", f"{exc.detail} - at `$.job`") from None
        _remember(self._accepted_jobs, job)
        return job

    def _remember(self, key: str) -> None:
        _remember(self._accepted, key)


def _remember(memo: dict[str, None], key: str) -> None:
    if len(memo) >= _MEMO_SIZE:
        memo.clear()
    memo[key] = None


def _check_dataset_list(names: Iterable[str], limits: ValidationLimits) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        limits.check_dataset(name, f"$.datasets[{i}]")
        if name in seen:
            raise InvalidMessage(
                "inconsistent", f"dataset {shown(name)} is listed twice - at `$.datasets[{i}]`"
            )
        seen.add(name)
    if not seen:
        raise InvalidMessage("inconsistent", "the event names no dataset - at `$.datasets`")


def _check_expectation(name: str, exp: DatasetExpectation) -> None:
    if exp.winners is not None and len(exp.winners) != exp.tasks:
        raise InvalidMessage(
            "inconsistent",
            f"dataset {shown(name)} expects {exp.tasks} tasks but names {len(exp.winners)} winners"
            f" - at `$.datasets.{name}.winners`",
        )


# One regex for the common case (an ASCII path) covering every rule of
# check_rel_path except segment length; anything it refuses goes through
# check_rel_path, which says precisely what is wrong.
_PLAIN_PATH: Final = re.compile(REL_PATH_PATTERN)


def _basename_and_size(path: str) -> tuple[int, int]:
    """Return the byte sizes of the path's basename and of the path, or raise ``unsafe_path``."""
    if path.isascii() and len(path) <= MAX_SEGMENT_BYTES and _PLAIN_PATH.match(path):
        return len(path) - path.rfind("/") - 1, len(path)
    return len(check_rel_path(path)[-1].encode()), len(path.encode())


# Every path of a message at once, joined by "\n": one C-level match instead of
# a Python loop of matches. It accepts only the plain paths Spark writes (ASCII
# letters, digits and "_.=-", no segment starting with "." and no first segment
# starting with "_"), a strict subset of REL_PATH_PATTERN, and needs no
# lookahead. Anything else is checked path by path (which names what is wrong);
# tests/unit/test_validation_fast_path.py checks the subset.
_PLAIN_ONE: Final = r"[A-Za-z0-9=-][A-Za-z0-9_.=-]*(?:/[A-Za-z0-9_=-][A-Za-z0-9_.=-]*)*"
_PLAIN_PATHS: Final = re.compile(rf"{_PLAIN_ONE}(?:\n{_PLAIN_ONE})*\Z")


_PLAIN_ONE_RE: Final = re.compile(_PLAIN_ONE)
_INDEX_DIGITS: Final = len(str(INT32_MAX))  # the widest task or attempt number
# The fixed part of a staged key: "/" x4 and "-" around job, dataset, task and attempt.
_STAGED_FIXED: Final = len(STAGING) + 5


def _all_plain(paths: list[str], name_prefix: int, room: int) -> bool:
    """Return True when every path is safe, unique, ASCII and short enough (one pass in C)."""
    # ASCII only (the patterns admit nothing else): characters are bytes, and a
    # basename is never longer than its path, so one bound covers the key
    # (``room``) and the published file name (``name_prefix`` + basename).
    # (Conditional expressions, not min()/max(): a builtin call costs more than the test here.)
    limit = MAX_SEGMENT_BYTES - name_prefix
    if room < limit:
        limit = room
    n = len(paths)
    if n == 1:
        path = paths[0]
        return len(path) <= limit and _PLAIN_ONE_RE.fullmatch(path) is not None
    if n == 0:
        return True
    joined = "\n".join(paths)
    # A "\n" inside a path would pass for a separator: count them.
    if joined.count("\n") != n - 1 or _PLAIN_PATHS.match(joined) is None:
        return False
    if len(joined) > limit:  # else every path is within the bound
        for path in paths:
            if len(path) > limit:
                return False
    return paths[0] != paths[1] if n == 2 else len(set(paths)) == n


def _check_task_finished(ev: TaskFinished, limits: ValidationLimits) -> None:
    for i, f in enumerate(ev.files):
        if f.stats is not None:
            check_file_stats(f.stats, f.size, f"$.files[{i}].stats")
    dataset = ev.dataset
    if dataset not in limits._accepted:  # check_dataset's memo, tested here: this runs per event
        limits.check_dataset(dataset)
    # Longest keys this message leads to: the staged key and the published key.
    # Job ids are ASCII (checked before); a dataset name may not be.
    job_len = len(ev.job)
    dataset_bytes = len(dataset) if dataset.isascii() else len(dataset.encode())
    paths = [f.path for f in ev.files]
    # First with the widest task and attempt numbers, which spares formatting
    # them: what passes with those bounds passes with the exact ones.
    widest = _STAGED_FIXED + job_len + dataset_bytes + 2 * _INDEX_DIGITS
    if _all_plain(paths, job_len + _INDEX_DIGITS + 2, MAX_KEY_BYTES - widest):
        return
    task_digits = len(str(ev.task))
    staged_base = _STAGED_FIXED + job_len + dataset_bytes + task_digits + len(str(ev.attempt))
    name_prefix = job_len + max(task_digits, 5) + 2  # "<job>~<task:05d>-"
    published_base = dataset_bytes + 1 + name_prefix
    room = MAX_KEY_BYTES - max(staged_base, published_base)
    if not _all_plain(paths, name_prefix, room):
        _check_paths(ev, name_prefix, room)


def _check_paths(ev: TaskFinished, name_prefix: int, room: int) -> None:
    """Check each path of ``ev``; raise ``unsafe_path`` or ``inconsistent`` naming the first bad one."""
    seen: set[str] = set()
    for f in ev.files:
        path = f.path
        try:
            basename_size, size = _basename_and_size(path)
        except InvalidMessage as exc:
            raise InvalidMessage("unsafe_path", f"{exc.detail} - at `{_where(ev, path)}`") from None
        if size > room:
            raise InvalidMessage(
                "unsafe_path",
                f"file path {shown(path, 60)} leads to a key over {MAX_KEY_BYTES} bytes"
                f" - at `{_where(ev, path)}`",
            )
        if name_prefix + basename_size > MAX_SEGMENT_BYTES:
            raise InvalidMessage(
                "unsafe_path",
                f"published file name <job>~<task>-{shown(path.rpartition('/')[2], 40)} is over"
                f" {MAX_SEGMENT_BYTES} bytes - at `{_where(ev, path)}`",
            )
        if path in seen:
            raise InvalidMessage(
                "inconsistent", f"file {shown(path)} is listed twice - at `{_where(ev, path, last=True)}`"
            )
        seen.add(path)


def _where(ev: TaskFinished, path: str, *, last: bool = False) -> str:
    # Error path only: find the index of the offending file for the message.
    indexes = [i for i, f in enumerate(ev.files) if f.path == path]
    return f"$.files[{indexes[-1] if last else indexes[0]}].path"


def validate_event(ev: QueueEvent, limits: ValidationLimits) -> QueueEvent:
    """Return ``ev`` when it passes every contextual check of the contract.

    Checks: version, job id, dataset names (configured pattern, no
    duplicates, at least one), file paths (safe, unique, short enough for every
    store), file statistics (types, bounds, counts: :func:`check_file_stats`),
    and ``winners`` consistency. Shape checks (types, non-negative
    numbers) were done by decoding.

    Raises:
        InvalidMessage: ``unsupported_version`` (of the event or of a file's
            statistics), ``schema`` (malformed statistics), ``bad_job``,
            ``bad_dataset``, ``unsafe_path`` or ``inconsistent``.
    """
    if ev.v != SCHEMA_VERSION:
        raise InvalidMessage(
            "unsupported_version", f"version {ev.v} is not supported (this consumer reads v{SCHEMA_VERSION})"
        )
    if ev.job not in limits._accepted_jobs:  # check_job's memo, tested here: this runs per event
        limits.check_job(ev.job)
    if isinstance(ev, TaskFinished):
        _check_task_finished(ev, limits)
    elif isinstance(ev, JobFinished):
        _check_dataset_list(ev.datasets, limits)
        for name, exp in ev.datasets.items():
            _check_expectation(name, exp)
    else:
        _check_dataset_list(ev.datasets, limits)
    return ev


def check_task_index(ev: TaskFinished, expectation: DatasetExpectation) -> None:
    """Return when ``ev.task`` is one of the task indexes ``expectation`` covers.

    A worker calls this once it holds both the job's ``JobFinished`` and a
    task's ``TaskFinished`` (in either order); a single message cannot tell.

    Raises:
        InvalidMessage: ``inconsistent`` when ``ev.task >= expectation.tasks``.
    """
    if ev.task >= expectation.tasks:
        raise InvalidMessage(
            "inconsistent",
            f"task {ev.task} of dataset {ev.dataset!r} is outside the job's {expectation.tasks} tasks",
        )
