"""WAV parsing and the measures the speech tests take (the resampler the engines use is
appliance/audio/resample.py: tests/audio/test_resample.py)."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.speech.audio import (
    WavError,
    band_energy_ratio,
    parse_wav_header,
    read_wav,
    wav_bytes,
)


def tone(freq: float, rate: int, seconds: float = 1.0, amp: float = 10000.0) -> bytes:
    t = np.arange(round(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


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
