"""Opus wrapper: a sine survives the round trip with its frequency; loss is concealed."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.transceiver.opus import FRAME_BYTES, SILENCE, OpusDecoder, OpusEncoder


def sine(freq: float, frames: int, amp: float = 0.3) -> bytes:
    t = np.arange(frames * 960) / 48_000
    return (np.sin(2 * np.pi * freq * t) * amp * 32767).astype(np.int16).tobytes()


def dominant_hz(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * 48_000 / len(x))


@pytest.mark.parametrize("freq", [300.0, 440.0, 1000.0])
def test_round_trip_keeps_frequency(freq: float) -> None:
    enc, dec = OpusEncoder(), OpusDecoder()
    pcm = sine(freq, 50)
    out = []
    for i in range(50):
        packet = enc.encode(pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
        assert 0 < len(packet) < 400
        frame = dec.decode(packet)
        assert len(frame) == FRAME_BYTES
        out.append(frame)
    decoded = b"".join(out[10:])  # skip the codec's start-up
    assert dominant_hz(decoded) == pytest.approx(freq, abs=5)
    level = np.abs(np.frombuffer(decoded, dtype=np.int16)).mean()
    assert level > 3000  # not silence


def test_encoder_rejects_wrong_frame_size() -> None:
    with pytest.raises(ValueError, match="1920"):
        OpusEncoder().encode(b"\0" * 100)


def test_conceal_fades_then_silences() -> None:
    enc, dec = OpusEncoder(), OpusDecoder()
    pcm = sine(440, 10)
    for i in range(10):
        dec.decode(enc.encode(pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES]))
    first = np.frombuffer(dec.conceal(), dtype=np.int16)
    assert np.abs(first[:100]).max() > 1000  # a repeat of the last frame…
    assert np.abs(first[-20:]).max() < 200  # …faded out by its end
    assert dec.conceal() == SILENCE
    # The decoder keeps working after a concealment.
    assert len(dec.decode(enc.encode(pcm[:FRAME_BYTES]))) == FRAME_BYTES


def test_conceal_before_any_audio_is_silence() -> None:
    assert OpusDecoder().conceal() == SILENCE


def test_corrupt_payload_is_concealed_not_raised() -> None:
    dec = OpusDecoder()
    for bad in [b"", b"\xff", b"\xfc" + b"\xff" * 50]:
        assert len(dec.decode(bad)) % FRAME_BYTES == 0
