"""The OpenAI-Realtime-compatible HTTP surface (GA shape), so a client written for the
OpenAI Realtime API over WebRTC works against the appliance by changing its base URL
(DESIGN.md "HTTP", issue 17 item 1).

===========================================  ================================================  =====
route                                         what                                              auth
===========================================  ================================================  =====
POST   /v1/realtime/client_secrets            mint an ``ek_…`` client secret + its session      api
                                              (+ ``ice_servers``, our extension)
POST   /v1/realtime/calls[?dcid=N]            SDP offer (raw or multipart) -> 201 + answer      call
GET    /v1/realtime/calls/{call_id}           the call: state, session config, media stats      call
DELETE /v1/realtime/calls/{call_id}           hang up (also ``POST …/{call_id}/hangup``)        call
GET    /v1/realtime/calls/{call_id}/recording the call's recording (stereo WAV; recordings.md)  api
GET    /v1/realtime?model=…  (WebSocket)      a Realtime session over the socket (realtime_ws)  call
===========================================  ================================================  =====

"api" is the API token (on a non-loopback bind, as ``/v1/client_tokens``); "call" also
accepts an ``ek_`` client secret, which may create calls and then see and end only the calls
it created. An ``ek_`` secret is checked even on loopback, where no token is needed: it
carries the session config its minter gave, and a client that presents an expired one must
hear so rather than silently get defaults.

**Client secrets** are the signaling client tokens (signaling/tokens.py) with the prefix
``ek_`` (inside the MAC, so a ``ct1.`` token never passes as one) and the scope
``realtime.calls``. The session config a secret was minted with lives in a bounded table
keyed by the token's ``jti`` (:class:`SecretTable`); a secret whose entry is gone (signaling
restarted, or :data:`MAX_SECRETS` newer ones pushed it out) is refused as expired.

**Calls** are ordinary appliance sessions (ids ``rtc_…``) whose agent is the configured
realtime agent (``--realtime-agent``, default ``realtime``; a full-rights caller may pick
another with ``?agent=``/``X-Agent``, at mint time or per call). The agent gets
``ctx.params["realtime"] = {"session": {...}, "dcid": N | None, "call_id": "rtc_…"}``
(TEAM.md contract): ``session`` is the secret's config with the call's own ``session`` field
(multipart) merged over it, as OpenAI lets "the client connection" override the secret's
config; ``dcid`` asks for the pre-negotiated ``oai-events`` channel (RFC 8832 §6: both sides
open stream ``dcid`` without DCEP, so the channel adds no round trip).

**Errors** on these routes only are OpenAI's error object, ``{"error": {"message", "type",
"code", "param"}}`` (what the OpenAI SDKs parse); the rest of the API keeps problem+json
(RFC 9457). **CORS**: any origin (bearer tokens, never cookies); a preflight may send
``Authorization``, ``Content-Type`` and ``X-OpenAI-Agents-SDK``; ``Location`` is exposed so
a page can read the call id.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from appliance import recordings

from .ice_servers import ice_servers, link_headers
from .problems import Problem
from .rules import (
    SDP,
    authorize_header,
    check_agent,
    check_body_headers,
    decode_body,
    http_problem,
)
from .state import SignalingState
from .tokens import ClientClaims, TokenError
from .webhooks import CALL_ENDED, CALL_STARTED, end_report, recording_link

EK_PREFIX = "ek_"
SCOPE_CALLS = "realtime.calls"
CALL_PREFIX = "rtc_"
MULTIPART = "multipart/form-data"
#: OpenAI's bounds for ``expires_after.seconds`` (10 s .. 2 h, default 10 min).
SECRET_TTL_DEFAULT, SECRET_TTL_MIN, SECRET_TTL_MAX = 600, 10, 7200
MAX_SECRETS = 10_000  # outstanding secrets' session configs kept (oldest forgotten past this)
MAX_CALLS = 10_000  # calls whose session config GET can still show
MAX_DCID = 65534  # SCTP stream ids are 0..65534 (RFC 8831 §6.5: 65535 is reserved)
_CORS_ALLOW = "Authorization, Content-Type, X-OpenAI-Agents-SDK, X-Agent, OpenAI-Beta"
_CORS_METHODS = "GET, POST, DELETE, OPTIONS"
EXTENSION = "appliance.realtime"


# -- errors ---------------------------------------------------------------------------------


class RealtimeProblem(Problem):
    """A :class:`Problem` that also names the request field at fault (OpenAI's ``param``)."""

    def __init__(self, status: int, code: str, detail: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, code, detail, headers)
        self.param = param


def error_body(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error object. 401s carry ``invalid_api_key``, the code the OpenAI SDKs and
    sample pages key on; the appliance's own code stays in ``message``'s company."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    if status == 401:
        code = "invalid_api_key"
    return {"error": {"message": message, "type": kind, "code": code, "param": param}}


def error_response(p: Problem) -> Response:
    param = p.param if isinstance(p, RealtimeProblem) else None
    resp = Response(json.dumps(error_body(p.status, p.code, p.detail, param)), status=p.status,
                    content_type="application/json")
    for k, v in p.headers.items():
        resp.headers[k] = v
    return resp


Route = Callable[..., Awaitable[Response]]


def openai_errors(max_body: int) -> Callable[[Route], Route]:
    """Answer every Problem and werkzeug HTTP error a route raises in OpenAI's shape."""

    def wrap(fn: Route) -> Route:
        @functools.wraps(fn)
        async def route(*args: Any, **kwargs: Any) -> Response:
            try:
                return await fn(*args, **kwargs)
            except Problem as p:
                return error_response(p)
            except HTTPException as exc:  # 413 from the body limit, 400 from form parsing
                return error_response(http_problem(exc, max_body))

        return route

    return wrap


# -- client secrets ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Secret:
    """What an ``ek_`` secret was minted with."""

    exp: float
    session: dict[str, Any]  # the config as requested (the agent applies defaults)
    agent: str | None  # picked by the (full-rights) minter; None: --realtime-agent


class SecretTable:
    """``jti -> Secret`` for outstanding secrets, bounded: expired entries are dropped when
    a secret is minted, and past :data:`MAX_SECRETS` the oldest goes first."""

    def __init__(self, limit: int = MAX_SECRETS) -> None:
        self._limit = limit
        self._by_jti: OrderedDict[str, Secret] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_jti)

    def add(self, jti: str, secret: Secret, *, now: float) -> None:
        for old in [j for j, s in self._by_jti.items() if s.exp <= now]:
            del self._by_jti[old]
        self._by_jti[jti] = secret
        while len(self._by_jti) > self._limit:
            self._by_jti.popitem(last=False)

    def get(self, jti: str) -> Secret | None:
        return self._by_jti.get(jti)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_expires_after(value: object) -> int:
    """``expires_after`` -> seconds of life (OpenAI: anchor ``created_at``, 10..7200)."""
    if value is None:
        return SECRET_TTL_DEFAULT
    if not isinstance(value, dict):
        raise RealtimeProblem(400, "invalid_type", "expires_after must be an object",
                              "expires_after")
    anchor = value.get("anchor", "created_at")
    if anchor != "created_at":
        raise RealtimeProblem(400, "invalid_value", "expires_after.anchor must be 'created_at'",
                              "expires_after.anchor")
    seconds = value.get("seconds", SECRET_TTL_DEFAULT)
    if (not _is_int(seconds) and not (isinstance(seconds, float) and seconds.is_integer())) \
            or not SECRET_TTL_MIN <= seconds <= SECRET_TTL_MAX:
        raise RealtimeProblem(400, "invalid_value", "expires_after.seconds must be an integer "
                              f"{SECRET_TTL_MIN}..{SECRET_TTL_MAX}", "expires_after.seconds")
    return int(seconds)


def check_session(value: object, param: str = "session") -> dict[str, Any]:
    """A session config as a client sends it: an object, a realtime one. Its fields are the
    event state machine's to validate (it answers ``session.update`` the same way); here
    only what decides whether this surface can serve it at all."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RealtimeProblem(400, "invalid_type", f"{param} must be an object", param)
    kind = value.get("type", "realtime")
    if kind != "realtime":
        raise RealtimeProblem(400, "unsupported_session_type",
                              f"{param}.type {kind!r} is not served here (only 'realtime')",
                              f"{param}.type")
    return value


def merge_session(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``, objects merged key by key (a call's ``audio.output.voice``
    keeps the secret's ``audio.input``), anything else replaced."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_session(out[k], v)
        else:
            out[k] = v
    return out


def _turn_detection_defaults() -> dict[str, Any]:
    return {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
            "silence_duration_ms": 200, "idle_timeout_ms": None, "create_response": True,
            "interrupt_response": True}


def effective_session(session: dict[str, Any], *, expires_at: int = 0) -> dict[str, Any]:
    """The GA session object ``client_secrets`` answers with (OpenAI's fields and defaults:
    ``type`` realtime, ``object`` realtime.session, PCM 24 kHz both ways, server VAD, voice
    alloy), with what the caller set merged over it; unknown fields are kept."""
    pcm = {"type": "audio/pcm", "rate": 24000}
    defaults: dict[str, Any] = {
        "type": "realtime",
        "object": "realtime.session",
        "id": "sess_" + secrets.token_hex(12),
        "model": "appliance-realtime",
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "include": None,
        "expires_at": expires_at,
        "audio": {
            "input": {"format": dict(pcm), "transcription": None, "noise_reduction": None,
                      "turn_detection": _turn_detection_defaults()},
            "output": {"format": dict(pcm), "voice": "alloy", "speed": 1.0},
        },
    }
    return merge_session(defaults, session)


# -- who is calling ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    full_rights: bool  # the API token, or loopback without an ek_ secret
    claims: ClientClaims | None  # an ek_ secret's claims
    secret: Secret | None

    @property
    def owner(self) -> str | None:
        return self.claims.jti if self.claims is not None else None


class Realtime:
    """The routes' state: the secrets table, the calls' configs, the ek_ token codec."""

    def __init__(self, state: SignalingState) -> None:
        self.state = state
        self.tokens = state.tokens.with_prefix(EK_PREFIX)
        self.secrets = SecretTable()
        self.calls: OrderedDict[str, dict[str, Any]] = OrderedDict()
        # the ends of WebRTC calls nobody hung up through the API (the caller left, the
        # agent hung up), as the transceivers' ``events`` tell them (call_events.py)
        state.call_events.on_ended.append(self.call_ended_if_done)

    def caller(self, authorization: str) -> Caller:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token.startswith(EK_PREFIX):
            invalid = {"WWW-Authenticate": 'Bearer realm="appliance", error="invalid_token"'}
            try:
                claims = self.tokens.verify_untrusted(token, now=self.state.clock())
            except TokenError as exc:
                raise RealtimeProblem(401, f"token-{exc.reason}",
                                      f"the client secret is not valid: {exc}",
                                      headers=invalid) from None
            secret = self.secrets.get(claims.jti)
            if SCOPE_CALLS not in claims.scope or secret is None:
                raise RealtimeProblem(401, "token-expired", "the client secret is no longer "
                                      "known here (expired, or signaling restarted)",
                                      headers=invalid)
            return Caller(False, claims, secret)
        # Not a client secret: the API token (or nothing, on loopback). A ct1. client token
        # is for /v1/sessions only: authorize_header answers it 403 here.
        authorize_header(self.state, authorization, sessions=False)
        return Caller(True, None, None)

    # -- webhooks (webhooks.py): call started / ended ---------------------------------------

    def call_started(self, call_id: str, *, transport: str, agent: str | None,
                     model: Any) -> None:
        hooks = self.state.webhooks
        if not hooks.queue.endpoints:
            return
        data = {"call_id": call_id, "transport": transport, "agent": agent,
                "model": model if isinstance(model, str) else None}
        if transport == "webrtc":
            hooks.pending_calls[call_id] = data
        hooks.emit(CALL_STARTED, data)

    def call_ended_if_done(self, call_id: str) -> bool:
        """The ended event of a WebRTC call whose record says it ended (or is gone)."""
        hooks = self.state.webhooks
        data = hooks.pending_calls.get(call_id)
        if data is None:
            return False
        rec = self.state.registry.get(call_id)
        if rec is not None and not rec.ended:
            return False
        del hooks.pending_calls[call_id]
        view = rec.view() if rec is not None else {}
        now = self.state.clock()
        started = rec.created_at if rec is not None else now
        ended = rec.ended_at if rec is not None and rec.ended_at is not None else now
        hooks.emit(CALL_ENDED, {**data, "report": end_report(
            started_at=started, ended_at=ended,
            reason=rec.end_reason or "gone" if rec is not None else "gone", session=view,
            recording=recording_link(call_id, view.get("media")))})
        return True

    def remember_call(self, call_id: str, session: dict[str, Any]) -> None:
        self.calls[call_id] = session
        while len(self.calls) > MAX_CALLS:
            self.calls.popitem(last=False)


def parse_dcid(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isascii() or not value.isdigit() or not 0 <= int(value) <= MAX_DCID:
        raise RealtimeProblem(400, "invalid_value",
                              f"dcid must be a data channel stream id 0..{MAX_DCID}", "dcid")
    return int(value)


def _json_object(raw: bytes | str, param: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RealtimeProblem(400, "invalid_json", f"{param} is not JSON: {exc}", param) from None


# -- routes -----------------------------------------------------------------------------------


def register(app: QuartTrio, state: SignalingState) -> None:
    """Add the Realtime routes and their CORS to the signaling app (one line in app.py,
    called before app.py's own ``after_request``, so this one runs after it and has the
    last word on these paths' CORS headers)."""
    rt = Realtime(state)
    app.extensions[EXTENSION] = rt
    errors = openai_errors(state.config.max_body)

    @app.after_request
    async def _realtime_cors(resp: Response) -> Response:
        if request.path.startswith("/v1/realtime/"):
            resp.headers["Access-Control-Allow-Origin"] = "*"
            exposed = resp.headers.get("Access-Control-Expose-Headers", "")
            if "Location" not in exposed:
                resp.headers["Access-Control-Expose-Headers"] = ", ".join(
                    h for h in (exposed, "Location") if h)
            if request.method == "OPTIONS":
                resp.headers["Access-Control-Allow-Methods"] = _CORS_METHODS
                resp.headers["Access-Control-Allow-Headers"] = _CORS_ALLOW
                resp.headers["Access-Control-Max-Age"] = "600"
        return resp

    def picked_agent(caller: Caller) -> str | None:
        """``?agent=`` / ``X-Agent``: honoured for a full-rights caller only."""
        asked = request.args.get("agent") or request.headers.get("X-Agent") or None
        if asked is not None and not caller.full_rights:
            raise RealtimeProblem(403, "insufficient_permissions", "only the API token may "
                                  "pick the agent; a client secret uses the one it was "
                                  "minted with", "agent")
        try:
            return check_agent(asked)
        except Problem as p:
            raise RealtimeProblem(p.status, p.code, p.detail, "agent") from None

    @app.post("/v1/realtime/client_secrets")
    @errors
    async def client_secrets() -> Response:
        caller = rt.caller(request.headers.get("Authorization", ""))
        if not caller.full_rights:
            raise RealtimeProblem(403, "insufficient_permissions",
                                  "a client secret cannot mint client secrets")
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        body: Any = {}
        if raw.strip():
            if request.mimetype != "application/json":
                raise RealtimeProblem(415, "unsupported_media_type",
                                      "Content-Type must be application/json")
            body = _json_object(raw, "body")
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise RealtimeProblem(400, "invalid_type", "the body must be a JSON object")
        ttl = parse_expires_after(body.get("expires_after"))
        session = check_session(body.get("session"))
        agent = picked_agent(caller)
        now = state.clock()
        value, claims = rt.tokens.mint(now=now, ttl=ttl, scope=(SCOPE_CALLS,))
        rt.secrets.add(claims.jti, Secret(exp=claims.exp, session=session, agent=agent), now=now)
        expires_at = math.floor(claims.exp)
        # Our extension (docs/realtime.md): the TURN servers for the call this secret
        # places, as RTCIceServer objects, valid from the secret's last moment on.
        resp = Response(json.dumps({"value": value, "expires_at": expires_at,
                                    "session": effective_session(session),
                                    "ice_servers": ice_servers(state.config.turn, now,
                                                               valid_for=ttl)}),
                        status=200, content_type="application/json")
        resp.headers["Cache-Control"] = "no-store"
        return resp

    async def read_offer() -> tuple[str, dict[str, Any]]:
        """(offer SDP, the call's own session config) from a raw or a multipart body."""
        if request.mimetype == MULTIPART:
            check_body_headers(MULTIPART, request.content_length, MULTIPART, state.config.max_body)
            form = await request.form
            files = await request.files
            sdp: str | None = form.get("sdp")
            if sdp is None and "sdp" in files:
                sdp = decode_body(files["sdp"].read(), SDP)
            if not sdp or not sdp.strip():
                raise RealtimeProblem(400, "missing_required_parameter",
                                      "the multipart body needs an 'sdp' field", "sdp")
            raw_session: str | bytes | None = form.get("session")
            if raw_session is None and "session" in files:
                raw_session = files["session"].read()
            session = {} if raw_session is None else check_session(
                _json_object(raw_session, "session"))
            return sdp, session
        try:
            check_body_headers(request.mimetype, request.content_length, SDP,
                               state.config.max_body)
        except Problem as p:
            if p.status == 415:
                raise RealtimeProblem(415, "unsupported_media_type", "Content-Type must be "
                                      f"{SDP} or {MULTIPART}", headers=p.headers) from None
            raise
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        return decode_body(raw, SDP), {}

    @app.post("/v1/realtime/calls")
    @errors
    async def create_call() -> Response:
        caller = rt.caller(request.headers.get("Authorization", ""))
        agent = picked_agent(caller)
        dcid = parse_dcid(request.args.get("dcid"))
        offer, call_session = await read_offer()
        base = caller.secret.session if caller.secret is not None else {}
        session = merge_session(base, call_session)
        if agent is None and caller.secret is not None:
            agent = caller.secret.agent
        agent = agent or state.config.realtime_agent

        def params(call_id: str) -> dict[str, Any]:
            return {"realtime": {"session": session, "dcid": dcid, "call_id": call_id}}

        rec, answer = await state.create_session(offer, agent, caller.owner, params=params,
                                                 id_prefix=CALL_PREFIX)
        rt.remember_call(rec.id, session)
        rt.call_started(rec.id, transport="webrtc", agent=agent, model=session.get("model"))
        resp = Response(answer, status=201, content_type=SDP)
        resp.headers["Location"] = f"/v1/realtime/calls/{rec.id}"
        resp.headers["Cache-Control"] = "no-store"
        for link in link_headers(state.config.turn, state.clock()):  # as WHIP's 201
            resp.headers.add("Link", link)
        return resp

    def own_call(call_id: str, caller: Caller) -> Any:
        rec = state.registry.get(call_id) if call_id.startswith(CALL_PREFIX) else None
        if rec is None:
            raise RealtimeProblem(404, "call_not_found", f"no realtime call {call_id!r}",
                                  "call_id")
        if caller.claims is not None and rec.owner != caller.claims.jti:
            raise RealtimeProblem(403, "insufficient_permissions",
                                  "this client secret did not create this call")
        return rec

    @app.get("/v1/realtime/calls/<call_id>")
    @errors
    async def get_call(call_id: str) -> Response:
        rec = own_call(call_id, rt.caller(request.headers.get("Authorization", "")))
        view = await state.get_session(rec.id)
        body = {
            "id": rec.id,
            "object": "realtime.call",
            "status": view.get("state"),
            "created_at": math.floor(rec.created_at),
            "agent": rec.agent,
            "session": rt.calls.get(rec.id, {}),
            "media": view,  # the appliance's session object (docs/control-protocol.md)
        }
        return Response(json.dumps(body), status=200, content_type="application/json")

    async def hangup(call_id: str) -> Response:
        rec = own_call(call_id, rt.caller(request.headers.get("Authorization", "")))
        await state.delete_session(rec, "hangup")
        rt.call_ended_if_done(rec.id)
        return Response("", status=200)

    @app.get("/v1/realtime/calls/<call_id>/recording")
    @errors
    async def get_recording(call_id: str) -> Response:
        """The call's recording (docs/recordings.md): the API token only — a client secret
        never reads one, not even of its own call."""
        caller = rt.caller(request.headers.get("Authorization", ""))
        if not caller.full_rights:
            raise RealtimeProblem(403, "insufficient_permissions",
                                  "recordings need the API token")
        directory = state.config.recordings_dir
        if directory is None or not recordings.safe_id(call_id):
            raise RealtimeProblem(404, "recording_not_found",
                                  f"no recording of call {call_id!r}", "call_id")
        try:
            raw = await trio.to_thread.run_sync(recordings.open_finished, directory, call_id)
        except recordings.Unfinished as exc:
            if exc.in_progress:
                raise RealtimeProblem(404, "recording_in_progress",
                                      f"the recording of call {call_id!r} is still being "
                                      "written: it is complete once the call has ended",
                                      "call_id") from None
            raise RealtimeProblem(404, "recording_not_found",
                                  f"no recording of call {call_id!r} (the call was not "
                                  "recorded, or its recording passed the retention "
                                  "period)", "call_id") from None
        f = trio.wrap_file(raw)
        size = os.fstat(f.fileno()).st_size

        async def body() -> Any:
            async with f:
                while data := await f.read(1 << 16):
                    yield data

        resp = Response(body(), status=200, content_type="audio/wav")
        resp.headers["Content-Length"] = str(size)
        resp.headers["Content-Disposition"] = f'attachment; filename="{call_id}.wav"'
        resp.headers["Cache-Control"] = "no-store"
        return resp

    app.add_url_rule("/v1/realtime/calls/<call_id>", "realtime_delete_call",
                     errors(hangup), methods=["DELETE"])
    app.add_url_rule("/v1/realtime/calls/<call_id>/hangup", "realtime_hangup",
                     errors(hangup), methods=["POST"])

    # Any other method on these paths: 405 in OpenAI's shape too (werkzeug's own 405 would
    # reach app.py's problem+json handler).
    async def not_allowed(**_: str) -> Response:
        allowed = {"/v1/realtime/client_secrets": "POST, OPTIONS",
                   "/v1/realtime/calls": "POST, OPTIONS"}.get(request.path)
        if allowed is None:
            allowed = ("POST, OPTIONS" if request.path.endswith("/hangup")
                       else "GET, OPTIONS" if request.path.endswith("/recording")
                       else "GET, DELETE, OPTIONS")
        return error_response(RealtimeProblem(405, "method_not_allowed",
                                              f"{request.method} is not allowed here",
                                              headers={"Allow": allowed}))

    others = ["GET", "PUT", "PATCH", "DELETE"]
    for rule, methods in (("/v1/realtime/client_secrets", others),
                          ("/v1/realtime/calls", others),
                          ("/v1/realtime/calls/<call_id>", ["POST", "PUT", "PATCH"]),
                          ("/v1/realtime/calls/<call_id>/hangup", ["GET", "PUT", "PATCH", "DELETE"]),
                          ("/v1/realtime/calls/<call_id>/recording",
                           ["POST", "PUT", "PATCH", "DELETE"])):
        app.add_url_rule(rule, f"realtime_405_{rule}", not_allowed, methods=methods)
