"""Audio conversions between the appliance (48 kHz mono PCM16) and the Realtime and
GPT-Live APIs' formats (``audio/pcm`` at 24 kHz — and 16 kHz on GPT-Live —, ``audio/pcmu``,
``audio/pcma`` at 8 kHz, ITU-T G.711).

Only the paths the event protocols need: ``input_audio_buffer.append`` and
``session.input_audio.append`` decode into the appliance's rate; ``conversation.item.retrieve``
and the WebSocket sessions' output audio encode from it. Rates change by integer factors
(2, 3 and 6), so a linear interpolation up and a pair/group mean down are enough for speech
(the band of interest is far below either Nyquist).
"""

from __future__ import annotations

import numpy as np

RATE = 48_000


def _up(samples: np.ndarray, factor: int) -> bytes:
    """Linear interpolation by an integer factor (the last sample is held)."""
    n = len(samples)
    if not n:
        return b""
    x = np.arange(n * factor, dtype=np.float64) / factor
    out = np.interp(x, np.arange(n, dtype=np.float64), samples.astype(np.float64))
    return bytes(np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes())


def pcm24k_to_48k(pcm: bytes) -> bytes:
    return _up(np.frombuffer(pcm[: len(pcm) & ~1], "<i2"), 2)


def pcm48k_to_24k(pcm: bytes) -> bytes:
    s = np.frombuffer(pcm[: len(pcm) & ~3], "<i2").astype(np.int32)
    return bytes(((s[0::2] + s[1::2]) // 2).astype("<i2").tobytes())


def pcm16k_to_48k(pcm: bytes) -> bytes:
    """GPT-Live's ``audio/pcm`` at 16 kHz (its WebSocket takes 16 or 24 kHz)."""
    return _up(np.frombuffer(pcm[: len(pcm) & ~1], "<i2"), 3)


def pcm48k_to_16k(pcm: bytes) -> bytes:
    """48 kHz PCM16 -> 16 kHz (the mean of each group of 3; a partial group is dropped)."""
    n = len(pcm) // 6 * 3
    s = np.frombuffer(pcm[: n * 2], "<i2").astype(np.int32)
    return bytes((s.reshape(-1, 3).sum(axis=1) // 3).astype("<i2").tobytes())


def _ulaw_table() -> np.ndarray:
    # ITU-T G.711 µ-law expansion: invert, sign bit 7, exponent bits 4-6, mantissa 0-3.
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    mag = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
    return np.where(u & 0x80, 0x84 - mag, mag - 0x84).astype(np.int16)


def _alaw_table() -> np.ndarray:
    # G.711 A-law expansion: even bits inverted (XOR 0x55), then sign/exponent/mantissa.
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exp = (a >> 4) & 0x07
    mant = a & 0x0F
    mag = np.where(exp == 0, (mant << 4) + 8, ((mant << 4) + 0x108) << np.maximum(exp - 1, 0))
    return np.where(a & 0x80, mag, -mag).astype(np.int16)


_ULAW = _ulaw_table()
_ALAW = _alaw_table()


def g711_to_48k(data: bytes, *, alaw: bool) -> bytes:
    table = _ALAW if alaw else _ULAW
    return _up(table[np.frombuffer(data, np.uint8)], 6)


def to_48k(data: bytes, fmt: str) -> bytes:
    """Decode appended audio in the session's input format to the appliance's PCM."""
    if fmt == "audio/pcmu":
        return g711_to_48k(data, alaw=False)
    if fmt == "audio/pcma":
        return g711_to_48k(data, alaw=True)
    return pcm24k_to_48k(data)


def seconds(pcm48k: bytes | int) -> float:
    n = pcm48k if isinstance(pcm48k, int) else len(pcm48k)
    return n / 2 / RATE


def _encode_table(decode: np.ndarray) -> np.ndarray:
    """int16 (offset by 32768) -> the G.711 code whose value is nearest: the inverse of a
    decode table, found once by a sorted search (exact quantisation, no bit tricks)."""
    order = np.argsort(decode, kind="stable")
    values = decode[order].astype(np.int32)
    x = np.arange(-32768, 32768, dtype=np.int32)
    hi = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lo = hi - 1
    pick = np.where(np.abs(values[hi] - x) < np.abs(x - values[lo]), hi, lo)
    return order[pick].astype(np.uint8)


_ULAW_ENC = _encode_table(_ULAW)
_ALAW_ENC = _encode_table(_ALAW)


def pcm48k_to_8k(pcm: bytes) -> np.ndarray:
    """48 kHz PCM16 -> 8 kHz int16 samples (the mean of each group of 6)."""
    n = len(pcm) // 12 * 6
    s = np.frombuffer(pcm[: n * 2], "<i2").astype(np.int32)
    out: np.ndarray = (s.reshape(-1, 6).sum(axis=1) // 6).astype(np.int16)
    return out


def g711_from_48k(pcm: bytes, *, alaw: bool) -> bytes:
    table = _ALAW_ENC if alaw else _ULAW_ENC
    return bytes(table[pcm48k_to_8k(pcm).astype(np.int32) + 32768].tobytes())


def from_48k(pcm: bytes, fmt: str) -> bytes:
    """Encode the appliance's PCM in the session's output format (``response.output_audio
    .delta`` on a WebSocket session)."""
    if fmt == "audio/pcmu":
        return g711_from_48k(pcm, alaw=False)
    if fmt == "audio/pcma":
        return g711_from_48k(pcm, alaw=True)
    return pcm48k_to_24k(pcm)
