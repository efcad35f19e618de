"""G.711 (ITU-T G.711: PCMU = µ-law, PCMA = A-law): the one implementation of both laws,
for the transceiver's phone and WebRTC legs (RFC 3551 §4.5.14: 8 kHz, one channel, static
payload types 0 and 8: the fallback codec when an offer has no Opus) and the Realtime API's
``audio/pcmu`` / ``audio/pcma`` formats (appliance/realtime/audio.py).

Table-driven with numpy (``audioop`` is deprecated since Python 3.11 and gone in 3.13):

* decoding is a 256-entry table, code -> linear PCM16 (the classic Sun reference
  expansions, ±32124 for µ-law and ±32256 for A-law: G.711's 14/13-bit segments scaled to
  16 bits);
* encoding is a 65,536-entry table indexed by the PCM16 sample's bit pattern, built once at
  import from the same segment rules (bit-exact with the Sun reference and ``audioop``:
  tests/audio/test_g711.py), so both directions are one ``take`` per frame.

:class:`G711Decoder` / :class:`G711Encoder` are the codec the media pipeline runs
(the :class:`~appliance.transceiver.opus.Decoder` / ``Encoder`` shapes): 8 kHz <-> 48 kHz is
exactly ×6, through :mod:`.resample`'s :data:`~.resample.TELEPHONE` low-pass (0.003 dB
ripple to 3.4 kHz, images and aliases below -75 dB, ~4 ms of delay each way), stateful
across frames so a stream cut into packets joins without clicks.
Loss concealment repeats nothing: a lost G.711 packet is 20 ms of silence fed through the
filter (G.711 Appendix I PLC is not implemented).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from .resample import TELEPHONE, Resampler

LAWS: Final = ("pcmu", "pcma")
RATE: Final = 8000
FACTOR: Final = 6  # 48000 / 8000
FRAME_SAMPLES_8K: Final = 160  # 20 ms
_BIAS: Final = 0x84
_CLIP: Final = 8159


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    t = (((u & 0x0F) << 3) + _BIAS) << ((u >> 4) & 7)
    return np.where(u & 0x80, _BIAS - t, t - _BIAS).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a >> 4) & 7
    t = (a & 0x0F) << 4
    t = np.where(seg == 0, t + 8, t + 0x108)
    t = np.where(seg > 1, t << np.maximum(seg - 1, 0), t)
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _segment(values: np.ndarray, ends: tuple[int, ...]) -> np.ndarray:
    """The G.711 segment of each magnitude: the first end it does not exceed (8: clipped)."""
    return np.searchsorted(np.array(ends, dtype=np.int32), values, side="left")


def _ulaw_encode_table() -> np.ndarray:
    pcm = np.arange(65536, dtype=np.int32).astype(np.uint16).view(np.int16).astype(np.int32)
    v = pcm >> 2  # 14-bit
    mask = np.where(v < 0, 0x7F, 0xFF)
    v = np.minimum(np.abs(v), _CLIP) + (_BIAS >> 2)
    seg = _segment(v, (0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF))
    code = np.where(seg >= 8, 0x7F,
                    (np.minimum(seg, 7) << 4) | ((v >> (np.minimum(seg, 7) + 1)) & 0x0F))
    return (code ^ mask).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    pcm = np.arange(65536, dtype=np.int32).astype(np.uint16).view(np.int16).astype(np.int32)
    v = pcm >> 3  # 13-bit
    mask = np.where(v >= 0, 0xD5, 0x55)
    v = np.where(v >= 0, v, -v - 1)
    seg = _segment(v, (0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF))
    s7 = np.minimum(seg, 7)
    quant = np.where(s7 < 2, (v >> 1) & 0x0F, (v >> s7) & 0x0F)
    code = np.where(seg >= 8, 0x7F, (s7 << 4) | quant)
    return (code ^ mask).astype(np.uint8)


#: code -> PCM16, and PCM16 bit pattern (as uint16) -> code, per law.
DECODE: Final = {"pcmu": _ulaw_decode_table(), "pcma": _alaw_decode_table()}
ENCODE: Final = {"pcmu": _ulaw_encode_table(), "pcma": _alaw_encode_table()}


def decode(law: str, payload: bytes) -> np.ndarray:
    """G.711 bytes -> int16 samples at 8 kHz."""
    return DECODE[law].take(np.frombuffer(payload, np.uint8))


def encode(law: str, samples: np.ndarray) -> bytes:
    """int16 samples at 8 kHz -> G.711 bytes."""
    return bytes(ENCODE[law].take(samples.astype(np.int16).view(np.uint16)))


class G711Decoder:
    """PCMU/PCMA payloads -> 48 kHz mono PCM16 (any ptime: 6 × 2 bytes out per byte in)."""

    def __init__(self, law: str) -> None:
        if law not in DECODE:
            raise ValueError(f"not a G.711 law: {law!r}")
        self.law = law
        self.errors = 0  # the Decoder protocol's count; every byte string is valid G.711
        self._up = Resampler(RATE, RATE * FACTOR, TELEPHONE)

    def decode(self, payload: bytes) -> bytes:
        x = decode(self.law, payload)
        if not len(x):
            return b""
        return self._up.process_int16(x).astype("<i2").tobytes()

    def conceal(self, fec_from: bytes | None = None) -> bytes:
        """A lost 20 ms packet: silence (G.711 carries no FEC to recover it from), through
        the filter so the audio before it fades out instead of stopping dead."""
        silence = np.zeros(FRAME_SAMPLES_8K, np.int16)
        return self._up.process_int16(silence).astype("<i2").tobytes()


class G711Encoder:
    """48 kHz mono PCM16 -> PCMU/PCMA payload (one byte per 6 samples; a remainder waits
    for the next frame)."""

    def __init__(self, law: str) -> None:
        if law not in ENCODE:
            raise ValueError(f"not a G.711 law: {law!r}")
        self.law = law
        self._down = Resampler(RATE * FACTOR, RATE, TELEPHONE)

    def encode(self, pcm: bytes) -> bytes:
        return encode(self.law, self._down.process_int16(np.frombuffer(pcm, "<i2")))

    def set_expected_loss(self, percent: int) -> None:
        """G.711 has no in-band FEC to tune."""

    def set_complexity(self, complexity: int) -> None:
        """G.711 has no complexity to trade: the overload controller's steps are no-ops."""
