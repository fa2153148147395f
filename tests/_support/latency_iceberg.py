"""pyiceberg's file IO with the latency model of ``shared.storage.LatencyStore`` (benchmarks only).

The table step reads and writes the table's files (metadata, manifest lists,
manifests, Parquet footers) through pyiceberg's own file IO, not through the
fleet's store, so a latency-modelled store alone would leave the table's
requests free. :class:`LatencyFileIO` (``py-io-impl``) delays each request
it makes like one round trip to a cloud store: a size or existence check
(HEAD), opening a file to read (HEAD, as pyarrow's S3 file system does),
each read call (a ranged GET), and closing a written file (PUT). Waits block
the calling thread: pyiceberg runs in a thread of its own (and footer reads
in its executor's threads, so they overlap as they would on S3).

Properties: ``commitfleet.latency-ms`` and ``commitfleet.latency-p99-ms``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pyiceberg.io import InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.typedef import Properties

from shared.storage import LatencyModel

LATENCY_MS = "commitfleet.latency-ms"
LATENCY_P99_MS = "commitfleet.latency-p99-ms"


class _Rtt:
    def __init__(self, model: LatencyModel) -> None:
        self._model = model
        self._lock = threading.Lock()
        self.count = 0

    def __call__(self) -> None:
        with self._lock:  # the model's random generator is not thread-safe
            wait = self._model.sample()
            self.count += 1
        time.sleep(wait)


class _ReadStream:
    """A read stream whose every read is one round trip (a ranged GET), but one at the end (none is sent)."""

    def __init__(self, inner: Any, rtt: _Rtt) -> None:
        self._inner = inner
        self._rtt = rtt
        self._size = inner.size()

    def read(self, size: int | None = -1) -> bytes:
        if self._inner.tell() < self._size:
            self._rtt()
        return bytes(self._inner.read() if size is None or size < 0 else self._inner.read(size))

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._inner.seek(offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def close(self) -> None:
        self._inner.close()

    @property
    def closed(self) -> bool:
        return bool(getattr(self._inner, "closed", False))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def __enter__(self) -> _ReadStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WriteStream:
    """A write stream whose close (the upload) is one round trip."""

    def __init__(self, inner: OutputStream, rtt: _Rtt) -> None:
        self._inner = inner
        self._rtt = rtt

    def write(self, b: bytes) -> int:
        return self._inner.write(b)

    def close(self) -> None:
        self._rtt()
        self._inner.close()

    def __enter__(self) -> _WriteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _In(InputFile):
    def __init__(self, inner: InputFile, rtt: _Rtt) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self._rtt = rtt

    def __len__(self) -> int:
        self._rtt()
        return len(self._inner)

    def exists(self) -> bool:
        self._rtt()
        return self._inner.exists()

    def open(self, seekable: bool = True) -> InputStream:
        self._rtt()
        stream: Any = _ReadStream(self._inner.open(seekable=seekable), self._rtt)
        return stream  # type: ignore[no-any-return]


class _Out(OutputFile):
    def __init__(self, inner: OutputFile, rtt: _Rtt) -> None:
        super().__init__(inner.location)
        self._inner = inner
        self._rtt = rtt

    def __len__(self) -> int:
        self._rtt()
        return len(self._inner)

    def exists(self) -> bool:
        self._rtt()
        return self._inner.exists()

    def to_input_file(self) -> InputFile:
        return _In(self._inner.to_input_file(), self._rtt)

    def create(self, overwrite: bool = False) -> OutputStream:
        if not overwrite:
            self._rtt()  # the existence check
        stream: Any = _WriteStream(self._inner.create(overwrite=overwrite), self._rtt)
        return stream  # type: ignore[no-any-return]


_models: dict[tuple[float, float], _Rtt] = {}


class LatencyFileIO(PyArrowFileIO):
    """PyArrowFileIO with every request delayed by the latency model (see the module doc)."""

    def __init__(self, properties: Properties = {}) -> None:  # noqa: B006 - pyiceberg's signature
        super().__init__(properties)
        median = float(properties.get(LATENCY_MS, 0)) / 1000
        p99 = float(properties.get(LATENCY_P99_MS, median * 1000)) / 1000
        self.rtt = _models.setdefault((median, p99), _Rtt(LatencyModel(median, p99)))

    def new_input(self, location: str) -> Any:
        return _In(super().new_input(location), self.rtt)

    def new_output(self, location: str) -> Any:
        return _Out(super().new_output(location), self.rtt)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        self.rtt()
        super().delete(location)


def requests_made() -> int:
    """Return how many requests every LatencyFileIO of this process has delayed so far."""
    return sum(r.count for r in _models.values())
