"""Small PCM helpers for the speech engines (numpy only): WAV files and streams, and the
measures the tests and benches take (band energy, RMS level).

The appliance speaks mono PCM16 at 48 kHz in 20 ms frames; speech models want 16 kHz, and
TTS engines produce 22.05 kHz (espeak-ng) or 24 kHz (OpenAI ``pcm``): the conversion is
:mod:`appliance.audio.resample` (the one resampler, :data:`~appliance.audio.resample.DEFAULT`
design), shared with the WebSocket bridges and the Realtime machine.
"""

from __future__ import annotations

import math
import struct

import numpy as np


def wav_bytes(pcm: bytes, rate: int) -> bytes:
    """A mono PCM16 WAV file around ``pcm``."""
    return (
        b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data" + struct.pack("<I", len(pcm)) + pcm
    )


class WavError(ValueError):
    """Not a mono PCM16 WAV stream."""


def parse_wav_header(data: bytes) -> tuple[int, int] | None:
    """``(sample_rate, offset_of_samples)`` of a mono PCM16 WAV stream's start, or ``None``
    if more bytes are needed. Streaming writers (``espeak-ng --stdout``) put placeholder
    sizes in the header, so the data chunk is taken to run to the end of the stream."""
    if len(data) < 12:
        return None
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise WavError("not a RIFF/WAVE stream")
    pos = 12
    rate = 0
    while True:
        if len(data) < pos + 8:
            return None
        cid = data[pos : pos + 4]
        size = struct.unpack_from("<I", data, pos + 4)[0]
        if cid == b"data":
            if not rate:
                raise WavError("data chunk before fmt chunk")
            return rate, pos + 8
        if len(data) < pos + 8 + size:
            return None
        if cid == b"fmt ":
            fmt, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, pos + 8)
            if fmt != 1 or channels != 1 or bits != 16 or rate <= 0:
                raise WavError(f"need mono PCM16, got format {fmt}, {channels} ch, {bits} bit")
        pos += 8 + size + (size & 1)


def read_wav(data: bytes) -> tuple[bytes, int]:
    """``(pcm16, sample_rate)`` of a whole mono PCM16 WAV file."""
    head = parse_wav_header(data)
    if head is None:
        raise WavError("truncated WAV header")
    rate, off = head
    pcm = data[off:]
    return pcm[: len(pcm) & ~1], rate


def band_energy_ratio(pcm: bytes, rate: int, lo: float = 300.0, hi: float = 3400.0) -> float:
    """Fraction of the signal's energy between ``lo`` and ``hi`` Hz (0 for silence)."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    if not len(x):
        return 0.0
    spec = np.abs(np.fft.rfft(x)) ** 2
    freqs = np.fft.rfftfreq(len(x), 1.0 / rate)
    total = float(spec[1:].sum())
    if total <= 0:
        return 0.0
    return float(spec[(freqs >= lo) & (freqs <= hi)].sum()) / total


def rms_dbfs(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    if not len(x):
        return -120.0
    ms = float(np.mean(x * x))
    return -120.0 if ms <= 1.0 else 10 * math.log10(ms / 32768.0**2)
