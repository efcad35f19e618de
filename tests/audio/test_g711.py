"""The G.711 codec (appliance/audio/g711.py): the tables against ITU-T G.711's
reference values and, where the interpreter still has it, every code and every PCM16 value
against CPython's ``audioop`` (the same Sun reference algorithm); the 8 <-> 48 kHz path
keeps a tone's pitch and level."""

from __future__ import annotations

import importlib
import math
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.audio.g711 import DECODE, ENCODE, G711Decoder, G711Encoder, decode, encode


def audioop_module() -> object | None:
    if sys.version_info >= (3, 13):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module("audioop")


def test_reference_values() -> None:
    u, a = DECODE["pcmu"], DECODE["pcma"]
    # µ-law: 0xFF is +0, 0x7F is -0, 0x80/0x00 are the extremes (±32124).
    assert (u[0xFF], u[0x7F], u[0x80], u[0x00]) == (0, 0, 32124, -32124)
    # A-law: the even-bit inversion (0x55) makes 0xD5/0x55 the smallest steps (±8).
    assert (a[0xD5], a[0x55], a[0xAA], a[0x2A]) == (8, -8, 32256, -32256)
    assert ENCODE["pcmu"][0] == 0xFF and ENCODE["pcma"][0] == 0xD5


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_every_code_round_trips(law: str) -> None:
    codes = np.arange(256, dtype=np.uint8)
    back = np.frombuffer(encode(law, decode(law, bytes(codes))), np.uint8)
    same = back == codes
    if law == "pcmu":  # -0 (0x7F) decodes to 0, which encodes as +0 (0xFF)
        assert not same[0x7F] and back[0x7F] == 0xFF
        same[0x7F] = True
    assert same.all()


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_against_audioop(law: str) -> None:
    audioop = audioop_module()
    if audioop is None:
        pytest.skip("audioop is gone in Python 3.13+: the reference values above stand in")
    lin2, to_lin = ((audioop.lin2ulaw, audioop.ulaw2lin) if law == "pcmu"  # type: ignore[attr-defined]
                    else (audioop.lin2alaw, audioop.alaw2lin))  # type: ignore[attr-defined]
    codes = bytes(range(256))
    assert decode(law, codes).astype("<i2").tobytes() == to_lin(codes, 2)
    pcm = np.arange(-32768, 32768, dtype=np.int32).astype("<i2")
    assert encode(law, pcm) == lin2(pcm.tobytes(), 2)


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_48k_path_keeps_a_tone(law: str) -> None:
    """A 440 Hz tone at -6 dBFS through encode (48->8 kHz) and decode (8->48 kHz), 20 ms
    frames: same pitch, level within 1 dB, no discontinuity at frame edges."""
    enc, dec = G711Encoder(law), G711Decoder(law)
    n = 960
    t = np.arange(50 * n) / 48000
    tone = np.rint(0.5 * 32767 * np.sin(2 * math.pi * 440 * t)).astype("<i2")
    out = b"".join(dec.decode(enc.encode(tone[i:i + n].tobytes())) for i in range(0, len(tone), n))
    y = np.frombuffer(out, "<i2").astype(np.float64)
    assert len(y) == len(tone)
    y = y[n:]  # skip the first frame (interpolation starts from silence)
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    assert abs(np.argmax(spectrum) * 48000 / len(y) - 440) < 5
    rms_in = np.sqrt(np.mean(tone.astype(np.float64) ** 2))
    assert abs(20 * math.log10(np.sqrt(np.mean(y ** 2)) / rms_in)) < 1.0
    assert np.max(np.abs(np.diff(y))) < 0.5 * 32767 * 2 * math.pi * 440 / 48000 * 2.5


def test_conceal_is_a_frame_of_silence() -> None:
    assert G711Decoder("pcmu").conceal(None) == bytes(1920)
    with pytest.raises(ValueError, match="not a G.711 law"):
        G711Decoder("g722")


@given(st.binary(max_size=400))
def test_decode_any_payload(payload: bytes) -> None:
    assert len(G711Decoder("pcma").decode(payload)) == 12 * len(payload)
