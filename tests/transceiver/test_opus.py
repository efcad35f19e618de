"""Opus wrapper: a sine survives the round trip with its frequency; loss is concealed."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.transceiver.opus import FRAME_BYTES, OpusDecoder, OpusEncoder


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


def rms(a: bytes, b: bytes) -> float:
    x = np.frombuffer(a, dtype=np.int16).astype(np.float64)
    y = np.frombuffer(b, dtype=np.int16).astype(np.float64)
    return float(np.sqrt(np.mean((x - y) ** 2)))


def frames_of(pcm: bytes) -> list[bytes]:
    return [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


def test_plc_continues_the_tone_then_fades() -> None:
    enc, dec = OpusEncoder(), OpusDecoder()
    for frame in frames_of(sine(440, 10)):
        dec.decode(enc.encode(frame))
    concealed = [dec.conceal() for _ in range(6)]
    assert all(len(c) == FRAME_BYTES for c in concealed)
    assert abs(dominant_hz(concealed[0]) - 440) < 60  # libopus PLC extrapolates the pitch
    level = [np.abs(np.frombuffer(c, dtype=np.int16)).max() for c in concealed]
    assert level[0] > 1000 and level[-1] < level[0] / 2  # …and fades over a run of losses
    assert dec.plc == 6
    # The decoder keeps working after a concealment.
    assert len(dec.decode(enc.encode(frames_of(sine(440, 1))[0]))) == FRAME_BYTES


def test_fec_from_the_next_packet_beats_plc() -> None:
    """A lost frame decoded from the next packet's in-band FEC is closer to what the sender
    encoded than PLC's guess (libopus adds FEC at 32 kb/s once it expects ≥ ~20 % loss)."""
    t = np.arange(100 * 960) / 48_000
    voice = (np.sin(2 * np.pi * 220 * t) + 0.5 * np.sin(2 * np.pi * 440 * t)
             + 0.3 * np.sin(2 * np.pi * 880 * t)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    pcm = (voice * 8000).astype(np.int16).tobytes()
    enc = OpusEncoder()
    enc.set_expected_loss(20)
    packets = [enc.encode(f) for f in frames_of(pcm)]
    ref = OpusDecoder()
    clean = [ref.decode(p) for p in packets]
    errors = {}
    for fec in (True, False):
        dec = OpusDecoder()
        out = [dec.conceal(packets[i + 1] if fec else None) if i == 60 else dec.decode(p)
               for i, p in enumerate(packets)]
        errors[fec] = rms(out[60], clean[60])
    assert errors[True] < 0.8 * errors[False]


def test_conceal_before_any_audio_is_silent() -> None:
    pcm = OpusDecoder().conceal()
    assert len(pcm) == FRAME_BYTES
    assert np.abs(np.frombuffer(pcm, dtype=np.int16)).max() < 50


def test_corrupt_payload_is_concealed_not_raised() -> None:
    dec = OpusDecoder()
    for bad in [b"", b"\xff", b"\xfc" + b"\xff" * 50]:
        assert len(dec.decode(bad)) % FRAME_BYTES == 0
