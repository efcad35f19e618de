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

Work at the pause (issue 38 items 2-3): at each pause of ``pause_ms`` inside a turn the
detector asks an :class:`~appliance.speech.vad.EndOfTurnQuery`. Here that starts, side by
side in worker threads (``trio.to_thread``; ~50-150 ms of CPU each, never on the loop that
carries the other calls' frames):

* **the verdict** (semantic mode): Smart Turn's P(complete), handed back with
  ``handle_verdict`` together with the pause's speculative transcript (below) once both
  are ready, so the detector can overrule a "complete" that the words contradict ("I would
  like to…": :func:`~appliance.speech.vad.unfinished`). Whisper's short window and the
  model take about as long (~50-150 ms each, on two cores side by side), and the reply
  needs that transcript anyway, so waiting for it costs the caller little. A second
  question about the same pause (``EndOfTurnQuery.again``) starts no new transcript;
* **a speculative transcript**: the STT stream's decode of the audio so far
  (``stream.speculate()``, engines that have one), yielded at once as a
  :class:`TranscriptPartial` while the turn is still open (Whisper's partials: one per
  pause). If the turn ends in that same pause
  (``SpeechStopped.pause``), the audio after it is silence and that transcript is the
  final one, ready when the turn ends instead of starting then; if the caller goes on, it
  is dropped (counted in :data:`speculation`, with its CPU).

While they run, this task goes on reading frames and feeding the detector (the caller may
speak again, or the bound may end the turn); the events that produces are held until both
are done (≤ one inference, ~0.1 s) and then yielded in order. An async generator must not
hold a nursery across a ``yield``, so the nursery lives only inside that window. A model
that fails leaves the silence bound to end the turn; a speculation that fails leaves
``finish()`` to transcribe.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator
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

log = logging.getLogger(__name__)


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
    #: The pause (``EndOfTurnQuery.query_id``) whose speculative decode this is; if the
    #: turn ends in that pause this text is its final transcript. None: an engine's partial.
    pause: int | None = None


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


@dataclass
class Speculation:
    """Process-wide count of speculative transcripts (bench/turn_latency.py reports it)."""

    started: int = 0
    used: int = 0  # the turn ended in that pause: it was the final transcript
    wasted: int = 0  # the caller went on (or it failed)
    cpu_seconds: float = 0.0  # worker-thread CPU of every speculative decode
    #: Replies started on a pause's transcript and held (the assistant's ``preempt``):
    #: released when the turn ended with that transcript, else dropped.
    replies: int = 0
    replies_used: int = 0
    replies_wasted: int = 0


speculation = Speculation()


class _Hearing:
    """One call's turn detector, STT stream and the work started at pauses."""

    def __init__(self, detector: TurnDetector, engine: SttEngine,
                 model: SmartTurn | None) -> None:
        self.detector = detector
        self.engine = engine
        self.model = model
        self.stream: SttStream | None = None
        self.start_ms = 0
        #: pause (query id) -> its speculative transcript; None while still decoding
        self.guesses: dict[int, str | None] = {}
        self.guessed = trio.Event()  # set (and replaced) whenever a guess completes
        self.busy = 0  # threads running for the current window
        self._pending: EndOfTurnQuery | None = None  # a query waiting for its window
        self.now = 0.0  # received_at of the last frame fed

    async def ask(self, query: EndOfTurnQuery) -> None:
        assert self.model is not None
        try:
            try:
                p = await trio.to_thread.run_sync(self.model.probability, query.audio16k)
            except Exception:  # the model failed: the silence bound ends the turn
                log.warning("end-of-turn model failed; the silence bound ends this turn",
                            exc_info=True)
                return
            # The pause's transcript goes with the verdict (None: no guess was started, or
            # it failed, and the model decides alone).
            text = await self._guess_of(query.query_id)
            # Stamped like every detector event: the time of the last frame it has seen.
            self.detector.handle_verdict(self.now, query.query_id, p, text)
        finally:
            self.busy -= 1

    async def _guess_of(self, pause: int) -> str | None:
        """The speculative transcript started at ``pause``, waiting for it if it is still
        decoding (without taking it: the end of the turn may still use it)."""
        while pause in self.guesses and self.guesses[pause] is None:
            await self.guessed.wait()
        return self.guesses.get(pause)

    async def guess(self, query: EndOfTurnQuery, stream: Any,
                    out: list[HearingEvent]) -> None:
        speculation.started += 1
        before = getattr(stream, "cpu_seconds", 0.0)
        try:
            text = self.guesses[query.query_id] = await stream.speculate()
            if text and self.stream is stream:  # the turn goes on: the caller sees it now
                out.append(TranscriptPartial(text, query.query_id))
        except Exception:  # a guess only: finish() runs instead and reports any failure
            self.guesses.pop(query.query_id, None)
        finally:
            speculation.cpu_seconds += getattr(stream, "cpu_seconds", 0.0) - before
            self.busy -= 1
            self.guessed.set()
            self.guessed = trio.Event()

    async def handle(self, ev: Any, out: list[HearingEvent],
                     nursery: trio.Nursery | None) -> None:
        """One detector event into ``out``; an :class:`EndOfTurnQuery` starts its work in
        the window's ``nursery`` (:meth:`drain` holds a query back until there is one)."""
        if isinstance(ev, EndOfTurnQuery):
            assert nursery is not None
            if self.model is not None and self.detector.config.semantic:
                self.busy += 1
                nursery.start_soon(self.ask, ev)
            if (self.detector.config.speculate and not ev.again and self.stream is not None
                    and hasattr(self.stream, "speculate")):
                self.busy += 1
                self.guesses[ev.query_id] = None
                nursery.start_soon(self.guess, ev, self.stream, out)
        elif isinstance(ev, SpeechStarted):
            self.start_ms = ev.audio_start_ms
            self.stream = self.engine.stream()
            self.guesses.clear()
            out.append(UserSpeechStarted(ev.at, ev.audio_start_ms))
        elif isinstance(ev, SpeechAudio):
            if self.stream is not None:
                try:
                    partial = await self.stream.feed(ev.pcm)
                except SttError:
                    partial = None  # reported by finish()
                if partial:
                    out.append(TranscriptPartial(partial))
        elif isinstance(ev, SpeechStopped) and self.stream is not None:
            out.append(UserSpeechStopped(ev.at, ev.audio_end_ms))
            s, self.stream = self.stream, None
            t0 = trio.current_time()
            text = await self._speculated(ev.pause)
            for pause in self.guesses:
                if pause != ev.pause:
                    speculation.wasted += 1
            self.guesses.clear()
            if text is not None:
                speculation.used += 1
                await s.aclose()
                out.append(TranscriptFinal(text, self.start_ms, ev.audio_end_ms, ev.at,
                                           trio.current_time() - t0))
                return
            try:
                text = await s.finish()
            except SttError as exc:
                out.append(TranscriptFailed(str(exc), self.start_ms, ev.audio_end_ms))
            else:
                out.append(TranscriptFinal(text, self.start_ms, ev.audio_end_ms, ev.at,
                                           trio.current_time() - t0))

    async def _speculated(self, pause: int | None) -> str | None:
        """The transcript guessed at the pause that ended the turn (waiting for it if it
        is still decoding); None if there is none."""
        if pause is None:
            return None
        text = await self._guess_of(pause)
        self.guesses.pop(pause, None)
        return text

    async def take(self, frame: Any, out: list[HearingEvent]) -> bool:
        """Feed one frame; True when an :class:`EndOfTurnQuery` asks for a window."""
        self.feed(frame)
        return await self.drain(out, None)

    def feed(self, frame: Any) -> None:
        self.now = frame.received_at
        self.detector.handle_input(frame.received_at, frame.pcm)

    async def drain(self, out: list[HearingEvent], nursery: trio.Nursery | None) -> bool:
        while (ev := self.detector.poll_output()) is not None:
            if isinstance(ev, EndOfTurnQuery) and nursery is None:
                self._pending = ev
                return True
            await self.handle(ev, out, nursery)
        return False


async def transcripts(ctx: AgentContext, *, turn: TurnConfig | None = None,
                      stt: SttEngine | None = None,
                      detector: TurnDetector | None = None,
                      endpoint: SmartTurn | None = None,
                      ) -> AsyncGenerator[HearingEvent, None]:
    """The caller's turns and their transcripts (see the module docstring). ``endpoint``
    answers a semantic detector's queries (default: the process's Smart Turn)."""
    detector = detector or TurnDetector(turn or TurnConfig())
    model = endpoint or (SmartTurn() if detector.config.semantic else None)
    hearing = _Hearing(detector, stt or default_stt(), model)
    frames = ctx.frames().__aiter__()
    out: list[HearingEvent] = []
    try:
        while True:
            try:
                frame = await frames.__anext__()
            except StopAsyncIteration:
                return
            window = await hearing.take(frame, out)
            if window:
                # The pause's work runs in threads while this task keeps listening; what
                # the frames meanwhile produce is held (no yield inside the nursery).
                async with trio.open_nursery() as nursery:
                    query, hearing._pending = hearing._pending, None
                    assert query is not None
                    await hearing.handle(query, out, nursery)
                    await hearing.drain(out, nursery)
                    while hearing.busy:
                        try:
                            frame = await frames.__anext__()
                        except StopAsyncIteration:
                            break  # the call ended: the threads finish, nothing is read
                        hearing.feed(frame)
                        await hearing.drain(out, nursery)
                    # A verdict that came in after the last frame may have ended the turn.
                    await hearing.drain(out, nursery)
            for ev in out:
                yield ev
            out.clear()
    finally:
        if hearing.stream is not None:
            with trio.CancelScope(shield=True):
                await hearing.stream.aclose()
