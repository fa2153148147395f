"""What the CLI and the admin API share: the stored form of an operator request (retry / skip) and the
admin event filter. Kept free of aiohttp: the CLI imports it."""

from __future__ import annotations

from shared import Settings
from shared.events import AdminEvent, operator_request_value


def request_value(s: Settings, op: str, dataset: str, job: str) -> str:
    """Return the stored form of a request: signed (docs/contract.md section 5) when the fleet signs v2."""
    secret = s.security.hmac_secret.reveal_bytes() if s.security.sign_version == 2 else None
    return operator_request_value(op, secret, fleet=s.fleet.name, dataset=dataset, job=job)


def event_matches(ev: AdminEvent, *, types: set[str], dataset: str | None, job: str | None) -> bool:
    """Return True when ``ev`` passes the filters (empty/None = no filter)."""
    if types and str(type(ev).__struct_config__.tag) not in types:
        return False
    if dataset is not None and getattr(ev, "dataset", None) != dataset:
        return False
    return job is None or getattr(ev, "job", None) == job
