"""``GET /v1/realtime?model=…``: a Realtime session over a WebSocket, served by signaling.

No RTP is involved — the audio is base64 in the events — so the session runs here, in the
signaling process, not on a transceiver: the same event state machine as the ``oai-events``
channel (appliance/realtime/machine.py, in its WebSocket mode) driven by
:class:`~appliance.realtime.ws_session.RealtimeSocketSession`, answered by the configured
realtime agent (``--realtime-agent``: ``realtime`` — the built-in echo agent — or
``realtime:<module:attr | file.py:attr>``, imported into signaling; a full-rights caller may
pick another with ``?agent=``). docs/realtime.md "The WebSocket endpoint" has the rules.

**Auth**, checked before the upgrade (a refusal is an HTTP answer in OpenAI's error shape):
``Authorization: Bearer <token>`` or, for browsers that cannot set headers, the subprotocol
``openai-insecure-api-key.<token>`` beside ``realtime``. The API token (loopback: nothing)
has full rights; an ``ek_`` client secret (as OpenAI lets a browser open a WebSocket with
one) opens a session with the config it was minted with. Tokens are never logged.

``?call_id=…`` attaches the socket to a live call instead (the sideband:
appliance/signaling/sideband.py; full rights only; docs/realtime.md "Sideband").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from ..agents.loader import AgentError
from ..realtime.agent import factory_for_spec
from ..realtime.interface import RealtimeAgent
from ..realtime.ws_session import (
    CLOSE_SLOW_READER,
    END_CLIENT,
    END_SLOW_READER,
    RealtimeSocketSession,
)
from .problems import Problem
from .realtime_http import Realtime, RealtimeProblem, error_response
from .rules import check_agent
from .sideband import END_CLIENT as END_SIDEBAND_CLIENT
from .sideband import SidebandSocket, attach, close_code
from .sip_http import EXTENSION as SIP_EXTENSION
from .webhooks import CALL_ENDED, CALL_STARTED, end_report

log = logging.getLogger(__name__)
SUBPROTOCOL = "realtime"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
MAX_MODEL = 256
#: Seconds after our close frame to keep reading what the client still had in flight, so
#: its close reply is seen (:func:`close_socket`).
CLOSE_DRAIN = 5.0


async def close_socket(code: int, reason: str) -> None:
    """Close the route's socket with ``code``, then read (and drop) what the client still
    sends until its close reply ends the connection, for at most :data:`CLOSE_DRAIN`.

    hypercorn hands each incoming frame to the app through a queue of 10 and stops reading
    the connection while that queue is full. A route that returned right after its close
    frame left nobody to empty it: a client that had more than 10 frames in flight (a slow
    reader still sending) never had its close reply read, and the TCP connection stayed
    open until the *client* gave up (20 s for the websockets client; never for one that
    does not). quart-trio cancels this read when hypercorn reports the disconnect."""
    await websocket.close(code, reason)
    with trio.move_on_after(CLOSE_DRAIN):
        while True:
            await websocket.receive()


def token_from_subprotocols(protocols: list[str]) -> str | None:
    for p in protocols:
        if p.startswith(KEY_SUBPROTOCOL) and len(p) > len(KEY_SUBPROTOCOL):
            return p[len(KEY_SUBPROTOCOL):]
    return None


class AgentFactories:
    """Spec -> RealtimeAgent factory, resolved once per spec (a file agent is imported once)
    by ``resolve`` (GPT-Live's route wraps the same resolver: live/agent.py)."""

    def __init__(self, resolve: Callable[[str], Callable[[], RealtimeAgent]] = factory_for_spec
                 ) -> None:
        self._resolve = resolve
        self._by_spec: dict[str, Callable[[], RealtimeAgent]] = {}

    def get(self, spec: str) -> Callable[[], RealtimeAgent]:
        factory = self._by_spec.get(spec)
        if factory is None:
            factory = self._resolve(spec)
            if len(self._by_spec) < 64:
                self._by_spec[spec] = factory
        return factory


def register_websocket(app: QuartTrio, rt: Realtime) -> None:
    state = rt.state
    factories = AgentFactories()
    live: dict[str, RealtimeSocketSession] = {}
    app.extensions["appliance.realtime.sockets"] = live

    @app.websocket("/v1/realtime")
    async def realtime_socket() -> Response | None:
        if websocket.args.get("call_id") is not None:
            return await sideband_socket(websocket.args.get("call_id") or "")
        try:
            session, spec = _admit()
            agent = factories.get(spec)()
        except Problem as p:
            return error_response(p)
        except AgentError as exc:
            return error_response(RealtimeProblem(
                500, "agent_not_servable", f"the realtime agent cannot serve a WebSocket "
                f"session: {exc}"))
        protocols = list(websocket.requested_subprotocols)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in protocols else None)
        sess = RealtimeSocketSession(agent, session=session,
                                     on_turn=state.registry.observe_turn)
        live[sess.id] = sess
        log.info("realtime socket %s opened (model %s)", sess.id, session.get("model"))
        data = {"call_id": sess.id, "transport": "websocket", "agent": spec,
                "model": session.get("model")}
        hooks = state.webhooks
        hooks.emit(CALL_STARTED, data)
        started = state.clock()
        reason: str | None = None
        try:
            reason = await sess.run(websocket.receive, websocket.send)
        finally:
            live.pop(sess.id, None)
            reason = reason or END_CLIENT
            log.info("realtime socket %s ended (%s)", sess.id, reason)
            hooks.emit(CALL_ENDED, {**data, "report": end_report(
                started_at=started, ended_at=state.clock(), reason=reason,
                stats=sess.stats.as_dict(), turns=list(sess.turns))})
        if reason == END_SLOW_READER:
            await close_socket(CLOSE_SLOW_READER, "slow reader: events were not read")
        return None

    async def sideband_socket(call_id: str) -> Response | None:
        try:
            att = await attach(rt, call_id, _authorization(), websocket.args,
                               app.extensions.get(SIP_EXTENSION))
        except Problem as p:
            return error_response(p)
        protocols = list(websocket.requested_subprotocols)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in protocols else None)
        log.info("sideband %s attached to %s (%s)", att.sideband_id, att.call_id,
                 "controller" if att.controller else "observer")
        sock = SidebandSocket(att)
        reason = await sock.run(websocket.receive, websocket.send)
        log.info("sideband %s detached (%s)", att.sideband_id, reason)
        if reason != END_SIDEBAND_CLIENT:  # the client's own close needs no answer
            code, text = close_code(reason)
            await close_socket(code, text)
        return None

    def _authorization() -> str:
        authorization = websocket.headers.get("Authorization", "")
        if not authorization:
            token = token_from_subprotocols(list(websocket.requested_subprotocols))
            if token is not None:
                authorization = f"Bearer {token}"
        return authorization

    def _admit() -> tuple[dict[str, Any], str]:
        args = websocket.args
        model = args.get("model")
        if not model:
            raise RealtimeProblem(400, "missing_required_parameter",
                                  "the model query parameter is required", "model")
        if len(model) > MAX_MODEL or not model.isprintable():
            raise RealtimeProblem(400, "invalid_value", "model is not a model name", "model")
        caller = rt.caller(_authorization())
        asked = args.get("agent") or websocket.headers.get("X-Agent") or None
        if asked is not None and not caller.full_rights:
            raise RealtimeProblem(403, "insufficient_permissions", "only the API token may "
                                  "pick the agent", "agent")
        try:
            spec = check_agent(asked)
        except Problem as p:
            raise RealtimeProblem(p.status, p.code, p.detail, "agent") from None
        if spec is None and caller.secret is not None:
            spec = caller.secret.agent
        session: dict[str, Any] = dict(caller.secret.session) if caller.secret else {}
        session.pop("type", None)
        session["model"] = model
        return session, spec or state.config.realtime_agent
