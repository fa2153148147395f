"""How each cloud adapter reports failures: real emulators stopped, a real HTTP server answering
throttling / 5xx / nothing at all, missing buckets, bad credentials, and the pure translation
functions fed with the SDKs' own exception objects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from shared._errors import (
    BadInput,
    ConfigError,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Throttled,
    TransientError,
)
from shared.settings import StoreSettings
from shared.storage import open_store
from shared.storage._s3 import translate_error as s3_translate
from tests._support.emulators import (
    AZURITE_ACCOUNT,
    MakeTarget,
    azurite_connection_string,
    create_bucket,
    start_emulator,
)
from tests._support.ports import free_port

CLOUD = ["s3", "gcs", "azure"]
SCHEME = {"s3": "s3", "gcs": "gs", "azure": "az"}


def _settings(backend: str, endpoint: str, timeout: float = 30.0, attempts: int = 1) -> StoreSettings:
    common = {"request_timeout": timeout, "sdk_attempts": attempts}
    if backend == "s3":
        return StoreSettings(s3_endpoint_url=endpoint, **common)  # type: ignore[arg-type]
    if backend == "gcs":
        return StoreSettings(gcs_endpoint=endpoint, **common)  # type: ignore[arg-type]
    conn = azurite_connection_string(endpoint)
    return StoreSettings(azure_connection_string=conn, **common)  # type: ignore[arg-type]


# -- a real emulator, stopped under the client ----------------------------------------


@pytest.mark.parametrize("backend", CLOUD)
async def test_a_stopped_emulator_gives_transient_errors(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "s3":
        request.getfixturevalue("_aws_env")
    emu = start_emulator(backend, tmp_path)
    try:
        create_bucket(emu, "cf-stop")
        url = f"{SCHEME[backend]}://cf-stop/root"
        async with (
            open_store(url, emu.settings()) as patient,
            open_store(url, _settings(backend, emu.endpoint)) as store,
        ):
            v = await store.write("k", b"v")
            emu.stop()
            # With the SDK's own retries (the default) the end is the same, only later.
            with pytest.raises(TransientError):
                await patient.write_if_absent("other", b"x")
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: store.read("k"),
                lambda: store.head("k"),
                lambda: store.write("k", b"w"),
                lambda: store.write_if_absent("new", b"w"),
                lambda: store.write_if_match("k", b"w", v.version),
                lambda: store.delete("k"),
                lambda: store.copy("k", "k2"),
                lambda: anext(aiter(store.list())),
            ]
            for call in calls:
                with pytest.raises(TransientError) as caught:
                    await call()
                assert not isinstance(caught.value, Throttled)
    finally:
        emu.stop()


# -- a real HTTP server that answers with faults ------------------------------------------


@dataclass
class Fault:
    status: int = 503
    body: bytes = b""
    headers: dict[str, str] | None = None
    hang: bool = False


@dataclass
class FaultServer:
    endpoint: str
    fault: Fault
    requests: int = 0


@pytest.fixture
async def fault_server() -> AsyncIterator[FaultServer]:
    """An HTTP server on loopback that answers every request with ``server.fault``."""
    release = asyncio.Event()
    server = FaultServer(endpoint="", fault=Fault())

    async def handle(req: web.Request) -> web.StreamResponse:
        server.requests += 1
        await req.read()
        f = server.fault
        if f.hang:
            await release.wait()
        return web.Response(status=f.status, body=f.body, headers=f.headers or {})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    server.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        release.set()
        await runner.cleanup()


def _xml_error(code: str) -> bytes:
    head = '<?xml version="1.0" encoding="UTF-8"?>'
    return f"{head}<Error><Code>{code}</Code><Message>m</Message></Error>".encode()


def _az(code: str) -> dict[str, str]:
    return {"x-ms-error-code": code, "Content-Type": "application/xml"}


# backend, case -> (fault, expected error, requests the server sees for one conditional write and,
# unless the case is 412, one read, with sdk_attempts=2: S3 and Azure retry what they think is
# transient once more themselves, GCS never retries).
FAULTS: dict[tuple[str, str], tuple[Fault, type[BaseException], int]] = {
    ("s3", "throttled"): (Fault(503, _xml_error("SlowDown")), Throttled, 4),
    ("s3", "429"): (Fault(429, _xml_error("TooManyRequests")), Throttled, 2),
    ("s3", "5xx"): (Fault(500, _xml_error("InternalError")), TransientError, 4),
    ("s3", "412"): (Fault(412, _xml_error("PreconditionFailed")), PreconditionFailed, 1),
    ("s3", "conflict"): (Fault(409, _xml_error("ConditionalRequestConflict")), TransientError, 2),
    ("gcs", "throttled"): (Fault(429, b'{"error":{"code":429,"message":"rate"}}'), Throttled, 2),
    ("gcs", "5xx"): (Fault(503, b'{"error":{"code":503,"message":"backend"}}'), TransientError, 2),
    ("gcs", "412"): (Fault(412, b'{"error":{"code":412,"message":"precondition"}}'), PreconditionFailed, 1),
    ("azure", "throttled"): (Fault(503, _xml_error("ServerBusy"), _az("ServerBusy")), Throttled, 4),
    ("azure", "5xx"): (Fault(500, _xml_error("InternalError"), _az("InternalError")), TransientError, 4),
    ("azure", "412"): (
        Fault(412, _xml_error("ConditionNotMet"), _az("ConditionNotMet")),
        PreconditionFailed,
        1,
    ),
}


@pytest.mark.parametrize(("backend", "case"), list(FAULTS), ids=[f"{b}-{c}" for b, c in FAULTS])
async def test_http_faults_map_to_our_errors(
    backend: str, case: str, fault_server: FaultServer, request: pytest.FixtureRequest
) -> None:
    if backend == "s3":
        request.getfixturevalue("_aws_env")
    fault, expected, requests = FAULTS[(backend, case)]
    fault_server.fault = fault
    settings = _settings(backend, fault_server.endpoint, attempts=2)
    async with open_store(f"{SCHEME[backend]}://bkt/root", settings) as store:
        with pytest.raises(expected) as caught:
            await store.write_if_match("k", b"payload", '"1"' if backend != "gcs" else "1")
        if expected is TransientError:
            assert not isinstance(caught.value, Throttled)
        if case != "412":
            with pytest.raises(expected):
                await store.read("k")
    assert fault_server.requests == requests


@pytest.mark.parametrize("backend", CLOUD)
async def test_a_server_that_never_answers(
    backend: str, fault_server: FaultServer, request: pytest.FixtureRequest
) -> None:
    """A timeout after the request went out: the conditional write's outcome is unknown; a read or
    an unconditional (idempotent) write is simply worth retrying."""
    if backend == "s3":
        request.getfixturevalue("_aws_env")
    fault_server.fault = Fault(hang=True)
    settings = _settings(backend, fault_server.endpoint, timeout=0.3)
    async with open_store(f"{SCHEME[backend]}://bkt/root", settings) as store:
        with pytest.raises(OutcomeUnknown):
            await store.write_if_absent("k", b"payload")
        with pytest.raises(TransientError):
            await store.read("k")
        with pytest.raises(TransientError):
            await store.write("k", b"payload")


# -- configuration errors ---------------------------------------------------------------


@pytest.mark.parametrize("backend", CLOUD)
async def test_a_missing_bucket_is_a_config_error(backend: str, make_target: MakeTarget) -> None:
    target = make_target(backend)
    url = target.url.replace("cf-session", "cf-no-such-bucket")
    async with open_store(url, target.settings) as store:
        with pytest.raises(ConfigError):
            await store.write("k", b"v")
        with pytest.raises(ConfigError):
            await store.write_if_absent("k", b"v")
        with pytest.raises(ConfigError):
            [i async for i in store.list()]


async def test_s3_without_credentials_is_a_config_error(
    make_target: MakeTarget, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = make_target("s3")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    async with target.open() as store:
        with pytest.raises(ConfigError):
            await store.read("k")


async def test_azure_with_a_wrong_key_is_a_config_error(make_target: MakeTarget) -> None:
    target = make_target("azure")
    conn = target.settings.azure_connection_string.reveal()
    bad_key = "QUJD" * 22
    wrong = StoreSettings(
        azure_connection_string=conn.replace(conn.split("AccountKey=")[1].split(";")[0], bad_key)
    )
    async with open_store(target.url, wrong) as store:
        with pytest.raises(ConfigError):
            await store.write("k", b"v")


async def test_azure_without_any_credentials_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError):
        open_store("az://container/prefix", StoreSettings())


async def test_azure_account_url_with_key_from_the_environment(
    make_target: MakeTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_target("azure")
    conn = target.settings.azure_connection_string.reveal()
    endpoint = conn.split("BlobEndpoint=")[1].rstrip(";")
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", conn.split("AccountKey=")[1].split(";")[0])
    async with open_store(target.url, StoreSettings(azure_account_url=endpoint)) as store:
        await store.write_if_absent("k", b"v")
        assert (await store.read("k")).data == b"v"


# -- the S3 translation, fed with botocore's own exception objects -----------------------


def _client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, op
    )


S3_CASES: list[tuple[str, BaseException, type[BaseException]]] = [
    ("cond", _client_error("PreconditionFailed", 412), PreconditionFailed),
    ("cond", _client_error("NoSuchKey", 404), PreconditionFailed),
    ("read", _client_error("NoSuchKey", 404, "GetObject"), NotFound),
    ("read", _client_error("404", 404, "HeadObject"), NotFound),
    ("copy", _client_error("NoSuchKey", 404, "CopyObject"), NotFound),
    ("cond", _client_error("ConditionalRequestConflict", 409), TransientError),
    ("write", _client_error("SlowDown", 503), Throttled),
    ("read", _client_error("TooManyRequests", 429, "GetObject"), Throttled),
    ("write", _client_error("ServiceUnavailable", 503), Throttled),
    ("write", _client_error("InternalError", 500), TransientError),
    ("read", _client_error("RequestTimeout", 400, "GetObject"), TransientError),
    ("write", _client_error("NoSuchBucket", 404), ConfigError),
    ("cond", _client_error("NoSuchBucket", 404), ConfigError),
    ("read", _client_error("InvalidAccessKeyId", 403, "GetObject"), ConfigError),
    ("read", _client_error("AccessDenied", 403, "GetObject"), ConfigError),
    ("write", _client_error("EntityTooLarge", 400), BadInput),
    ("cond", NoCredentialsError(), ConfigError),
    ("cond", ReadTimeoutError(endpoint_url="http://x"), OutcomeUnknown),
    ("write", ReadTimeoutError(endpoint_url="http://x"), TransientError),
    ("cond", ConnectionClosedError(endpoint_url="http://x"), OutcomeUnknown),
    ("read", ConnectionClosedError(endpoint_url="http://x"), TransientError),
    (
        "cond",
        EndpointConnectionError(endpoint_url="http://x", error=aiohttp.ServerDisconnectedError()),
        OutcomeUnknown,
    ),
]


@pytest.mark.parametrize(("op", "exc", "expected"), S3_CASES, ids=[f"{o}-{e!r}"[:60] for o, e, _ in S3_CASES])
def test_s3_translation(op: str, exc: BaseException, expected: type[BaseException]) -> None:
    got = s3_translate(exc, op, "bucket/key")  # type: ignore[arg-type]
    assert type(got) is expected, got
