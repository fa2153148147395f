"""The admin event filter the event stream (``GET /events``) and ``commitfleet events`` share.

Kept free of aiohttp: the CLI imports it.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared import BadInput
from shared.events import ADMIN_EVENT_TYPES, AdminEvent


def event_types(values: Iterable[str]) -> set[str]:
    """Return the admin event types named by ``values``: each a type or a comma-separated list of them.

    ``--type committed,aborted``, ``-t committed -t aborted`` and ``?type=committed,aborted``
    all name the same two types; an empty result means no filter.

    Raises:
        BadInput: a name that is no admin event type (it would filter out every event),
            with the known types in the message.
    """
    names = {t.strip() for v in values for t in v.split(",") if t.strip()}
    unknown = sorted(names - ADMIN_EVENT_TYPES.keys())
    if unknown:
        known = ", ".join(sorted(ADMIN_EVENT_TYPES))
        raise BadInput(f"unknown admin event type(s) {', '.join(map(repr, unknown))}; known: {known}")
    return names


def event_matches(ev: AdminEvent, *, types: set[str], dataset: str | None, job: str | None) -> bool:
    """Return True when ``ev`` passes the filters (empty/None = no filter)."""
    if types and str(type(ev).__struct_config__.tag) not in types:
        return False
    if dataset is not None and getattr(ev, "dataset", None) != dataset:
        return False
    return job is None or getattr(ev, "job", None) == job


__all__ = ["event_matches", "event_types"]
