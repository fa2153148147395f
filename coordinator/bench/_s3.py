"""``commitfleet bench commit --s3-emulator``: run the commit benchmark on a throwaway moto S3 server.

moto's standalone server (``moto_server``, next to this Python) is started on a
free port with a fresh bucket; the bench processes (and the fleet's workers,
which inherit the environment) talk to it with dummy credentials. It is a
local emulator: its figures say what the request count and the client CPU
cost, not what a cloud would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec

from coordinator.demo import free_port
from shared import ConfigError, Settings

# moto accepts any credentials; these only keep the SDK from looking for real ones.
_EMULATOR_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
_BUCKET = "commitfleet-bench"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP status: the server is up
    except OSError:
        return False


@contextlib.contextmanager
def s3_emulator(settings: Settings, work: Path, *, start_timeout: float = 60.0) -> Iterator[Settings]:
    """Start moto, create the bucket, yield ``settings`` pointed at it; stop moto on the way out.

    Raises:
        ConfigError: moto_server is not installed, or did not start in time.
    """
    moto = Path(sys.executable).parent / "moto_server"
    if not moto.exists():
        raise ConfigError(f"moto_server not found next to {sys.executable} (install moto[server])")
    port = free_port()
    saved = {k: os.environ.get(k) for k in _EMULATOR_ENV}
    os.environ.update(_EMULATOR_ENV)  # the fleet's worker processes inherit it
    log = open(work / "moto.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while not _answers(endpoint + "/moto-api/"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ConfigError(f"moto_server did not start (see {work / 'moto.log'})")
            time.sleep(0.05)
        req = urllib.request.Request(f"{endpoint}/{_BUCKET}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass
        store = msgspec.structs.replace(
            settings.store, url=f"s3://{_BUCKET}/bench", s3_endpoint_url=endpoint, s3_region="us-east-1"
        )
        yield msgspec.structs.replace(settings, store=store)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
