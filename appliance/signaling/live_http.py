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

**Errors** are OpenAI's error object naming the ``param`` (``session.audio.format``: an
unknown field, WebRTC negotiates the codec; ``transport.type``; ``transport.sdp``), from the
same validator as the WebSocket's ``session.start`` (appliance/live/config.py). Any other
method but GET (the WebSocket's) is a 405 in the same shape.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from ..live.config import resolve_untrusted
from ..live.plugin import agent_spec
from ..live.schema import AnyJson, Const, LiveError, Obj, Str, required, validate_untrusted
from .live_ws import ROUTE, admit
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


def _problem(exc: LiveError) -> RealtimeProblem:
    return RealtimeProblem(400, exc.code, exc.message, exc.param)


def parse_create_untrusted(raw: bytes) -> tuple[dict[str, Any], str]:
    """The body of a create: (the checked session config as given, the SDP offer).
    Raises :class:`RealtimeProblem` (400) naming the param."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RealtimeProblem(400, "invalid_json", f"The body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RealtimeProblem(400, "invalid_type", "The body must be a JSON object with "
                              "'session' and 'transport'.")
    try:
        checked = validate_untrusted(CREATE, body, "")
        session = checked["session"]
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
        spec = admit(state, request.headers.get("Authorization", ""),
                     request.headers.get("X-Agent") or None)
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
        session, offer = parse_create_untrusted(raw)

        def params(session_id: str) -> dict[str, Any]:
            return {"live": {"session": session}}

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
