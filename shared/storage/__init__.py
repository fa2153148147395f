"""The object-store port and its adapters (local files, S3, GCS, Azure)."""

from ._open import open_store
from ._port import ObjectData, ObjectInfo, ObjectStore, check_key

__all__ = ["ObjectData", "ObjectInfo", "ObjectStore", "check_key", "open_store"]
