"""HTTP call control for phone calls, the shape of OpenAI's Realtime SIP API (what the
``openai`` SDK's ``client.realtime.calls.accept / reject / refer / hangup`` send).

===============================================  ==========================================
route                                             what
===============================================  ==========================================
POST /v1/realtime/calls/{call_id}/accept          body: a Realtime session config (``type``
                                                  ``realtime``); 200 OK + our SDP to the trunk
POST /v1/realtime/calls/{call_id}/reject          body ``{"status_code": 486}``, default 603
POST /v1/realtime/calls/{call_id}/refer           body ``{"target_uri": "tel:+1…"}``: REFER
POST /v1/realtime/calls/{call_id}/hangup          BYE (603 while ringing)
DELETE /v1/realtime/calls/{call_id}               the same as hangup
GET  /v1/realtime/calls/{call_id}                 the call's state, DTMF digits, REFER progress
POST /v1/realtime/calls/sip                       place a call (sip_outbound.py): body
                                                  ``{"to", "trunk", "agent", "session",
                                                  "headers"}``; 201 + the call (``dialing``)
===============================================  ==========================================

Every route needs full rights (the API token; nothing on a loopback bind): call control is
the application's, never a browser's. ``hangup``, ``DELETE`` and ``GET`` share their paths
with the WebRTC calls of realtime_http.py: a ``before_request`` hook answers SIP call ids
(``rtc_sip_<24 hex>``) and lets every other id fall through to those routes unchanged.
Errors are OpenAI's error object, like the rest of ``/v1/realtime``.
"""

from __future__ import annotations

import json
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from .phone_media import OutboundPhoneMedia, TransceiverPhoneMedia
from .problems import Problem
from .realtime_http import error_body
from .rules import authorize_header, check_agent
from .sip_call import CallError
from .sip_calls import CALL_ID_RE, SipCalls
from .sip_outbound import SipOutbound
from .state import SignalingState

EXTENSION = "appliance.sip"
_PREFIX = "/v1/realtime/calls/"
MAX_BODY = 64 * 1024


def _error(status: int, code: str, message: str, param: str | None = None) -> Response:
    return Response(json.dumps(error_body(status, code, message, param)), status=status,
                    content_type="application/json")


async def _json_body() -> dict[str, Any]:
    raw = await request.get_data()
    assert isinstance(raw, bytes)
    if len(raw) > MAX_BODY:
        raise CallError(413, "body_too_large", "the body is larger than 64 kB")
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise CallError(400, "invalid_json", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise CallError(400, "invalid_type", "the body must be a JSON object")
    return body


def register(app: QuartTrio, state: SignalingState) -> SipCalls | None:
    """The routes, and the :class:`SipCalls` of this app when ``--sip`` is set (serve_sip
    drives it: server.py finds it in ``app.extensions``)."""
    settings = state.config.sip
    # Media on the transceivers (phone_media.TransceiverPhoneMedia); a signaling run with
    # none configured (its own tests) answers SDP only, with no leg behind it.
    media = TransceiverPhoneMedia(state) if state.config.transceivers else None
    calls = SipCalls(state, settings, media=media) if settings is not None else None
    if calls is not None and settings is not None:
        outbound = calls.media if isinstance(calls.media, OutboundPhoneMedia) else None
        calls.outbound = SipOutbound(state, settings.trunks, outbound, clock=calls.clock)
    app.extensions[EXTENSION] = calls
    if calls is not None:
        def hang_up(call_id: str) -> None:  # DELETE /v1/sessions/{id} of a phone call
            try:
                if calls.outbound is not None and calls.outbound.owns(call_id):
                    calls.outbound.hangup(call_id)
                else:
                    calls.hangup(call_id)
            except CallError as exc:
                raise Problem(exc.status, exc.code, exc.message) from None

        state.hang_up_phone = hang_up

    def authorize() -> None:
        authorize_header(state, request.headers.get("Authorization", ""), sessions=False)

    async def run(call_id: str, op: str) -> Response:
        try:
            authorize()
            if calls is None:
                raise CallError(404, "call_not_found", f"no SIP call {call_id} (SIP is off)")
            if op == "accept":
                body = await _json_body()
                kind = body.get("type", "realtime")
                if kind != "realtime":
                    raise CallError(400, "unsupported_session_type",
                                    f"type {kind!r} is not served here (only 'realtime')")
                agent = check_agent(request.args.get("agent")
                                    or request.headers.get("X-Agent") or None)
                await calls.accept(call_id, body, agent)
            elif op == "reject":
                body = await _json_body()
                status = body.get("status_code", 603)
                if isinstance(status, bool) or not isinstance(status, int) \
                        or not 300 <= status <= 699:
                    raise CallError(400, "invalid_value", "status_code must be 300..699")
                calls.reject(call_id, status)
            elif op == "refer":
                body = await _json_body()
                target = body.get("target_uri")
                if not isinstance(target, str) or not 0 < len(target) <= 1024:
                    raise CallError(400, "invalid_value", "target_uri must be a SIP or tel URI")
                calls.refer(call_id, target)
            elif op == "hangup":
                if calls.outbound is not None and calls.outbound.owns(call_id):
                    calls.outbound.hangup(call_id)
                else:
                    calls.hangup(call_id)
            else:  # "get"
                view = calls.outbound.get(call_id).view() \
                    if calls.outbound is not None and calls.outbound.owns(call_id) \
                    else calls.get(call_id).view()
                return Response(json.dumps(view), status=200, content_type="application/json")
        except CallError as exc:
            return _error(exc.status, exc.code, exc.message)
        except Problem as p:
            return _error(p.status, p.code, p.detail)
        return Response("", status=200)

    for op in ("accept", "reject", "refer"):
        async def route(call_id: str, op: str = op) -> Response:
            return await run(call_id, op)

        app.add_url_rule(f"{_PREFIX}<call_id>/{op}", f"sip_{op}", route, methods=["POST"])

    async def place() -> Response:
        try:
            authorize()
            if calls is None or calls.outbound is None:
                raise CallError(404, "sip_off", "SIP is off (--sip HOST:PORT)")
            body = await _json_body()
            to = body.get("to")
            if not isinstance(to, str) or not 0 < len(to) <= 256:
                raise CallError(400, "invalid_value", "to must be a SIP/tel URI or a number")
            trunk = body.get("trunk")
            if trunk is not None and not isinstance(trunk, str):
                raise CallError(400, "invalid_value", "trunk must be a trunk's name")
            agent = body.get("agent", request.args.get("agent") or None)
            if agent is not None and not isinstance(agent, str):
                raise CallError(400, "invalid_value", "agent must be an agent spec")
            agent = check_agent(agent)
            session = body.get("session", {"type": "realtime"})
            if not isinstance(session, dict) or session.get("type", "realtime") != "realtime":
                raise CallError(400, "unsupported_session_type",
                                    "session must be a Realtime session config (type realtime)")
            headers = body.get("headers", {})
            if not isinstance(headers, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
                raise CallError(400, "invalid_headers", "headers must map names to strings")
            call = await calls.outbound.place(to, trunk, agent, session, headers)
        except CallError as exc:
            return _error(exc.status, exc.code, exc.message)
        except Problem as p:
            return _error(p.status, p.code, p.detail)
        return Response(json.dumps(call.view()), status=201, content_type="application/json")

    app.add_url_rule(f"{_PREFIX}sip", "sip_place", place, methods=["POST"])

    @app.before_request
    async def _sip_call_ids() -> Response | None:
        """``…/{rtc_sip_…}/hangup``, ``DELETE``/``GET …/{rtc_sip_…}``: ours; others fall
        through to realtime_http.py."""
        path = request.path
        if not path.startswith(_PREFIX):
            return None
        rest = path[len(_PREFIX):]
        call_id, _, tail = rest.partition("/")
        if not CALL_ID_RE.fullmatch(call_id):
            return None
        method = request.method
        if tail == "hangup" and method == "POST":
            return await run(call_id, "hangup")
        if tail == "" and method == "DELETE":
            return await run(call_id, "hangup")
        if tail == "" and method == "GET":
            return await run(call_id, "get")
        return None

    return calls
