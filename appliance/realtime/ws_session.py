"""The trio shell of a Realtime session over a WebSocket (``GET /v1/realtime?model=…``):
the same :class:`~appliance.realtime.machine.RealtimeConnection` as the ``oai-events``
channel, with no media track — the caller's audio arrives as ``input_audio_buffer.append``
(run through the energy VAD in 20 ms frames for server turn detection) and the answer's
audio leaves as ``response.output_audio.delta`` events (the machine's WebSocket mode).

Transport-free: :meth:`RealtimeSocketSession.run` takes ``receive()`` and ``send(text)``
coroutines, so the signaling route
(appliance/signaling/realtime_ws.py) and a test can both drive it.

Bounds: the events waiting for the socket are at most ``queue_limit``. A response's audio
waits for room (back-pressure on the agent, as the output queue paces it on a call); past
the limit anyway — a client that keeps sending but stops reading — the session ends with
:data:`END_SLOW_READER` (the route closes the socket with :data:`CLOSE_SLOW_READER`).

**One shell, many protocols** (docs/style.md rule 20): the object facing the socket is a
``SocketProtocol`` (socket_protocol.py: the seam) — the Realtime machine itself by default,
or GPT-Live's :class:`~appliance.live.connection.LiveConnection`, which translates its
events onto an inner machine (``protocol=`` and ``machine=``: the machine is what
transcriptions report to and what the agent's ``session_updated`` hook reads). Two
behaviours are this shell's own for such a protocol: ``EndSession`` (stop reading, send
what is queued, end with its reason) and, with ``pace_lead`` set, the answer's audio
leaves at real time plus that lead instead of as fast as the agent makes it, so a
barge-in that cancels the response stops the audio the client gets, not only the audio
still to be made. Actions the shell does not know go to
:meth:`RealtimeSocketSession.handle_action` (a subclass's).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ..agents.vad import EnergyVad
from ..session_info import MAX_TURNS, turn_line
from .agent import AUDIO_PIECE, close_deltas, id_source
from .audio import RATE
from .interface import AudioDelta, RealtimeAgent, ResponseRequest, TextDelta, TranscriptDelta
from .machine import (
    CancelResponse,
    ClearAudio,
    JudgeTurn,
    RealtimeConnection,
    SessionUpdated,
    SpeculateTurn,
    StartResponse,
    Transcribe,
)
from .socket_protocol import EndSession, SocketProtocol
from .transcription import transcribe_item
from .turns import PauseWork, can_judge, can_speculate
from .waterfall import Waterfall

log = logging.getLogger("appliance.realtime.ws")
QUEUE_LIMIT = 2048  # server events waiting for a slow socket before it is dropped
CLOSE_SLOW_READER = 1008  # policy violation: the client stopped reading its events
END_SLOW_READER = "slow_reader"
END_CLIENT = "client_closed"
SEND_GRACE = 10.0  # seconds one event's frame may take to leave once it has started


class SocketClosed(Exception):
    """``receive`` found the socket closed."""


@dataclass(slots=True)
class SocketStats:
    """What the end-of-call report tells of a WebSocket session."""

    started_at: float = field(default_factory=time.time)
    events_in: int = 0
    events_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    responses: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"events_in": self.events_in, "events_out": self.events_out,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "responses": self.responses}


class RealtimeSocketSession:
    def __init__(self, agent: RealtimeAgent, *, session: dict[str, Any] | None = None,
                 queue_limit: int | None = None, session_id: str | None = None,
                 protocol: SocketProtocol | None = None,
                 machine: RealtimeConnection | None = None,
                 pace_lead: float | None = None,
                 on_turn: Callable[[dict[str, Any]], None] | None = None) -> None:
        """``protocol`` (with the ``machine`` under it) replaces the Realtime machine the
        shell builds by default; ``pace_lead`` (seconds) paces the answer's audio;
        ``on_turn`` takes each turn's waterfall line as it completes (signaling's turn
        histograms), and :attr:`turns` keeps the last ones (the end-of-call report's)."""
        self.agent = agent
        self.id = session_id or f"sess_{secrets.token_hex(8)}"
        self.machine = machine or RealtimeConnection(
            session_id=self.id, ids=id_source(), session=session,
            can_transcribe=True,
            vad=EnergyVad().update, judge=can_judge(), speculate=can_speculate(agent))
        self.protocol: SocketProtocol = protocol or self.machine
        self._lead = pace_lead
        self._play_at = 0.0  # trio clock: when the client has played all audio sent
        self._reading: trio.CancelScope | None = None
        self._sending = False
        self.stats = SocketStats()
        self.end_reason: str | None = None
        self._limit = QUEUE_LIMIT if queue_limit is None else queue_limit
        self._queue: deque[str] = deque()
        self._wake = trio.Event()  # the sender: something was queued
        self._room = trio.Event()  # a waiting response: the queue fell under half
        self._runs: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._pause_work = PauseWork(self.machine, self.agent, self._drain)
        # Each turn's marks (issue 38 item 5): "first sent" is the first audio delta's
        # event written to the socket (the sender counts the events it wrote against the
        # count queued when that one was).
        self.waterfall = Waterfall()
        self.turns: deque[dict[str, Any]] = deque(maxlen=MAX_TURNS)
        self._on_turn = on_turn
        self._queued_count = 0  # events ever queued for the socket
        self._watch: deque[tuple[int, str]] = deque()  # (queued count, response id)

    async def run(self, receive: Callable[[], Awaitable[str | bytes]],
                  send: Callable[[str], Awaitable[None]]) -> str:
        """Serve until the client goes (``receive`` is cancelled with the route, or raises
        :class:`SocketClosed`) or reads too slowly; returns the end reason."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._sender, send)
            self.protocol.handle_open()
            self._drain()
            with trio.CancelScope() as self._reading:
                while self.end_reason is None:
                    try:
                        data = await receive()
                    except SocketClosed:
                        break
                    self.stats.events_in += 1
                    self.stats.bytes_in += len(data)
                    self.protocol.handle_message(data)
                    self._drain()
            if self.end_reason is None:
                self.end_reason = END_CLIENT
            elif self.end_reason != END_SLOW_READER:
                # The protocol ended the session: its last events (session.closed) go out
                # before the route closes the socket; a peer that reads nothing gets
                # SEND_GRACE, as a frame already started does.
                for scope in self._runs.values():
                    scope.cancel()
                with trio.move_on_after(SEND_GRACE):
                    while self._queue or self._sending:
                        self._room = trio.Event()
                        await self._room.wait()
            nursery.cancel_scope.cancel()
        return self.end_reason

    def end(self, reason: str) -> None:
        """End the session from outside the read loop (a timer, a route): as
        :class:`EndSession` does."""
        if self.end_reason is None:
            self.end_reason = reason
        if self._reading is not None:
            self._reading.cancel()

    def handle_action(self, action: object) -> None:
        """An action this shell does not know (a subclass's protocol's own)."""

    def _overflow(self) -> None:
        if self.end_reason is None:
            self.end_reason = END_SLOW_READER
            log.info("realtime socket %s: %d events unread, closing", self.id, len(self._queue))
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _sender(self, send: Callable[[str], Awaitable[None]]) -> None:
        while True:
            while self._queue:
                text = self._queue.popleft()
                if len(self._queue) < self._limit // 2:
                    self._room.set()
                # A frame half written cannot be taken back: finish it (or give up on a
                # peer that reads nothing for SEND_GRACE s) even when the session is ending,
                # so the close that follows is still a valid frame.
                self._sending = True
                with trio.CancelScope(shield=True), trio.move_on_after(SEND_GRACE):
                    await send(text)
                self._sending = False
                self.stats.events_out += 1
                self.stats.bytes_out += len(text)
                while self._watch and self._watch[0][0] <= self.stats.events_out:
                    self._report(self._watch.popleft()[1], trio.current_time())
            self._room.set()  # an ending session waits for the queue to be empty
            self._wake = trio.Event()
            await self._wake.wait()

    async def _wait_room(self) -> None:
        await trio.lowlevel.checkpoint()  # a burst of deltas still lets a barge-in cut it
        while len(self._queue) >= self._limit // 2:
            self._room = trio.Event()
            await self._room.wait()

    async def _paced(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more of 48 kHz PCM are due: the client is to hold at most
        ``pace_lead`` seconds it has not played (its own playback clock is assumed to be
        real time from the first audio on)."""
        assert self._lead is not None
        now = trio.current_time()
        self._play_at = max(self._play_at, now)
        wait = self._play_at - self._lead - now
        if wait > 0:
            await trio.sleep(wait)  # real-time pacing of a media source
        self._play_at += nbytes / 2 / RATE

    def _drain(self) -> None:
        m = self.machine
        p = self.protocol
        now = trio.current_time()
        # A WebSocket client's audio arrives in messages: what the machine was fed by now
        # arrived by now.
        self.waterfall.arrived(m.audio_ms, now)
        while (bound := m.poll_bound()) is not None:
            self.waterfall.bound(bound, now)
        while (action := p.poll_action()) is not None:
            if isinstance(action, CancelResponse):
                scope = self._runs.pop(action.response_id, None)
                if scope is not None:
                    scope.cancel()
                # Cut: what was sent and not yet played is the client's to drop; the next
                # answer starts from now.
                self._play_at = trio.current_time()
            elif isinstance(action, StartResponse) and self._nursery is not None:
                scope = trio.CancelScope()
                self._runs[action.request.response_id] = scope
                self.stats.responses += 1
                self.waterfall.respond(action.request)
                self._nursery.start_soon(self._respond, action.request, scope)
            elif isinstance(action, Transcribe) and self._nursery is not None:
                self._nursery.start_soon(self._transcribe, action)
            elif isinstance(action, JudgeTurn | SpeculateTurn) and self._nursery is not None:
                self._pause_work.start(action, self._nursery)
            elif isinstance(action, SessionUpdated):
                hook = getattr(self.agent, "session_updated", None)
                if callable(hook):
                    hook(dict(m.session))
            elif isinstance(action, ClearAudio):
                pass  # nothing is queued for playback here: the client plays the deltas
            elif isinstance(action, EndSession):
                self.end(action.reason)
            else:
                self.handle_action(action)
        queued = False
        while (event := p.poll_event()) is not None:
            self._queue.append(json.dumps(event, separators=(",", ":")))
            self._queued_count += 1
            queued = True
        if queued:
            self._wake.set()
        if len(self._queue) > self._limit:
            self._overflow()

    async def _respond(self, request: ResponseRequest, scope: trio.CancelScope) -> None:
        rid = request.response_id
        error: str | None = None
        with scope:
            try:
                deltas = self.agent.respond(request)
                try:
                    async for delta in deltas:
                        if isinstance(delta, AudioDelta):
                            self.waterfall.audio(rid, trio.current_time())
                        elif isinstance(delta, TranscriptDelta | TextDelta):
                            self.waterfall.text(rid, trio.current_time())
                        if self._lead is not None and isinstance(delta, AudioDelta):
                            # Paced: 100 ms pieces, so a cancel cuts within one.
                            pcm = delta.pcm[: len(delta.pcm) & ~1]
                            for i in range(0, len(pcm), AUDIO_PIECE):
                                piece = AudioDelta(pcm[i : i + AUDIO_PIECE])
                                await self._paced(len(piece.pcm))
                                self._deliver(rid, piece)
                                await self._wait_room()
                            continue
                        self._deliver(rid, delta)
                        await self._wait_room()
                finally:
                    await close_deltas(deltas)
            except Exception as exc:  # the agent's bug fails the response, not the session
                error = type(exc).__name__
                log.warning("realtime agent failed on %s: %r", rid, exc)
        self._runs.pop(rid, None)
        self.waterfall.ended(rid)
        if not scope.cancelled_caught:
            self.protocol.handle_response_end(rid, error)
            self._drain()

    def _deliver(self, rid: str, delta: Any) -> None:
        """One delta to the protocol; the response's first audio event queued is watched
        until the sender has written it (the turn's ``first_sent``)."""
        before = self._queued_count
        self.protocol.handle_delta(rid, delta)
        self._drain()
        if (isinstance(delta, AudioDelta) and self._queued_count > before
                and self.waterfall.queued(rid, trio.current_time())):
            self._watch.append((self._queued_count, rid))

    def _report(self, rid: str, sent_at: float) -> None:
        hook = getattr(self.agent, "turn_marks", None)
        event = self.waterfall.sent(rid, sent_at, hook(rid) if callable(hook) else None)
        line = turn_line(event) if event is not None else None
        if line is None:
            return
        self.turns.append(line)
        if self._on_turn is not None:
            self._on_turn(line)

    async def _transcribe(self, action: Transcribe) -> None:
        await transcribe_item(action, self.agent, self.machine, self._drain)
