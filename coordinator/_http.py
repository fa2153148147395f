"""The admin HTTP API (aiohttp): status JSON, the admin stream as server-sent events, metrics.

Routes:

- ``GET /status``   the fleet's status document (see :func:`fleet_status`)
- ``GET /events``   server-sent events of the admin stream; query ``type``,
  ``dataset``, ``job`` filter; ``from`` (``$`` = from now, ``0`` = replay the
  capped stream) or the ``Last-Event-ID`` header resumes
- ``GET /metrics``  Prometheus text format
- ``GET /healthz``  ``ok``
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import msgspec
import redis.asyncio
from aiohttp import web

from shared import ConfigError, Settings, TransientError
from shared._logging import kv
from shared.events import AdminEvent, Committed, MessageRejected, RecoveryDone, encode_admin
from shared.queue import Keys, follow_admin
from shared.storage import ObjectStore

from ._metrics import Histogram, render_metrics
from ._status import fleet_status

log = logging.getLogger("coordinator.http")


def event_matches(ev: AdminEvent, *, types: set[str], dataset: str | None, job: str | None) -> bool:
    """Return True when ``ev`` passes the filters (empty/None = no filter)."""
    if types and str(type(ev).__struct_config__.tag) not in types:
        return False
    if dataset is not None and getattr(ev, "dataset", None) != dataset:
        return False
    return job is None or getattr(ev, "job", None) == job


# How long one status document answers /status and /metrics requests.
STATUS_CACHE_S = 1.0


class AdminServer:
    """Serves the admin API and aggregates admin events into metrics."""

    def __init__(
        self,
        settings: Settings,
        redis_client: redis.asyncio.Redis,
        keys: Keys,
        store: ObjectStore,
        *,
        coordinator_id: str,
        leading: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.r = redis_client
        self.keys = keys
        self.store = store
        self.coordinator_id = coordinator_id
        self.leading = leading
        self.port: int | None = None
        self.event_counts: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.commit_seconds = Histogram()
        self.recovery_seconds = Histogram()
        self.phase_seconds: dict[str, Histogram] = {}
        self._runner: web.AppRunner | None = None
        # The status document, shared by the requests of STATUS_CACHE_S seconds.
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._status_lock = asyncio.Lock()

    async def start(self) -> None:
        """Bind and serve. Raises ConfigError when the address is unusable."""
        app = web.Application()
        app.add_routes(
            [
                web.get("/status", self._status),
                web.get("/events", self._events),
                web.get("/metrics", self._metrics),
                web.get("/healthz", self._health),
            ]
        )
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        c = self.settings.coordinator
        site = web.TCPSite(self._runner, c.http_host, c.http_port)
        try:
            await site.start()
        except OSError as exc:
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
        """Aggregate admin events into metrics, forever (the owner cancels it)."""
        while True:
            try:
                async for _id, ev in follow_admin(self.r, self.keys, from_id="$", block_ms=500):
                    self._count(ev)
            except TransientError as exc:
                log.warning("admin stream unavailable", extra=kv(error=str(exc)))
                await asyncio.sleep(1.0)

    def _count(self, ev: AdminEvent) -> None:
        self.event_counts[str(type(ev).__struct_config__.tag)] += 1
        if isinstance(ev, Committed):
            self.commit_seconds.observe(ev.duration_s)
            for phase, seconds in ev.phases.items():
                self.phase_seconds.setdefault(phase, Histogram()).observe(seconds)
        elif isinstance(ev, RecoveryDone):
            self.recovery_seconds.observe(ev.duration_s)
        elif isinstance(ev, MessageRejected):
            self.rejections[ev.reason] += 1

    async def _status_doc(self) -> dict[str, Any]:
        """Return the status document, at most STATUS_CACHE_S old.

        Computed from the Redis state the workers keep (quarantines included),
        never by listing the store: a request costs the same at any store size.
        Concurrent requests wait for one computation. Raises TransientError.
        """
        async with self._status_lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < STATUS_CACHE_S:
                return self._cached[1]
            doc = await fleet_status(self.r, self.keys, self.settings)
            doc["coordinator"] = {"id": self.coordinator_id, "leading": self.leading.is_set()}
            self._cached = (time.monotonic(), doc)
            return doc

    async def _status(self, _request: web.Request) -> web.Response:
        try:
            doc = await self._status_doc()
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.Response(body=msgspec.json.encode(doc), content_type="application/json")

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _metrics(self, _request: web.Request) -> web.Response:
        try:
            doc = await self._status_doc()
        except TransientError as exc:
            return web.Response(text=f"# status unavailable: {exc}\n", status=503)
        text = render_metrics(
            doc,
            events=self.event_counts,
            rejections=self.rejections,
            commit_seconds=self.commit_seconds,
            recovery_seconds=self.recovery_seconds,
            phase_seconds=self.phase_seconds,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _events(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        types = {t for t in q.get("type", "").split(",") if t}
        dataset, job = q.get("dataset"), q.get("job")
        start = request.headers.get("Last-Event-ID") or q.get("from", "$")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        async for entry_id, ev in follow_admin(self.r, self.keys, from_id=start, block_ms=1000):
            if not event_matches(ev, types=types, dataset=dataset, job=job):
                continue
            tag = str(type(ev).__struct_config__.tag)
            payload = encode_admin(ev).decode()
            await resp.write(f"id: {entry_id.decode()}\nevent: {tag}\ndata: {payload}\n\n".encode())
        return resp
