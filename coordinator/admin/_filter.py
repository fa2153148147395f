"""The admin event filter the event stream (``GET /events``) and ``commitfleet events`` share.

Kept free of aiohttp: the CLI imports it.
"""

from __future__ import annotations

from shared.events import AdminEvent


def event_matches(ev: AdminEvent, *, types: set[str], dataset: str | None, job: str | None) -> bool:
    """Return True when ``ev`` passes the filters (empty/None = no filter)."""
    if types and str(type(ev).__struct_config__.tag) not in types:
        return False
    if dataset is not None and getattr(ev, "dataset", None) != dataset:
        return False
    return job is None or getattr(ev, "job", None) == job


__all__ = ["event_matches"]
