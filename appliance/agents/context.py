"""The session context an in-process agent programs against (issue 6, item 1).

An agent is an async function ``async def agent(ctx: AgentContext) -> None`` or a class
whose instances have ``async def run(self, ctx)`` (one instance per session). It runs as a
task in the session's nursery and talks to the caller only through ``ctx``::

    async def echo(ctx: AgentContext) -> None:
        async for frame in ctx.frames():
            await ctx.send(frame.pcm)

Audio is **mono PCM16 little-endian at 48 kHz**; inbound frames are exactly 20 ms (960
samples, 1920 bytes). Timing model:

* inbound: each frame is handed over the moment the transceiver has decoded it (the jitter
  buffer adds no delay while packets arrive in order); if the agent does not keep up, the
  oldest unread frames are dropped (``frames_dropped``), never the network loop blocked;
* outbound: :meth:`AgentContext.send` takes any even number of bytes and returns as soon
  as they are queued; the transceiver cuts them into 20 ms frames and sends them at real
  time. The queue is bounded (``max_output_seconds``, 2 s by default): ``send`` waits while
  it is full — that wait is the back-pressure that paces a faster-than-real-time producer
  such as a TTS engine. :meth:`AgentContext.interrupt` drops everything queued at once
  (barge-in), including the unsent rest of a ``send`` that is waiting for room.

Events are JSON-able dicts with a ``"type"``: the transceiver sends ``session.started``,
``stats``, ``recording.stopped`` and ``session.ended`` to :meth:`AgentContext.events`; an agent may send any event
with :meth:`AgentContext.send_event`; ``{"type": "session.end", "reason": ...}`` ends the
call. At most one ``stats`` event waits unread: a newer one replaces it (a snapshot is
superseded, and an agent that never reads events must not make the session grow). The
transceiver side of the object is :class:`AgentHost`.

Data channels (RFC 8831) come beside the audio: :meth:`AgentContext.channel_events` yields
typed, frozen ``ChannelOpened`` / ``ChannelMessage`` / ``ChannelClosed`` events, and
:meth:`AgentContext.send_message` sends text (``str``) or binary (``bytes``) on a channel
by id or label, waiting while the channel's unacknowledged bytes are above a high-water
mark (the browser's ``bufferedAmount``). The bounds are in :mod:`appliance.agents.channels`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from .channels import ChannelEvent, ChannelHub, ChannelInfo

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
FRAME_BYTES = FRAME_SAMPLES * 2


class SessionEnded(Exception):
    """Raised by :meth:`AgentContext.send` once the session is over."""


#: What ``ctx.transcripts(**options)`` is made by: ``provider(ctx, **options)`` -> the async
#: iterator of the caller's turns and words. agents/ has none of its own: the speech
#: package provides :func:`appliance.speech.listen.transcripts` (appliance/speech/plugin.py).
TranscriptsProvider = Callable[..., AsyncGenerator[Any, None]]
_transcripts: TranscriptsProvider | None = None


def provide_transcripts(provider: TranscriptsProvider | None) -> None:
    """Make ``provider`` what ``ctx.transcripts()`` runs in every context created without
    one of its own (the speech package calls this when it is loaded as a plugin)."""
    global _transcripts
    _transcripts = provider


@dataclass(frozen=True, slots=True)
class Frame:
    """20 ms of inbound audio."""

    pcm: bytes  # 1920 bytes: 960 mono PCM16 samples at 48 kHz
    timestamp: float  # media time in seconds since the session's first frame (RTP clock)
    received_at: float  # trio clock time at which the frame was handed over
    speech: bool  # "speech likely", from an energy VAD
    level_dbfs: float = -120.0  # the frame's RMS level
    concealed: bool = False  # True if the packet was lost and this is concealment


@dataclass(frozen=True, slots=True)
class AgentIdentity:
    """Who the agent is, and for which session."""

    name: str  # "echo", "pkg.mod:attr", "ws://…"
    session_id: str
    transceiver: int = 0
    info: dict[str, Any] = field(default_factory=dict)  # codec, client hints…
    params: dict[str, Any] = field(default_factory=dict)  # per-call parameters from signaling (e.g. "realtime")


class AgentContext:
    """What an agent sees. Created by the transceiver; agents never construct one."""

    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES

    def __init__(self, host: AgentHost, identity: AgentIdentity, *,
                 transcripts: TranscriptsProvider | None = None) -> None:
        self._host = host
        self.identity = identity
        self._output_seen = 0  # host.queued_total at the last output_queued()
        #: :meth:`transcripts`' provider: given here, else the one the speech plugin
        #: provided (:func:`provide_transcripts`), looked up at the call.
        self._transcripts = transcripts

    @property
    def session_id(self) -> str:
        return self.identity.session_id

    @property
    def params(self) -> dict[str, Any]:
        """Per-call parameters given by signaling (e.g. ``params["realtime"]``)."""
        return self.identity.params

    @property
    def ended(self) -> bool:
        return self._host.closed

    @property
    def end_reason(self) -> str | None:
        return self._host.end_reason

    async def frames(self) -> AsyncGenerator[Frame, None]:
        """Inbound frames in order, until the session ends."""
        host = self._host
        while True:
            if host._frames:
                yield host._frames.popleft()
                continue
            if host.closed:
                return
            await host._frames_lot.park()

    async def send(self, pcm: bytes | bytearray | memoryview) -> None:
        """Queue PCM16 audio for playback (any even length); waits while the queue is full."""
        await self._host._enqueue(bytes(pcm))

    def send_nowait(self, pcm: bytes) -> bool:
        """Queue one whole 20 ms frame (1920 bytes) without waiting; ``False`` (and nothing
        queued) if the queue is full. For synchronous frame handlers (see
        :attr:`~appliance.agents.registry.ResolvedAgent.on_frame`)."""
        return self._host.enqueue_frame_nowait(pcm)

    def interrupt(self) -> float:
        """Drop every queued output sample now (barge-in); returns the seconds dropped."""
        return self._host.interrupt() / SAMPLE_RATE

    @property
    def played_seconds(self) -> float:
        """Seconds of agent audio handed to the network so far (silence fill not counted).

        Counted when the pacer takes a frame off the queue and sends it, so after an
        :meth:`interrupt` ``played_seconds`` is exactly how much of what was queued the
        caller got (their own jitter buffer plays it some tens of ms later)."""
        return self._host.played_samples / SAMPLE_RATE

    async def drained(self) -> None:
        """Return once everything queued has been handed to the pacer (or the call ended)."""
        await self._host.wait_drained()

    async def played_past(self, seconds: float) -> bool:
        """Return True once :attr:`played_seconds` is past ``seconds`` (the pacer has sent
        output beyond that point), False if the output was interrupted or the call ended
        first. ``played_seconds + queued_seconds`` read just before a :meth:`send` is where
        that audio starts: waiting past it returns the moment its first frame went out (the
        assistant's ``first_sent`` mark)."""
        host = self._host
        target = round(seconds * SAMPLE_RATE)
        interrupts = host.interrupts
        while host.played_samples <= target:
            if host.closed or host.interrupts != interrupts:
                return False
            await host._space_lot.park()  # woken by every frame the pacer takes
        return True

    async def output_queued(self) -> None:
        """Return once audio has been queued since the last return (or since the start).

        It counts samples ever queued, so audio queued and already sent before the caller
        got to wait still counts: no wake-up is lost to the pacer being quicker."""
        host = self._host
        while host.queued_total == self._output_seen and not host.closed:
            await host._out_lot.park()
        self._output_seen = host.queued_total

    @property
    def frames_dropped(self) -> int:
        """Inbound frames dropped because the agent did not read them in time."""
        return self._host.frames_dropped

    @property
    def queued_seconds(self) -> float:
        """Audio queued and not yet sent."""
        return self._host.queued_samples / SAMPLE_RATE

    async def events(self) -> AsyncGenerator[dict[str, Any], None]:
        """Events from the transceiver (session.started, stats, session.ended, custom)."""
        host = self._host
        while True:
            if host._events_in:
                yield host._events_in.popleft()
                continue
            if host.closed:
                return
            await host._events_lot.park()

    async def send_event(self, event: dict[str, Any]) -> None:
        """Send an event to the transceiver; ``{"type": "session.end"}`` hangs up."""
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ValueError("an event is a dict with a string 'type'")
        await trio.lowlevel.checkpoint()
        self._host._event_out(event)


    def transcripts(self, **options: Any) -> AsyncGenerator[Any, None]:
        """The caller's turns and transcripts: turn detection (Silero VAD) and speech-to-text
        (PocketSphinx by default) over :meth:`frames` — :func:`appliance.speech.transcripts`
        with ``options`` (``turn=``, ``stt=``). It reads the frames itself, so an agent uses
        one or the other. Needs the ``speech`` extra (docs/speech.md)."""
        # Injected, never imported: speech sits above agents (it registers the provider).
        provider = self._transcripts or _transcripts
        if provider is None:
            raise RuntimeError("ctx.transcripts() needs the speech package loaded as a plugin "
                               "(import appliance.plugins; the transceiver does)")
        return provider(self, **options)

    # -- data channels (appliance.agents.channels) -------------------------------------------

    @property
    def channels(self) -> dict[int, ChannelInfo]:
        """The call's open data channels, by id (a snapshot is a ``dict(...)`` away)."""
        return self._host.channels.channels

    async def channel_events(self) -> AsyncGenerator[ChannelEvent, None]:
        """Channel opened / message / closed events, in order, until the session ends."""
        async for event in self._host.channels.events():
            yield event

    async def send_message(self, channel: int | str, data: str | bytes) -> None:
        """Send one message (``str``: text, ``bytes``: binary) on a channel given by id or
        label; waits while the channel's buffered amount is above the high-water mark."""
        await self._host.channels.send(channel, data)

    def send_message_nowait(self, channel: int | str, data: str | bytes) -> None:
        """Send one message without waiting for buffer room (synchronous handlers)."""
        self._host.channels.send_nowait(channel, data)

    def open_channel(
        self,
        label: str,
        *,
        protocol: str = "",
        ordered: bool = True,
        max_retransmits: int | None = None,
        max_packet_lifetime_ms: int | None = None,
        negotiated_id: int | None = None,
    ) -> ChannelInfo:
        """Open a data channel to the caller (DCEP, or pre-negotiated with an id)."""
        return self._host.channels.open(
            label,
            protocol=protocol,
            ordered=ordered,
            max_retransmits=max_retransmits,
            max_packet_lifetime_ms=max_packet_lifetime_ms,
            negotiated_id=negotiated_id,
        )

    def close_channel(self, channel: int | str) -> None:
        self._host.channels.close_channel(channel)

    def buffered_amount(self, channel: int | str) -> int:
        """Bytes sent on the channel and not yet acknowledged by the caller."""
        return self._host.channels.buffered_amount(channel)


#: An agent: called once per session with that session's context.
AgentFn = Callable[[AgentContext], Awaitable[None]]


class AgentHost:
    """The transceiver's half of an agent session: queues both ways, no I/O of its own.

    ``push_frame``/``push_event`` never block (the network loop calls them);
    ``pop_output_frame`` hands the pacer one 20 ms frame at a time.
    """

    def __init__(
        self,
        *,
        max_output_seconds: float = 2.0,
        max_inbound_frames: int = 50,
        max_events: int = 100,
        on_event: Any = None,
        on_output: Any = None,
    ) -> None:
        self._frames: deque[Frame] = deque(maxlen=max_inbound_frames)
        self._frames_lot = trio.lowlevel.ParkingLot()
        self._events_in: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._events_lot = trio.lowlevel.ParkingLot()
        self._out: deque[bytes] = deque()
        self._partial = bytearray()
        self._out_lot = trio.lowlevel.ParkingLot()  # the pacer waits here for output
        self._space_lot = trio.lowlevel.ParkingLot()  # senders wait here for room
        self.max_output_frames = max(1, round(max_output_seconds * SAMPLE_RATE / FRAME_SAMPLES))
        self._epoch = 0  # bumped by interrupt(): a waiting send() drops its remainder
        self._on_event = on_event
        #: Called (no arguments) whenever output is queued: the transceiver sends what is
        #: due at once, from the caller's task, instead of waking a pacer task per frame.
        self.on_output: Any = on_output
        self.closed = False
        self.end_reason: str | None = None
        self.frames_dropped = 0
        self.events_dropped = 0
        self.events_coalesced = 0  # unread stats events replaced by a newer one
        self.interrupts = 0
        #: Output samples (48 kHz) handed to the pacer, and dropped by interrupt(): every
        #: sample ever queued is one or the other, or still queued.
        self.played_samples = 0
        self.dropped_samples = 0
        self.queued_total = 0  # samples ever queued (bytes // 2)
        #: The call's data channels; the transceiver sets ``channels.port`` once SCTP is up.
        self.channels = ChannelHub()

    # -- inbound (network side) ----------------------------------------------------------

    def push_frame(self, frame: Frame) -> None:
        if len(self._frames) == self._frames.maxlen:
            self.frames_dropped += 1  # deque drops the oldest
        self._frames.append(frame)
        if self._frames_lot:  # unpark_all() costs ~1 µs even with nobody parked
            self._frames_lot.unpark_all()

    def push_event(self, event: dict[str, Any]) -> None:
        queue = self._events_in
        if event.get("type") == "stats":
            # A stats event is a snapshot: an unread one is superseded by the newer one.
            # Without this, a session whose agent never reads events() (passthrough, a
            # synchronous frame handler, an agent that ignores them) accumulated one dict
            # per RTCP interval, up to max_events (~40 KB per call after ~8 min).
            for i, pending in enumerate(queue):
                if pending.get("type") == "stats":
                    del queue[i]
                    self.events_coalesced += 1
                    break
        if len(queue) == queue.maxlen:
            self.events_dropped += 1
        queue.append(event)
        if self._events_lot:
            self._events_lot.unpark_all()

    # -- outbound (pacer side) -----------------------------------------------------------

    @property
    def queued_samples(self) -> int:
        return len(self._out) * FRAME_SAMPLES + len(self._partial) // 2

    @property
    def queued_frames(self) -> int:
        """Whole frames queued (the pacer's backlog)."""
        return len(self._out)

    def has_output(self) -> bool:
        return bool(self._out) or bool(self._partial)

    async def wait_output(self) -> None:
        """Return once there is something to send (immediately if there is)."""
        while not self._out and not self._partial:
            await self._out_lot.park()

    async def wait_drained(self) -> None:
        """Return once every queued sample has been handed to the pacer."""
        while (self._out or self._partial) and not self.closed:
            await self._space_lot.park()

    def pop_output_frame(self) -> bytes | None:
        """One 20 ms frame; a trailing partial frame comes out zero-padded (underrun)."""
        if self._out:
            frame = self._out.popleft()
            self.played_samples += FRAME_SAMPLES
            if self._space_lot:
                self._space_lot.unpark_all()
            return frame
        if self._partial:
            frame = bytes(self._partial) + bytes(FRAME_BYTES - len(self._partial))
            self.played_samples += len(self._partial) // 2
            self._partial.clear()
            self._space_lot.unpark_all()
            return frame
        return None

    def interrupt(self) -> int:
        """Drop the queue; returns how many samples (48 kHz) were dropped."""
        dropped = self.queued_samples
        self.dropped_samples += dropped
        self._out.clear()
        self._partial.clear()
        self._epoch += 1
        self.interrupts += 1
        self._space_lot.unpark_all()
        return dropped

    async def _enqueue(self, pcm: bytes) -> None:
        if len(pcm) % 2:
            raise ValueError("PCM16 audio must be an even number of bytes")
        if self.closed:
            raise SessionEnded(self.end_reason or "session ended")
        await trio.lowlevel.checkpoint_if_cancelled()
        epoch = self._epoch
        pos = 0
        n = len(pcm)
        while pos < n:
            while len(self._out) >= self.max_output_frames:
                await self._space_lot.park()
                if self.closed:
                    raise SessionEnded(self.end_reason or "session ended")
                if self._epoch != epoch:
                    return  # interrupted while waiting: the rest is dropped too
            take = min(FRAME_BYTES - len(self._partial), n - pos)
            self.queued_total += take // 2
            if not self._partial and take == FRAME_BYTES:
                self._out.append(pcm[pos : pos + FRAME_BYTES])  # whole frames: no partial copy
            else:
                self._partial += pcm[pos : pos + take]
                if len(self._partial) == FRAME_BYTES:
                    self._out.append(bytes(self._partial))
                    self._partial.clear()
            pos += take
            if self._out_lot:
                self._out_lot.unpark_all()
            if self.on_output is not None:
                self.on_output()

    def enqueue_frame_nowait(self, pcm: bytes) -> bool:
        """Queue one whole frame now (no partial-frame handling, never waits)."""
        if len(pcm) != FRAME_BYTES:
            raise ValueError(f"a frame is {FRAME_BYTES} bytes of PCM16, got {len(pcm)}")
        if self.closed:
            raise SessionEnded(self.end_reason or "session ended")
        if self._partial or len(self._out) >= self.max_output_frames:
            return False
        self._out.append(pcm)
        self.queued_total += FRAME_SAMPLES
        if self._out_lot:
            self._out_lot.unpark_all()
        if self.on_output is not None:
            self.on_output()
        return True

    def _event_out(self, event: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(event)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """The session is over: iterators finish after what is queued, send() raises."""
        if self.closed:
            return
        self.closed = True
        self.end_reason = reason
        self._frames_lot.unpark_all()
        self._events_lot.unpark_all()
        self._space_lot.unpark_all()
        self._out_lot.unpark_all()
        self.channels.close()
