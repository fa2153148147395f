"""Google Cloud Storage adapter (``gs://bucket/prefix``) over gcloud-aio-storage.

- Every upload is a single multipart request (JSON metadata + bytes), never a resumable one: it is
  atomic, and it is the upload path on which ``ifGenerationMatch`` is enforced by GCS and by
  fake-gcs-server alike. ``ifGenerationMatch=0`` creates only if absent; ``ifGenerationMatch=<g>``
  replaces only at generation ``g``.
- ``version`` is the object's generation: it changes on every write, even of identical bytes.
  ``checksum`` is ``md5Hash`` as hex (absent for composite objects).
- ``copy`` is server side (``rewriteTo``, repeated until done).
- Endpoint: ``gcs_endpoint`` or ``STORAGE_EMULATOR_HOST`` (emulator, no credentials); otherwise
  https://storage.googleapis.com with Application Default Credentials
  (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's default file, or the metadata server).
- gcloud-aio-storage does not retry; a timeout or a dropped connection after a conditional upload
  was sent raises :class:`~shared._errors.OutcomeUnknown`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp

from .._errors import (
    BadInput,
    CommitfleetError,
    ConfigError,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Throttled,
    TransientError,
)
from ..settings import StoreSettings
from ._port import ObjectData, ObjectInfo, PrefixedStore, check_key, check_prefix

# What a request was doing when it failed; "cond" is a conditional write.
Op = Literal["read", "write", "cond", "delete", "copy", "list"]

_CONTENT_TYPE = "application/octet-stream"
_MAX_PAGE = 1000


def md5_hex(md5_b64: str | None) -> str | None:
    """Return GCS's base64 ``md5Hash`` as hex, or None when absent or malformed."""
    if not md5_b64:
        return None
    try:
        return base64.b64decode(md5_b64, validate=True).hex()
    except (binascii.Error, ValueError):
        return None


def translate_error(exc: aiohttp.ClientError | TimeoutError, op: Op, what: str) -> CommitfleetError:
    """Return the :mod:`shared._errors` exception that ``exc`` (from ``op`` on ``what``) means.

    Pure: looks only at the exception. 412 -> PreconditionFailed; 404 -> NotFound on reads,
    ConfigError (no such bucket) on writes and listings; 429 -> Throttled; 5xx and 408 ->
    TransientError; 401/403 -> ConfigError; other 4xx -> BadInput. A connection that could not be
    opened -> TransientError; a timeout or a connection lost after sending -> OutcomeUnknown on a
    conditional write, else TransientError.
    """
    if isinstance(exc, aiohttp.ClientResponseError):
        status = exc.status
        msg = f"GCS {op} {what}: {status} {exc.message}".strip()
        if status == 412:
            return PreconditionFailed(msg)
        if status == 429:
            return Throttled(msg)
        if status >= 500 or status == 408:
            return TransientError(msg)
        if status in (401, 403):
            return ConfigError(msg)
        if status == 404:
            # Objects are never missing for a write: a 404 there is the bucket.
            return ConfigError(msg) if op in ("write", "cond", "list") else NotFound(msg)
        return BadInput(msg)
    msg = f"GCS {op} {what}: {type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransientError(msg)
    return OutcomeUnknown(msg) if op == "cond" else TransientError(msg)


def _info(key: str, meta: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        key=key,
        size=int(meta.get("size", 0)),
        version=str(meta["generation"]),
        checksum=md5_hex(meta.get("md5Hash")),
    )


class GcsStore(PrefixedStore):
    """An :class:`~shared.storage.ObjectStore` on a GCS bucket (or fake-gcs-server)."""

    def __init__(self, bucket: str, prefix: str, settings: StoreSettings, *, url: str) -> None:
        """Prepare a store rooted at ``bucket``/``prefix``; no connection is made yet.

        Raises:
            BadInput: ``prefix`` is not a safe key prefix.
        """
        super().__init__(prefix, settings, url)
        self._bucket = bucket
        self._timeout = settings.request_timeout
        self._session: aiohttp.ClientSession | None = None
        self._storage: Any = None

    def _client(self) -> Any:
        if self._storage is None:
            from gcloud.aio.storage import Storage

            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
            try:
                session: Any = self._session  # gcloud's annotation names its own wrapper type
                self._storage = Storage(session=session, api_root=self._settings.gcs_endpoint or None)
            except (ValueError, OSError) as exc:  # unreadable or malformed credentials file
                raise ConfigError(f"GCS credentials for {self._url}: {exc}") from exc
        return self._storage

    async def read(self, key: str) -> ObjectData:
        full = self._full(key)
        gcs = self._client()
        try:
            meta = await gcs.download_metadata(self._bucket, full, timeout=self._timeout)
            # Pin the bytes to the generation just read, so data and version agree. GCS enforces the
            # pin; fake-gcs-server does not, and there the bytes may be newer than the version, which
            # can only make a later compare-and-swap fail, never let a stale one win.
            data = await gcs._download(
                self._bucket,
                full,
                params={"alt": "media", "ifGenerationMatch": str(meta["generation"])},
                timeout=self._timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            err = translate_error(exc, "read", full)
            if isinstance(err, PreconditionFailed):  # replaced between the two requests
                raise TransientError(str(err)) from exc
            raise err from exc
        return ObjectData(info=_info(key, meta), data=bytes(data))

    async def head(self, key: str) -> ObjectInfo:
        full = self._full(key)
        try:
            meta = await self._client().download_metadata(self._bucket, full, timeout=self._timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate_error(exc, "read", full) from exc
        return _info(key, meta)

    async def head_md5(self, key: str) -> ObjectInfo:
        """Return :meth:`head`'s answer: its checksum is the stored MD5 where this store keeps one."""
        return await self.head(key)

    async def _upload(self, key: str, data: bytes, op: Op, generation: str | None) -> ObjectInfo:
        full = self._full(key)
        params = {} if generation is None else {"ifGenerationMatch": generation}
        try:
            meta = await self._client().upload(
                self._bucket,
                full,
                data,
                content_type=_CONTENT_TYPE,
                parameters=params,
                # A non-empty metadata part selects the multipart upload (see module docstring).
                metadata={"contentType": _CONTENT_TYPE},
                force_resumable_upload=False,
                timeout=self._timeout,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate_error(exc, op, full) from exc
        return _info(key, meta)

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._upload(key, data, "write", None)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._upload(key, data, "cond", "0")

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        check_key(key)
        if not version.isdigit() or version == "0":
            # Not a generation this store handed out: it can never match (and "0" would mean absent).
            raise PreconditionFailed(f"{key} is not at version {version!r}")
        return await self._upload(key, data, "cond", version)

    async def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            await self._client().delete(self._bucket, full, timeout=self._timeout)
        except aiohttp.ClientResponseError as exc:
            if exc.status == 404:
                return  # already gone (a missing bucket shows up on the next write)
            raise translate_error(exc, "delete", full) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate_error(exc, "delete", full) from exc

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        """Server-side copy (``rewriteTo``); returns dst's info. Raises NotFound when ``src`` is missing.

        With ``source``, pinned by ``ifSourceGenerationMatch`` (412: PreconditionFailed). GCS
        enforces it; fake-gcs-server ignores it (the answer's md5Hash still tells what was copied).
        """
        full_src, full_dst = self._full(src), self._full(dst)
        params = {} if source is None else {"ifSourceGenerationMatch": source.version}
        try:
            resp = await self._client().copy(
                self._bucket, full_src, self._bucket, new_name=full_dst, params=params, timeout=self._timeout
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate_error(exc, "copy", f"{full_src} -> {full_dst}") from exc
        return _info(dst, resp["resource"])

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        check_prefix(prefix)
        params = {"prefix": self._root + prefix, "maxResults": str(max(1, min(page_size, _MAX_PAGE)))}
        cut = len(self._root)
        gcs = self._client()
        while True:
            try:
                page = await gcs.list_objects(self._bucket, params=dict(params), timeout=self._timeout)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise translate_error(exc, "list", self._root + prefix) from exc
            for item in page.get("items", []):
                yield _info(item["name"][cut:], item)
            token = page.get("nextPageToken")
            if not token:
                return
            params["pageToken"] = token

    async def close(self) -> None:
        """Close the HTTP session. Safe to call twice; shielded so a cancelled caller still closes."""
        session, self._session, self._storage = self._session, None, None
        if session is not None:
            await asyncio.shield(session.close())

    async def open(self) -> None:
        self._client()
