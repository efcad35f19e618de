"""The trio shell of a GPT-Live WebSocket session: the Realtime WebSocket shell
(appliance/realtime/ws_session.py — its send queue, back-pressure, slow-reader bound,
response and transcription tasks) driving a :class:`~appliance.live.connection.LiveConnection`
instead of the bare machine, with what only a Live session has:

* the answer's audio **paced** at real time plus :data:`PACE_LEAD` (GPT-Live has no
  "clear" event: a barge-in, which the server's turn engine detects and which cancels the
  answer, must stop the audio the client receives, so little may run ahead of playback);
* the session's **lifetime**: after ``expires_in`` seconds from ``session.start`` it
  closes with reason ``expired`` (``session.closed``, then close code 1000);
* a socket that goes away without ``session.close`` ends the session as
  ``connection_lost`` (:data:`END_LOST`);
* its **sideband** (``GET /v1/live/sessions/{id}/attach``): a
  :class:`~appliance.realtime.sideband.SidebandPoint` of the ``live`` surface, registered
  in ``POINTS`` from ``session.started`` to the end (signaling attaches to it in process:
  appliance/signaling/sideband.py), fed the core's observer stream after every drain; a
  sideband's command runs through :meth:`LiveConnection.handle_sideband`;
* a **stored** session (``store: true`` and ``store``: the recordings directory with
  ``--recording-quota`` and ``--recording-retention``):
  the caller's audio (L) and the answer's (R), each at its place on the session timeline
  (the core's ``tap``), go through a :class:`~appliance.transceiver.stages.recorder.RecorderTap`
  into the :class:`~appliance.transceiver.recording.CallRecording` every recorded call uses
  (its stereo WAV, quota and retention; a recording that stops early — the quota, a full
  disk — is told to the client as ``error`` ``session_storage_failed``, and the session goes
  on); at the end the conversation is kept beside it
  (store.py), before the socket is closed — so a client that saw the close can fetch the
  content and fork;
* **Responses delegation**: the core's ``AskBackend`` runs in the session's nursery
  (backend.py: the assistant's ``--llm``), its stream fed back into the core;
* a **fork** (``fork=`` a stored session, from ``GET /v1/live/sessions/{id}/fork``): its
  ``session.start`` carries overrides (connection.py).

Transport-free like its base: :meth:`run` takes ``receive()`` and ``send(text)``.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..agents.vad import EnergyVad
from ..realtime.agent import id_source
from ..realtime.interface import RealtimeAgent
from ..realtime.sideband import LIVE, SidebandPoint, register, unregister
from ..realtime.turns import can_judge, can_speculate
from ..realtime.ws_session import END_CLIENT, RealtimeSocketSession
from ..transceiver.recording import CallRecording, RecordingSettings
from ..transceiver.stages.recorder import RecorderTap
from . import store
from .backend import Backend, start_request
from .config import MAX_SESSION_SECONDS
from .connection import LiveConnection, Started, State

log = logging.getLogger("appliance.live")
PACE_LEAD = 0.3  # seconds of answer audio the client may hold ahead of playback
END_LOST = "connection_lost"
#: End reasons after which the route closes the socket with 1000 (session.closed was sent).
CLOSED_NORMALLY = ("close_requested", "expired")
#: The recording ring (both directions): a WebSocket client may send its audio faster than
#: real time, so more than a call's ring (drained every 0.25 s either way).
RING_SECONDS = 60.0
SAVE_GRACE = 5.0  # s the conversation's write may take once the session has ended


def new_session_id() -> str:
    """``live_`` + 24 URL-safe characters (the SDK's pattern: ``^live_[A-Za-z0-9_-]+$``)."""
    return "live_" + secrets.token_urlsafe(18)


class LiveSocketSession(RealtimeSocketSession):
    def __init__(self, agent: RealtimeAgent, *, session_id: str | None = None,
                 queue_limit: int | None = None, max_seconds: int = MAX_SESSION_SECONDS,
                 pace_lead: float | None = PACE_LEAD,
                 on_started: Callable[[Started], None] | None = None,
                 on_turn: Callable[[dict[str, Any]], None] | None = None,
                 store: RecordingSettings | None = None,
                 fork: dict[str, Any] | None = None) -> None:
        sid = session_id or new_session_id()
        self.backend = Backend.from_env()  # Responses delegation's LLM (--llm), if any
        self.live = LiveConnection(session_id=sid, ids=id_source(), wall_clock=time.time,
                                   vad=EnergyVad().update, max_seconds=max_seconds,
                                   judge=can_judge(), speculate=can_speculate(agent),
                                   fork=fork, backend=self.backend is not None)
        self.store = store  # the recordings directory, its quota and retention
        self.recording: CallRecording | None = None
        super().__init__(agent, session_id=sid, queue_limit=queue_limit, protocol=self.live,
                         machine=self.live.machine, pace_lead=pace_lead, on_turn=on_turn)
        self.started: Started | None = None
        self._on_started = on_started
        self.sideband = SidebandPoint(sid, self.live.resource, self._feed, surface=LIVE,
                                      replay=self.live.replay)
        self.live.observed = lambda: bool(self.sideband.attachments)
        self._origin: str | None = None  # the sideband whose command is being run

    async def run(self, receive: Callable[[], Awaitable[str | bytes]],
                  send: Callable[[str], Awaitable[None]]) -> str:
        """Serve until ``session.closed`` went out, the socket went away or the client
        stopped reading; returns the end reason (a Live close reason, or
        ``slow_reader``)."""
        try:
            reason = await super().run(receive, send)
            await self._keep()
        finally:
            if self.live.state is not State.CLOSED:
                self.live.lost()
                self._observe()  # the sidebands' session.closed (connection_lost)
            unregister(self.sideband)
            self.sideband.close()  # the sidebands get what was queued, then close
        return END_LOST if reason == END_CLIENT else reason

    def handle_action(self, action: object) -> None:
        if start_request(self._nursery, self.backend, self.live, action, self._drain):
            return
        if isinstance(action, Started) and self._nursery is not None:
            self.started = action
            register(self.sideband)  # attachable once its id is known
            if self.live.config.get("store") and self.store is not None:
                self._record(self._nursery, self.store)
            self._nursery.start_soon(self._expire, action.expires_in)
            if self._on_started is not None:
                self._on_started(action)

    def _record(self, nursery: trio.Nursery, settings: RecordingSettings) -> None:
        tap = RecorderTap.for_seconds(RING_SECONDS)
        tap.push("in", b"", 0.0)  # the axis starts at the timeline's 0
        self.recording = CallRecording(tap, self.id, settings, on_stop=self._storage_failed)
        self.live.tap = lambda direction, at, pcm: tap.push(direction, pcm, at)
        nursery.start_soon(self.recording.run)  # finalised when the session's nursery ends

    def _storage_failed(self, reason: str) -> None:
        self.live.storage_failed(reason)
        self._drain()

    async def _keep(self) -> None:
        """A stored session's conversation, kept once it has ended (its recording is
        final by now: it ran in the session's nursery)."""
        if self.started is None or not self.live.config.get("store") or self.store is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(SAVE_GRACE):
            try:
                await trio.to_thread.run_sync(store.save, self.store.directory,
                                              self.live.stored())
            except OSError as exc:
                log.warning("live session %s: conversation not stored: %s", self.id, exc)

    def _drain(self) -> None:
        super()._drain()
        self._observe()

    def _observe(self) -> None:
        while (event := self.live.poll_observed()) is not None:
            self.sideband.observe(event, json.dumps(event, separators=(",", ":")),
                                  self._origin)

    def _feed(self, text: str, origin: str) -> None:
        """A command of the attached sideband ``origin``."""
        self._origin = origin
        try:
            self.live.handle_sideband(text)
            self._drain()
        finally:
            self._origin = None

    async def _expire(self, seconds: float) -> None:
        await trio.sleep(seconds)
        self.live.close("expired")
        self._drain()
