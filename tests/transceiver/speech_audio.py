"""Test speech made here, not downloaded: espeak-ng (``make sysdeps``) renders a few
sentences, resampled to 48 kHz; noise and echo paths are mixed in by the tests and by
bench/clean_audio.py. Cached per process."""

from __future__ import annotations

import functools
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

SR = 48_000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog. Please call me back tomorrow morning "
    "about the delivery.",
    "I would like to change my booking to Thursday, if there is still a table for four. "
    "Thank you very much.",
)


@functools.cache
def espeak(index: int = 0, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    """Sentence ``index`` as float samples at 48 kHz, peak 12 000 (int16 scale)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path),
                        SENTENCES[index]], check=True, capture_output=True)
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    n = int(len(x) * SR / rate)
    spec = np.fft.rfft(x)
    out = np.zeros(n // 2 + 1, complex)
    out[: len(spec)] = spec[: len(out)]
    y = np.fft.irfft(out, n) * (n / len(x))
    return np.asarray(y / np.abs(y).max() * 12_000)


def aligned_snr(clean: np.ndarray, y: np.ndarray, max_lag: int = 4000) -> tuple[int, float]:
    """(lag, SNR dB) of ``y`` against ``clean`` at the lag (0..max_lag) and gain that fit
    best: a stage's own delay (RNNoise: 20 ms here) is not counted as distortion."""
    n = min(len(clean), len(y))
    c, o = clean[:n], y[:n]
    m = 1 << (2 * n).bit_length()
    cc = np.fft.irfft(np.fft.rfft(o, m) * np.conj(np.fft.rfft(c, m)), m)[:max_lag]
    lag = int(np.argmax(cc))
    c, o = c[: n - max_lag], o[lag : lag + n - max_lag]
    g = float(c.dot(o) / c.dot(c))
    return lag, float(10 * np.log10(float(c.dot(c)) * g * g / float(((o - g * c) ** 2).sum())))


def white_noise_like(x: np.ndarray, snr_db: float, seed: int = 9) -> np.ndarray:
    """White noise at ``snr_db`` below ``x``'s mean power."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 1, len(x))
    return np.asarray(noise * np.sqrt((x ** 2).mean() / (noise ** 2).mean()) / 10 ** (snr_db / 20))
