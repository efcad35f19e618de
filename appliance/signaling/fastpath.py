"""The WHIP hot path, served in front of Quart: ``POST /v1/sessions`` and
``DELETE /v1/sessions/{id}`` straight on ASGI.

Why: with 20 setups at once, signaling's CPU per request is what the last POST of the burst
waits behind (docs/performance.md "Setup time"). Through Quart, each request builds a
request object (werkzeug headers, title-cased copies of every header), pushes app and
request contexts, runs the URL map, wraps the answer in a response object, and runs the
receive loop and the handler as two tasks of a nursery of their own. None of that changes
what the client sees for these two routes, so :class:`WhipFastPath` answers them itself and
hands every other request (and every other method on these paths) to the Quart app
unchanged. It is installed as the app's ``asgi_app``, so the Quart test client goes through
it too and the API tests cover both paths.

Same answers as the Quart routes, byte for byte apart from the ``date`` header: the checks,
their order and their problem details are the functions of rules.py both paths call
(``authorize_header``, ``check_body_headers``, ``decode_body``, ``check_agent``,
``created_headers``, ``http_problem``), then the same :class:`SignalingState` operations;
the response headers come in the order Quart writes them (Content-Type, Content-Length, the
route's own, then CORS), the status counter of ``/metrics`` is counted the same way, an
unexpected exception is logged and answered 500 ``internal`` as Quart's handler does, and a
body that stalls past ``body_timeout`` or grows past ``max_body`` gets the same 408 / 413.

One difference, deliberate: Quart cancels a handler whose client disconnects *after* the
body has arrived. Here the create or delete that is under way completes (and is recorded),
rather than leaving a session on a transceiver that signaling never registered; the client
is gone either way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import trio
import werkzeug.urls  # noqa: F401  (registers the "werkzeug.url_quote" codec error handler)
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout
from werkzeug.http import parse_options_header
from werkzeug.sansio.utils import get_content_length

from .problems import CONTENT_TYPE as PROBLEM_TYPE
from .problems import Problem, problem_body
from .rules import (
    CORS_RESPONSE_HEADERS,
    SDP,
    agent_for,
    authorize_header,
    check_body_headers,
    check_owner,
    created_headers,
    decode_body,
    http_problem,
)
from .state import SignalingState

log = logging.getLogger("appliance.signaling.app")  # where Quart's handler logs bugs

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]  # the Quart app (hypercorn types)

_SESSIONS = "/v1/sessions"
_PREFIX = "/v1/sessions/"
_CORS = [(k.lower().encode(), v.encode()) for k, v in CORS_RESPONSE_HEADERS]
# An empty 200 through Quart: Response("") is text/html with its charset.
_EMPTY_200 = [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", b"0")]


class _Disconnected(Exception):
    """The client went away before its request body was complete."""


class WhipFastPath:
    """ASGI middleware: serves the WHIP create and delete, passes everything else on."""

    def __init__(self, app: ASGIApp, state: SignalingState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "POST" and path == _SESSIONS:
                return await self._serve(scope, receive, send, self._create)
            if method == "DELETE" and path.startswith(_PREFIX):
                sid = path[len(_PREFIX):]
                if sid and "/" not in sid:  # what the route's <sid> matches
                    return await self._serve(scope, receive, send, self._delete)
        try:
            await self.app(scope, receive, send)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # The client hung up while Quart wrote its answer (hypercorn's own race between
            # send_eof and send_all, see _serve): nobody is left to tell. Anything else in
            # the group still propagates to hypercorn's handler and is logged there.
            pass

    async def _serve(self, scope: Scope, receive: Receive, send: Send,
                     handler: Callable[[Scope, dict[str, list[str]], Receive],
                                       Awaitable[tuple[int, list[tuple[bytes, bytes]], bytes]]],
                     ) -> None:
        headers: dict[str, list[str]] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin1").lower(), []).append(value.decode("latin1"))
        try:
            status, out, body = await handler(scope, headers, receive)
        except _Disconnected:
            return  # nobody to answer (Quart, too, answers nothing)
        except Problem as p:
            status, out, body = _problem(p)
        except Exception:
            log.exception("unhandled error in %s %s", scope["method"], scope["path"])
            status, out, body = _problem(Problem(500, "internal", "internal error (logged)"))
        counts = self.state.http_responses
        counts[status] = counts.get(status, 0) + 1
        try:
            await send({"type": "http.response.start", "status": status, "headers": out + _CORS})
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            # The client hung up while its answer was being written (hypercorn closes the
            # stream from another task: BusyResourceError). Nobody is left to tell; through
            # Quart this surfaced as hypercorn's "Error in ASGI Framework" log line.
            return

    async def _read_body(self, headers: dict[str, list[str]], receive: Receive,
                         expected: str) -> str:
        """What app.py's ``read_body`` does through Quart's request object."""
        cfg = self.state.config
        mimetype = parse_options_header(_first(headers, "content-type") or "")[0].lower()
        length = get_content_length(_first(headers, "content-length"),
                                    _first(headers, "transfer-encoding"))
        check_body_headers(mimetype, length, expected, cfg.max_body)
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(cfg.body_timeout) as timer:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise _Disconnected
                if msg["type"] != "http.request":
                    continue
                chunk = bytes(msg.get("body", b""))
                size += len(chunk)
                if size > cfg.max_body:
                    raise http_problem(RequestEntityTooLarge(), cfg.max_body)
                chunks.append(chunk)
                if not msg.get("more_body", False):
                    break
        if timer.cancelled_caught:
            raise http_problem(RequestTimeout(), cfg.max_body)
        return decode_body(b"".join(chunks), expected)

    async def _create(self, scope: Scope, headers: dict[str, list[str]],
                      receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        state = self.state
        claims = authorize_header(state, _first(headers, "authorization") or "", sessions=True)
        offer = await self._read_body(headers, receive, SDP)
        agent = agent_for(_query_arg(scope, "agent") or _first(headers, "x-agent") or None,
                          claims)
        ingress = None
        if state.config.ingress.enabled:
            geo = state.config.ingress
            client = scope.get("client")
            ingress = state.pick_ingress(
                peer=str(client[0]) if client else None,
                forwarded_for=headers.get("x-forwarded-for", []) if geo.trusted_proxies else [],
                region=_first(headers, geo.region_header.lower()) if geo.region_header else None,
            )
        rec, answer = await state.create_session(
            offer, agent, claims.jti if claims else None, ingress=ingress
        )
        body = answer.encode()
        out = [(b"content-type", SDP.encode()), (b"content-length", str(len(body)).encode())]
        out += [(k.lower().encode(), v.encode()) for k, v in created_headers(rec)]
        return 201, out, body

    async def _delete(self, scope: Scope, headers: dict[str, list[str]],
                      receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        claims = authorize_header(self.state, _first(headers, "authorization") or "",
                                  sessions=True)
        rec = self.state.lookup(scope["path"][len(_PREFIX):])
        check_owner(rec, claims)
        await self.state.delete_session(rec)
        return 200, list(_EMPTY_200), b""


def _first(headers: dict[str, list[str]], name: str) -> str | None:
    values = headers.get(name)
    return values[0] if values else None


def _query_arg(scope: Scope, name: str) -> str | None:
    """The first value of ``name`` in the query string, parsed as werkzeug's
    ``request.args`` does."""
    qs: bytes = scope.get("query_string", b"")
    if not qs:
        return None
    for key, value in parse_qsl(qs.decode(), keep_blank_values=True,
                                errors="werkzeug.url_quote"):
        if key == name:
            return value
    return None


def _problem(p: Problem) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    body = json.dumps(problem_body(p.status, p.code, p.detail)).encode()
    out = [(b"content-type", PROBLEM_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in p.headers.items()]
    return p.status, out, body
