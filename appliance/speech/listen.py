"""Hear the caller: turn detection + speech-to-text over an agent's inbound frames.

``async for event in transcripts(ctx)`` (also reachable as ``ctx.transcripts()``) reads
the call's frames and yields, in order:

* :class:`UserSpeechStarted` — the turn detector heard speech (barge-in point);
* :class:`TranscriptPartial` — the engine's current hypothesis, when it changes;
* :class:`UserSpeechStopped` — the turn ended: ``silence_duration_ms`` of silence, or, with
  a semantic config (``TurnConfig.semantic``), Smart Turn calling it complete at a pause;
* :class:`TranscriptFinal` — the utterance's transcript (possibly empty), or
  :class:`TranscriptFailed` if the engine failed on it (the call goes on).

The Realtime ``conversation.item.input_audio_transcription.delta/.completed/.failed`` and
``input_audio_buffer.speech_started/stopped`` events map one to one onto these.

Semantic end of turn: the detector's :class:`~appliance.speech.vad.EndOfTurnQuery` goes to
Smart Turn in its worker pool (:meth:`~appliance.speech.endpoint.SmartTurn.submit`, ~50 ms
of CPU off the trio loop, so other calls' frames keep flowing), and the answer is handed
back with ``handle_verdict`` at the first frame after it is ready (≤ 20 ms later). Not a
``trio.to_thread`` task: this is an async generator, which must not hold a nursery across
its ``yield``; polling a future per frame also keeps verdicts in frame order. A model that
fails leaves the silence bound to end the turn.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from .endpoint import SmartTurn
from .stt import SttEngine, SttError, SttStream, make_stt
from .vad import (
    EndOfTurnQuery,
    SpeechAudio,
    SpeechStarted,
    SpeechStopped,
    TurnConfig,
    TurnDetector,
)


class AgentContext(Protocol):
    """What this module needs of ``appliance.agents.context.AgentContext`` (its inbound
    frames): a Protocol, so speech/ does not import agents/context.py back (that module
    reaches this one for ``ctx.transcripts()``)."""

    def frames(self) -> AsyncIterator[Any]: ...


@dataclass(frozen=True, slots=True)
class UserSpeechStarted:
    at: float  # trio clock time of the frame that confirmed speech
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class UserSpeechStopped:
    at: float
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class TranscriptPartial:
    text: str


@dataclass(frozen=True, slots=True)
class TranscriptFinal:
    text: str
    audio_start_ms: int
    audio_end_ms: int
    stopped_at: float  # trio clock time of the end of speech (for latency accounting)
    stt_seconds: float  # time the engine took after the end of speech


@dataclass(frozen=True, slots=True)
class TranscriptFailed:
    error: str
    audio_start_ms: int
    audio_end_ms: int


HearingEvent = (UserSpeechStarted | UserSpeechStopped | TranscriptPartial | TranscriptFinal
                | TranscriptFailed)

_default_stt: SttEngine | None = None


def default_stt() -> SttEngine:
    """The process-wide offline engine (Whisper tiny.en), built on first use."""
    global _default_stt
    if _default_stt is None:
        _default_stt = make_stt("whisper")
    return _default_stt


async def transcripts(ctx: AgentContext, *, turn: TurnConfig | None = None,
                      stt: SttEngine | None = None,
                      detector: TurnDetector | None = None,
                      endpoint: SmartTurn | None = None,
                      ) -> AsyncGenerator[HearingEvent, None]:
    """The caller's turns and their transcripts (see the module docstring). ``endpoint``
    answers a semantic detector's queries (default: the process's Smart Turn)."""
    detector = detector or TurnDetector(turn or TurnConfig())
    engine = stt or default_stt()
    model = endpoint or (SmartTurn() if detector.config.semantic else None)
    asked: dict[int, Future[float]] = {}  # query id -> the model's answer, when ready
    stream: SttStream | None = None
    start_ms = 0
    try:
        async for frame in ctx.frames():
            detector.handle_input(frame.received_at, frame.pcm)
            for query_id, answer in list(asked.items()):
                if answer.done():
                    del asked[query_id]
                    try:
                        p = answer.result()
                    except Exception:  # the model failed: the silence bound ends the turn
                        continue
                    detector.handle_verdict(frame.received_at, query_id, p)
            while (ev := detector.poll_output()) is not None:
                if isinstance(ev, EndOfTurnQuery):
                    assert model is not None  # a semantic detector has one
                    asked[ev.query_id] = model.submit(ev.audio16k)
                    continue
                if isinstance(ev, SpeechStarted):
                    start_ms = ev.audio_start_ms
                    stream = engine.stream()
                    yield UserSpeechStarted(ev.at, ev.audio_start_ms)
                elif isinstance(ev, SpeechAudio):
                    if stream is not None:
                        try:
                            partial = await stream.feed(ev.pcm)
                        except SttError:
                            partial = None  # reported by finish()
                        if partial:
                            yield TranscriptPartial(partial)
                elif isinstance(ev, SpeechStopped) and stream is not None:
                    yield UserSpeechStopped(ev.at, ev.audio_end_ms)
                    s, stream = stream, None
                    t0 = trio.current_time()
                    try:
                        text = await s.finish()
                    except SttError as exc:
                        yield TranscriptFailed(str(exc), start_ms, ev.audio_end_ms)
                    else:
                        yield TranscriptFinal(text, start_ms, ev.audio_end_ms, ev.at,
                                              trio.current_time() - t0)
    finally:
        for answer in asked.values():
            answer.cancel()  # not started yet: never run; running: its result is dropped
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()
