"""A Pipecat transport for the appliance: the caller's WebRTC call as a pipeline's I/O.

``pip install appliance[pipecat]``. Pipecat is asyncio; the appliance is trio. They meet
at the process boundary the appliance already has for agents in any language, the
WebSocket agent protocol (docs/agent-protocol.md, ``appliance.agent.v1``): the
transceiver connects out to ``--agent ws://host:port/path`` once per call, so each
incoming connection is one call and one pipeline run. Nothing of trio enters the
Pipecat process and nothing of asyncio enters the transceiver, a bot crashing or
stalling cannot stall the media loop (the transceiver bounds both directions), and bots
scale and deploy like any other WebSocket service::

    async def bot(websocket):
        transport = ApplianceTransport(websocket, ApplianceParams())   # the one-line change
        pipeline = Pipeline([transport.input(), ..., transport.output()])
        ...

    run(bot, port=8765)       # appliance up --agent ws://127.0.0.1:8765

What maps to what:

* caller audio (binary, PCM16 at the accepted rate) -> ``InputAudioRawFrame`` at the
  pipeline's input rate. The transport accepts the session at that rate when the
  transceiver offers it (48/24/16 kHz; the transceiver resamples: appliance/audio/),
  otherwise at 48 kHz and resamples here with Pipecat's stream resampler.
* ``speech.started`` / ``speech.stopped`` (the appliance's energy VAD, 200 ms hangover)
  -> ``VADUserStartedSpeakingFrame`` / ``VADUserStoppedSpeakingFrame``, the frames
  Pipecat's user-turn strategies consume in place of a Silero VAD. With
  ``user_turn_frames`` the transport is also the turn detector for pipelines without a
  turn processor: ``UserStartedSpeakingFrame`` + an interruption, then
  ``UserStoppedSpeakingFrame``.
* ``OutputAudioRawFrame`` -> binary frames, paced so the transceiver's queue holds at
  most ``max_ahead_secs`` (the protocol processes messages in order, so audio far ahead
  of playback would delay an ``interrupt``; docs/agent-protocol.md "Barge-in").
* ``InterruptionFrame`` -> ``{"type": "interrupt"}`` at once (the transceiver drops its
  queue) and every chunk queued before the interruption is dropped here, including one
  the output task had already taken off Pipecat's queue.
* ``channel.message`` -> ``InputTransportMessageFrame`` (JSON text decoded, as Pipecat's
  own WebRTC transport does; other text as ``str``, binary as ``bytes``; the channel
  label in ``frame.transport_source``); ``OutputTransportMessageFrame`` /
  ``OutputTransportMessageUrgentFrame`` -> ``channel.send`` (``str`` as text, ``bytes``
  as binary, anything else JSON), on ``frame.metadata["channel"]``, else
  ``default_channel``, else the first open channel; held (bounded) until one opens.
* the call ending (``session.ended``, the socket closing) -> ``CancelWorkerFrame``
  upstream, so the pipeline stops; the pipeline ending -> close 1000, which lets the
  queued audio play out (``agent: closed: pipeline-ended``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from typing import Any

from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import (
    CancelFrame,
    CancelWorkerFrame,
    ClientConnectedFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InputTransportMessageFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputTransportMessageFrame,
    OutputTransportMessageUrgentFrame,
    StartFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ._wsagent import AgentSocket, close_reason, json_object, run, serve_bots

__all__ = [
    "ApplianceParams",
    "ApplianceTransport",
    "channel_message",
    "run",
    "serve_bots",
]

#: The appliance's VAD holds "speech" for 10 frames (appliance/agents/vad.py).
VAD_STOP_SECS = 0.2


class ApplianceParams(TransportParams):
    """:class:`TransportParams` with the appliance's defaults and its own knobs.

    Parameters:
        wire_sample_rate: the rate to accept the session at (48000, 24000 or 16000). None:
            the pipeline's input rate if the transceiver offers it, else 48000.
        vad_frames: emit ``VADUserStarted/StoppedSpeakingFrame`` from the appliance's VAD.
        user_turn_frames: also act as the turn detector (``UserStarted/Stopped
            SpeakingFrame`` and an interruption when the caller starts talking); for
            pipelines without a user-turn processor or aggregator.
        max_ahead_secs: how far audio may run ahead of playback in the transceiver.
        default_channel: the data-channel label for outgoing messages that name none.
        json_messages: decode text channel messages that are JSON.
        end_on_hangup: cancel the pipeline when the call ends.
        start_timeout_secs: wait at most this long for ``session.start``.
    """

    audio_in_enabled: bool = True
    audio_out_enabled: bool = True
    # 20 ms chunks, the appliance's frame: an interruption leaves at most one in flight.
    audio_out_10ms_chunks: int = 2
    # The transceiver plays silence on an under-run: no padding needed at the end.
    audio_out_end_silence_secs: int = 0
    wire_sample_rate: int | None = None
    vad_frames: bool = True
    user_turn_frames: bool = False
    max_ahead_secs: float = 0.06
    default_channel: str | None = None
    json_messages: bool = True
    end_on_hangup: bool = True
    start_timeout_secs: float = 5.0


def channel_message(message: Any, channel: str | int | None = None, *,
                    urgent: bool = False) -> Frame:
    """An output message frame for a given data channel (label or id)."""
    frame: Frame = (OutputTransportMessageUrgentFrame(message=message) if urgent
                    else OutputTransportMessageFrame(message=message))
    if channel is not None:
        frame.metadata["channel"] = channel
    return frame


class ApplianceInputTransport(BaseInputTransport):
    """Caller audio, VAD and channel messages into the pipeline."""

    def __init__(self, transport: ApplianceTransport, conn: AgentSocket,
                 params: ApplianceParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._transport = transport
        self._conn = conn
        self._params: ApplianceParams = params
        self._receive_task: asyncio.Task[None] | None = None
        self._resampler = create_stream_resampler()

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        try:
            await self._conn.accept(self.sample_rate)
        except (TimeoutError, ConnectionError, ConnectionClosed) as exc:
            logger.error(f"{self}: no appliance session: {exc}")
            await self._hung_up(f"no session: {exc}")
            return
        await self.set_transport_ready(frame)
        await self.push_frame(ClientConnectedFrame())
        await self._transport.call_event("on_client_connected", self._conn.start)
        if self._receive_task is None:
            self._receive_task = self.create_task(self._receive())

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._stop_receiving()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._stop_receiving()

    async def cleanup(self) -> None:
        await super().cleanup()  # type: ignore[no-untyped-call]
        await self._stop_receiving()

    async def _stop_receiving(self) -> None:
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None

    async def _receive(self) -> None:
        conn = self._conn
        try:
            async for msg in conn.ws:
                if isinstance(msg, bytes):
                    await self._audio(msg)
                else:
                    event = json_object(msg)
                    if event is not None:
                        await self._event(event)
                if conn.end_reason is not None:
                    break
        except ConnectionClosed:
            pass
        reason = conn.end_reason or close_reason(conn.ws)
        await self._hung_up(reason)

    async def _hung_up(self, reason: str) -> None:
        self._conn.end_reason = self._conn.end_reason or reason
        self._conn.closed = True
        await self._transport.call_event("on_client_disconnected", self._conn.end_reason)
        if self._params.end_on_hangup:
            await self.push_frame(CancelWorkerFrame(reason=f"call ended: {reason}"),
                                  FrameDirection.UPSTREAM)

    async def _audio(self, pcm: bytes) -> None:
        if self._conn.rate != self.sample_rate:
            pcm = await self._resampler.resample(pcm, self._conn.rate, self.sample_rate)
        if pcm:
            await self.push_audio_frame(
                InputAudioRawFrame(audio=pcm, sample_rate=self.sample_rate, num_channels=1))

    async def _in_order(self, frame: Frame) -> None:
        """Push a frame after the audio frames that came before it on the socket.

        Audio goes through the base class's queue and task (filters, passthrough); a frame
        pushed directly could overtake the last frames of an utterance. The queue's
        ``join()`` returns once every queued frame has been pushed."""
        queue = getattr(self, "_audio_in_queue", None)
        if queue is not None:
            await queue.join()
        await self.push_frame(frame)

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        params = self._params
        if kind == "speech.started":
            if params.vad_frames:
                await self._in_order(VADUserStartedSpeakingFrame(start_secs=0.0))
            if params.user_turn_frames:
                await self.broadcast_frame(UserStartedSpeakingFrame)
                await self.broadcast_interruption()  # type: ignore[no-untyped-call]
        elif kind == "speech.stopped":
            if params.vad_frames:
                await self._in_order(VADUserStoppedSpeakingFrame(stop_secs=VAD_STOP_SECS))
            if params.user_turn_frames:
                queue = getattr(self, "_audio_in_queue", None)
                if queue is not None:
                    await queue.join()
                await self.broadcast_frame(UserStoppedSpeakingFrame)
        elif kind == "channel.message":
            await self._channel_message(event)
        elif kind == "channel.opened" and isinstance(event.get("channel"), dict):
            info = event["channel"]
            if isinstance(info.get("id"), int):
                self._conn.channels[info["id"]] = info
                await self._transport.call_event("on_channel_opened", info)
                await self._conn.flush_pending()
        elif kind == "channel.closed":
            info = self._conn.channels.pop(event.get("id"), None)  # type: ignore[arg-type]
            await self._transport.call_event("on_channel_closed", info or event)
        elif kind == "channel.error":
            logger.warning(f"{self}: channel {event.get('channel')!r}: {event.get('message')}")
        elif kind == "input.dropped":
            logger.warning(f"{self}: the appliance dropped {event.get('frames')} input frames "
                           "(the pipeline read too slowly)")
        elif kind == "session.ended":
            self._conn.end_reason = str(event.get("reason") or "ended")

    async def _channel_message(self, event: dict[str, Any]) -> None:
        message: Any
        if isinstance(event.get("text"), str):
            message = event["text"]
            if self._params.json_messages:
                try:
                    message = json.loads(message)
                except ValueError:
                    pass
        elif isinstance(event.get("binary"), str):
            try:
                message = base64.b64decode(event["binary"], validate=True)
            except (binascii.Error, ValueError):
                return
        else:
            return
        frame = InputTransportMessageFrame(message=message)
        frame.transport_source = event.get("label")
        await self.broadcast_frame_instance(frame)


class ApplianceOutputTransport(BaseOutputTransport):
    """Pipeline audio and messages to the caller; interruptions drop queued audio."""

    def __init__(self, transport: ApplianceTransport, conn: AgentSocket,
                 params: ApplianceParams, **kwargs: Any) -> None:
        super().__init__(params, **kwargs)
        self._transport = transport
        self._conn = conn
        self._params: ApplianceParams = params
        self._resampler = create_stream_resampler()
        # Frame ids come from one global counter (pipecat.utils.utils.obj_id): a chunk
        # with an id below the last interruption's was queued before it.
        self._interrupted_at = 0
        self._playout_end = 0.0  # monotonic time at which the transceiver's queue runs dry
        self.frames_dropped = 0  # chunks dropped by interruptions after leaving the queue

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        try:
            await self._conn.accept(self.sample_rate)
        except (TimeoutError, ConnectionError, ConnectionClosed):
            return  # the input side reports it and cancels the pipeline
        await self.set_transport_ready(frame)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)  # waits until the queued audio has been written
        if not self._conn.closed:
            # A normal close lets the transceiver play what it holds (agent-protocol.md).
            await self._conn.close("pipeline-ended")

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        if not self._conn.closed:
            await self._conn.send_json({"type": "session.end", "reason": "pipeline-cancelled"})
            await self._conn.close("pipeline-cancelled")

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, InterruptionFrame):
            # Before any await: the audio task may be between taking a chunk off the
            # queue and writing it.
            self._interrupted_at = frame.id
            self._playout_end = 0.0
            await self._conn.send_json({"type": "interrupt"})
        await super().process_frame(frame, direction)

    async def send_message(
        self, frame: OutputTransportMessageFrame | OutputTransportMessageUrgentFrame
    ) -> None:
        await self._conn.send_message(frame.message, frame.metadata.get("channel"))

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        conn = self._conn
        if conn.closed or not conn.rate:
            return False
        if frame.interruptible and frame.id < self._interrupted_at:
            self.frames_dropped += 1
            return True  # taken, and dropped: it was queued before the interruption
        pcm = frame.audio
        if frame.sample_rate != conn.rate:
            pcm = await self._resampler.resample(pcm, frame.sample_rate, conn.rate)
        if not pcm:
            return True
        await conn.send(pcm)
        # Pace like a sound card, but against the transceiver's playout: it plays 20 ms per
        # 20 ms from the first frame, so the queue ends at max(now, end) + duration.
        now = time.monotonic()
        self._playout_end = max(now, self._playout_end) + len(pcm) / 2 / conn.rate
        ahead = self._playout_end - now - self._params.max_ahead_secs
        if ahead > 0:
            await asyncio.sleep(ahead)
        return not conn.closed


class ApplianceTransport(BaseTransport):
    """One appliance call (one WebSocket connection from a transceiver) as a transport.

    Event handlers: ``on_client_connected(transport, session_start)``,
    ``on_client_disconnected(transport, reason)``, ``on_channel_opened(transport,
    channel)``, ``on_channel_closed(transport, channel)``.
    """

    def __init__(self, websocket: ServerConnection, params: ApplianceParams | None = None,
                 *, input_name: str | None = None, output_name: str | None = None) -> None:
        super().__init__(input_name=input_name, output_name=output_name)
        self._params = params or ApplianceParams()
        self._conn = AgentSocket(websocket, wire_sample_rate=self._params.wire_sample_rate,
                                 default_channel=self._params.default_channel,
                                 start_timeout=self._params.start_timeout_secs)
        self._input = ApplianceInputTransport(self, self._conn, self._params,
                                              name=self._input_name)
        self._output = ApplianceOutputTransport(self, self._conn, self._params,
                                                name=self._output_name)
        for name in ("on_client_connected", "on_client_disconnected", "on_channel_opened",
                     "on_channel_closed"):
            self._register_event_handler(name)

    def input(self) -> ApplianceInputTransport:
        return self._input

    def output(self) -> ApplianceOutputTransport:
        return self._output

    @property
    def session_id(self) -> str | None:
        return None if self._conn.start is None else self._conn.start.get("session_id")

    @property
    def wire_sample_rate(self) -> int:
        """The rate the session was accepted at (0 before)."""
        return self._conn.rate

    @property
    def channels(self) -> dict[int, dict[str, Any]]:
        """Open data channels by id, as ``channel.opened`` described them."""
        return self._conn.channels

    @property
    def end_reason(self) -> str | None:
        return self._conn.end_reason

    async def call_event(self, name: str, *args: Any) -> None:
        await self._call_event_handler(name, *args)


