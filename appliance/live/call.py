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
* no Realtime sideband: ``GET /v1/realtime?call_id=`` does not attach to a Live session
  (GPT-Live's own sideband, ``…/{id}/attach``, is issue 42 item 5).

The agent spec is ``live[:SPEC]`` (plugin.py): SPEC is ``--live-agent``'s language.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from ..agents.context import AgentContext
from ..realtime.agent import LABEL, RealtimeShell, id_source
from ..realtime.interface import RealtimeAgent
from ..realtime.socket_protocol import EndSession
from ..realtime.turns import can_judge, can_speculate
from .connection import LiveConnection, Started, State

log = logging.getLogger("appliance.live")
CLOSE_GRACE = 2.0  # seconds the last events get to reach the peer before the hang-up
PARAMS_KEY = "live"


def session_config(ctx: AgentContext) -> Any:
    """The ``session`` of the POST, as signaling passed it (``ctx.params["live"]``)."""
    params = ctx.params.get(PARAMS_KEY) if isinstance(ctx.params, dict) else None
    return params.get("session") if isinstance(params, dict) else None


class LiveCallShell(RealtimeShell):
    def __init__(self, ctx: AgentContext, agent: RealtimeAgent) -> None:
        self.live = LiveConnection(
            session_id=ctx.session_id, ids=id_source(), wall_clock=time.time, media=True,
            queued_seconds=lambda: ctx.queued_seconds,
            judge=can_judge(), speculate=can_speculate(agent))
        super().__init__(ctx, agent, protocol=self.live, machine=self.live.machine,
                         sideband=False)
        self.live.start(session_config(ctx))  # LiveError: signaling let a bad config by
        self.started: Started | None = None
        self._ending = False

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            if self.live.state is not State.CLOSED:
                self.live.lost()  # the caller left: the session ends with the call

    def tasks(self, nursery: trio.Nursery) -> None:
        self._drain()  # Started: the expiry timer, now that there is a nursery

    def handle_action(self, action: object) -> None:
        if self._nursery is None:
            return
        if isinstance(action, Started):
            self.started = action
            self._nursery.start_soon(self._expire, action.expires_in)
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
