"""Azure Blob Storage adapter (``az://container/prefix``) over azure-storage-blob (aio).

- Create-if-absent is ``upload_blob(overwrite=False)`` (the service answers 409 BlobAlreadyExists);
  replace-if-match is ``upload_blob(etag=..., match_condition=IfNotModified)`` (412 on a stale etag,
  and on a missing blob). Both become :class:`~shared._errors.PreconditionFailed`.
- ``version`` is the blob's ETag: it changes on every write, even of identical bytes.
  ``checksum`` is the blob's Content-MD5 as hex when the service has one (single-shot uploads).
- ``copy`` is server side (``start_copy_from_url``); a copy the service reports as pending is
  polled until it ends.
- Credentials: ``azure_connection_string``, else the ``AZURE_STORAGE_CONNECTION_STRING`` environment
  variable, else ``azure_account_url`` with the account key in ``AZURE_STORAGE_KEY`` (account name from
  ``AZURE_STORAGE_ACCOUNT`` or the URL's first host label), or with a SAS token in the URL itself.
- The SDK retries connection errors, timeouts and 5xx (``store.sdk_attempts`` attempts in all, default 3,
  about a second apart); a retried conditional
  upload whose first attempt took effect answers 409/412, so a PreconditionFailed is not proof that
  someone else won: callers that must know re-read.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ServiceRequestError,
)

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

_MAX_PAGE = 5000
_COPY_POLL = 0.05


def translate_error(exc: AzureError, op: Op, what: str) -> CommitfleetError:
    """Return the :mod:`shared._errors` exception that ``exc`` (from ``op`` on ``what``) means.

    Pure: looks only at the exception. 412, and 409 BlobAlreadyExists -> PreconditionFailed on a
    conditional write (TransientError elsewhere: the blob changed during a ranged read); 404 ->
    PreconditionFailed on a conditional write, ConfigError when the container is missing, else
    NotFound; 429 / 503 -> Throttled; other 5xx, 408 and other 409 -> TransientError; 401/403 ->
    ConfigError; other 4xx -> BadInput. A request that could not be sent -> TransientError; a
    response that was lost -> OutcomeUnknown on a conditional write, else TransientError.
    """
    if isinstance(exc, HttpResponseError) and exc.status_code is not None:
        status = exc.status_code
        code = str(getattr(exc, "error_code", None) or "")
        msg = f"Azure {op} {what}: {status} {code}".rstrip()
        if status == 412 or (isinstance(exc, ResourceExistsError) and code == "BlobAlreadyExists"):
            # Outside a conditional write, a 412 means the blob changed under a multi-range download.
            return PreconditionFailed(msg) if op == "cond" else TransientError(msg)
        if status in (429, 503):
            return Throttled(msg)
        if status >= 500 or status in (408, 409):
            return TransientError(msg)
        if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            return ConfigError(msg)
        if status == 404:
            if code == "ContainerNotFound":
                return ConfigError(msg)
            return PreconditionFailed(msg) if op == "cond" else NotFound(msg)
        return BadInput(msg)
    msg = f"Azure {op} {what}: {type(exc).__name__}: {exc.message}"
    if isinstance(exc, ServiceRequestError):
        return TransientError(msg)
    # ServiceResponseError and the like: the request went out, its answer was lost.
    return OutcomeUnknown(msg) if op == "cond" else TransientError(msg)


def _md5_hex(md5: bytes | bytearray | None) -> str | None:
    return bytes(md5).hex() if md5 else None


def _etag(etag: str) -> str:
    # Listings give the ETag bare, everything else quoted: one spelling, so versions compare equal.
    return etag if etag.startswith('"') else f'"{etag}"'


def connection_kwargs(settings: StoreSettings, env: dict[str, str] | os._Environ[str]) -> dict[str, Any]:
    """Return how to reach the account: ``{"conn_str": ...}`` or ``{"account_url", "credential"}``.

    Raises:
        ConfigError: no connection string and no account URL.
    """
    conn = settings.azure_connection_string.reveal() or env.get("AZURE_STORAGE_CONNECTION_STRING", "")
    if conn:
        return {"conn_str": conn}
    url = settings.azure_account_url.reveal()
    if not url:
        raise ConfigError(
            "Azure store needs store.azure_connection_string, AZURE_STORAGE_CONNECTION_STRING, "
            "or store.azure_account_url"
        )
    key = env.get("AZURE_STORAGE_KEY", "")
    if key:
        host = urlsplit(url).hostname or ""
        account = env.get("AZURE_STORAGE_ACCOUNT", "") or host.split(".")[0]
        return {"account_url": url, "credential": {"account_name": account, "account_key": key}}
    return {"account_url": url, "credential": None}  # a SAS token in the URL, or public access


class AzureStore(PrefixedStore):
    """An :class:`~shared.storage.ObjectStore` on an Azure Blob container (or Azurite)."""

    def __init__(self, container: str, prefix: str, settings: StoreSettings, *, url: str) -> None:
        """Prepare a store rooted at ``container``/``prefix``; no connection is made yet.

        Raises:
            BadInput: ``prefix`` is not a safe key prefix.
            ConfigError: no credentials configured (see module docstring).
        """
        super().__init__(prefix, settings, url)
        self._container_name = container
        self._how = connection_kwargs(settings, os.environ)
        self._service: Any = None
        self._container: Any = None

    def _cc(self) -> Any:
        if self._container is None:
            from azure.storage.blob.aio import BlobServiceClient, LinearRetry

            # Short SDK retries: the callers' RetryPolicy does the patient retrying.
            options: dict[str, Any] = {
                "retry_policy": LinearRetry(
                    backoff=1, retry_total=self._settings.sdk_attempts - 1, random_jitter_range=1
                ),
                "connection_timeout": self._settings.request_timeout,
                "read_timeout": self._settings.request_timeout,
            }
            try:
                if "conn_str" in self._how:
                    svc = BlobServiceClient.from_connection_string(self._how["conn_str"], **options)
                else:
                    svc = BlobServiceClient(
                        self._how["account_url"], credential=self._how["credential"], **options
                    )
            except ValueError as exc:
                raise ConfigError(f"Azure connection settings for {self._url}: {exc}") from exc
            self._service = svc
            self._container = svc.get_container_client(self._container_name)
        return self._container

    async def read(self, key: str) -> ObjectData:
        full = self._full(key)
        try:
            stream = await self._cc().get_blob_client(full).download_blob()
            data = await stream.readall()
        except AzureError as exc:
            raise translate_error(exc, "read", full) from exc
        props = stream.properties
        info = ObjectInfo(
            key=key,
            size=len(data),
            version=_etag(props.etag),
            checksum=_md5_hex(props.content_settings.content_md5),
        )
        return ObjectData(info=info, data=bytes(data))

    async def head(self, key: str) -> ObjectInfo:
        full = self._full(key)
        try:
            props = await self._cc().get_blob_client(full).get_blob_properties()
        except AzureError as exc:
            raise translate_error(exc, "read", full) from exc
        return ObjectInfo(
            key=key,
            size=props.size,
            version=_etag(props.etag),
            checksum=_md5_hex(props.content_settings.content_md5),
        )

    async def head_md5(self, key: str) -> ObjectInfo:
        """Return :meth:`head`'s answer: its checksum is the stored MD5 where this store keeps one."""
        return await self.head(key)

    async def _upload(self, key: str, data: bytes, op: Op, **cond: Any) -> ObjectInfo:
        full = self._full(key)
        try:
            resp = await self._cc().get_blob_client(full).upload_blob(data, **cond)
        except AzureError as exc:
            raise translate_error(exc, op, full) from exc
        return ObjectInfo(
            key=key, size=len(data), version=_etag(resp["etag"]), checksum=_md5_hex(resp.get("content_md5"))
        )

    async def write(self, key: str, data: bytes) -> ObjectInfo:
        return await self._upload(key, data, "write", overwrite=True)

    async def write_if_absent(self, key: str, data: bytes) -> ObjectInfo:
        return await self._upload(key, data, "cond", overwrite=False)

    async def write_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        check_key(key)
        if not version:
            # The SDK would drop an empty condition and write unconditionally.
            raise PreconditionFailed(f"{key} is not at version {version!r}")
        return await self._upload(
            key, data, "cond", overwrite=True, etag=version, match_condition=MatchConditions.IfNotModified
        )

    async def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            await self._cc().delete_blob(full)
        except AzureError as exc:
            err = translate_error(exc, "delete", full)
            if isinstance(err, NotFound):
                return
            raise err from exc

    async def copy(self, src: str, dst: str, *, source: ObjectInfo | None = None) -> ObjectInfo:
        """Server-side copy; returns dst's info. Raises NotFound when ``src`` is missing.

        With ``source``, pinned to its ETag (``x-ms-source-if-match``; 412: PreconditionFailed).
        A pending copy is polled (every 50 ms, for at most ``request_timeout``); one that fails or is
        aborted raises TransientError.
        """
        full_src, full_dst = self._full(src), self._full(dst)
        what = f"{full_src} -> {full_dst}"
        cc = self._cc()
        dst_client = cc.get_blob_client(full_dst)
        pin: dict[str, Any] = (
            {}
            if source is None
            else {"source_etag": source.version, "source_match_condition": MatchConditions.IfNotModified}
        )
        try:
            started = await dst_client.start_copy_from_url(cc.get_blob_client(full_src).url, **pin)
            status = started.get("copy_status")
            deadline = time.monotonic() + self._settings.request_timeout
            while True:
                props = await dst_client.get_blob_properties()
                status = props.copy.status or status
                if status != "pending":
                    break
                if time.monotonic() > deadline:
                    raise TransientError(
                        f"Azure copy {what}: still pending after {self._settings.request_timeout}s"
                    )
                await asyncio.sleep(_COPY_POLL)
        except AzureError as exc:
            if source is not None and getattr(exc, "status_code", None) == 412:
                raise PreconditionFailed(
                    f"Azure copy {what}: the source moved since {source.version}"
                ) from exc
            raise translate_error(exc, "copy", what) from exc
        if status != "success":
            raise TransientError(f"Azure copy {what}: ended {status}: {props.copy.status_description}")
        return ObjectInfo(
            key=dst,
            size=props.size,
            version=_etag(props.etag),
            checksum=_md5_hex(props.content_settings.content_md5),
        )

    async def list(self, prefix: str = "", *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        check_prefix(prefix)
        cut = len(self._root)
        pages = (
            self._cc()
            .list_blobs(
                name_starts_with=self._root + prefix, results_per_page=max(1, min(page_size, _MAX_PAGE))
            )
            .by_page()
        )
        try:
            async for page in pages:
                async for item in page:
                    yield ObjectInfo(
                        key=item.name[cut:],
                        size=item.size,
                        version=_etag(item.etag),
                        checksum=_md5_hex(item.content_settings.content_md5),
                    )
        except AzureError as exc:
            raise translate_error(exc, "list", self._root + prefix) from exc

    async def close(self) -> None:
        """Close the HTTP pipeline. Safe to call twice; shielded so a cancelled caller still closes."""
        service, self._service, self._container = self._service, None, None
        if service is not None:
            await asyncio.shield(service.close())

    async def open(self) -> None:
        self._cc()
