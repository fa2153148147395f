"""``CF_TEST_FAULT=... python -m tests._support.faulty_cli worker|coordinator ...``: a planted bug.

A test's way to make a real fleet process hit an unexpected error, without
any hook in the product: this launcher patches one method and then runs the
``commitfleet`` CLI as usual. ``CF_TEST_FAULT`` (read by this launcher only;
the product has no fault hook):

- ``raise``: the first shard runner of this worker to tick raises
  ``RuntimeError("planted fault in shard <n>")``; the others' ticks do nothing.
- ``raise-and-hang``: the runner of every other shard hangs in its tick,
  swallowing every cancellation (a task that will not die), and the first one
  raises as soon as another one hangs (so one always does when the process
  ends; the worker must own two shards or more).
- ``coordinator-step``: the leading coordinator's rebalance step raises
  ``RuntimeError("planted fault in the leader")``.
- ``block-loop``: each SIGUSR2 blocks the process's event loop for
  ``CF_TEST_BLOCK_S`` seconds (a Python signal handler runs on the loop's
  thread and sleeps there: a loop stuck in synchronous code).

(``ShardRunner._tick`` runs at the start of every shard session, then every second.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

from coordinator import Coordinator
from workers._shard import ShardRunner

FAULT = os.environ.get("CF_TEST_FAULT", "")
_crasher: list[int] = []  # the shard whose runner raises: the first to tick
_hanging = asyncio.Event()  # set once a runner hangs in its tick


async def _planted_tick(self: ShardRunner) -> None:
    if not _crasher:
        _crasher.append(self.shard)
    if self.shard == _crasher[0]:
        if FAULT == "raise-and-hang":
            # Raise only once another runner is stuck: a fixed pause here (0.5 s, as this was) let
            # the fault land while the others were still in it, and they all ended cleanly whenever
            # the lowest shard was the first to tick (the test failed 3 runs of 6).
            await _hanging.wait()
        raise RuntimeError(f"planted fault in shard {self.shard}")
    if FAULT == "raise-and-hang":
        _hanging.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug under test: a task that ignores cancellation


async def _planted_step(self: Coordinator, *args: object) -> None:
    raise RuntimeError("planted fault in the leader")


if FAULT in ("raise", "raise-and-hang"):
    ShardRunner._tick = _planted_tick  # type: ignore[method-assign]
elif FAULT == "coordinator-step":
    Coordinator._step = _planted_step  # type: ignore[method-assign]
elif FAULT == "block-loop":
    _block_s = float(os.environ["CF_TEST_BLOCK_S"])
    signal.signal(signal.SIGUSR2, lambda _sig, _frame: time.sleep(_block_s))
else:
    raise SystemExit(f"unknown fault {FAULT!r}")

from coordinator.cli import main  # noqa: E402 - after the patch, as the CLI imports the worker lazily

main()
