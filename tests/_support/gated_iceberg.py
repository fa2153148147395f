"""pyiceberg's file IO whose writes can be held or failed, by file name (tests of the table step's uploads).

:class:`GatedFileIO` (``py-io-impl``) is pyiceberg's PyArrow file IO; a
written file's upload (opening it to write) goes through :data:`GATE`: it
records the file's name, fails when ``fail`` matches the name (once), and
waits for ``release`` when ``hold`` matches it. The gate is process-wide
(pyiceberg makes its file IOs from the catalog's properties); a test sets it
and calls :meth:`UploadGate.reset` when done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pyiceberg.io import OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFileIO

Match = Callable[[str], bool]


class UploadGate:
    """What :class:`GatedFileIO` does with each upload (see the module doc). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.release = threading.Event()
        self.reset()

    def reset(self) -> None:
        """Hold nothing, fail nothing, forget the names seen."""
        with self._lock:
            self.hold: Match | None = None
            self.fail: Match | None = None
            self.started: list[str] = []
            self.failed: list[str] = []
        self.release.clear()

    def names(self) -> list[str]:
        """Return the names (last path part) of the uploads begun so far, in order."""
        with self._lock:
            return list(self.started)

    def upload(self, location: str) -> None:
        """Record an upload of ``location``; hold or fail it as set. Raises OSError when failed."""
        name = location.rsplit("/", 1)[-1]
        with self._lock:
            self.started.append(name)
            fail = self.fail is not None and self.fail(name)
            if fail:
                self.fail = None
                self.failed.append(location)
            hold = self.hold is not None and self.hold(name)
        if fail:
            raise OSError(f"upload of {name} failed (test)")
        if hold:
            assert self.release.wait(20), f"upload of {name} never released"


GATE = UploadGate()


class _GatedOut(OutputFile):
    def __init__(self, inner: OutputFile) -> None:
        super().__init__(inner.location)
        self._inner = inner

    def __len__(self) -> int:
        return len(self._inner)

    def exists(self) -> bool:
        return self._inner.exists()

    def to_input_file(self) -> Any:
        return self._inner.to_input_file()

    def create(self, overwrite: bool = False) -> OutputStream:
        GATE.upload(self.location)  # before the file is opened: a failed upload leaves no file
        return self._inner.create(overwrite=overwrite)


class GatedFileIO(PyArrowFileIO):
    """PyArrowFileIO whose uploads go through :data:`GATE`."""

    def new_output(self, location: str) -> Any:
        return _GatedOut(super().new_output(location))
