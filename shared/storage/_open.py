"""Open an object store from its root URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from .._errors import ConfigError
from ..settings import StoreSettings
from ._port import ObjectStore


def split_bucket_url(url: str) -> tuple[str, str]:
    """Return ``(bucket, prefix)`` for ``scheme://bucket/prefix`` (prefix without slashes at the ends).

    Raises:
        ConfigError: no bucket (or container) name.
    """
    parts = urlsplit(url)
    if not parts.netloc:
        raise ConfigError(f"store URL has no bucket or container: {url}")
    return parts.netloc, parts.path.strip("/")


def open_store(url: str, settings: StoreSettings | None = None) -> ObjectStore:
    """Return the adapter for ``url`` (``file://``, ``s3://``, ``gs://``, ``az://``).

    The adapter is not connected yet; use it as an async context manager.
    With ``settings.chaos_fault_rate`` > 0 it is wrapped in a
    :class:`~shared.storage._faults.FaultyStore` (chaos testing only); with
    ``settings.model_latency_ms`` > 0 in a :class:`~shared.storage._latency.LatencyStore`
    (benchmarks only).

    Raises:
        ConfigError: unknown scheme, missing bucket, or a bad path.
    """
    settings = settings or StoreSettings()
    store = _adapter(url, settings)
    if settings.model_latency_ms > 0:
        from ._latency import LatencyModel, LatencyStore

        store = LatencyStore(
            store, LatencyModel(settings.model_latency_ms / 1000, settings.model_latency_p99_ms / 1000)
        )
    if settings.chaos_fault_rate > 0:
        from ._faults import FaultyStore

        return FaultyStore(store, settings.chaos_fault_rate)
    return store


def _adapter(url: str, settings: StoreSettings) -> ObjectStore:
    scheme = urlsplit(url).scheme
    if scheme == "file":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// store URLs must be local (file:///abs/path): {url}")
        from ._local import LocalStore

        return LocalStore(Path(unquote(parts.path)), url=url, threads=settings.local_threads)
    if scheme == "s3":
        from ._s3 import S3Store

        bucket, prefix = split_bucket_url(url)
        return S3Store(bucket, prefix, settings, url=url)
    if scheme == "gs":
        from ._gcs import GcsStore

        bucket, prefix = split_bucket_url(url)
        return GcsStore(bucket, prefix, settings, url=url)
    if scheme == "az":
        from ._azure import AzureStore

        container, prefix = split_bucket_url(url)
        return AzureStore(container, prefix, settings, url=url)
    raise ConfigError(f"unknown store URL scheme {scheme!r} in {url!r} (use file, s3, gs or az)")
