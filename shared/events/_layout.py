"""The storage layout, in one place: every key the fleet reads or writes.

Pure functions, no I/O. Every function checks the names it is given, so a
bad value fails here with :class:`InvalidMessage` (``unsafe_path``,
``bad_job`` or ``bad_dataset``) instead of producing a key outside its area::

    _staging/<job>/<dataset>/<task>-<attempt>/<rel>  task output (staged)
    <dataset>/<dir>/<job>~<task:05d>-<basename>     published data
    <dataset>/_commits/<job>.json                   commit manifest
    _state/<dataset>/watermarks.json                source watermarks
    _wal/<dataset>/<job>.json                       commit sequence (write-ahead log)
    _locks/<name>.json                              locks (see shared.locks.lock_key)
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from ._invalid import InvalidMessage, shown
from ._queue_events import JOB_PATTERN

STAGING: Final = "_staging"
WAL: Final = "_wal"
STATE: Final = "_state"
LOCKS: Final = "_locks"
COMMITS: Final = "_commits"

MAX_KEY_BYTES: Final = 1024
"""S3's key limit (bytes of UTF-8), the smallest of the supported stores."""
MAX_SEGMENT_BYTES: Final = 255
"""A file-name limit of local file systems (NAME_MAX)."""

_JOB_RE: Final = re.compile(JOB_PATTERN)
# Structural safety for dataset names, whatever pattern a fleet configures: one
# segment starting with a letter or digit, so never `_staging`, `_wal`, `.cf`...
_SAFE_DATASET_RE: Final = re.compile(r"^[A-Za-z0-9][^/\\\x00-\x1f\x7f-\x9f]*$")
_BAD_PATH_CHARS: Final = re.compile(r"[\\\x00-\x1f\x7f-\x9f]")


def check_job(job: str) -> str:
    """Return ``job`` when it matches :data:`JOB_PATTERN`.

    Raises:
        InvalidMessage: ``bad_job``.
    """
    if not _JOB_RE.fullmatch(job):
        raise InvalidMessage("bad_job", f"job id {shown(job)} does not match {JOB_PATTERN}")
    return job


def check_dataset_segment(dataset: str) -> str:
    """Return ``dataset`` when it is one safe key segment (letter or digit first, <= 128 chars).

    This is the structural floor every dataset name must meet; the fleet's
    configured ``security.dataset_pattern`` is checked on top by the validator.

    Raises:
        InvalidMessage: ``bad_dataset``.
    """
    if len(dataset) > 128 or not _SAFE_DATASET_RE.fullmatch(dataset):
        raise InvalidMessage(
            "bad_dataset", f"dataset {shown(dataset)} is not one safe segment of 1..128 characters"
        )
    return dataset


def check_rel_path(path: str) -> list[str]:
    """Return the ``/``-separated segments of a staged file's relative path.

    Raises:
        InvalidMessage: ``unsafe_path`` when the path is empty, absolute, has an
            empty, ``.`` or ``..`` segment, a backslash or control character, a
            segment over 255 bytes, or a first folder starting with ``_``
            (reserved for the dataset's own areas, such as ``_commits``).
    """
    if not path:
        raise InvalidMessage("unsafe_path", "file path is empty")
    if path.startswith("/"):
        raise InvalidMessage("unsafe_path", f"file path {shown(path)} is absolute")
    bad = _BAD_PATH_CHARS.search(path)
    if bad:
        raise InvalidMessage(
            "unsafe_path", f"file path {shown(path)} has a backslash or control character {bad.group()!r}"
        )
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise InvalidMessage("unsafe_path", f"file path {shown(path)} has an empty, '.' or '..' segment")
        if len(part.encode()) > MAX_SEGMENT_BYTES:
            raise InvalidMessage("unsafe_path", f"file path {shown(path)} has a segment over 255 bytes")
    if len(parts) > 1 and parts[0].startswith("_"):
        raise InvalidMessage(
            "unsafe_path", f"file path {shown(path)} starts with a folder beginning with '_' (reserved)"
        )
    return parts


def _check_index(name: str, value: int) -> int:
    if value < 0:
        raise InvalidMessage("schema", f"{name} must be >= 0, got {value}")
    return value


def _fits(key: str) -> str:
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidMessage("unsafe_path", f"derived key is over {MAX_KEY_BYTES} bytes: {shown(key, 80)}")
    return key


def staging_prefix(job: str, dataset: str, task: int | None = None, attempt: int | None = None) -> str:
    """Return ``_staging/<job>/<dataset>/``, or ``.../<task>-<attempt>/`` with both given.

    Raises:
        InvalidMessage: bad job or dataset name, negative task or attempt.
        TypeError: only one of ``task`` and ``attempt`` given.
    """
    base = f"{STAGING}/{check_job(job)}/{check_dataset_segment(dataset)}/"
    if task is None and attempt is None:
        return base
    if task is None or attempt is None:
        raise TypeError("staging_prefix takes both task and attempt, or neither")
    return f"{base}{_check_index('task', task)}-{_check_index('attempt', attempt)}/"


def staged_key(job: str, dataset: str, task: int, attempt: int, rel_path: str) -> str:
    """Return the key of a staged file: ``_staging/<job>/<dataset>/<task>-<attempt>/<rel_path>``.

    Raises:
        InvalidMessage: unsafe ``rel_path`` (see :func:`check_rel_path`), bad
            names, or a key over 1024 bytes.
    """
    check_rel_path(rel_path)
    return _fits(staging_prefix(job, dataset, task, attempt) + rel_path)


class StagedKey(NamedTuple):
    """The parts of a staged file's key."""

    job: str
    dataset: str
    task: int
    attempt: int
    rel_path: str


_ATTEMPT_RE: Final = re.compile(r"^(0|[1-9][0-9]*)-(0|[1-9][0-9]*)$")


def parse_staged_key(key: str) -> StagedKey:
    """Split a key under ``_staging/`` into its parts (inverse of :func:`staged_key`).

    Raises:
        InvalidMessage: ``unsafe_path`` (or ``bad_job`` / ``bad_dataset``) when
            the key is not a well-formed staged file key.
    """
    parts = key.split("/", 4)
    if len(parts) != 5 or parts[0] != STAGING:
        raise InvalidMessage("unsafe_path", f"{shown(key)} is not a staged file key")
    _, job, dataset, attempt_dir, rel = parts
    m = _ATTEMPT_RE.fullmatch(attempt_dir)
    if not m:
        raise InvalidMessage("unsafe_path", f"{shown(key)} has no '<task>-<attempt>' folder")
    check_job(job)
    check_dataset_segment(dataset)
    check_rel_path(rel)
    return StagedKey(job, dataset, int(m.group(1)), int(m.group(2)), rel)


def published_key(dataset: str, job: str, task: int, rel_path: str) -> str:
    """Return where a staged file is published: ``<dataset>/<dir>/<job>~<task:05d>-<basename>``.

    The relative folder is kept (Hive partition folders such as
    ``date=2024-01-01/`` stay); the file name gets the job and task as a
    prefix. ``~`` cannot occur in a job id and the task is digits up to the
    first ``-``, so the name parses back to one (job, task, basename): no two
    tasks or jobs ever publish to the same key, whatever a producer names its
    jobs and files. The result is always inside ``<dataset>/`` and never
    inside ``<dataset>/_commits/``.

    Raises:
        InvalidMessage: unsafe ``rel_path``, bad names, a negative task, a
            published file name over 255 bytes or a key over 1024 bytes.
    """
    parts = check_rel_path(rel_path)
    name = f"{check_job(job)}~{_check_index('task', task):05d}-{parts[-1]}"
    if len(name.encode()) > MAX_SEGMENT_BYTES:
        raise InvalidMessage("unsafe_path", f"published file name {shown(name, 80)} is over 255 bytes")
    return _fits("/".join([check_dataset_segment(dataset), *parts[:-1], name]))


def commits_prefix(dataset: str) -> str:
    """Return ``<dataset>/_commits/``, the folder of the dataset's commit manifests."""
    return f"{check_dataset_segment(dataset)}/{COMMITS}/"


def manifest_key(dataset: str, job: str) -> str:
    """Return ``<dataset>/_commits/<job>.json``, the proof that the job's commit of the dataset is done."""
    return f"{commits_prefix(dataset)}{check_job(job)}.json"


def wal_prefix(dataset: str | None = None) -> str:
    """Return ``_wal/``, or ``_wal/<dataset>/`` for one dataset's unfinished sequences."""
    return f"{WAL}/" if dataset is None else f"{WAL}/{check_dataset_segment(dataset)}/"


def wal_key(dataset: str, job: str) -> str:
    """Return ``_wal/<dataset>/<job>.json``, the commit sequence while a commit is under way."""
    return f"{wal_prefix(dataset)}{check_job(job)}.json"


def staging_jobs_prefix(job_prefix: str) -> str:
    """Return ``_staging/<job_prefix>``: the staging folders of every job whose id starts so.

    Raises:
        InvalidMessage: ``job_prefix`` holds a ``/`` or is not the start of a valid job id.
    """
    if "/" in job_prefix or not job_prefix:
        raise InvalidMessage("bad_job", f"bad job id prefix {shown(job_prefix)}")
    check_job(job_prefix)
    return f"{STAGING}/{job_prefix}"


def state_prefix() -> str:
    """Return ``_state/``: every dataset's watermarks document is under it."""
    return f"{STATE}/"


def watermarks_key(dataset: str) -> str:
    """Return ``_state/<dataset>/watermarks.json``."""
    return f"{STATE}/{check_dataset_segment(dataset)}/watermarks.json"


def lock_name(dataset: str) -> str:
    """Return the lock name of a dataset: the dataset itself.

    Fleet-wide locks (such as the coordinator's election) use names starting
    with ``_``, which no dataset can have.
    """
    return check_dataset_segment(dataset)
