"""The resampler: anti-aliasing, streaming equals one-shot, rates in and out; WAV parsing."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.speech.audio import (
    Resampler,
    WavError,
    band_energy_ratio,
    parse_wav_header,
    read_wav,
    resample,
    wav_bytes,
)


def tone(freq: float, rate: int, seconds: float = 1.0, amp: float = 10000.0) -> bytes:
    t = np.arange(round(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def gain_db(pcm: bytes, amp: float = 10000.0, skip: int = 400) -> float:
    y = np.frombuffer(pcm, "<i2").astype(float)[skip:]
    rms = np.sqrt(np.mean(y * y)) if len(y) else 0.0
    return 20 * np.log10(max(rms, 1e-3) / (amp / np.sqrt(2)))


@pytest.mark.parametrize(("freq", "lo", "hi"), [(300, -0.2, 0.2), (3000, -0.2, 0.2),
                                                  (6500, -1.0, 0.2), (9000, -200, -60),
                                                  (15000, -200, -60), (23000, -200, -60)])
def test_48k_to_16k_passes_speech_and_stops_aliases(freq: float, lo: float, hi: float) -> None:
    r = Resampler(48_000, 16_000)
    x = tone(freq, 48_000)
    out = b"".join(r.process(x[i : i + 1920]) for i in range(0, len(x), 1920))
    assert len(out) == 2 * 16_000
    assert lo <= gain_db(out) <= hi


@pytest.mark.parametrize("src", [16_000, 22_050, 24_000])
def test_up_to_48k_streaming_equals_one_shot(src: int) -> None:
    x = tone(1000, src)
    whole = Resampler(src, 48_000).process(x)
    r = Resampler(src, 48_000)
    parts = b"".join(r.process(x[i : i + 666]) for i in range(0, len(x), 666))
    assert parts[: len(whole)] == whole
    assert abs(len(parts) // 2 - 48_000) <= Resampler(src, 48_000).taps * 3
    assert -0.2 <= gain_db(whole, skip=2000) <= 0.2


def test_resample_is_aligned_and_sized() -> None:
    x = tone(440, 22_050, 0.5)
    y = resample(x, 22_050, 48_000)
    assert len(y) == 2 * (len(x) // 2 * 48_000 // 22_050)
    # Aligned: the resampled tone's zero crossings match the original's phase.
    ref = tone(440, 48_000, 0.5)
    a = np.frombuffer(y, "<i2").astype(float)[2000:20000]
    b = np.frombuffer(ref, "<i2").astype(float)[2000:20000]
    assert np.corrcoef(a, b)[0, 1] > 0.99


def test_wav_round_trip_and_streaming_header() -> None:
    pcm = tone(500, 16_000, 0.1)
    assert read_wav(wav_bytes(pcm, 16_000)) == (pcm, 16_000)
    streaming = bytearray(wav_bytes(pcm, 22_050))
    streaming[4:8] = b"\xff\xff\xff\x7f"  # espeak-ng --stdout's placeholder sizes
    streaming[40:44] = b"\xff\xff\xff\x7f"
    assert read_wav(bytes(streaming)) == (pcm, 22_050)
    assert parse_wav_header(bytes(streaming[:30])) is None  # needs more bytes
    with pytest.raises(WavError):
        parse_wav_header(b"RIFX" + bytes(40))
    stereo = bytearray(wav_bytes(pcm, 16_000))
    stereo[22] = 2
    with pytest.raises(WavError, match="mono"):
        read_wav(bytes(stereo))


def test_band_energy_ratio() -> None:
    assert band_energy_ratio(tone(1000, 48_000), 48_000) > 0.99
    assert band_energy_ratio(tone(8000, 48_000), 48_000) < 0.01
    assert band_energy_ratio(bytes(1000), 48_000) == 0.0
