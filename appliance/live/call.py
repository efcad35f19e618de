"""The trio shell of a GPT-Live **WebRTC** session (``POST /v1/live/sessions``): the
Realtime call shell (appliance/realtime/agent.py :class:`RealtimeShell` — the track's
frames, the ``oai-events`` channel, the agent's response and transcription tasks, barge-in
on the output queue) driving a :class:`~appliance.live.connection.LiveConnection` in its
media mode instead of the bare Realtime machine: one call shell, one Live event core for
both transports (the WebSocket's shell is socket.py).

What only a Live call adds, here:

* the session **starts with the call**: signaling validated the ``session`` of the POST and
  passed it as ``ctx.params["live"]["session"]``; ``session.started`` goes out when the
  browser's ``oai-events`` channel opens;
* the session's **lifetime** (``expires_at``: reason ``expired``) and its **end**: on
  ``session.closed`` (``session.close`` on the channel, or expiry) the events still queued
  are handed to the channel (bounded by :data:`CLOSE_GRACE`), then the call is hung up
  (``session.end``);
* GPT-Live's own **sideband** (``GET /v1/live/sessions/{id}/attach``), not the Realtime
  one: a :class:`~appliance.realtime.sideband.SidebandPoint` of the ``live`` surface
  registered under the call's id (signaling reaches it with the ``realtime.*`` control ops;
  ``GET /v1/realtime?call_id=`` is refused with 409), fed the core's observer stream after
  every drain; a sideband's command runs through :meth:`LiveConnection.handle_sideband`
  (its ``session.close`` hangs the call up, as the channel's does).

* a **SIP call** accepted on the Live surface (``POST /v1/live/sessions/{live_sip_…}/accept``,
  signaling/live_http.py): the phone session runs this shell as its agent (the ``transport``
  of its identity is ``sip``). There is no ``oai-events`` channel, so the events go to the
  sidebands only, from the start; the session's id is the call's Live id
  (``ctx.params["live"]["session_id"]``, the transceiver's session id staying the
  ``rtc_sip_…`` one its point is registered under); the caller's digits (the phone
  session's ``dtmf`` events) become ``transport.dtmf.received``, a sideband's
  ``transport.dtmf.send`` the phone leg's RFC 4733 events (the ``dtmf.send`` op of
  transceiver/phone_session.py); ``session.close`` hangs up (BYE) and a caller's BYE ends
  the session as ``remote_hangup``;
* **Responses delegation**: the core's ``AskBackend`` runs in the call's nursery
  (backend.py: the transceiver's ``--llm``), its stream fed back into the core;

* a **stored** session (``store: true``): the transceiver records the call as any
  (signaling asked for ``media.record``); at the end the shell keeps the conversation
  beside the recording (store.py), in the directory signaling named
  (``ctx.params["live"]["store_dir"]``).

The agent spec is ``live[:SPEC]`` (plugin.py): SPEC is ``--live-agent``'s language.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import trio

from ..agents.context import AgentContext
from ..realtime.agent import LABEL, RealtimeShell, id_source
from ..realtime.interface import RealtimeAgent
from ..realtime.sideband import LIVE, SidebandPoint, register, unregister
from ..realtime.socket_protocol import EndSession
from ..realtime.turns import can_judge, can_speculate
from . import store
from .backend import Backend, start_request
from .connection import LiveConnection, SendDtmf, Started, State

log = logging.getLogger("appliance.live")
CLOSE_GRACE = 2.0  # seconds the last events get to reach the peer before the hang-up
PARAMS_KEY = "live"


def _live_params(ctx: AgentContext) -> dict[str, Any]:
    params = ctx.params.get(PARAMS_KEY) if isinstance(ctx.params, dict) else None
    return params if isinstance(params, dict) else {}


def session_config(ctx: AgentContext) -> Any:
    """The ``session`` of the POST, as signaling passed it (``ctx.params["live"]``)."""
    return _live_params(ctx).get("session")


def store_dir(ctx: AgentContext) -> Path | None:
    """Where a stored session's conversation goes (signaling's recordings directory)."""
    directory = _live_params(ctx).get("store_dir")
    return Path(directory) if isinstance(directory, str) and directory else None


def live_session_id(ctx: AgentContext) -> str:
    """The session's Live id: signaling's (a SIP call's ``live_sip_…``), else the call's."""
    sid = _live_params(ctx).get("session_id")
    return sid if isinstance(sid, str) and sid.startswith("live_") else ctx.session_id


def is_phone(ctx: AgentContext) -> bool:
    return ctx.identity.info.get("transport") == "sip"


class LiveCallShell(RealtimeShell):
    def __init__(self, ctx: AgentContext, agent: RealtimeAgent) -> None:
        self.backend = Backend.from_env()  # Responses delegation's LLM (--llm), if any
        self.live = LiveConnection(
            session_id=live_session_id(ctx), ids=id_source(), wall_clock=time.time,
            media=True, queued_seconds=lambda: ctx.queued_seconds,
            judge=can_judge(), speculate=can_speculate(agent), phone=is_phone(ctx),
            backend=self.backend is not None)
        super().__init__(ctx, agent, protocol=self.live, machine=self.live.machine,
                         sideband=False)
        self.live.start(session_config(ctx))  # LiveError: signaling let a bad config by
        self.started: Started | None = None
        self._ending = False
        self.live_sideband = SidebandPoint(ctx.session_id, self.live.resource,
                                           self._feed_live, surface=LIVE,
                                           replay=self.live.replay)
        self.live.observed = lambda: bool(self.live_sideband.attachments)

    async def run(self) -> None:
        register(self.live_sideband)
        try:
            await super().run()
        finally:
            await self._keep()
            if self.live.state is not State.CLOSED:
                # the caller left: the session ends with the call
                self.live.lost("remote_hangup" if self.live.phone else "connection_lost")
                self._observe(None)  # the sidebands' session.closed (connection_lost)
            unregister(self.live_sideband)
            self.live_sideband.close()

    async def _keep(self) -> None:
        directory = store_dir(self.ctx)
        if directory is None or not self.live.config.get("store"):
            return
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
            try:
                await trio.to_thread.run_sync(store.save, directory, self.live.stored())
            except OSError as exc:
                log.warning("live call %s: conversation not stored: %s",
                            self.ctx.session_id, exc)

    def _drain(self, origin: str | None = None) -> None:
        super()._drain(origin)
        self._observe(origin)

    def _observe(self, origin: str | None) -> None:
        while (event := self.live.poll_observed()) is not None:
            self.live_sideband.observe(event, json.dumps(event, separators=(",", ":")),
                                       origin)

    def _feed_live(self, text: str, origin: str) -> None:
        """A command of the attached sideband ``origin``."""
        self.live.handle_sideband(text)
        self._drain(origin)

    async def _event_loop(self) -> None:
        """Transceiver events: a phone call's digits are the core's (transport.dtmf.*); a
        recording that stopped early (the quota, a full disk) is ``session_storage_failed``."""
        async for event in self.ctx.events():
            digit = event.get("digit")
            if event.get("type") == "dtmf" and isinstance(digit, str):
                self.live.handle_dtmf(digit.upper())
                self._drain()
            elif event.get("type") == "recording.stopped" and self.live.config.get("store"):
                self.live.storage_failed(str(event.get("reason")))
                self._drain()

    def tasks(self, nursery: trio.Nursery) -> None:
        self._drain()  # Started: the expiry timer, now that there is a nursery

    def handle_action(self, action: object) -> None:
        if self._nursery is None:
            return
        if start_request(self._nursery, self.backend, self.live, action, self._drain):
            return
        if isinstance(action, Started):
            self.started = action
            self._nursery.start_soon(self._expire, action.expires_in)
        elif isinstance(action, SendDtmf):
            # the phone leg's RFC 4733 events (transceiver/phone_session.py dtmf.send)
            self._nursery.start_soon(self.ctx.send_event,
                                     {"type": "dtmf.send", "digits": action.key})
        elif isinstance(action, EndSession) and not self._ending:
            self._ending = True
            self._nursery.start_soon(self._end, action.reason)

    async def _expire(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self.live.close("expired")
        self._drain()

    async def _end(self, reason: str) -> None:
        """``session.closed`` is queued: let it reach the peer, then hang up."""
        self._out_send.close()  # the sender hands over what is queued, then stops
        with trio.move_on_after(CLOSE_GRACE):
            await self.flushed.wait()
        log.info("live call %s ended (%s)", self.ctx.session_id, reason)
        await self.ctx.send_event({"type": "session.end", "reason": reason})


__all__ = ["LABEL", "LiveCallShell", "session_config"]
