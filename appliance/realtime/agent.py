"""The trio shell that runs a :class:`~appliance.realtime.machine.RealtimeConnection` over an
:class:`~appliance.agents.context.AgentContext`: ``--agent realtime`` (the built-in echo
realtime agent) and ``--agent realtime:<spec>`` (a user :class:`RealtimeAgent`).

The ``oai-events`` channel is the browser's (DCEP, RFC 8832) unless signaling gave a
pre-negotiated id (``ctx.params["realtime"]["dcid"]``, OpenAI's ``?dcid=``): then the agent
opens that id itself at start, with no round trip. Tasks, all in one nursery:

* frames: every 20 ms frame -> ``handle_frame`` (server VAD turns);
* channel: ``ChannelOpened("oai-events")`` -> ``handle_open``, messages -> ``handle_message``;
* one task per response: the agent's deltas -> ``handle_delta``; audio is queued with
  ``ctx.send`` in 100 ms pieces (so a cancel or clear cuts within one piece), and once the
  generator is done the task waits for the queue to drain to report
  ``output_audio_buffer.stopped``. ``CancelResponse`` cancels only the generating part.

After each ``handle_*`` the shell drains events (sent in order on the channel) and actions
(``ClearAudio`` -> ``ctx.interrupt()`` at once, before anything else runs).

Sideband (``GET /v1/realtime?call_id=``): the shell registers a
:class:`~appliance.realtime.sideband.SidebandPoint` under its session id; each drained event
is serialised once and published there with its origin (the browser, or the sideband whose
client event caused it), which decides what the channel gets; a controller's client events
come in through :meth:`RealtimeShell._feed`, and a browser ``session.update`` of a locked
field is answered with an ``error`` without reaching the machine.

**One shell, many protocols** (docs/style.md rule 20), as the WebSocket shell
(ws_session.py): the object facing the channel and the track is a ``CallProtocol``
(socket_protocol.py) — the Realtime machine by default, or GPT-Live's WebRTC
:class:`~appliance.live.connection.LiveConnection` over its own machine (``protocol=``,
``machine=``; appliance/live/call.py), which registers no Realtime sideband
(``sideband=False``). Actions this shell does not know go to :meth:`RealtimeShell.handle_action`,
and :meth:`RealtimeShell.tasks` starts a subclass's own tasks in the call's nursery.
"""

from __future__ import annotations

import inspect
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio

from ..agents.channels import ChannelClosed, ChannelError, ChannelMessage, ChannelOpened
from ..agents.context import AgentContext
from ..agents.loader import AgentError, import_target
from .interface import AudioDelta, Delta, RealtimeAgent, ResponseRequest, TextDelta, TranscriptDelta
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
from .protocol import json_copy
from .registry import factory_resolver, registered
from .sideband import POINTS, SidebandPoint
from .socket_protocol import CallProtocol
from .transcription import transcribe_item
from .turns import PauseWork, can_judge, can_speculate
from .waterfall import Waterfall

log = logging.getLogger("appliance.realtime")
LABEL = "oai-events"
AUDIO_PIECE = 9_600  # 100 ms of 48 kHz PCM16
SPEC_PREFIX = "realtime"


def id_source(token: str | None = None) -> Callable[[str], str]:
    """``ids("event")`` -> ``"event_<token><n>"``: unique in the call, unguessable across."""
    base = token or secrets.token_hex(6)
    counter = 0

    def ids(prefix: str) -> str:
        nonlocal counter
        counter += 1
        return f"{prefix}_{base}{counter:05d}"

    return ids


async def close_deltas(deltas: AsyncIterator[Delta]) -> None:
    """Close an agent's delta generator that its consumer stopped reading (a cancelled
    response is cancelled while the shell awaits the output queue, the generator parked at
    a ``yield``): its ``finally`` blocks run now, not when the garbage collector finds it
    (trio warns then, and the agent's upstream requests stay open meanwhile)."""
    aclose = getattr(deltas, "aclose", None)
    if aclose is not None:
        await aclose()


class _Generator:
    """A plain ``async def respond(request)`` generator function as a RealtimeAgent."""

    def __init__(self, fn: Callable[[ResponseRequest], AsyncIterator[Delta]]) -> None:
        self._fn = fn

    def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        return self._fn(request)


def agent_factory(obj: Any, spec: str) -> Callable[[], RealtimeAgent]:
    """A class (one instance per call), an instance, or an async generator function."""

    if inspect.isclass(obj):
        if not callable(getattr(obj, "respond", None)):
            raise AgentError(f"realtime agent {spec!r} needs a 'respond(self, request)' method")
        cls: Any = obj
        return lambda: cls()  # noqa: PLW0108 (a fresh instance per call)
    if inspect.isasyncgenfunction(obj):
        return lambda: _Generator(obj)
    if callable(getattr(obj, "respond", None)):
        return lambda: obj
    raise AgentError(f"realtime agent {spec!r} is not a RealtimeAgent class, instance or "
                     "async generator function")


def realtime_agent(factory: Callable[[], RealtimeAgent]) -> Callable[[AgentContext], Any]:
    async def run(ctx: AgentContext) -> None:
        await RealtimeShell(ctx, factory()).run()

    return run


def factory_for_spec(spec: str) -> Callable[[], RealtimeAgent]:
    """``realtime`` or ``realtime:<target>`` -> a RealtimeAgent factory (a WebSocket session
    runs the agent itself, with no AgentContext: appliance/realtime/ws_session.py)."""
    if spec == SPEC_PREFIX:
        from .echo import EchoRealtime

        return EchoRealtime
    resolver = factory_resolver(spec)  # another package's family (speech: assistant)
    if resolver is not None:
        return resolver(spec)
    if not spec.startswith(SPEC_PREFIX + ":") or not spec[len(SPEC_PREFIX) + 1 :]:
        others = "".join(f"{name}[?options], " for name in registered())
        raise AgentError(f"agent {spec!r} cannot answer a Realtime WebSocket session: expected "
                         f"realtime, {others}or realtime:<module:attr|file.py:attr>")
    target = spec[len(SPEC_PREFIX) + 1 :]
    return agent_factory(import_target(target, spec), spec)


def resolve_spec(spec: str) -> Callable[[AgentContext], Any]:
    """``realtime`` or ``realtime:<module:attr | file.py:attr>`` -> an agent function."""
    if spec == SPEC_PREFIX:
        from .echo import EchoRealtime

        return realtime_agent(EchoRealtime)
    target = spec[len(SPEC_PREFIX) + 1 :]
    if not target:
        raise AgentError(f"agent {spec!r}: expected realtime:<module:attr|file.py:attr>")
    return realtime_agent(agent_factory(import_target(target, spec), spec))


def noise_reduction_type(session: Any) -> str | None:
    """``audio.input.noise_reduction.type`` of a Realtime session (``near_field`` /
    ``far_field``), or None: what the transceiver's noise suppressor runs
    (appliance/transceiver/stages/config.py)."""
    try:
        nr = session["audio"]["input"]["noise_reduction"]
    except (KeyError, TypeError):
        return None
    kind = nr.get("type") if isinstance(nr, dict) else None
    return kind if kind in ("near_field", "far_field") else None


class RealtimeShell:
    def __init__(self, ctx: AgentContext, agent: RealtimeAgent, *,
                 protocol: CallProtocol | None = None,
                 machine: RealtimeConnection | None = None, sideband: bool = True) -> None:
        self.ctx = ctx
        self.agent = agent
        params = ctx.params.get("realtime") if isinstance(ctx.params, dict) else None
        params = params if isinstance(params, dict) else {}
        session = params.get("session")
        dcid = params.get("dcid")
        self.dcid = dcid if isinstance(dcid, int) and not isinstance(dcid, bool) else None
        self.machine = machine or RealtimeConnection(
            session_id=f"sess_{secrets.token_hex(8)}", ids=id_source(),
            queued_seconds=lambda: ctx.queued_seconds,
            session=session if isinstance(session, dict) else None,
            can_transcribe=True, judge=can_judge(), speculate=can_speculate(agent))
        self.protocol: CallProtocol = protocol or self.machine
        self._attach = sideband
        self.channel: int | None = None
        # audio.input.noise_reduction as the transceiver's stages have it (the create-time
        # session reached them through ctx.params; updates go as a media.update event).
        self._noise_reduction = noise_reduction_type(self.machine.session)
        self._runs: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._pause_work = PauseWork(self.machine, self.agent, self._drain)
        # Each turn's marks (issue 38 item 5), sent as turn.metrics like the ctx loop's: the
        # transceiver keeps them for the report, /metrics and the dashboard.
        self.waterfall = Waterfall()
        # Events go out in order through one sender task (send_message waits for room).
        self._out_send, self._out_recv = trio.open_memory_channel[str](1024)
        #: Set once the sender has handed every queued event to the channel after the send
        #: side was closed (a protocol that ends the session closes it: live/call.py).
        self.flushed = trio.Event()
        # The sideband (GET /v1/realtime?call_id=, appliance/realtime/sideband.py): every
        # drained event is also offered to the backends attached to this call.
        self.sideband = SidebandPoint(ctx.session_id, lambda: json_copy(self.machine.session),
                                      self._feed)

    async def run(self) -> None:
        if self._attach:
            POINTS[self.sideband.call_id] = self.sideband
        try:
            await self._run()
        finally:
            if POINTS.get(self.sideband.call_id) is self.sideband:
                del POINTS[self.sideband.call_id]
            self.sideband.close()

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.dcid is not None:
                try:
                    self.ctx.open_channel(LABEL, negotiated_id=self.dcid)
                except ChannelError:
                    pass  # no data channels in the offer: audio only, nothing to speak to
            if self.ctx.identity.info.get("transport") == "sip":
                # a phone call has no oai-events channel to wait for: its events go to the
                # sidebands from the start (session.created first), none are held
                self.protocol.handle_open()
                self._drain()
            nursery.start_soon(self._sender)
            nursery.start_soon(self._channel_loop)
            nursery.start_soon(self._event_loop)
            self.tasks(nursery)
            async for frame in self.ctx.frames():
                self.protocol.handle_frame(frame.pcm, frame.speech)
                self.waterfall.arrived(self.machine.audio_ms, frame.received_at)
                self._drain()
            nursery.cancel_scope.cancel()

    async def _channel_loop(self) -> None:
        async for event in self.ctx.channel_events():
            if isinstance(event, ChannelOpened) and event.channel.label == LABEL:
                self.channel = event.channel.id
                self.protocol.handle_open()
            elif isinstance(event, ChannelMessage) and event.channel_id == self.channel:
                data = event.data
                data = data if isinstance(data, str) else bytes(data)
                refused = self.sideband.refuse_untrusted(data, None)
                if refused is not None:  # a locked session field: the machine never sees it
                    self._to_channel(json.dumps(refused.to_event(f"event_{secrets.token_hex(8)}")))
                    continue
                self.protocol.handle_message(data)
            elif isinstance(event, ChannelClosed) and event.channel_id == self.channel:
                self.channel = None  # events from now on have nowhere to go
                continue
            else:
                continue
            self._drain()

    async def _event_loop(self) -> None:
        """Transceiver events: a phone call's DTMF digits become the Realtime event."""
        async for event in self.ctx.events():
            digit = event.get("digit")
            if event.get("type") == "dtmf" and isinstance(digit, str):
                self.machine.handle_dtmf(digit, int(time.time()))
                self._drain()

    def _noise_reduction_changed(self) -> None:
        nr = noise_reduction_type(self.machine.session)
        if nr != self._noise_reduction and self._nursery is not None:
            self._noise_reduction = nr
            self._nursery.start_soon(self.ctx.send_event,
                                     {"type": "media.update", "noise_reduction": nr})

    async def _sender(self) -> None:
        async for text in self._out_recv:
            if self.channel is None:
                continue
            try:
                await self.ctx.send_message(self.channel, text)
            except ChannelError:
                continue  # closed meanwhile: this one is lost, a reopened channel gets the rest
        self.flushed.set()

    def _feed(self, text: str, origin: str) -> None:
        """A client event of the sideband ``origin`` (its controller)."""
        self.sideband.refuse_untrusted(text, origin)
        self.machine.handle_message(text)
        self._drain(origin)

    def _to_channel(self, text: str) -> None:
        if self.channel is None:
            return
        try:
            self._out_send.send_nowait(text)
        except trio.WouldBlock:
            pass  # 1024 unsent events: the peer stopped reading; drop, never block
        except trio.ClosedResourceError:
            pass  # the session ended: nothing more goes out

    def tasks(self, nursery: trio.Nursery) -> None:
        """Start a subclass's own tasks in the call's nursery (none here)."""

    def handle_action(self, action: object) -> None:
        """An action this shell does not know (a subclass's protocol's own)."""

    def _drain(self, origin: str | None = None) -> None:
        m = self.machine
        p = self.protocol
        now = trio.current_time()
        while (bound := m.poll_bound()) is not None:
            self.waterfall.bound(bound, now)
        while (action := p.poll_action()) is not None:
            if isinstance(action, ClearAudio):
                self.ctx.interrupt()
            elif isinstance(action, CancelResponse):
                scope = self._runs.pop(action.response_id, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(action, StartResponse) and self._nursery is not None:
                scope = trio.CancelScope()
                self._runs[action.request.response_id] = scope
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
                self._noise_reduction_changed()
            else:
                self.handle_action(action)
        while (event := p.poll_event()) is not None:
            # The channel closed: events have nowhere to go but the sidebands (before it
            # opens the machine holds them).
            text = self.sideband.publish(event, json.dumps(event, separators=(",", ":")),
                                         origin)
            if text is not None:
                self._to_channel(text)

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
                            pcm = delta.pcm[: len(delta.pcm) & ~1]
                            for i in range(0, len(pcm), AUDIO_PIECE):
                                piece = AudioDelta(pcm[i : i + AUDIO_PIECE])
                                ok = self.protocol.handle_delta(rid, piece)
                                self._drain()
                                if not ok:
                                    break
                                start = self.ctx.played_seconds + self.ctx.queued_seconds
                                await self.ctx.send(piece.pcm)
                                self._queued(rid, start)
                        else:
                            if isinstance(delta, TranscriptDelta | TextDelta):
                                self.waterfall.text(rid, trio.current_time())
                            self.protocol.handle_delta(rid, delta)
                            self._drain()
                finally:
                    await close_deltas(deltas)
            except Exception as exc:  # the agent's bug fails the response, not the call
                error = type(exc).__name__
                log.warning("realtime agent failed on %s: %r", rid, exc)
        self._runs.pop(rid, None)
        self.waterfall.ended(rid)
        if not scope.cancelled_caught:
            self.protocol.handle_response_end(rid, error)
            self._drain()
        await self.ctx.drained()
        self.protocol.handle_output_drained(rid)
        self._drain()

    def _queued(self, rid: str, start: float) -> None:
        """The response's audio from ``start`` (output seconds) was queued: the first time,
        watch for it to go out (the turn's ``first_sent``, then its ``turn.metrics``)."""
        if not self.waterfall.queued(rid, trio.current_time()) or self._nursery is None:
            return
        if self.ctx.played_seconds > start:  # send() sent it at once (an idle pacer)
            self._report(rid, trio.current_time())
        else:
            self._nursery.start_soon(self._first_sent, rid, start)

    async def _first_sent(self, rid: str, start: float) -> None:
        """From a task of its own, so the response never waits on it; a barge-in (or the
        call's end) before the frame went out reports nothing: the caller heard no reply."""
        if await self.ctx.played_past(start):
            self._report(rid, trio.current_time())
        else:
            self.waterfall.forget(rid)

    def _report(self, rid: str, sent_at: float) -> None:
        hook = getattr(self.agent, "turn_marks", None)
        event = self.waterfall.sent(rid, sent_at, hook(rid) if callable(hook) else None)
        if event is not None and self._nursery is not None:
            self._nursery.start_soon(self.ctx.send_event, event)

    async def _transcribe(self, action: Transcribe) -> None:
        await transcribe_item(action, self.agent, self.machine, self._drain)
