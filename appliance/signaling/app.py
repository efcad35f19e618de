"""The HTTP API (DESIGN.md "HTTP"), WHIP semantics per RFC 9725.

==========================  =====================================================  ==========
route                        what                                                   auth
==========================  =====================================================  ==========
POST   /v1/sessions          SDP offer in, 201 + answer, Location, ETag             session
PATCH  /v1/sessions/{id}     trickle-ice-sdpfrag: 204 (trickle) / 200 (ICE restart)  session
DELETE /v1/sessions/{id}     end the session                                        session
GET    /v1/sessions[/{id}]   JSON, live from the transceivers + the registry        api
GET    /v1/events            server-sent events: sessions + health, ~1 s            api
POST   /v1/client_tokens     mint a short-lived browser token (+ ``ice_servers``)   api
GET    /v1/ice_servers       TURN servers + a fresh credential (RTCIceServer list)  session
GET    /metrics              Prometheus text                                         api
GET    /healthz /readyz      liveness / at least one transceiver and relay answer   none
GET    / /demo /<file>       the static web UI from ``webui/``                      none
==========================  =====================================================  ==========

"auth" applies unless signaling is bound to loopback *and* the request's real client is on
this host (a caller spliced in from the media port or forwarded by a proxy is judged by its
own address: proxied.py): ``api`` wants the API token; ``session`` also accepts a client token (and then only for sessions it created).
Every error is ``application/problem+json`` (RFC 9457, see problems.py); bad input is a 4xx,
never a 500.

A 201 to ``POST /v1/sessions`` carries one WHIP ``Link: <turn:…>; rel="ice-server"`` header
per TURN server with a credential minted for it (RFC 9725 §4.6, ice_servers.py).

``POST /v1/sessions`` and ``DELETE /v1/sessions/{id}`` are answered in front of Quart by
fastpath.py (the WHIP hot path, no request contexts); the rules both paths apply are in
rules.py, so the routes below and the fast path cannot drift apart
(tests/signaling/test_fastpath.py compares their answers).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncGenerator
from typing import Any

import trio
from quart import Response, request, send_from_directory
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from . import metrics, sip_http
from . import realtime_http as realtime
from .fastpath import WhipFastPath
from .ice_servers import ice_servers
from .live_http import register_live_http
from .live_ws import register_live_websocket
from .problems import Problem, problem_response
from .proxied import TrustEdge
from .realtime_ws import register_websocket
from .registry import etag_matches, new_etag
from .rules import (
    CORS_RESPONSE_HEADERS,
    SDP,
    SDPFRAG,
    agent_for,
    authorize_header,
    check_agent,
    check_body_headers,
    check_owner,
    created_headers,
    decode_body,
    http_problem,
)
from .state import SignalingState
from .tokens import ClientClaims

log = logging.getLogger(__name__)
_CORS_HEADERS = "Authorization, Content-Type, If-Match, X-Agent"  # a preflight may send these


def create_app(state: SignalingState) -> QuartTrio:
    app = QuartTrio(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = state.config.max_body
    # A body that stalls (slow upload) gets 408 after this, not Quart's 60 s default.
    app.config["BODY_TIMEOUT"] = state.config.body_timeout
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = True
    app.extensions["appliance.state"] = state
    realtime.register(app, state)  # /v1/realtime/*: before _after below, so its CORS wins
    register_websocket(app, app.extensions[realtime.EXTENSION])  # GET /v1/realtime (WebSocket)
    # GET /v1/live/sessions (WebSocket): GPT-Live over the same shell, machine and agents
    register_live_websocket(app, app.extensions[realtime.EXTENSION])
    # POST /v1/live/sessions: GPT-Live over WebRTC, placed as /v1/realtime/calls places calls
    register_live_http(app, app.extensions[realtime.EXTENSION])
    sip_http.register(app, state)  # /v1/realtime/calls/{rtc_sip_…}/accept|reject|refer|hangup

    # -- errors -------------------------------------------------------------------------

    @app.errorhandler(Problem)
    async def _problem(exc: Problem) -> Response:
        return problem_response(exc.status, exc.code, exc.detail, exc.headers)

    @app.errorhandler(HTTPException)
    async def _http_error(exc: HTTPException) -> Response:
        p = http_problem(exc, state.config.max_body)
        return problem_response(p.status, p.code, p.detail, p.headers)

    @app.errorhandler(Exception)
    async def _bug(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem_response(500, "internal", "internal error (logged)")

    @app.after_request
    async def _after(resp: Response) -> Response:
        state.http_responses[resp.status_code] = state.http_responses.get(resp.status_code, 0) + 1
        if request.path.startswith("/v1/"):
            for k, v in CORS_RESPONSE_HEADERS:
                resp.headers[k] = v
            if request.method == "OPTIONS":
                resp.headers["Access-Control-Allow-Methods"] = "GET, POST, PATCH, DELETE, OPTIONS"
                resp.headers["Access-Control-Allow-Headers"] = _CORS_HEADERS
                resp.headers["Access-Control-Max-Age"] = "600"
                if request.path.startswith("/v1/sessions"):
                    resp.headers["Accept-Post"] = SDP
                    resp.headers["Accept-Patch"] = SDPFRAG
        return resp

    # -- auth ---------------------------------------------------------------------------

    def authorize(*, sessions: bool) -> ClientClaims | None:
        """None when the caller has full rights; the claims of a client token otherwise."""
        return authorize_header(state, request.headers.get("Authorization", ""),
                                sessions=sessions)

    async def read_body(expected: str) -> str:
        check_body_headers(request.mimetype, request.content_length, expected,
                           state.config.max_body)
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        return decode_body(raw, expected)

    # -- sessions -----------------------------------------------------------------------

    @app.post("/v1/sessions")
    async def create_session() -> Response:
        claims = authorize(sessions=True)
        offer = await read_body(SDP)
        agent = agent_for(request.args.get("agent") or request.headers.get("X-Agent") or None,
                          claims)
        ingress = None
        if state.config.ingress.enabled:
            geo = state.config.ingress
            client = request.scope.get("client")
            ingress = state.pick_ingress(
                peer=str(client[0]) if client else None,
                forwarded_for=request.headers.getlist("X-Forwarded-For")
                if geo.trusted_proxies else [],
                region=request.headers.get(geo.region_header) if geo.region_header else None,
            )
        rec, answer = await state.create_session(
            offer, agent, claims.jti if claims else None, ingress=ingress
        )
        resp = Response(answer, status=201, content_type=SDP)
        for k, v in created_headers(rec, state):
            resp.headers.add(k, v)  # add: one Link header per TURN server
        return resp

    @app.patch("/v1/sessions/<sid>")
    async def patch_session(sid: str) -> Response:
        claims = authorize(sessions=True)
        rec = state.lookup(sid)
        check_owner(rec, claims)
        sdpfrag = await read_body(SDPFRAG)
        if_match = request.headers.get("If-Match")
        # RFC 9725 §4.3.1: a stale entity-tag gets 412; "*" always matches.
        if if_match is not None and not etag_matches(if_match, rec.etag):
            raise Problem(412, "etag-mismatch",
                          "If-Match does not match the session's current ETag", {"ETag": rec.etag})
        answer = await state.patch_session(rec, sdpfrag)
        if not answer:
            return Response("", status=204)
        # An ICE restart: a new ICE ufrag/pwd, hence a new entity-tag (RFC 9725 §4.3.2).
        rec.etag = new_etag()
        resp = Response(answer, status=200, content_type=SDPFRAG)
        resp.headers["ETag"] = rec.etag
        return resp

    @app.delete("/v1/sessions/<sid>")
    async def delete_session(sid: str) -> Response:
        claims = authorize(sessions=True)
        rec = state.lookup(sid)
        check_owner(rec, claims)
        await state.delete_session(rec)
        return Response("", status=200)

    @app.get("/v1/sessions")
    async def list_sessions() -> Response:
        authorize(sessions=False)
        return json_response({"sessions": await state.list_sessions()})

    @app.get("/v1/sessions/<sid>")
    async def get_session(sid: str) -> Response:
        authorize(sessions=False)
        return json_response(await state.get_session(sid))

    @app.post("/v1/client_tokens")
    async def client_tokens() -> Response:
        authorize(sessions=False)
        ttl = state.config.client_token_ttl
        agent: str | None = None
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        if raw.strip():
            if request.mimetype != "application/json":
                raise Problem(415, "unsupported-media-type",
                              "Content-Type must be application/json (or send no body)")
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise Problem(400, "bad-json", f"the body is not JSON: {exc}") from None
            if body is None:
                body = {}
            if not isinstance(body, dict):
                raise Problem(400, "bad-json", "the body must be a JSON object")
            if "ttl" in body:
                ttl_in = body["ttl"]
                if (
                    isinstance(ttl_in, bool)
                    or not isinstance(ttl_in, int | float)
                    or not math.isfinite(ttl_in)
                    or not 1 <= ttl_in <= state.config.client_token_max_ttl
                ):
                    raise Problem(400, "bad-ttl", "ttl must be a number of seconds, 1.."
                                  f"{state.config.client_token_max_ttl:g}")
                ttl = float(ttl_in)
            if body.get("agent") is not None:
                if not isinstance(body["agent"], str):
                    raise Problem(400, "bad-agent", "agent must be a string")
                # The minter has full rights (above): it may choose the agent the token's
                # sessions get, as it could have created the session itself.
                agent = check_agent(body["agent"] or None)
        now = state.clock()
        token, claims = state.tokens.mint(now=now, ttl=ttl, agent=agent)
        # The TURN servers the call this token places may use (ice_servers.py): their
        # credential lasts from the token's last moment to a call's length after it.
        resp = json_response(
            {"token": token, "expires_at": claims.exp, "ttl": ttl, "scope": list(claims.scope),
             "ice_servers": ice_servers(state.config.turn, now, valid_for=ttl),
             **({} if agent is None else {"agent": agent})},
            status=201,
        )
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.get("/v1/ice_servers")
    async def get_ice_servers() -> Response:
        """The TURN servers for a call about to be offered (``iceServers`` before the
        offer: the WHIP Link headers come only with the answer). Whoever may create a
        session may ask: loopback, the API token, a client token."""
        authorize(sessions=True)
        now = state.clock()
        servers = ice_servers(state.config.turn, now)
        # The credential's own expiry (its username is "expiry:id"); null without TURN.
        expires = int(str(servers[0]["username"]).split(":", 1)[0]) if servers else None
        resp = json_response({"ice_servers": servers, "expires_at": expires})
        resp.headers["Cache-Control"] = "no-store"
        return resp

    # -- dashboard feed, health, metrics --------------------------------------------------

    @app.get("/v1/events")
    async def events() -> Response:
        authorize(sessions=False)

        async def stream() -> AsyncGenerator[bytes, None]:
            yield b"retry: 2000\n\n"
            while True:
                await state.refresh()
                sessions = await state.list_sessions()
                yield sse("sessions", {"sessions": sessions})
                yield sse("health", {"processes": state.health_view()})
                await trio.sleep(state.config.events_interval)

        resp = Response(stream(), status=200, content_type="text/event-stream")
        resp.headers["Cache-Control"] = "no-store"
        resp.headers["X-Accel-Buffering"] = "no"
        resp.timeout = None  # an event stream lasts as long as the dashboard is open
        return resp

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, detail = await state.ready()
        return json_response({"ready": ok, **detail}, status=200 if ok else 503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        authorize(sessions=False)
        await state.refresh()
        await state.list_sessions()  # the sessions' datachannels objects, fresh
        return Response(metrics.render(state, app.extensions.get(sip_http.EXTENSION)),
                        status=200, content_type=metrics.CONTENT_TYPE)

    # -- web UI ---------------------------------------------------------------------------

    async def static_file(name: str, *, page: bool = False) -> Response:
        root = state.config.webui_dir
        if root is None or not root.is_dir() or name.startswith("v1/"):
            if page:
                raise Problem(404, "no-web-ui", "the web UI is not installed")
            raise Problem(404, "not-found", f"nothing at /{name}")
        resp: Response = await send_from_directory(root, name)
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    @app.get("/")
    async def index() -> Response:
        return await static_file("index.html", page=True)

    @app.get("/demo")
    async def demo() -> Response:
        return await static_file("demo.html", page=True)

    @app.get("/<path:name>")
    async def webui_file(name: str) -> Response:
        return await static_file(name)

    # The WHIP create/delete are answered in front of Quart (fastpath.py), through the same
    # rules (rules.py); installed as asgi_app so hypercorn and the test client both use it.
    # Outermost: the trust edge (proxied.py) puts the real client into every request's
    # scope and decides whether it is local before any route or the fast path runs.
    app.asgi_app = TrustEdge(  # type: ignore[method-assign,assignment]
        WhipFastPath(app.asgi_app, state), state.real_clients)
    return app


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json.dumps(obj), status=status, content_type="application/json")


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
