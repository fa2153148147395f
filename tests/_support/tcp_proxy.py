"""A loopback TCP proxy whose target can be switched: new connections go to the new target, open ones stay.

What a managed Redis's single endpoint does on a failover (its DNS name or IP moves to the promoted
replica; a connection opened before keeps reaching the old primary). Threads, not the event loop, so a
blocking client in the test's own thread can use it too.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


class SwitchableProxy:
    """Listens on 127.0.0.1:port; pipes each connection to 127.0.0.1:target as it was when accepted."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def _spawn(self, fn: object, *args: object) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Close the listener and every open connection (safe to call twice)."""
        with self._lock:
            self._closed = True
            socks, self._open = self._open, []
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        with contextlib.suppress(OSError):
            self._listener.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


@contextlib.contextmanager
def switchable_proxy(target: int) -> Iterator[SwitchableProxy]:
    """Run a :class:`SwitchableProxy` to ``target`` for the block."""
    proxy = SwitchableProxy(target)
    try:
        yield proxy
    finally:
        proxy.close()
