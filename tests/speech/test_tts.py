"""espeak-ng TTS: 20 ms 48 kHz frames whose energy is in the speech band, streamed (the
first frame comes before the program has finished), stoppable mid-sentence."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.speech.audio import band_energy_ratio, rms_dbfs
from appliance.speech.tts import EspeakTts, TtsError, make_tts
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
