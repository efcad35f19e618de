"""LiveKit Agents audio I/O for the appliance: an ``AgentSession`` behind its WebRTC front door.

``pip install appliance[livekit]``. ``AgentSession`` takes any ``AudioInput`` /
``AudioOutput`` pair (``session.input.audio = …``) and runs without a room, a job
context or a LiveKit server when it has them; this module supplies the pair over the
WebSocket agent protocol (docs/agent-protocol.md), the same process boundary as the
Pipecat transport (``appliance.integrations.pipecat``) and for the same reasons: one
connection per call from the transceiver, asyncio here and trio there::

    async def entry(websocket):
        io = ApplianceIO(websocket, on_speech_started=lambda: session.interrupt())
        await io.start()
        session = AgentSession(...)
        session.input.audio, session.output.audio = io.audio_input, io.audio_output
        await session.start(MyAgent(), record=False)
        await io.run()            # until the caller hangs up
        await session.aclose()

    run(entry, port=8766)     # appliance up --agent ws://127.0.0.1:8766

* :class:`ApplianceAudioInput` yields ``rtc.AudioFrame`` (20 ms, mono, the accepted rate);
  it keeps at most 1 s and drops the oldest if the session reads too slowly.
* :class:`ApplianceAudioOutput` sends captured frames paced to ``max_ahead_secs`` ahead of
  the transceiver's playout and reports the segment protocol ``AgentSession`` relies on:
  ``on_playback_started`` at the first frame of a segment, ``on_playback_finished(
  playback_position, interrupted=False)`` once a flushed segment has played out, and on
  ``clear_buffer()`` (barge-in) an ``interrupt`` to the transceiver and
  ``on_playback_finished(playback_position=<seconds actually played>, interrupted=True)``,
  so the session truncates the assistant's turn where the caller stopped hearing it.
  Played time is the transceiver's own count (``output.cleared`` / ``output.idle``,
  docs/agent-protocol.md), not a model of it.
* the appliance's VAD reaches you as ``on_speech_started`` / ``on_speech_stopped``; data
  channel messages as ``on_message(label, data)`` and :meth:`ApplianceIO.send_message`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from livekit import rtc
from livekit.agents.voice.io import AudioInput, AudioOutput, AudioOutputCapabilities
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from ._wsagent import AgentSocket, close_reason, json_object, run, serve_bots

__all__ = ["ApplianceAudioInput", "ApplianceAudioOutput", "ApplianceIO", "run", "serve_bots"]

MAX_INPUT_FRAMES = 50  # 1 s of 20 ms frames, the transceiver's own bound
#: The transceiver's resampler holds a few samples of a segment's tail (a windowed-sinc
#: filter's delay, < 1 ms) until more audio comes: "played out" allows for them.
PLAYED_SLACK = 0.005


class ApplianceAudioInput(AudioInput):
    """The caller's audio as ``rtc.AudioFrame``s, until the call ends."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__(label="appliance")
        self.sample_rate = sample_rate
        self.frames_dropped = 0
        self._frames: deque[rtc.AudioFrame] = deque(maxlen=MAX_INPUT_FRAMES)
        self._ready = asyncio.Event()
        self._closed = False

    def push(self, pcm: bytes) -> None:
        if len(self._frames) == self._frames.maxlen:
            self.frames_dropped += 1
        self._frames.append(rtc.AudioFrame(pcm, self.sample_rate, 1, len(pcm) // 2))
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def __anext__(self) -> rtc.AudioFrame:
        while not self._frames:
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        return self._frames.popleft()


class ApplianceAudioOutput(AudioOutput):
    """The agent's speech to the caller, with playback positions for truncation.

    Positions come from the transceiver's own count of what it sent (``output.cleared``
    in reply to an ``interrupt``, ``output.idle`` when its queue runs dry;
    docs/agent-protocol.md), kept on the same timeline as what we sent: every second we
    send is played or dropped there, in order. Against a transceiver that does not send
    them, the real-time playout model is used after a grace period.
    """

    #: How long to wait for ``output.cleared`` before falling back to the model.
    ACK_GRACE = 0.5

    def __init__(self, conn: AgentSocket, *, max_ahead_secs: float = 0.06) -> None:
        super().__init__(label="appliance", capabilities=AudioOutputCapabilities(pause=False),
                         sample_rate=conn.rate)
        self._conn = conn
        self._rate = conn.rate
        self.max_ahead_secs = max_ahead_secs
        self._playout_end = 0.0  # monotonic time at which the transceiver's queue runs dry
        self._segment_start: float | None = None  # when its first sample plays (model)
        self._segment_secs = 0.0  # audio sent in the current segment
        self._open = False  # a segment has frames and no playback_finished yet
        self._finish: asyncio.Task[None] | None = None
        # The shared timeline: seconds we sent, and the transceiver's "played" for them.
        self._sent = 0.0
        self._offset = 0.0  # transceiver seconds - our seconds (resampling rounding)
        self._seg_at = 0.0  # _sent when the current segment's first sample was sent
        self._played = 0.0  # the last "played" the transceiver reported
        self._acked = asyncio.Event()  # set on each output.idle / output.cleared
        self.acknowledged = False  # the transceiver sends output.* (it is new enough)
        #: Interrupts not yet answered: (_sent, _seg_at, the position's future or None).
        self._clears: deque[tuple[float, float, asyncio.Future[float] | None]] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)  # counts the segment
        if not self._open:
            self._open, self._segment_secs, self._segment_start = True, 0.0, None
            self._seg_at = self._sent
        pcm = bytes(frame.data)
        if not pcm:
            return
        now = time.monotonic()
        if self._segment_start is None:
            self._segment_start = max(now, self._playout_end)
            self.on_playback_started(created_at=time.time())
        await self._conn.send(pcm)
        secs = len(pcm) / 2 / self._rate
        self._segment_secs += secs
        self._sent += secs
        self._playout_end = max(now, self._playout_end) + secs
        ahead = self._playout_end - time.monotonic() - self.max_ahead_secs
        if ahead > 0:
            await asyncio.sleep(ahead)

    def flush(self) -> None:
        super().flush()
        if self._open and self._finish is None:
            self._finish = asyncio.get_running_loop().create_task(
                self._played_out(self._seg_at + self._segment_secs))

    async def _played_out(self, end: float) -> None:
        # Played out when the transceiver says it sent up to the segment's end; the model's
        # time plus a grace period bounds the wait if it never says so.
        deadline = max(self._playout_end, time.monotonic()) + self.ACK_GRACE
        while self._played + PLAYED_SLACK < end + self._offset:
            if self.acknowledged:
                deadline = max(deadline, time.monotonic() + self.ACK_GRACE)
            self._acked.clear()
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            try:
                await asyncio.wait_for(self._acked.wait(), timeout)
            except TimeoutError:
                if not self.acknowledged:
                    break
        self._finish = None
        self._finished(self._segment_secs, interrupted=False)

    def clear_buffer(self) -> None:
        # The transceiver drops its queue when it reads this and answers with what it had
        # sent (output.cleared): the position is then exact.
        loop = asyncio.get_running_loop()
        self._spawn(self._conn.send_json({"type": "interrupt"}))
        if self._finish is not None:
            self._finish.cancel()
            self._finish = None
        answer: asyncio.Future[float] | None = None
        if self._open:
            start = self._segment_start
            model = 0.0 if start is None else time.monotonic() - start
            answer = loop.create_future()
            self._spawn(self._interrupted(answer, model, self._segment_secs))
            self._open = False  # a new segment may start before the answer comes
        self._clears.append((self._sent, self._seg_at, answer))
        self._playout_end = 0.0

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        # The loop keeps only weak references to tasks: hold them until they are done.
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _interrupted(self, answer: asyncio.Future[float], model: float,
                           secs: float) -> None:
        try:
            position = await asyncio.wait_for(asyncio.shield(answer), self.ACK_GRACE)
        except TimeoutError:
            position = model  # a transceiver that does not answer: the real-time model
        self.on_playback_finished(playback_position=min(max(position, 0.0), secs),
                                  interrupted=True)

    # -- the transceiver's acknowledgements (ApplianceIO routes them here) ---------------

    def on_idle(self, played: float) -> None:
        self.acknowledged = True
        self._played = played
        self._acked.set()

    def on_cleared(self, played: float, dropped: float) -> None:
        self.acknowledged = True
        self._played = played
        if self._clears:
            sent, seg_at, answer = self._clears.popleft()
            if answer is not None and not answer.done():
                answer.set_result(played - (seg_at + self._offset))
            # Everything sent before the interrupt was played or dropped: re-align.
            self._offset = played + dropped - sent
        self._acked.set()

    def _finished(self, position: float, *, interrupted: bool) -> None:
        self._open = False
        self.on_playback_finished(playback_position=position, interrupted=interrupted)


class ApplianceIO:
    """One call: the handshake, then :attr:`audio_input` / :attr:`audio_output` for an
    ``AgentSession`` and :meth:`run` to pump the socket until the call ends."""

    def __init__(
        self,
        websocket: ServerConnection,
        *,
        sample_rate: int = 24_000,
        max_ahead_secs: float = 0.06,
        on_speech_started: Callable[[], Any] | None = None,
        on_speech_stopped: Callable[[], Any] | None = None,
        on_message: Callable[[str, str | bytes], Any] | None = None,
        default_channel: str | None = None,
    ) -> None:
        self._conn = AgentSocket(websocket, wire_sample_rate=sample_rate,
                                 default_channel=default_channel)
        self._max_ahead = max_ahead_secs
        self.on_speech_started = on_speech_started
        self.on_speech_stopped = on_speech_stopped
        self.on_message = on_message
        self._input: ApplianceAudioInput | None = None
        self._output: ApplianceAudioOutput | None = None

    async def start(self) -> None:
        """Read ``session.start`` and accept it (raises ``TimeoutError``/``ConnectionError``)."""
        await self._conn.accept(self._conn.wire_sample_rate or 24_000)
        self._input = ApplianceAudioInput(self._conn.rate)
        self._output = ApplianceAudioOutput(self._conn, max_ahead_secs=self._max_ahead)

    @property
    def audio_input(self) -> ApplianceAudioInput:
        assert self._input is not None, "call start() first"
        return self._input

    @property
    def audio_output(self) -> ApplianceAudioOutput:
        assert self._output is not None, "call start() first"
        return self._output

    @property
    def session_id(self) -> str | None:
        return None if self._conn.start is None else self._conn.start.get("session_id")

    @property
    def end_reason(self) -> str | None:
        return self._conn.end_reason

    async def send_message(self, data: Any, channel: str | int | None = None) -> None:
        """Send on a data channel (``str`` text, ``bytes`` binary, else JSON)."""
        await self._conn.send_message(data, channel)

    async def run(self) -> str:
        """Pump the socket until the call ends; returns why."""
        conn, audio = self._conn, self.audio_input
        try:
            async for msg in conn.ws:
                if isinstance(msg, bytes):
                    audio.push(msg)
                    continue
                event = json_object(msg)
                if event is not None:
                    await self._event(event)
                if conn.end_reason is not None:
                    break
        except ConnectionClosed:
            pass
        conn.end_reason = conn.end_reason or close_reason(conn.ws)
        conn.closed = True
        audio.close()
        return conn.end_reason

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "speech.started" and self.on_speech_started is not None:
            await _maybe_await(self.on_speech_started())
        elif kind == "speech.stopped" and self.on_speech_stopped is not None:
            await _maybe_await(self.on_speech_stopped())
        elif kind == "channel.opened" and isinstance(event.get("channel"), dict):
            info = event["channel"]
            if isinstance(info.get("id"), int):
                self._conn.channels[info["id"]] = info
                await self._conn.flush_pending()
        elif kind == "channel.closed":
            self._conn.channels.pop(event.get("id"), None)  # type: ignore[arg-type]
        elif kind == "channel.message" and self.on_message is not None:
            data: str | bytes
            if isinstance(event.get("text"), str):
                data = event["text"]
            elif isinstance(event.get("binary"), str):
                try:
                    data = base64.b64decode(event["binary"], validate=True)
                except (binascii.Error, ValueError):
                    return
            else:
                return
            await _maybe_await(self.on_message(str(event.get("label", "")), data))
        elif kind in ("output.idle", "output.cleared") and self._output is not None:
            played = event.get("played")
            if isinstance(played, int | float) and not isinstance(played, bool):
                if kind == "output.idle":
                    self._output.on_idle(float(played))
                else:
                    dropped = event.get("dropped")
                    if not isinstance(dropped, int | float) or isinstance(dropped, bool):
                        dropped = 0.0
                    self._output.on_cleared(float(played), float(dropped))
        elif kind == "session.ended":
            self._conn.end_reason = str(event.get("reason") or "ended")

    async def close(self, reason: str = "session-ended") -> None:
        """Hang up once the queued audio has played (a normal close)."""
        if not self._conn.closed:
            await self._conn.close(reason)


async def _maybe_await(value: Any) -> None:
    """Await a callback's coroutine; a future (``session.interrupt()``'s) is not waited
    for: the socket must keep being read while the session acts on it."""
    if asyncio.iscoroutine(value):
        await value
