"""Credentials that never show: :class:`Secret` and its msgspec hooks.

A :class:`Secret` wraps one credential (a password, the signing key, a
connection string, a token). Its ``repr`` and ``str`` are ``'**********'``
(or ``''`` when empty), so a settings object, a producer config, an exception
message or a log line that formats one shows the mask, never the value; code
that needs the value calls :meth:`Secret.reveal` at the one place it hands it
to a library. It pickles (the producer config travels to every Spark executor)
and goes through msgspec with :func:`secret_dec_hook` / :func:`secret_enc_hook`.
(A password written in a Redis URL is moved out of it by :mod:`._redis_url`.)
"""

from __future__ import annotations

import hmac
from typing import Any, Final

MASK: Final = "**********"


class Secret:
    """One credential: masked in ``repr``/``str``/``format``, revealed only on request.

    Equality compares the values in constant time; the truth value says
    whether the secret is set (non-empty).
    """

    __slots__ = ("_value",)

    def __init__(self, value: str | Secret = "") -> None:
        """Wrap ``value`` (a ``str``; a Secret is unwrapped).

        Raises:
            TypeError: ``value`` is neither.
        """
        raw: object = value
        if isinstance(raw, Secret):
            raw = raw.reveal()
        if not isinstance(raw, str):
            raise TypeError(f"a Secret wraps a str, not a {type(raw).__name__}")
        self._value = raw

    def reveal(self) -> str:
        """Return the credential itself (hand it to the library that needs it, nowhere else)."""
        return self._value

    def reveal_bytes(self) -> bytes | None:
        """Return the UTF-8 bytes of the credential, or None when it is empty (signing keys)."""
        return self._value.encode("utf-8") if self._value else None

    def __repr__(self) -> str:
        return repr(MASK) if self._value else "''"

    def __str__(self) -> str:
        return MASK if self._value else ""

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


def coerce_secret(value: object) -> Secret:
    """Return ``value`` as a Secret (a struct built in code may have been given a plain ``str``).

    Raises:
        TypeError: ``value`` is neither a Secret nor a str.
    """
    if isinstance(value, Secret):
        return value
    if isinstance(value, str):
        return Secret(value)
    raise TypeError(f"expected a str or a Secret, not a {type(value).__name__}")


def secret_dec_hook(type_: type, obj: Any) -> Any:
    """msgspec ``dec_hook``: build a :class:`Secret` from a ``str`` (TOML, env vars, a config document).

    Raises:
        NotImplementedError: ``type_`` is not Secret (msgspec reports it as a type error).
    """
    if type_ is Secret:
        if isinstance(obj, Secret):
            return obj
        if isinstance(obj, str):
            return Secret(obj)
        raise TypeError(f"Expected `str`, got `{type(obj).__name__}`")
    raise NotImplementedError(f"no decoder for {type_!r}")


def secret_enc_hook(obj: Any) -> Any:
    """msgspec ``enc_hook`` that writes a Secret's value (only for files and documents handed to a
    process that needs the value: the demo's config file, the preflight task).

    Raises:
        NotImplementedError: ``obj`` is not a Secret.
    """
    if isinstance(obj, Secret):
        return obj.reveal()
    raise NotImplementedError(f"cannot encode a {type(obj).__name__}")


__all__ = [
    "MASK",
    "Secret",
    "coerce_secret",
    "secret_dec_hook",
    "secret_enc_hook",
]
