"""``POST /v1/live/sessions``: a GPT-Live session over **WebRTC** (issue 42 item 4), the
JSON call the official SDK's ``client.live.create(session=…, transport={"type": "webrtc",
"sdp": offer})`` makes (``types/live/live_create_params.py``)::

    POST /v1/live/sessions   {"session": MediaSessionConfig, "transport": {"type": "webrtc",
                                                                           "sdp": "<offer>"}}
    201 Created              {"session": {"id": "live_…"},
                              "transport": {"type": "webrtc", "sdp": "<answer>"}}

**One call path**: the call is placed exactly as ``POST /v1/realtime/calls`` places one
(``SignalingState.create_session``: admission, the least loaded transceiver, the same SDP
answer), with the agent spec ``live:<--live-agent>`` (appliance/live/plugin.py) and the
checked ``session`` as ``ctx.params["live"]``: on the transceiver the Realtime call shell
runs GPT-Live's event core (appliance/live/call.py), ``session.started`` going out when the
browser's ``oai-events`` channel opens. The ``live_…`` id is the call's id.

**Auth** as the Live WebSocket (live_ws.py :func:`admit`): the API token (nothing on
loopback); GPT-Live has no ephemeral keys — "the browser's SDP offer goes through your
trusted backend" — so an ``ek_`` or ``ct1.`` token is refused. ``X-Agent`` picks another
agent for a full-rights caller.

**Stored sessions** (issue 42 item 7; appliance/live/store.py): a ``store: true`` call is
recorded by its transceiver (``media.record``) and its shell keeps the conversation in the
recordings directory (``live.store_dir``). ``GET /v1/live/sessions/{id}/content`` is the
recording as GPT-Live serves it (``audio/wav``, 24 kHz stereo, L input, R output) and
``POST /v1/live/sessions/{id}/fork`` (``{"transport": {"type": "webrtc", "sdp"},
"session"?: MediaSessionForkConfig}``) places a new call as the create does, its session
the stored one's with the overrides and the stored conversation as ``input``. Both need
the API token; an id with nothing stored is a 404 naming it.

**Errors** are OpenAI's error object naming the ``param`` (``session.audio.format``: an
unknown field, WebRTC negotiates the codec; ``transport.type``; ``transport.sdp``), from the
same validator as the WebSocket's ``session.start`` (appliance/live/config.py). Any other
method but GET (the WebSocket's) is a 405 in the same shape.

**SIP call control** (issue 42 item 6; the SDK's ``client.live.sessions.accept / reject /
refer / hangup``), on the pending phone call a trunk's INVITE made — its ``session_id`` is
the ``live_sip_…`` id of the ``live.transport.incoming`` webhook (sip_calls.py)::

    POST /v1/live/sessions/{session_id}/accept  {"session": {"type": "live", "model", …}}
    POST /v1/live/sessions/{session_id}/reject  {"status_code": 300..699}
    POST /v1/live/sessions/{session_id}/refer   {"target_uri": "tel:+1…"}
    POST /v1/live/sessions/{session_id}/hangup
    200, empty body

They are :class:`~.sip_calls.SipCalls`' own accept / reject / refer / hangup — the ones
``/v1/realtime/calls/{rtc_sip_…}/…`` run (sip_http.py) — on the same record: the first
accept on either surface wins and the other surface's gets 409
``call_accepted_on_other_surface``. The answering agent is ``X-Agent`` (a full-rights
caller's pick) or ``--live-agent``, behind GPT-Live's event core as a WebRTC session's is
(agent spec ``live:<agent>``, the checked ``session`` and the ``live_sip_…`` id as
``ctx.params["live"]``: appliance/live/call.py) on the phone leg, so the session has a
sideband (``GET /v1/live/sessions/{live_sip_…}/attach``, sideband.py) with the caller's
DTMF and ``transport.dtmf.send``.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from ..live import store
from ..live.backend import Backend
from ..live.config import fork_untrusted, resolve_untrusted
from ..live.plugin import agent_spec
from ..live.schema import (
    AnyJson,
    Const,
    LiveError,
    Obj,
    Str,
    optional,
    required,
    validate_untrusted,
)
from .live_ws import ROUTE, admit, stored_session
from .problems import Problem
from .realtime_http import Realtime, RealtimeProblem, error_response, openai_errors
from .rules import authorize_header, check_agent, check_body_headers
from .sip_call import CallError
from .sip_calls import LIVE, SipCalls
from .sip_http import EXTENSION as SIP_EXTENSION
from .webhooks import LIVE_TRANSPORT_CONNECTED

JSON = "application/json"
MAX_SIP_BODY = 64 * 1024  # a SIP call-control body (sip_http.py's bound)
SESSION_PREFIX = "live_"
#: The request body (``LiveCreateParams``); ``session`` is resolve_untrusted's to check.
CREATE = Obj({"session": required(AnyJson()),
              "transport": required(Obj({"type": required(Const("webrtc")),
                                         "sdp": required(Str())}))})


#: The body of a WebRTC fork (``SessionForkParams``); ``session`` is fork_untrusted's.
FORK = Obj({"session": optional(AnyJson()),
            "transport": required(Obj({"type": required(Const("webrtc")),
                                       "sdp": required(Str())}))})
WAV = "audio/wav"


def _problem(exc: LiveError) -> RealtimeProblem:
    return RealtimeProblem(400, exc.code, exc.message, exc.param)


def parse_create_untrusted(raw: bytes, fork: dict[str, Any] | None = None
                           ) -> tuple[dict[str, Any], str]:
    """The body of a create (or, with ``fork`` the stored session, of a fork): (the checked
    session config as given, the SDP offer). Raises :class:`RealtimeProblem` (400) naming
    the param."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RealtimeProblem(400, "invalid_json", f"The body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RealtimeProblem(400, "invalid_type", "The body must be a JSON object with "
                              "'session' and 'transport'.")
    try:
        checked = validate_untrusted(CREATE if fork is None else FORK, body, "")
        session = (checked["session"] if fork is None else
                   fork_untrusted(fork, checked.get("session", {}), media=True))
        # the transceiver resolves it again; a Responses delegation needs its --llm
        resolve_untrusted(session, media=True, backend=Backend.from_env() is not None)
    except LiveError as exc:
        raise _problem(exc) from None
    sdp: str = checked["transport"]["sdp"]
    if not sdp.strip():
        raise RealtimeProblem(400, "invalid_value", "transport.sdp must be an SDP offer",
                              "transport.sdp")
    return session, sdp


#: MediaSessionConfig fields a SIP accept's ``session`` does not have (the SDK's
#: ``session_accept_params.Session``): WebRTC's data channel and idle pausing
_NOT_ON_SIP = ("client", "idle_timeout_s", "wake_policy")
SIP_OPS = ("accept", "reject", "refer", "hangup")


def parse_accept_untrusted(raw: bytes) -> dict[str, Any]:
    """The ``session`` of a SIP accept (``{"session": {"type": "live", "model", …}}``),
    checked by the WebRTC POST's validator (no ``audio.format``: SIP negotiates it), without
    its ``type``. Raises :class:`RealtimeProblem` (400) naming the param."""
    body = _json_object_untrusted(raw, "'session'")
    session = body.get("session")
    if not isinstance(session, dict):
        raise RealtimeProblem(400, "missing_required_parameter",
                              "session is required: {'type': 'live', 'model': …}", "session")
    unknown = sorted(set(body) - {"session"})
    if unknown:
        raise RealtimeProblem(400, "unknown_parameter", f"Unknown parameter: '{unknown[0]}'.",
                              unknown[0])
    if session.get("type") != "live":
        raise RealtimeProblem(400, "invalid_value", "session.type must be 'live' (a Realtime "
                              "session is accepted at /v1/realtime/calls/{call_id}/accept)",
                              "session.type")
    config = {k: v for k, v in session.items() if k != "type"}
    for key in _NOT_ON_SIP:
        if key in config:
            raise RealtimeProblem(400, "unknown_parameter", f"Unknown parameter: "
                                  f"'session.{key}' (not a SIP session's).", f"session.{key}")
    try:
        resolve_untrusted(config, media=True, backend=Backend.from_env() is not None)
    except LiveError as exc:
        raise _problem(exc) from None
    return config


def _json_object_untrusted(raw: bytes, what: str) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RealtimeProblem(400, "invalid_json", f"The body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RealtimeProblem(400, "invalid_type", f"The body must be a JSON object with {what}.")
    return body


def parse_reject_untrusted(raw: bytes) -> int:
    """``status_code`` of a SIP reject: required (the SDK's ``SessionRejectParams``),
    300..699."""
    status = _json_object_untrusted(raw, "'status_code'").get("status_code")
    if isinstance(status, bool) or not isinstance(status, int) or not 300 <= status <= 699:
        raise RealtimeProblem(400, "invalid_value", "status_code is required: a SIP status "
                              "300..699", "status_code")
    return status


def parse_refer_untrusted(raw: bytes) -> str:
    """``target_uri`` of a SIP refer: a nonblank URI (the core checks it is SIP or tel)."""
    target = _json_object_untrusted(raw, "'target_uri'").get("target_uri")
    if not isinstance(target, str) or not target.strip() or len(target) > 1024:
        raise RealtimeProblem(400, "invalid_value", "target_uri must be a nonblank SIP or tel "
                              "URI", "target_uri")
    return target


def register_live_http(app: QuartTrio, rt: Realtime) -> None:
    state = rt.state
    errors = openai_errors(state.config.max_body)

    @app.post(ROUTE)
    @errors
    async def create_live_session() -> Response:
        return await _place(None)

    async def _place(fork_of: str | None) -> Response:
        """A create, or a fork of the stored session ``fork_of``: one call path."""
        spec = admit(state, request.headers.get("Authorization", ""),
                     request.headers.get("X-Agent") or None)
        fork = None if fork_of is None else await stored_session(state, fork_of)
        try:
            check_body_headers(request.mimetype, request.content_length, JSON,
                               state.config.max_body)
        except Problem as p:
            if p.status == 415:
                raise RealtimeProblem(415, "unsupported_media_type",
                                      f"Content-Type must be {JSON}") from None
            raise
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        session, offer = parse_create_untrusted(raw, fork)
        directory = state.config.recordings_dir
        stored = bool(session.get("store")) and directory is not None

        def params(session_id: str) -> dict[str, Any]:
            if not stored:
                return {"live": {"session": session}}
            return {"live": {"session": session, "store_dir": str(directory)},
                    "media": {"record": True}}

        rec, answer = await state.create_session(offer, agent_spec(spec), None,
                                                 params=params, id_prefix=SESSION_PREFIX)
        rt.call_started(rec.id, transport="webrtc", agent=spec, model=session["model"])
        if state.webhooks.queue.endpoints:  # GPT-Live's own, beside the family's started
            state.webhooks.emit(LIVE_TRANSPORT_CONNECTED,
                                {"session_id": rec.id, "type": "webrtc"})
        body = {"session": {"id": rec.id}, "transport": {"type": "webrtc", "sdp": answer}}
        resp = Response(json.dumps(body), status=201, content_type=JSON)
        resp.headers["Cache-Control"] = "no-store"
        return resp

    async def not_allowed() -> Response:
        return error_response(RealtimeProblem(405, "method_not_allowed",
                                              f"{request.method} is not allowed here",
                                              headers={"Allow": "POST, GET (WebSocket)"}))

    app.add_url_rule(ROUTE, "live_405", not_allowed, methods=["PUT", "PATCH", "DELETE"])

    # -- SIP call control on a pending phone call (issue 42 item 6) ---------------------------

    async def sip_op(session_id: str, op: str) -> Response:
        authorize_header(state, request.headers.get("Authorization", ""), sessions=False)
        raw = await request.get_data()
        assert isinstance(raw, bytes)
        if len(raw) > MAX_SIP_BODY:
            raise RealtimeProblem(413, "body_too_large", "the body is larger than 64 kB")
        calls = app.extensions.get(SIP_EXTENSION)
        if not isinstance(calls, SipCalls):
            raise RealtimeProblem(404, "session_not_found",
                                  f"no SIP Live session {session_id[:64]!r} (SIP is off)")
        call_id = ""
        try:
            call_id = calls.from_live(session_id)
            if op == "accept":
                config = parse_accept_untrusted(raw)
                try:
                    agent = check_agent(request.headers.get("X-Agent") or None)
                except Problem as p:
                    raise RealtimeProblem(p.status, p.code, p.detail, "agent") from None
                # The Live event core runs the call (live/call.py, as a WebRTC session's
                # does): its session is ctx.params["live"], under the call's Live id; the
                # Realtime shape of the same fields is what the phone session's own
                # stages read (ctx.params["realtime"]).
                session = {"type": "realtime", "model": config["model"]}
                if config.get("instructions"):
                    session["instructions"] = config["instructions"]
                await calls.accept(call_id, session,
                                   agent_spec(agent or state.config.live_agent),
                                   surface=LIVE, params={"live": {
                                       "session": config, "session_id": session_id}})
            elif op == "reject":
                calls.reject(call_id, parse_reject_untrusted(raw))
            elif op == "refer":
                calls.refer(call_id, parse_refer_untrusted(raw))
            else:
                calls.hangup(call_id)
        except CallError as exc:
            code = "session_not_found" if exc.code == "call_not_found" else exc.code
            # a 404 names the id the caller used; a 409 may name the other surface's route
            message = exc.message.replace(call_id, session_id) \
                if call_id and code == "session_not_found" else exc.message
            raise RealtimeProblem(exc.status, code, message) from None
        return Response("", status=200)

    for op in SIP_OPS:
        async def sip_route(session_id: str, op: str = op) -> Response:
            return await sip_op(session_id, op)

        app.add_url_rule(f"{ROUTE}/<session_id>/{op}", f"live_sip_{op}",
                         errors(sip_route), methods=["POST"])

    # -- stored sessions (issue 42 item 7) ---------------------------------------------------

    @app.get("/v1/live/sessions/<session_id>/content")
    @errors
    async def live_content(session_id: str) -> Response:
        """The recording of a stored session (``client.live.sessions.download_recording``)."""
        admit(state, request.headers.get("Authorization", ""), None)
        try:
            wav = await trio.to_thread.run_sync(store.content, state.config.recordings_dir,
                                                session_id)
        except store.NotStored as exc:
            raise RealtimeProblem(404, "recording_in_progress" if exc.in_progress
                                  else "session_not_found", str(exc), "session_id") from None
        resp = Response(wav, status=200, content_type=WAV)
        resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.post("/v1/live/sessions/<session_id>/fork")
    @errors
    async def fork_live_session(session_id: str) -> Response:
        """A WebRTC fork (``client.live.sessions.fork``)."""
        return await _place(session_id)
