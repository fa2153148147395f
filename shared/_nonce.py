"""Nonces: fresh 16-hex-digit strings that tell one write from another.

A nonce makes every write of a lock, a commit log or the watermarks change
the bytes, so that a holder re-reading after an ambiguous answer can tell its
own write from another's; a temp file's name carries one too. They need to be
unique, not secret: they come from the :mod:`random` module's generator, which
is seeded from ``os.urandom`` when it is imported and again in a forked child.
``secrets.token_hex`` made a system call per nonce, and with it let go of the
GIL on the event loop's thread, where the store's threads then took it.
"""

from __future__ import annotations

import random


def nonce() -> str:
    """Return 16 fresh random hex digits (64 bits)."""
    return f"{random.getrandbits(64):016x}"


__all__ = ["nonce"]
