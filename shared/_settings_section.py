"""The base of every settings section."""

from __future__ import annotations

import msgspec


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A frozen section: an unknown key is an error (a typo must not pass for a default)."""


__all__ = ["_Section"]
