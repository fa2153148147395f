"""Nonces (``shared._nonce``): unique, 16 hex digits, and not repeated by a forked child."""

from __future__ import annotations

import multiprocessing
import re

from shared._nonce import nonce
from shared.locks._io import new_nonce
from shared.storage._local_put import _temp_name


def _child_nonces(out: multiprocessing.SimpleQueue[list[str]]) -> None:
    out.put([nonce() for _ in range(100)])


def test_a_nonce_is_16_hex_digits_and_never_repeats() -> None:
    seen = [nonce() for _ in range(100_000)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", n) for n in seen)
    assert len(set(seen)) == len(seen)
    assert re.fullmatch(r"[0-9a-f]{16}", new_nonce())


def test_a_forked_child_does_not_repeat_its_parents_nonces() -> None:
    # Without a new seed in the child, parent and child would draw the same
    # sequence: the lock and log writes of two processes would carry equal nonces.
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.SimpleQueue[list[str]] = ctx.SimpleQueue()
    child = ctx.Process(target=_child_nonces, args=(out,))
    child.start()
    theirs = out.get()
    child.join(timeout=30)
    assert child.exitcode == 0
    ours = [nonce() for _ in range(100)]
    assert not set(ours) & set(theirs)


def test_temp_names_differ_between_calls() -> None:
    names = {_temp_name() for _ in range(10_000)}
    assert len(names) == 10_000
