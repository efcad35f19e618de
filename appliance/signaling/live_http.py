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
"""

from __future__ import annotations

import json
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from ..live import store
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
from .rules import check_body_headers
from .webhooks import LIVE_TRANSPORT_CONNECTED

JSON = "application/json"
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
        resolve_untrusted(session, media=True)  # the transceiver resolves it again
    except LiveError as exc:
        raise _problem(exc) from None
    sdp: str = checked["transport"]["sdp"]
    if not sdp.strip():
        raise RealtimeProblem(400, "invalid_value", "transport.sdp must be an SDP offer",
                              "transport.sdp")
    return session, sdp


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
