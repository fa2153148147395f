"""The stored form of an operator request (retry / skip), shared by the CLI and the console."""

from __future__ import annotations

from shared import Settings
from shared.events import operator_request_value


def request_value(s: Settings, op: str, dataset: str, job: str) -> str:
    """Return the stored form of a request: signed (docs/contract.md section 5) when the fleet signs v2."""
    secret = s.security.hmac_secret.reveal_bytes() if s.security.sign_version == 2 else None
    return operator_request_value(op, secret, fleet=s.fleet.name, dataset=dataset, job=job)
