"""Per-process clients for Spark executors (and the driver): one event loop, open stores.

A PySpark Python worker process runs many tasks one after the other
(``spark.python.worker.reuse``). Opening an object-store client per task would
cost a connection handshake every ~30 ms task; instead each process keeps

- one asyncio event loop in a daemon thread, which drives the async
  :class:`~shared.storage.ObjectStore` port from synchronous task code, and
- one open store per ``(url, settings)``, entered once and closed at exit.

This is the one place in the project with process-global state, on purpose:
it is a cache of connections, never of decisions, and it is rebuilt in a
forked child (the pid is checked) because sockets and threads do not survive
a fork.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..settings import StoreSettings
from ..storage import ObjectStore, open_store

T = TypeVar("T")

_CLOSE_TIMEOUT = 5.0


class ExecutorRuntime:
    """An event loop thread and the stores opened on it, for one process."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="commitfleet-runtime", daemon=True)
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, StoreSettings], ObjectStore] = {}
        self._closed = False
        self._thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    @property
    def pid(self) -> int:
        """The process this runtime belongs to."""
        return self._pid

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the runtime's loop and return its result (blocking the caller).

        Raises:
            Whatever ``coro`` raises; ``TimeoutError`` after ``timeout`` seconds
            (the coroutine is then cancelled).

        If the calling thread is interrupted (KeyboardInterrupt, a Spark task
        kill) the coroutine is cancelled and the interruption re-raised.
        """
        if self._closed:
            coro.close()
            raise RuntimeError("the executor runtime is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"coroutine did not finish within {timeout}s") from None
        except BaseException:
            fut.cancel()
            raise

    def store(self, url: str, settings: StoreSettings) -> ObjectStore:
        """Return the open store for ``url`` and ``settings``, opening it on first use.

        Raises:
            ConfigError: bad URL or settings (from :func:`~shared.storage.open_store`).
            TransientError: the store could not be reached while opening.
        """
        key = (url, settings)
        with self._lock:
            found = self._stores.get(key)
            if found is not None:
                return found
            store = open_store(url, settings)
            opened = self.run(_enter(store))
            self._stores[key] = opened
            return opened

    def close(self) -> None:
        """Close every store and stop the loop (idempotent; at most ~5 s)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stores = list(self._stores.values())
            self._stores.clear()
        if stores and self._thread.is_alive():
            fut = asyncio.run_coroutine_threadsafe(_close_all(stores), self._loop)
            try:
                fut.result(_CLOSE_TIMEOUT)
            except concurrent.futures.TimeoutError:
                fut.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CLOSE_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()


async def _enter(store: ObjectStore) -> ObjectStore:
    return await store.__aenter__()


async def _close_all(stores: list[ObjectStore]) -> None:
    # Closing is best effort at process exit: one store's error must not leave
    # the others open, and nobody is left to report it to.
    results = await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)
    del results


_runtime: ExecutorRuntime | None = None
_runtime_lock = threading.Lock()


def process_runtime() -> ExecutorRuntime:
    """Return this process's runtime, starting it on first use (and again after a fork)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = ExecutorRuntime()
            atexit.register(_runtime.close)
        return _runtime


__all__ = ["ExecutorRuntime", "process_runtime"]
