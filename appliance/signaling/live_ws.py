"""``GET /v1/live/sessions``: a GPT-Live session over a WebSocket (issue 42), on the same
host and ``/v1`` as the REST routes, as the official SDK's ``client.live.connect()`` builds
its URL from ``base_url``.

Like ``GET /v1/realtime`` (realtime_ws.py) the session runs here, in signaling — base64
audio in the events, no RTP — on the same shell, machine and agents: the Live protocol
layer (appliance/live/) translates onto them. docs/live.md has the rules.

**Auth**, checked before the upgrade (a refusal is an HTTP answer in OpenAI's error shape):
``Authorization: Bearer <API token>`` (nothing on loopback), or the subprotocol pair
``openai-live`` + ``openai-insecure-api-key.<token>`` for browsers that cannot set
headers (KugelAudio's extension; the Python SDK sends none). GPT-Live has no ephemeral
keys: an ``ek_`` or ``ct1.`` token is refused. A query string is ignored (the SDK sends
none; GPT-Live takes the model in ``session.start``).

**The agent** is ``--live-agent`` (default ``assistant``: the offline assistant);
the caller may pick another with the ``X-Agent`` header, as on the Realtime routes.

**Ends**: ``session.close`` or the session's expiry → ``session.closed``, then close code
1000; a client that stops reading → 1008; a dropped socket → the session ends as
``connection_lost``. Each ends with a ``realtime.call.ended`` webhook (transport
``websocket``, the ``live_…`` id as ``call_id``) when it had started.

**Stored sessions and forks** (issue 42 item 7; appliance/live/store.py): a session
started with ``store: true`` is recorded into the recordings directory and keeps its
conversation there. ``GET /v1/live/sessions/{id}/fork`` (the SDK's
``client.live.forks.connect``) is a new session over a WebSocket whose ``session.start``
carries a ``ForkSessionConfig`` of overrides: it starts with the stored session's config
and its conversation as ``input``. Auth as the session routes; an id with nothing stored is
a 404 before the upgrade.

**The sideband** ``GET /v1/live/sessions/{id}/attach[?graceful_close=true]`` (the SDK's
``client.live.sideband.connect``): a backend's WebSocket attached to a running WebSocket or
WebRTC Live session — the Realtime sideband's socket and ops (sideband.py
:func:`~appliance.signaling.sideband.attach_live`), asking for the ``live`` surface. Auth as
the session routes; an unknown id is a 404 before the upgrade. It ends with close code 1000
once the session has ended (always the closing handshake: ``graceful_close`` is accepted,
and is this server's default).
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from quart import Response, websocket
from quart_trio import QuartTrio

from ..agents.loader import AgentError
from ..live import store
from ..live.agent import live_factory
from ..live.connection import Started
from ..live.socket import CLOSED_NORMALLY, END_LOST, LiveSocketSession
from ..realtime.ws_session import CLOSE_SLOW_READER, END_SLOW_READER
from ..transceiver.recording import RecordingSettings
from .problems import Problem
from .realtime_http import Realtime, RealtimeProblem, error_response
from .realtime_ws import AgentFactories, close_socket, token_from_subprotocols
from .rules import authorize_header, check_agent
from .sideband import END_CLIENT as END_SIDEBAND_CLIENT
from .sideband import SidebandSocket, attach_live, close_code, local_session
from .sip_http import EXTENSION as SIP_EXTENSION
from .state import SignalingConfig, SignalingState
from .webhooks import CALL_ENDED, CALL_STARTED, end_report

log = logging.getLogger(__name__)
ROUTE = "/v1/live/sessions"
ATTACH_ROUTE = "/v1/live/sessions/<session_id>/attach"
FORK_ROUTE = "/v1/live/sessions/<session_id>/fork"
SUBPROTOCOL = "openai-live"
EXTENSION = "appliance.live.sockets"
CLOSE_NORMAL = 1000


def register_live_websocket(app: QuartTrio, rt: Realtime) -> None:
    state = rt.state
    factories = AgentFactories(live_factory)
    sockets: dict[str, LiveSocketSession] = {}
    app.extensions[EXTENSION] = sockets

    @app.websocket(ROUTE)
    async def live_socket() -> Response | None:
        return await _serve(None)

    @app.websocket(FORK_ROUTE)
    async def live_fork(session_id: str) -> Response | None:
        return await _serve(session_id)

    async def _serve(fork_of: str | None) -> Response | None:
        try:
            spec = _admit()
            fork = None if fork_of is None else await stored_session(state, fork_of)
            agent = factories.get(spec)()
        except Problem as p:
            return error_response(p)
        except AgentError as exc:
            return error_response(RealtimeProblem(
                500, "agent_not_servable", f"the live agent cannot serve a session: {exc}"))
        protocols = list(websocket.requested_subprotocols)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in protocols else None)
        hooks = state.webhooks
        data: dict[str, Any] = {}
        started_at = state.clock()

        def on_started(started: Started) -> None:
            nonlocal started_at
            started_at = state.clock()
            data.update(call_id=started.session_id, transport="websocket", agent=spec,
                        model=started.model)
            hooks.emit(CALL_STARTED, dict(data))
            log.info("live socket %s started (model %s)", started.session_id, started.model)

        sess = LiveSocketSession(agent, on_started=on_started,
                                 on_turn=state.registry.observe_turn,
                                 store=recording_settings(state.config), fork=fork)
        sockets[sess.id] = sess
        reason = END_LOST
        try:
            reason = await sess.run(websocket.receive, websocket.send)
        finally:
            sockets.pop(sess.id, None)
            if data:
                log.info("live socket %s ended (%s)", sess.id, reason)
                hooks.emit(CALL_ENDED, {**data, "report": end_report(
                    started_at=started_at, ended_at=state.clock(), reason=reason,
                    stats=sess.stats.as_dict(), turns=list(sess.turns))})
        if reason in CLOSED_NORMALLY:
            await close_socket(CLOSE_NORMAL, reason)
        elif reason == END_SLOW_READER:
            await close_socket(CLOSE_SLOW_READER, "slow reader: events were not read")
        return None

    @app.websocket(ATTACH_ROUTE)
    async def live_sideband(session_id: str) -> Response | None:
        try:
            att = await attach_live(rt, session_id, _authorization(), websocket.args,
                                    local_session, app.extensions.get(SIP_EXTENSION))
        except Problem as p:
            return error_response(p)
        protocols = list(websocket.requested_subprotocols)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in protocols else None)
        log.info("live sideband %s attached to %s", att.sideband_id, session_id)
        reason = await SidebandSocket(att).run(websocket.receive, websocket.send)
        log.info("live sideband %s detached (%s)", att.sideband_id, reason)
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

    def _admit() -> str:
        return admit(state, _authorization(), websocket.headers.get("X-Agent") or None)


def recording_settings(config: SignalingConfig) -> RecordingSettings | None:
    """Where a stored WebSocket session's recording goes, with the quota and retention the
    transceivers' recordings have (``up``'s --recording-quota / --recording-retention)."""
    if config.recordings_dir is None:
        return None
    return RecordingSettings(config.recordings_dir, config.recording_quota,
                             config.recording_retention)


async def stored_session(state: SignalingState, session_id: str) -> dict[str, Any]:
    """The stored session a fork starts from; a 404 naming it when there is none."""
    try:
        return await trio.to_thread.run_sync(store.load, state.config.recordings_dir,
                                             session_id)
    except store.NotStored as exc:
        raise RealtimeProblem(404, "session_not_found", str(exc), "session_id") from None


def admit(state: SignalingState, authorization: str, asked: str | None) -> str:
    """Who may open a Live session, on either transport, and with which agent: the API
    token (nothing on loopback; GPT-Live has no ephemeral keys, so an ``ek_`` or ``ct1.``
    token is refused), and ``X-Agent`` (a full-rights caller's pick) or ``--live-agent``.
    Raises :class:`RealtimeProblem` (401/403/400)."""
    authorize_header(state, authorization, sessions=False)
    try:
        spec = check_agent(asked)
    except Problem as p:
        raise RealtimeProblem(p.status, p.code, p.detail, "agent") from None
    return spec or state.config.live_agent
