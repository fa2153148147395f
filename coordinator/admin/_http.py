"""The admin HTTP API (aiohttp): status JSON, the admin stream as server-sent events, metrics, console.

Routes:

- ``GET /status``   the fleet's status summary (see :func:`fleet_summary`): bounded by the
  shards and workers, never by the open work
- ``GET /status/datasets``  one page of open work (:func:`open_work_page`): query ``state``,
  ``job``, ``prefix``, ``dataset``, ``shard``, ``limit`` (1..1000, 100), ``cursor``; answers
  ``{"items": [...], "next": cursor or null}``
- ``GET /status/jobs``  one page of open jobs (:func:`open_jobs_page`): ``limit`` (1..200), ``cursor``
- ``GET /events``   server-sent events of the admin stream; query ``type``,
  ``dataset``, ``job`` filter; ``from`` (``$`` = from now, ``0`` = replay the
  capped stream) or the ``Last-Event-ID`` header resumes
- ``GET /events/recent``  the last admin events, newest first, as JSON: the
  same filters, ``limit`` (1..:data:`RECENT_MAX`), ``before`` (a cursor);
  reads at most :data:`RECENT_SCAN` entries per request and answers the
  stream's ``head`` (follow the live events from it: ``/events?from=<head>``)
  and a ``cursor`` for older events
- ``GET /jobs/{job}``  the job page (coordinator/admin/_job_page.py): its shards,
  liveness, a page of its datasets (``limit`` 1..1000, ``cursor`` = the page's
  ``next``), its newest events (first page; ``events`` 0..100)
- ``GET /datasets/{name}``  the dataset page (coordinator/admin/_dataset_page.py):
  shard, open work, quarantine, lock, newest commits (``commits`` 1..100)
- ``GET /metrics``  Prometheus text format
- ``GET /healthz``  ``ok`` (no token, no Host check: it tells nothing)
- ``/ui``           the web console (coordinator/admin/_ui.py)

Every route but ``/healthz`` checks the Host header (DNS rebinding) and the
bearer token or console cookie when ``coordinator.admin_token`` is set
(coordinator/admin/_ui_auth.py). Requests other than event streams end after
``coordinator.request_timeout``; event streams send a keep-alive comment when
idle, are capped at ``coordinator.sse_max_clients``, and end as soon as their
client disconnects (aiohttp cancels the handler: no loop, no Redis read left).
Nothing on a request path lists or reads the store but the dataset page, which
reads a bounded number of objects of one dataset (its lock, watermarks, newest
manifests, its ``_wal/`` logs and a capped listing of its ``_commits/``).
The job and dataset pages answer 400 for a name that is not a job id or a
dataset name, 404 for one the fleet does not know.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import redis.asyncio
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from shared import (
    BadInput,
    ConfigError,
    NotFound,
    OutcomeUnknown,
    Settings,
    TransientError,
    kv,
    raise_if_cancelling,
)
from shared.events import DATA_FIELD, AdminEvent, Committed, InvalidMessage, decode_admin, encode_admin
from shared.queue import (
    Keys,
    entries_from_reply,
    keep_repeated_fields,
    queue_operator_request,
    read_admin_range,
    read_admin_recent,
    redis_errors,
)

from . import _ui
from ._dataset_page import dataset_page
from ._filter import event_matches, event_types, filter_names
from ._job_page import EVENTS_DEFAULT, PAGE_DEFAULT, job_page
from ._metrics import CONTENT_TYPE, FleetMetrics
from ._open_work import DEFAULT_LIMIT, OpenWorkFilter, open_jobs_page, open_work_page
from ._status import OpenJobs, fleet_summary
from ._ui_auth import allowed_hosts, authorized, check_bind, host_allowed
from ._ui_history import CommitHistory, window_start_id

if TYPE_CHECKING:
    from shared.storage import ObjectStore

log = logging.getLogger("coordinator.http")


class _BadRequestsQuiet(logging.Filter):
    """Turn the HTTP server's report of a request it could not parse into one debug line.

    aiohttp answers such a request (a header or URL too long, too many
    headers, two Host headers...) with 400 and logs it as an error with a
    traceback: anyone who can reach the port, token or not, could fill the
    error log. The client's mistake is the client's; one line at debug says it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "bad request from %s: %s", (remote, exc.message or type(exc).__name__)
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info = record.exc_text = None
            # Made at error level, the record passed the level check: check again at debug.
            return _SERVER_LOG.isEnabledFor(logging.DEBUG)
        return True


# The server's own logger: aiohttp's messages, with requests it could not parse made quiet.
_SERVER_LOG = logging.getLogger("coordinator.http.server")
_SERVER_LOG.addFilter(_BadRequestsQuiet())

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# How long one status document answers /status and /metrics requests.
STATUS_CACHE_S = 1.0
# Admin entries read per request when the commit history reads the last hour back.
BACKFILL_PAGE = 1000
# Paths served without token or Host check.
OPEN_PATHS = frozenset({"/healthz"})
_DATA = DATA_FIELD.encode()
STREAM_ID = re.compile(r"\$|[0-9]{1,20}(-[0-9]{1,20})?")
_U64_MAX = 2**64 - 1
# GET /events/recent: events per answer by default and at most; entries read per request at most
# (a filter that matches nothing reads this many, then answers a cursor to go on from).
RECENT_DEFAULT = 100
RECENT_MAX = 1000
RECENT_SCAN = 10_000
_FILTER_PARAMS = ("type", "dataset", "job")
_RECENT_PARAMS = frozenset({*_FILTER_PARAMS, "limit", "before"})
_JOB_PARAMS = frozenset({"limit", "cursor", "events"})
_DATASET_PARAMS = frozenset({"commits"})
_WORK_PARAMS = frozenset({"state", "job", "dataset", "prefix", "shard", "limit", "cursor"})
_JOBS_PARAMS = frozenset({"limit", "cursor"})


def stream_id_ok(text: str) -> bool:
    """Return True when ``text`` is ``$`` or a stream id Redis takes (``ms[-seq]``, each below 2**64)."""
    if not STREAM_ID.fullmatch(text):
        return False
    return text == "$" or all(int(part) <= _U64_MAX for part in text.split("-"))


SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class AdminServer:
    """Serves the admin API and console; aggregates admin events into metrics and commit history."""

    def __init__(
        self,
        settings: Settings,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        *,
        coordinator_id: str,
        leading: asyncio.Event,
        store: ObjectStore | None = None,
    ) -> None:
        self.settings = settings
        # Read by the dataset page only (its lock, manifests, watermarks, logs); None: those parts are null.
        self.store = store
        self.r = keep_repeated_fields(redis_client)  # the admin stream reader sees a repeated field name
        self.keys = keys
        self.coordinator_id = coordinator_id
        self.leading = leading
        self.port: int | None = None
        self.metrics = FleetMetrics()
        self.history = CommitHistory()
        self.sse_clients = 0
        self._hosts = allowed_hosts(settings.coordinator)
        self._runner: web.AppRunner | None = None
        # The status document, shared by the requests of STATUS_CACHE_S seconds.
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._status_lock = asyncio.Lock()
        self._open_jobs = OpenJobs()  # the distinct job count, kept while no job record moved

    def app(self) -> web.Application:
        """Return the aiohttp application (routes and guards)."""
        app = web.Application(middlewares=[self._guard])
        app.add_routes(
            [
                web.get("/status", self._status),
                web.get("/status/datasets", self._status_datasets),
                web.get("/status/jobs", self._status_jobs),
                web.get("/events", self._events),
                web.get("/events/recent", self._recent),
                web.get("/jobs/{job}", self._job),
                web.get("/datasets/{name}", self._dataset),
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._health),
            ]
        )
        console = _ui.ConsoleInputs(
            token=self.settings.coordinator.admin_token.reveal(),
            history=self.history,
            queue_request=self._queue_request,
        )
        _ui.add_routes(app, console)
        return app

    async def _queue_request(self, dataset: str, job: str, op: str) -> int:
        """Queue the console's request (:func:`shared.queue.queue_operator_request`); return its shard.

        Raises:
            BadInput: bad names or operation.
            NotFound: the sequence is not quarantined.
            TransientError: Redis unavailable.
        """
        return await queue_operator_request(self.r, self.keys, self.settings, dataset, job, op)

    async def start(self) -> None:
        """Bind and serve.

        Raises:
            ConfigError: the address is unusable, or exposed without a token.
        """
        c = self.settings.coordinator
        check_bind(c)
        # handler_cancellation: a client that goes away cancels its handler at once (an
        # event stream whose filter never matches would otherwise loop for ever).
        self._runner = web.AppRunner(
            self.app(),
            handle_signals=False,
            access_log=None,
            shutdown_timeout=1.0,
            handler_cancellation=True,
            keepalive_timeout=min(75.0, c.request_timeout),
            logger=_SERVER_LOG,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, c.http_host, c.http_port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(f"cannot serve the admin API on {c.http_host}:{c.http_port}: {exc}") from None
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else c.http_port

    async def stop(self) -> None:
        """Stop serving (safe to call twice)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def follow_admin(self) -> None:
        """Aggregate admin events into metrics and the commit history, forever (the owner cancels it).

        The history first reads back the last hour of the (capped) stream, up
        to the newest entry at the start; the metrics count what comes after it.
        """
        last: bytes | str = "$"
        start = window_start_id(time.time())
        try:
            with redis_errors("XREVRANGE admin"):
                newest: Any = await self.r.xrevrange(self.keys.admin, count=1)
            if newest:
                last = end = newest[0][0]
                while True:  # in pages: the hour may hold the whole capped stream
                    page = await read_admin_range(self.r, self.keys, start, end, count=BACKFILL_PAGE)
                    for _id, ev in page:
                        self._history(ev)
                    if not page or page[-1][0] == end:
                        break
                    start = "(" + page[-1][0].decode()  # exclusive: after the last one read
        except TransientError as exc:
            log.warning("admin stream unavailable; commit history starts now", extra=kv(error=str(exc)))
        first = True
        if last == "$":
            last = "0-0"  # the stream was empty a moment ago
        start = last.decode() if isinstance(last, bytes) else last
        while True:
            try:
                start, events = await self._read_admin(start, 500)
                for _, ev in events:
                    self.metrics.agg.count(ev)
                    self._history(ev)
            except TransientError as exc:
                if first:
                    log.warning("admin stream unavailable", extra=kv(error=str(exc)))
                first = False
                await asyncio.sleep(1.0)

    async def _read_admin(self, after: str, block_ms: int) -> tuple[str, list[tuple[str, AdminEvent]]]:
        """Return the id of the last admin entry read after ``after`` (or ``after``) and ``(id, event)``s.

        Waits up to ``block_ms`` for one; undecodable entries are skipped (the
        workers that act on events log them).

        Raises:
            TransientError: Redis unavailable.

        On cancel: ends. redis-py 8.1 can lose a cancellation that arrives just
        after a blocking read returned data (the task reads on, "cancelling"):
        the loops here check for a pending cancel after every read, so they
        end within one ``block_ms`` all the same.
        """
        with redis_errors("XREAD admin"):
            reply = await self.r.xread({self.keys.admin: after}, count=100, block=block_ms)
        raise_if_cancelling()
        events: list[tuple[str, AdminEvent]] = []
        for entry in entries_from_reply(reply):
            after = entry.id.decode()
            try:
                events.append((after, decode_admin(entry.fields.get(_DATA, b""))))
            except InvalidMessage:
                continue
        return after, events

    def _history(self, ev: AdminEvent) -> None:
        # An event stamped in the future (a bad clock, a forged entry) would push the window on.
        if isinstance(ev, Committed) and ev.at < time.time() + 300:
            self.history.add(ev.at, ev.duration_s)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Host check, token check and request timeout, in that order."""
        if request.path in OPEN_PATHS:
            return await handler(request)
        if not host_allowed(request.headers.get("Host"), self._hosts):
            return web.json_response({"error": "host not allowed"}, status=421)
        c = self.settings.coordinator
        if not _ui.is_public(request) and not authorized(
            request.headers, request.cookies, c.admin_token.reveal()
        ):
            if _ui.wants_page(request):
                raise web.HTTPSeeOther(_ui.LOGIN_PATH)
            return web.json_response(
                {"error": "unauthorized"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        if request.path == "/events":
            return await handler(request)  # long-lived by design; ends with its client
        try:
            async with asyncio.timeout(c.request_timeout):
                return await handler(request)
        except TimeoutError:
            return web.json_response({"error": "request timed out"}, status=503)

    async def status_doc(self, *, fresh: bool = False) -> dict[str, Any]:
        """Return the status summary, at most STATUS_CACHE_S old (``fresh``: newly read).

        Computed from the counts the workers keep in Redis (quarantines included),
        never by listing the store or the open work: a request costs the same at any
        store size and any amount of open work. Concurrent requests wait for one
        computation. Raises TransientError.
        """
        async with self._status_lock:
            now = time.monotonic()
            if not fresh and self._cached is not None and now - self._cached[0] < STATUS_CACHE_S:
                return self._cached[1]
            doc = await fleet_summary(self.r, self.keys, self.settings, self._open_jobs)
            doc["coordinator"] = {"id": self.coordinator_id, "leading": self.leading.is_set()}
            self._cached = (time.monotonic(), doc)
            return doc

    async def _status(self, _request: web.Request) -> web.Response:
        try:
            doc = await self.status_doc()
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(doc), content_type="application/json")

    async def _status_datasets(self, request: web.Request) -> web.Response:
        """Answer one page of open work (``GET /status/datasets``): 200, 400 on a bad query, 503."""
        q = request.query
        try:
            _known(q, _WORK_PARAMS)
            shard = _whole(q, "shard", 0, 1 << 20)
            flt = OpenWorkFilter(
                job=_single(q, "job") or None,
                dataset=_single(q, "dataset") or None,
                prefix=_single(q, "prefix") or None,
                state=_single(q, "state") or None,
                shard=shard,
            )
            limit = _whole(q, "limit", 1, 1 << 20)
            page = await open_work_page(
                self.r, self.keys, self.settings, flt, _single(q, "cursor") or None, limit or DEFAULT_LIMIT
            )
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(page), content_type="application/json")

    async def _status_jobs(self, request: web.Request) -> web.Response:
        """Answer one page of open jobs (``GET /status/jobs``): 200, 400 on a bad query, 503."""
        q = request.query
        try:
            _known(q, _JOBS_PARAMS)
            limit = _whole(q, "limit", 1, 1 << 20)
            page = await open_jobs_page(
                self.r, self.keys, self.settings, _single(q, "cursor") or None, limit or DEFAULT_LIMIT
            )
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(page), content_type="application/json")

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, _request: web.Request) -> web.Response:
        try:
            doc = await self.status_doc()
        except TransientError as exc:
            return web.Response(text=f"# status unavailable: {exc}\n", status=503)
        body = self.metrics.render(doc, sse_clients=self.sse_clients)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _recent(self, request: web.Request) -> web.Response:
        """Answer the last matching admin events (``GET /events/recent``).

        Returns 200 with the page, 400 on a bad query, 503 when Redis is unavailable.
        """
        q = request.query
        try:
            unknown = sorted(set(q) - _RECENT_PARAMS)
            if unknown:
                known = ", ".join(sorted(_RECENT_PARAMS))
                raise BadInput(f"unknown parameter {unknown[0][:40]!r}; known: {known}")
            types, dataset, job = _filter_query(q)
            limit = _limit(q)
            before = _single(q, "before")
            if before is not None and (before == "$" or not stream_id_ok(before)):
                raise BadInput(f"bad cursor {before[:40]!r}: use the cursor of an earlier answer (ms-seq)")
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)

        def match(ev: AdminEvent) -> bool:
            return event_matches(ev, types=types, dataset=dataset, job=job)

        try:
            page = await read_admin_recent(
                self.r, self.keys, limit=limit, scan=RECENT_SCAN, match=match, before=before
            )
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        doc = {
            "events": [{"id": i.decode(), "event": ev} for i, ev in page.events],
            "head": None if page.head is None else page.head.decode(),
            "cursor": None if page.cursor is None else page.cursor.decode(),
            "scanned": page.scanned,
        }
        return web.Response(body=msgspec.json.encode(doc), content_type="application/json")

    async def _job(self, request: web.Request) -> web.Response:
        """Answer the job page (``GET /jobs/{job}``).

        Returns 200 with the page, 400 on a bad name or query, 404 for a job no
        shard knows, 503 when Redis is unavailable.
        """
        q = request.query
        try:
            _known(q, _JOB_PARAMS)
            limit = _whole_or(q, "limit", PAGE_DEFAULT, 1, 1000)
            events = _whole_or(q, "events", EVENTS_DEFAULT, 0, 100)
            doc = await job_page(
                self.r,
                self.keys,
                self.settings,
                request.match_info["job"],
                cursor=_single(q, "cursor"),
                limit=limit,
                events=events,
            )
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except NotFound as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(doc), content_type="application/json")

    async def _dataset(self, request: web.Request) -> web.Response:
        """Answer the dataset page (``GET /datasets/{name}``).

        Returns 200 with the page, 400 on a bad name or query, 404 for a dataset
        nothing is known of, 503 when Redis or the store is unavailable.
        """
        q = request.query
        try:
            _known(q, _DATASET_PARAMS)
            commits = _whole_or(q, "commits", 10, 1, 100)
            doc = await dataset_page(
                self.r,
                self.keys,
                self.settings,
                request.match_info["name"],
                store=self.store,
                commits=commits,
            )
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except NotFound as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except (TransientError, OutcomeUnknown) as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(doc), content_type="application/json")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        c = self.settings.coordinator
        if self.sse_clients >= c.sse_max_clients:
            return web.json_response(
                {"error": f"too many event-stream clients ({c.sse_max_clients})"},
                status=503,
                headers={"Retry-After": "5"},
            )
        self.sse_clients += 1
        try:
            return await self._stream(request)
        finally:
            self.sse_clients -= 1

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        """Serve one event stream until its client goes (cancelled) or Redis fails (the stream ends)."""
        c = self.settings.coordinator
        q = request.query
        try:
            types, dataset, job = _filter_query(q)
        except BadInput as exc:
            return web.json_response({"error": str(exc)}, status=400)
        start = request.headers.get("Last-Event-ID") or q.get("from", "$")
        if not stream_id_ok(start):
            error = f"bad stream id {start[:40]!r}: use $, 0 or ms-seq"
            return web.json_response({"error": error}, status=400)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(b"retry: 3000\n\n")
        # A blocking read must end before the Redis client's socket timeout.
        block_ms = int(min(c.sse_keepalive, self.settings.redis.socket_timeout / 2) * 1000)
        last_write = time.monotonic()
        try:
            with redis_errors("XREVRANGE admin"):
                if start == "$":
                    newest: Any = await self.r.xrevrange(self.keys.admin, count=1)
                    start = newest[0][0].decode() if newest else "0-0"
            while True:
                start, events = await self._read_admin(start, block_ms)
                out: list[bytes] = []
                for entry_id, ev in events:
                    if event_matches(ev, types=types, dataset=dataset, job=job):
                        tag = str(type(ev).__struct_config__.tag)
                        out.append(
                            f"id: {entry_id}\nevent: {tag}\ndata: {encode_admin(ev).decode()}\n\n".encode()
                        )
                now = time.monotonic()
                if not out and now - last_write >= c.sse_keepalive:
                    out.append(b": keep-alive\n\n")
                if out:
                    await resp.write(b"".join(out))
                    last_write = now
        except TransientError as exc:
            log.warning("event stream ended: Redis unavailable", extra=kv(error=str(exc)))
        except ConnectionResetError:
            pass  # the client went away between two writes
        return resp


def _single(q: Any, name: str) -> str | None:
    """Return query parameter ``name`` (None when absent).

    Raises:
        BadInput: given more than once.
    """
    values = q.getall(name, [])
    if len(values) > 1:
        raise BadInput(f"give {name} once")
    return str(values[0]) if values else None


def _known(q: Any, params: frozenset[str]) -> None:
    """Return None when every parameter of ``q`` is one of ``params``.

    Raises:
        BadInput: one is not (named, with the known ones).
    """
    unknown = sorted(set(q) - params)
    if unknown:
        raise BadInput(f"unknown parameter {unknown[0][:40]!r}; known: {', '.join(sorted(params))}")


def _whole(q: Any, name: str, low: int, high: int) -> int | None:
    """Return the query's whole number ``name`` (None when absent or empty).

    Raises:
        BadInput: not a whole number from ``low`` to ``high``, or given twice.
    """
    text = _single(q, name)
    if not text:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and low <= int(text) <= high):
        raise BadInput(f"{name} {text[:40]!r}: give a whole number from {low} to {high}")
    return int(text)


def _whole_or(q: Any, name: str, default: int, low: int, high: int) -> int:
    """Return the query's whole number ``name``, ``default`` when absent or empty.

    Raises:
        BadInput: not a whole number from ``low`` to ``high``, or given twice.
    """
    value = _whole(q, name, low, high)
    return default if value is None else value


def _filter_query(q: Any) -> tuple[set[str], str | None, str | None]:
    """Return the event filter of a query: (types, dataset, job); empty/None = no filter.

    ``type`` may repeat or list types with commas; ``dataset`` and ``job`` are
    given once, as names an event can carry (an empty value = no filter).

    Raises:
        BadInput: an unknown type, a bad name, a repeated dataset or job.
    """
    types = event_types(q.getall("type", []))
    dataset, job = _single(q, "dataset") or None, _single(q, "job") or None
    filter_names(dataset, job)
    return types, dataset, job


def _limit(q: Any) -> int:
    """Return the query's ``limit`` (default RECENT_DEFAULT).

    Raises:
        BadInput: not a whole number from 1 to RECENT_MAX.
    """
    text = _single(q, "limit")
    if text is None:
        return RECENT_DEFAULT
    if not (text.isascii() and text.isdigit() and len(text) <= 6 and 1 <= int(text) <= RECENT_MAX):
        raise BadInput(f"limit {text[:40]!r}: give a whole number from 1 to {RECENT_MAX}")
    return int(text)
