"""The object-store port and its adapters (local files, S3, GCS, Azure)."""

from ._counting import CountingStore
from ._faults import FaultyStore
from ._latency import LatencyModel, LatencyStore
from ._open import open_store
from ._port import ObjectData, ObjectInfo, ObjectStore, check_key

__all__ = [
    "CountingStore",
    "FaultyStore",
    "LatencyModel",
    "LatencyStore",
    "ObjectData",
    "ObjectInfo",
    "ObjectStore",
    "check_key",
    "open_store",
]
