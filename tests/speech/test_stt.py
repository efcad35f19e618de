"""The offline STT engines on espeak-ng speech (a voice and rate unlike the TTS default).

Thresholds are set from measurement on this machine (docs/speech.md): on the 20 fixed
phrases of bench/speech_bench.py, Whisper tiny.en made 15 % word errors and PocketSphinx 84 %
(en-gb voice, 140 wpm). The tests use the first phrases of that set, with margin.
Whisper can encode a window sized to the turn (``short_window=True``, issue 38); the 30 s
window is the default and the reference the short one is held to here."""

from __future__ import annotations

import re

import pytest
import trio
from speech.speech_support import PHRASES, espeak_pcm48, frames, silence, wer

from appliance.audio.resample import resample
from appliance.speech.stt import (
    STT_RATE,
    WINDOW_MAX_SECONDS,
    PocketSphinxStt,
    SttEngine,
    WhisperStt,
    make_stt,
    whisper_model,
    whisper_window,
)


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split())


async def transcribe(engine: SttEngine, pcm: bytes) -> tuple[str, list[str]]:
    stream = engine.stream()
    partials = []
    for f in frames(pcm):
        p = await stream.feed(f)
        if p:
            partials.append(p)
    return normalise(await stream.finish()), partials


async def test_whisper_word_error_rate() -> None:
    engine = make_stt("whisper")
    assert isinstance(engine, WhisperStt)
    phrases = PHRASES[:6]
    total = 0.0
    heard = []
    for phrase in phrases:
        text, partials = await transcribe(engine, espeak_pcm48(phrase))
        heard.append(text)
        total += wer(phrase, text)
        assert partials == []  # not a streaming model
    assert total / len(phrases) <= 0.30, heard
    assert "what time is it" in heard


async def test_whisper_model_loads_once_and_silence_says_nothing() -> None:
    assert whisper_model() is whisper_model()
    text, _ = await transcribe(WhisperStt(), silence(1.0))
    assert text == ""


async def test_whisper_short_window_reads_as_the_30s_window() -> None:
    """Turns as the turn detector hands them over (300 ms before the phrase, 500 ms after)
    through both windows, on phrases both read right in every measured run. Over the whole
    phrase set the short window makes more errors (docs/speech.md): that gap is measured in
    bench/speech_bench.py, not asserted here."""
    for phrase in ("what time is it", "please call me back tomorrow", "open the front door"):
        turn = silence(0.3) + espeak_pcm48(phrase) + silence(0.5)
        heard = [(await transcribe(WhisperStt(short_window=short), turn))[0]
                 for short in (False, True)]
        assert wer(phrase, heard[1]) <= wer(phrase, heard[0]), heard


def test_whisper_window_sizes() -> None:
    assert whisper_window(STT_RATE) == 500  # at least 5 s
    assert whisper_window(8 * STT_RATE) == 1100  # 801 frames + 200 of padding, in whole s
    assert whisper_window(int(WINDOW_MAX_SECONDS * STT_RATE)) == 2800
    assert whisper_window(int(WINDOW_MAX_SECONDS * STT_RATE) + 1) is None


def test_whisper_long_turn_takes_the_30s_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn over WINDOW_MAX_SECONDS goes to faster-whisper's own transcribe(); a shorter
    one to the short window (both paths stubbed: only the choice is under test)."""
    taken: list[str] = []

    def full(self: WhisperStt, model: object, audio: object, lang: str, prompt: str | None
             ) -> str:
        taken.append("30s")
        return ""

    def short(self: WhisperStt, model: object, audio: object, window: int, lang: str,
              prompt: str | None) -> str:
        taken.append(f"short {window}")
        return ""

    monkeypatch.setattr(WhisperStt, "_transcribe_30s", full)
    monkeypatch.setattr(WhisperStt, "_transcribe_window", short)
    engine = WhisperStt(short_window=True)
    engine.transcribe_sync(bytes(2 * int((WINDOW_MAX_SECONDS + 1) * STT_RATE)))
    engine.transcribe_sync(bytes(2 * 2 * STT_RATE))
    WhisperStt().transcribe_sync(bytes(2 * 2 * STT_RATE))  # the default: 30 s
    assert taken == ["30s", "short 500", "30s"]


def test_whisper_under_100ms_says_nothing() -> None:
    pcm = resample(espeak_pcm48("stop"), 48_000, STT_RATE)
    mid = len(pcm) // 4 * 2
    clip = pcm[mid - STT_RATE // 10 + 2 : mid + STT_RATE // 10 - 2]  # 99.9 ms of the word
    assert WhisperStt(short_window=True).transcribe_sync(clip) == ""
    assert WhisperStt().transcribe_sync(clip) == ""


async def test_pocketsphinx_streams_partials_and_pools_decoders() -> None:
    engine = PocketSphinxStt()
    pcm = espeak_pcm48("send a message to my friend")
    text, partials = await transcribe(engine, pcm)
    assert partials, "no partial hypothesis while the audio was fed"
    # PocketSphinx's live cepstral mean normalisation carries over between utterances of a
    # pooled decoder, so its words vary from run to run (0 to 100 % WER on this phrase):
    # its accuracy is measured in bench/speech_bench.py, not asserted here.
    assert text and partials[-1]
    built = engine.pool.built
    # Two calls at once take two decoders; afterwards both are idle and reused.
    async with trio.open_nursery() as n:
        n.start_soon(transcribe, engine, pcm)
        n.start_soon(transcribe, engine, pcm)
    assert engine.pool.built <= max(built, 2)
    await transcribe(engine, pcm)
    assert engine.pool.built <= max(built, 2)


def test_unknown_engine() -> None:
    with pytest.raises(ValueError, match="unknown STT engine"):
        make_stt("vosk")
