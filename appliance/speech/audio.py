"""Sample-rate conversion and small PCM helpers for the speech engines (numpy only).

The appliance speaks mono PCM16 at 48 kHz in 20 ms frames; speech models want 16 kHz, and
TTS engines produce 22.05 kHz (espeak-ng) or 24 kHz (OpenAI ``pcm``). :class:`Resampler` is
a streaming rational polyphase resampler: a Kaiser-windowed sinc low-pass (β = 8, ~80 dB
stop band) cut off at 92 % of the lower Nyquist frequency, so decimating 48 → 16 kHz does
not fold 8-24 kHz (sibilants, fan noise) back into the speech band. State carries across
calls, so feeding 20 ms frames gives exactly the samples one call on the whole signal would.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


class Resampler:
    """Streaming ``src`` → ``dst`` Hz resampler of mono PCM16 (or float) blocks."""

    __slots__ = ("src", "dst", "up", "down", "taps", "_bank", "_buf", "_base", "_next_out")

    def __init__(self, src: int, dst: int, *, taps_per_phase: int | None = None) -> None:
        if src <= 0 or dst <= 0:
            raise ValueError("sample rates must be positive")
        g = math.gcd(src, dst)
        self.src, self.dst = src, dst
        self.up, self.down = dst // g, src // g
        ratio = max(1.0, self.down / self.up)
        k = taps_per_phase or int(2 * math.ceil(16 * ratio)) + 16
        self.taps = k
        n = self.up * k
        cutoff = 0.92 * 0.5 / max(self.up, self.down)  # cycles per upsampled sample
        t = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
        h = 2 * cutoff * np.sinc(2 * cutoff * t) * np.kaiser(n, 8.0)
        h *= self.up / h.sum()
        # bank[p, i] = h[p + up*i]: the taps that meet input samples for output phase p.
        self._bank = h.reshape(k, self.up).T.astype(np.float32).copy()
        self._buf = np.zeros(k - 1, dtype=np.float32)  # the last k-1 input samples
        self._base = -(k - 1)  # absolute input index of _buf[0]
        self._next_out = 0

    @property
    def delay_seconds(self) -> float:
        """Group delay of the filter."""
        return (self.up * self.taps - 1) / 2.0 / (self.up * self.src)

    def process_float(self, x: F32) -> F32:
        """Feed float samples; return the float output samples now computable."""
        buf = np.concatenate((self._buf, x.astype(np.float32, copy=False)))
        total_in = self._base + len(buf)  # absolute index one past the newest input
        up, down = self.up, self.down
        # Outputs n whose newest input sample (n*down)//up is already here.
        n_end = (total_in * up + down - 1) // down  # first n with (n*down)//up >= total_in
        n0 = self._next_out
        if n_end > n0:
            ns = np.arange(n0, n_end, dtype=np.int64)
            u = ns * down
            phase = u % up
            newest = u // up - self._base
            k = self.taps
            if up == 1 or down == 1:
                # Integer ratios: one convolution per phase, then pick (fast path).
                conv = np.stack([np.convolve(buf, self._bank[q], "valid") for q in range(up)])
                out = conv[phase, newest - (k - 1)].astype(np.float32)
            else:
                idx = newest[:, None] - np.arange(k, dtype=np.int64)[None, :]
                out = np.einsum("ij,ij->i", buf[idx], self._bank[phase]).astype(np.float32)
            self._next_out = int(n_end)
        else:
            out = np.zeros(0, dtype=np.float32)
        keep = self.taps - 1
        self._base = total_in - keep
        self._buf = buf[len(buf) - keep :].copy()
        return out

    def process(self, pcm: bytes) -> bytes:
        """Feed PCM16 bytes; return the PCM16 output now computable."""
        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        return to_pcm16(self.process_float(x))

    def flush(self) -> bytes:
        """The tail held back by the filter (feeds ``taps`` zeros)."""
        return to_pcm16(self.process_float(np.zeros(self.taps, dtype=np.float32)))


def to_pcm16(x: F32) -> bytes:
    return np.clip(np.rint(x), -32768, 32767).astype("<i2").tobytes()


def resample(pcm: bytes, src: int, dst: int) -> bytes:
    """Resample a whole PCM16 buffer (delay-compensated: output aligned with the input)."""
    if src == dst:
        return pcm
    r = Resampler(src, dst)
    out = r.process(pcm) + r.flush()
    skip = round(r.delay_seconds * dst)
    want = len(pcm) // 2 * dst // src
    return out[2 * skip : 2 * (skip + want)]


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
