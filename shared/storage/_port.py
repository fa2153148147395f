"""The object-store port: one small async interface every backend implements.

Keys are relative to the store's root (``a/b/c.parquet``), ``/``-separated,
never absolute, never with ``.``/``..`` segments. A *version* is an opaque
string that changes on every write of a key (ETag, generation, or the local
adapter's stamp); conditional writes compare it.

Every method raises only :mod:`shared._errors` exceptions:
``NotFound``, ``PreconditionFailed``, ``TransientError`` (incl. ``Throttled``),
``OutcomeUnknown``, ``BadInput`` (unsafe key; ``LinkRefused``: a symbolic link
met by the local store, which never follows one) and ``ConfigError``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from .._errors import BadInput
from ..settings import StoreSettings

# Keys never start with this segment: the local adapter keeps its own
# bookkeeping (temp files, lock stripes) there.
RESERVED_TOP = ".cf"
_BAD_CHARS = re.compile(r"[\x00-\x1f\\]")


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a store knows about one object without reading its bytes.

    ``checksum`` is the hex MD5 of the content where the store gives one
    cheaply (S3 single-part ETag, GCS md5Hash, Azure Content-MD5), else None.
    """

    key: str
    size: int
    version: str
    checksum: str | None = None


@dataclass(frozen=True, slots=True)
class ObjectData:
    """An object's bytes together with the version they were read at."""

    info: ObjectInfo
    data: bytes


def check_key(key: str) -> str:
    """Return ``key`` when it is a safe relative object key.

    Raises:
        BadInput: empty, absolute, with empty/``.``/``..`` segments, control
            characters, backslashes or lone surrogates, or inside the reserved
            ``.cf/`` area.
    """
    if not key or len(key) > 1024:
        raise BadInput(f"object key must be 1..1024 characters: {key!r}")
    if key.startswith("/"):
        raise BadInput(f"object key must be relative: {key!r}")
    if _BAD_CHARS.search(key):
        raise BadInput(f"object key has control characters or backslashes: {key!r}")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates: no store can name them
            raise BadInput(f"object key is not valid Unicode: {key!r}") from exc
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise BadInput(f"object key has an empty, '.' or '..' segment: {key!r}")
    if parts[0] == RESERVED_TOP:
        raise BadInput(f"object key is in the reserved area {RESERVED_TOP!r}: {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` when it is a safe listing prefix ('' lists everything).

    Raises:
        BadInput: same rules as :func:`check_key`, but a trailing ``/`` is allowed.
    """
    if prefix == "":
        return prefix
    check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


@runtime_checkable
class ObjectStore(Protocol):
    """An async object store rooted at :attr:`url`.

    Use it as an async context manager (or call :meth:`close`) so the
    adapter's HTTP sessions are released.
    """

    @property
    def url(self) -> str:
        """The root URL this store was opened with (``s3://bucket/prefix``...)."""
        ...

    async def read(self, key: str) -> ObjectData:
        """Return the object's bytes and version. Raises NotFound."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Return size, version and checksum without the bytes. Raises NotFound."""
        ...

    async def head_md5(self, key: str) -> ObjectInfo:
        """Return the object's info with ``checksum`` filled wherever this store can.

        The stored MD5 (S3 single-part ETag, GCS ``md5Hash``, Azure
        Content-MD5: the same answer as :meth:`head`), or on local files the
        MD5 computed by reading the file. ``checksum`` is None only where the
        store keeps no MD5 of this object (S3 multipart or SSE-KMS uploads,
        GCS composite objects, Azure blobs committed from blocks without
        Content-MD5): then no checksum can be compared. Raises NotFound.
        """
        ...

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        """Write unconditionally (create or replace) and return the new info."""
        ...

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        """Create the object only if no object has the key.

        Raises:
            PreconditionFailed: the key exists (whatever the store answers:
                412, 409 BlobAlreadyExists...).
        """
        ...

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace the object only if its current version is ``version``.

        Raises:
            PreconditionFailed: the version moved, or the object is gone.
        """
        ...

    async def delete(self, key: str) -> None:
        """Delete the object; deleting a missing object is not an error."""
        ...

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        """Server-side copy ``src`` to ``dst`` (replacing it); returns dst's info.

        ``source``: ``src``'s info as read just before (``head``/``head_md5``).
        The copy is then pinned: made only while ``src`` is still at
        ``source.version`` (S3 ``CopySourceIfMatch``, GCS
        ``ifSourceGenerationMatch``, Azure source ETag, local files: the
        opened file's version), so dst holds exactly the bytes ``source``
        describes. Without it, each adapter copies whatever ``src`` holds.

        Raises:
            NotFound: ``src`` does not exist.
            PreconditionFailed: ``source`` was given and ``src`` has moved
                since (nothing was copied).
        """
        ...

    def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        """Yield every object whose key starts with ``prefix``, in key order.

        Pages of ``page_size`` are fetched lazily; the iteration is flat
        (recursive), not delimited.
        """
        ...

    async def close(self) -> None:
        """Release connections. Safe to call twice."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class StoreLifecycle:
    """The async-context-manager behaviour every adapter shares.

    ``async with store:`` calls :meth:`open` (adapters override it to create
    their SDK client eagerly; the default does nothing) and :meth:`close` on
    the way out, whatever happened.
    """

    async def open(self) -> None:
        """Create the adapter's clients now instead of on first use."""
        return

    async def close(self) -> None:
        """Release connections. Safe to call twice."""
        return

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class PrefixedStore(StoreLifecycle):
    """What the bucket adapters share: a root prefix inside the bucket, and the root URL.

    Raises (at construction):
        BadInput: ``prefix`` is not a safe key prefix.
    """

    def __init__(self, prefix: str, settings: StoreSettings, url: str) -> None:
        if prefix:
            check_key(prefix)
        self._root = f"{prefix}/" if prefix else ""
        self._settings = settings
        self._url = url

    @property
    def url(self) -> str:
        """The root URL this store was opened with."""
        return self._url

    def _full(self, key: str) -> str:
        """Return the bucket key of the root-relative ``key`` (checked)."""
        return self._root + check_key(key)
