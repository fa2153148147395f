"""The web console at ``/ui``: static pages (shipped in the package), login, commit history, actions.

Routes (all but the login page and the static assets behind the admin token,
checked by the server's guard):

- ``GET  /ui``                    the console (plain HTML, JS and CSS; no CDN, no build step)
- ``GET  /ui/login``, ``POST``    the token form; sets an HttpOnly SameSite=Strict session cookie
- ``POST /ui/logout``             clears it
- ``GET  /ui/static/<file>``      the console's assets
- ``GET  /ui/api/commits``        commits per second and latency, per minute, over the last hour
- ``POST /ui/api/retry``, ``/ui/api/skip``  JSON ``{"dataset", "job"}``: queue the operator
  request for a quarantined sequence; the owner acts and reports on the admin
  stream (``operator_action``), which the console shows live

A state-changing request authenticated by the cookie must come from the
console's own origin (``Origin`` header): a cross-site form cannot post.

The console is given what it uses (:class:`ConsoleInputs`: the token, the
commit history, the operator-request writer) by the server that hosts it; it
knows nothing of the server, its Redis client or its settings.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final

import msgspec
from aiohttp import web

from shared import BadInput, NotFound, TransientError
from shared.queue import check_request_names

from ._ui_auth import SESSION_COOKIE, bearer_ok, same_origin, session_value
from ._ui_history import CommitHistory

LOGIN_PATH: Final = "/ui/login"
STATIC_PREFIX: Final = "/ui/static/"
ASSETS: Final = {
    "app.js": "text/javascript",
    "app.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a form post says "Origin: null".
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
OPS: Final = ("retry", "skip")


class _Action(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dataset: str
    job: str


@dataclass(frozen=True)
class ConsoleInputs:
    """What the console is given by the server that hosts it (it reaches for nothing else)."""

    # The admin token ("" = none): the login form checks it and the session cookie is made from it.
    token: str
    # Commits per minute over the last hour (the server feeds it from the admin stream).
    history: CommitHistory
    # Queues an operator request (dataset, job, op) and returns its shard; raises NotFound when
    # the sequence is not quarantined, TransientError when Redis is unavailable.
    queue_request: Callable[[str, str, str], Awaitable[int]]


def _asset(name: str) -> bytes:
    return (resources.files("coordinator.admin") / "ui_static" / name).read_bytes()


def is_public(request: web.Request) -> bool:
    """Return True for the paths served without the token (login page, assets)."""
    return request.path == LOGIN_PATH or request.path.startswith(STATIC_PREFIX)


def wants_page(request: web.Request) -> bool:
    """Return True when an unauthenticated request is a browser asking for the console page."""
    return request.method == "GET" and request.path in ("/ui", "/ui/")


def add_routes(app: web.Application, inputs: ConsoleInputs) -> None:
    """Add the console's routes to ``app``."""
    token = inputs.token

    def page(name: str) -> web.Response:
        return web.Response(
            body=_asset(name), content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
        )

    def cross_site(request: web.Request) -> web.Response | None:
        # A bearer token cannot be added by another site's page; a cookie can be sent by one.
        if (token and bearer_ok(request.headers, token)) or same_origin(request.headers, request.scheme):
            return None
        return web.json_response({"error": "cross-site request refused"}, status=403)

    async def index(_request: web.Request) -> web.Response:
        return page("index.html")

    async def login_form(_request: web.Request) -> web.Response:
        return page("login.html")

    async def login(request: web.Request) -> web.Response:
        if (refused := cross_site(request)) is not None:
            return refused
        form = await request.post()
        given = str(form.get("token", ""))
        if token and not bearer_ok({"Authorization": f"Bearer {given}"}, token):
            raise web.HTTPSeeOther(f"{LOGIN_PATH}?failed=1")
        resp = web.HTTPSeeOther("/ui")
        if token:
            resp.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="Strict", path="/")
        raise resp

    async def logout(request: web.Request) -> web.Response:
        if (refused := cross_site(request)) is not None:
            return refused
        resp = web.HTTPSeeOther(LOGIN_PATH)
        resp.del_cookie(SESSION_COOKIE, path="/")
        raise resp

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in ASSETS:
            raise web.HTTPNotFound()
        return web.Response(
            body=_asset(name), headers={"Content-Type": ASSETS[name], "X-Content-Type-Options": "nosniff"}
        )

    async def commits(_request: web.Request) -> web.Response:
        return web.Response(
            body=msgspec.json.encode(inputs.history.series(time.time())), content_type="application/json"
        )

    async def action(request: web.Request) -> web.Response:
        if (refused := cross_site(request)) is not None:
            return refused
        op = request.match_info["op"]
        try:
            body = msgspec.json.decode(await request.read(), type=_Action)
            check_request_names(body.dataset, body.job)
        except (msgspec.DecodeError, msgspec.ValidationError, BadInput) as exc:
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        # The owner acts under the dataset's lock and reports on the admin stream
        # (operator_action), which the console shows live.
        try:
            shard = await inputs.queue_request(body.dataset, body.job, op)
        except NotFound as exc:  # not quarantined
            return web.json_response({"error": str(exc)}, status=409)
        except TransientError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(
            {"queued": op, "dataset": body.dataset, "job": body.job, "shard": shard}, status=202
        )

    app.add_routes(
        [
            web.get("/ui", index),
            web.get("/ui/", index),
            web.get(LOGIN_PATH, login_form),
            web.post(LOGIN_PATH, login),
            web.post("/ui/logout", logout),
            web.get(STATIC_PREFIX + "{name}", asset),
            web.get("/ui/api/commits", commits),
            web.post(r"/ui/api/{op:(retry|skip)}", action),
        ]
    )


__all__ = ["ASSETS", "LOGIN_PATH", "ConsoleInputs", "add_routes", "is_public", "wants_page"]
