"""``ctx.transcripts()``: the caller's turns and words, in order, from the call's frames."""

from __future__ import annotations

from typing import Any

import trio
import trio.lowlevel
from speech.speech_support import (
    VerdictOnCue,
    espeak_pcm48,
    frames,
    silence,
    speech_bounds_ms,
)

from appliance.agents import AgentContext, AgentHost, AgentIdentity, Frame
from appliance.speech import (
    TranscriptFinal,
    TranscriptPartial,
    TurnConfig,
    UserSpeechStarted,
    UserSpeechStopped,
    make_stt,
)
from appliance.speech.listen import speculation, transcripts
from appliance.speech.stt import WhisperStt
from appliance.speech.vad import SileroVad, TurnDetector


async def test_ctx_transcripts_yields_turns_and_words() -> None:
    host = AgentHost(max_inbound_frames=10_000)  # all frames queued up front
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    audio = (silence(0.5) + espeak_pcm48("turn on the lights") + silence(1.0)
             + espeak_pcm48("thank you very much") + silence(1.0))
    for i, f in enumerate(frames(audio)):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    got = []
    with trio.fail_after(120):
        async for ev in ctx.transcripts():
            got.append(ev)
    kinds = [type(e) for e in got]
    assert kinds == [UserSpeechStarted, UserSpeechStopped, TranscriptFinal] * 2
    finals = [e for e in got if isinstance(e, TranscriptFinal)]
    assert "lights" in finals[0].text.lower() and "thank" in finals[1].text.lower()
    assert finals[0].audio_end_ms < finals[1].audio_start_ms


async def test_streaming_engine_gives_partials_first() -> None:
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    for i, f in enumerate(frames(silence(0.3) + espeak_pcm48("good morning everybody")
                                 + silence(1.0))):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    with trio.fail_after(120):
        got = [ev async for ev in ctx.transcripts(turn=TurnConfig(vad="energy"),
                                                  stt=make_stt("pocketsphinx"))]
    assert isinstance(got[0], UserSpeechStarted)
    assert any(isinstance(e, TranscriptPartial) for e in got)
    assert isinstance(got[-1], TranscriptFinal)


class SureEndpoint:
    """A stand-in for Smart Turn that calls every pause complete (run in a worker thread,
    as listen.py runs the real one)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def probability(self, pcm16_16k: bytes) -> float:
        self.asked.append(len(pcm16_16k))
        return 1.0


async def test_semantic_turn_ends_at_the_models_verdict_not_the_bound() -> None:
    """The shell hands the detector's query to the endpoint (in a worker thread) and its
    verdict back: the turn ends ~200 ms into the pause (plus a frame), not at the 1000 ms
    silence bound. Frames arrive on a 20 ms grid as on a call: the model's answer is
    taken while the caller is still silent, which a queue of every frame at once would
    outrun (the bound would fire before the thread returned)."""
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    audio = frames(silence(0.3) + espeak_pcm48("turn on the lights") + silence(1.5))
    endpoint = SureEndpoint()

    async def caller() -> None:
        for i, f in enumerate(audio):
            host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
            await trio.sleep(0.02)
        host.close("done")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        with trio.fail_after(120):
            got = [ev async for ev in ctx.transcripts(
                turn=TurnConfig.semantic_vad("auto"), endpoint=endpoint)]  # type: ignore[arg-type]
    (stop,) = [e for e in got if isinstance(e, UserSpeechStopped)]
    assert len(endpoint.asked) == 1
    assert stop.at - stop.audio_end_ms / 1000 < 0.6  # the silence bound would be 0.98
    assert isinstance(got[-1], TranscriptFinal)


class GuessingEngine:
    """An STT engine whose streams say which path made the transcript: ``speculate()``
    answers ``guess@<bytes heard>``, ``finish()`` answers ``final@<bytes heard>``."""

    name = "guessing"

    def __init__(self) -> None:
        self.finished = 0

    def stream(self, *, language: str | None = None, prompt: str | None = None) -> Any:
        engine = self

        class Stream:
            def __init__(self) -> None:
                self.heard = 0
                self.cpu_seconds = 0.0

            async def feed(self, pcm: bytes) -> None:
                self.heard += len(pcm)

            async def speculate(self) -> str:
                await trio.lowlevel.checkpoint()  # as a worker thread would: the loop goes on
                return f"guess@{self.heard}"

            async def finish(self) -> str:
                engine.finished += 1
                return f"final@{self.heard}"

            async def aclose(self) -> None:
                pass

        return Stream()


def _trimmed(text: str) -> bytes:
    """A phrase without espeak-ng's own leading and trailing silence (48 kHz PCM16)."""
    pcm = espeak_pcm48(text)
    start_ms, end_ms = speech_bounds_ms(pcm)
    return pcm[start_ms * 96 : end_ms * 96]


def _queue(ctx_audio: bytes) -> AgentContext:
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    for i, f in enumerate(frames(ctx_audio)):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    return ctx


async def test_a_turn_that_ends_in_the_pause_takes_the_transcript_started_there() -> None:
    """Issue 38 item 3: the transcript is decoded at the 200 ms pause, while the detector
    waits out the rest of the silence; the turn ending in that pause uses it, and the
    stream is never asked to finish."""
    before = (speculation.used, speculation.wasted)
    engine = GuessingEngine()
    ctx = _queue(silence(0.3) + espeak_pcm48("turn on the lights") + silence(1.0))
    turn = TurnConfig(vad="energy", silence_duration_ms=500, speculate=True)
    with trio.fail_after(60):
        got = [ev async for ev in ctx.transcripts(turn=turn, stt=engine)]
    (final,) = [e for e in got if isinstance(e, TranscriptFinal)]
    assert final.text.startswith("guess@") and engine.finished == 0
    assert (speculation.used, speculation.wasted) == (before[0] + 1, before[1])


async def test_a_caller_who_goes_on_after_the_pause_wastes_the_guess() -> None:
    """A 450 ms mid-sentence pause (the energy VAD's release leaves ~350 ms of silent
    frames: past the 200 ms pause, short of the 500 ms bound) is asked about and guessed
    at; the guess is shown as a partial while the turn is open; the caller goes on, so the
    final transcript is the last pause's guess, which heard the words after the first
    pause, and the first guess is counted as wasted. Frames arrive on a 20 ms grid, as on
    a call (a queue of every frame at once would be read before any guess ran)."""
    before = (speculation.used, speculation.wasted)
    engine = GuessingEngine()
    first, second = _trimmed("I would like to"), _trimmed("order a pizza")
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    audio = frames(silence(0.3) + first + silence(0.45) + second + silence(1.0))

    async def caller() -> None:
        for i, f in enumerate(audio):
            host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
            await trio.sleep(0.02)
        host.close("done")

    turn = TurnConfig(vad="energy", silence_duration_ms=500, speculate=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        with trio.fail_after(60):
            got = [ev async for ev in ctx.transcripts(turn=turn, stt=engine)]
    # A partial per pause: the mid-sentence one, and the last one (shown before the bound
    # ends the turn 300 ms later).
    assert [type(e) for e in got] == [UserSpeechStarted, TranscriptPartial, TranscriptPartial,
                                      UserSpeechStopped, TranscriptFinal]
    partial, final = got[1], got[-1]
    assert isinstance(partial, TranscriptPartial) and isinstance(final, TranscriptFinal)
    early, late = int(partial.text.split("@")[1]), int(final.text.split("@")[1])
    assert early < len(first) + len(silence(0.45)) + 96_000  # the first pause's guess
    assert late > len(first) + len(second)  # the last pause's: every word
    assert (speculation.used, speculation.wasted) == (before[0] + 1, before[1] + 1)


async def test_without_speculation_the_stream_finishes_after_the_turn() -> None:
    engine = GuessingEngine()
    ctx = _queue(silence(0.3) + espeak_pcm48("turn on the lights") + silence(1.0))
    with trio.fail_after(60):
        got = [ev async for ev in ctx.transcripts(
            turn=TurnConfig(vad="energy", silence_duration_ms=500), stt=engine)]
    (final,) = [e for e in got if isinstance(e, TranscriptFinal)]
    assert final.text.startswith("final@") and engine.finished == 1


class WordsEngine:
    """An STT engine whose speculative transcript is always ``words`` (after a checkpoint,
    as a worker thread would take a while), and whose final one says so."""

    name = "words"

    def __init__(self, words: str) -> None:
        self.words = words
        self.guessed = 0

    def stream(self, *, language: str | None = None, prompt: str | None = None) -> Any:
        engine = self

        class Stream:
            cpu_seconds = 0.0

            async def feed(self, pcm: bytes) -> None:
                pass

            async def speculate(self) -> str:
                await trio.lowlevel.checkpoint()
                engine.guessed += 1
                return engine.words

            async def finish(self) -> str:
                return "finished"

            async def aclose(self) -> None:
                pass

        return Stream()


async def _semantic_turn(words: str) -> tuple[list[Any], TurnDetector, WordsEngine]:
    """One phrase and 1.5 s of silence, frames on a 20 ms grid, a model that calls every
    pause complete, and a speculating engine that hears ``words``."""
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    audio = frames(silence(0.3) + _trimmed("send the report to") + silence(1.5))

    async def caller() -> None:
        for i, f in enumerate(audio):
            host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
            await trio.sleep(0.02)  # real-time pacing of a media source, not test sync
        host.close("done")

    detector = TurnDetector(TurnConfig.semantic_vad("auto", speculate=True))
    engine = WordsEngine(words)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        with trio.fail_after(120):
            got = [ev async for ev in ctx.transcripts(
                detector=detector, stt=engine, endpoint=SureEndpoint())]  # type: ignore[arg-type]
    return got, detector, engine


async def test_the_pause_transcript_goes_with_the_verdict_and_can_veto_it() -> None:
    """Issue 38 item 2: the model says complete, the pause's transcript ends on "to": the
    detector is handed both, keeps the turn open, and the silence bound (1000 ms) ends it;
    the transcript made at that pause is still the final one."""
    got, detector, engine = await _semantic_turn("Send the report to...")
    (stop,) = [e for e in got if isinstance(e, UserSpeechStopped)]
    (final,) = [e for e in got if isinstance(e, TranscriptFinal)]
    assert detector.vetoes == 1 and detector.last_probability == 1.0
    assert stop.at - stop.audio_end_ms / 1000 >= 0.9  # the bound, not the verdict
    assert final.text == "Send the report to..." and engine.guessed == 1


async def test_finished_words_let_the_verdict_end_the_turn() -> None:
    got, detector, engine = await _semantic_turn("Send the report to Anna.")
    (final,) = [e for e in got if isinstance(e, TranscriptFinal)]
    assert detector.vetoes == 0 and detector.last_probability == 1.0
    assert final.text == "Send the report to Anna." and engine.guessed == 1


async def test_the_word_after_a_turn_ended_in_its_pause_is_heard_whole() -> None:
    """Issue 38 item 8a, through the assistant's hearing path (semantic turn, Silero,
    Whisper's short window). "hello there, ... what time is it": the model calls "hello
    there" complete, and its verdict lands just after the caller went on, in a frame Silero
    has not yet flagged (its flag rises a few frames into a word). On main the verdict
    ended the turn there and the next turn's audio began after it, inside "what" (in
    Chromium: "time as it right now"). Now that turn starts before the word: its
    ``audio_start_ms`` is at or before the word's onset and its transcript keeps "what"."""
    first, second = _trimmed("hello there"), _trimmed("what time is it")
    lead, gap = silence(0.3), silence(0.5)
    audio = lead + first + gap + second + silence(1.5)
    onset = (len(lead) + len(first) + len(gap)) // 1920  # the frame "what" begins in
    vad = SileroVad()
    flagged = [vad.update(f) for f in frames(audio)]
    rises = next(i for i in range(onset, len(flagged)) if flagged[i])
    assert rises > onset  # the premise: Silero flags the word some frames after its onset

    # No hold: a verdict that ends the turn at once is what can land inside the next word
    # (with auto's 600 ms hold this 500 ms pause does not end the turn at all; a longer
    # pause ends it at the hold, and a word begun then is the same case as this one).
    # No words with the verdict: the pause's transcript is snapshot when its task first runs
    # (trio's scheduler may move that by a frame), and one that caught the onset of "what"
    # vetoed the end (a clean-clone run saw one turn, not two); the pre-roll is the test.
    call = VerdictOnCue(audio, TurnConfig.semantic_vad("auto", speculate=True, hold_ms=0),
                        words=False)
    call.cue = lambda query_frame: rises - 1  # type: ignore[method-assign]
    with trio.fail_after(120):
        got = [ev async for ev in transcripts(call, detector=call.detector, endpoint=call,  # type: ignore[arg-type]
                                              stt=WhisperStt(short_window=True))]
    assert call.queries[0] < onset <= call.verdicts[0] < rises  # the verdict fell in the word
    starts = [e for e in got if isinstance(e, UserSpeechStarted)]
    finals = [e for e in got if isinstance(e, TranscriptFinal)]
    assert len(starts) == len(finals) == 2, got
    assert starts[1].audio_start_ms <= onset * 20, (starts[1], onset * 20)
    assert finals[1].audio_start_ms >= finals[0].audio_end_ms  # the turns do not overlap
    assert "what" in finals[1].text.lower(), finals
