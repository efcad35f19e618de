"""8 kHz <-> 48 kHz PCM16 resampling for telephone audio (G.711 legs) to and from the
agents' 48 kHz frames: one polyphase FIR low-pass, both directions, stateful across
frames so a stream cut into 20 ms frames comes out exactly as if resampled whole.

The filter (designed here, at import, with numpy only — no scipy at run time)::

    384-tap windowed sinc at 48 kHz, cut-off 3.7 kHz, Kaiser window β = 7.5
    passband 0-3.4 kHz (the G.711 telephone band):   ripple ≈ 0.003 dB
    stopband >= 4.0 kHz (8 kHz Nyquist):             -76 dB or lower
    group delay 191.5 samples at 48 kHz ≈ 4.0 ms per direction

Measured in ``tests/transceiver/test_resample.py`` (numeric asserts: ripple < 0.5 dB,
rejection > 60 dB, frames == whole) and timed by ``bench/resample.py``.

* Up (8 -> 48 kHz, :class:`Upsampler`): each input sample becomes six output samples, one
  per *phase* of the filter (taps ``h[p::6]``, 64 each): ``y[6i+p] = 6·Σ_k h[6k+p]·x[i-k]``,
  six 64-tap ``np.convolve`` over the input (no zero is ever multiplied). The
  images of the 8 kHz spectrum at 8k±f, 16k±f, 24k-f are what the stopband removes.
* Down (48 -> 8 kHz, :class:`Downsampler`): ``y[i] = Σ_k h[k]·x[6i-k]``: the full filter
  evaluated at every sixth input only, as six 64-tap correlations of the input's phases
  ``x[p::6]`` summed. Everything above
  4 kHz, which would alias into the telephone band, is in the stopband.

What this replaces: ``g711.py``'s ``G711Decoder`` upsamples by linear interpolation and
``G711Encoder`` downsamples by a 6-sample mean (a boxcar). ``bench/resample.py`` measures
them at 2.7 dB passband ripple (the boxcar droops towards 3.4 kHz), aliases only -4.5 dB
down and images -10.5 dB down. Wiring this module into those classes (or the media
pipeline) is the lead's, not done here.
"""

from __future__ import annotations

from typing import Final

import numpy as np

FACTOR: Final = 6  # 48000 / 8000
TAPS: Final = 384
TAPS_PER_PHASE: Final = TAPS // FACTOR  # 64
CUTOFF_HZ: Final = 3700.0
KAISER_BETA: Final = 7.5
HIGH_RATE: Final = 48_000
LOW_RATE: Final = 8_000


def design_lowpass(taps: int = TAPS, cutoff: float = CUTOFF_HZ, rate: float = HIGH_RATE,
                   beta: float = KAISER_BETA) -> np.ndarray:
    """A linear-phase windowed-sinc low-pass with unit DC gain (float64)."""
    t = np.arange(taps) - (taps - 1) / 2
    h = 2 * cutoff / rate * np.sinc(2 * cutoff / rate * t) * np.kaiser(taps, beta)
    out: np.ndarray = h / h.sum()
    return out


#: The prototype filter at 48 kHz, shared by both directions.
LOWPASS: Final = design_lowpass()
#: Up: phase p's 64 taps ``h[p::6]`` (times 6: the gain zero stuffing loses), for
#: ``np.convolve(x, taps, "valid")``: output i is Σ_k h[6k+p]·x[i-k].
_UP_PHASES: Final = tuple(np.ascontiguousarray(FACTOR * LOWPASS[p::FACTOR])
                          for p in range(FACTOR))
#: Down: y[i] = Σ_j g[j]·x[6i+j] with g the taps reversed (newest input last); split j =
#: 6q + p, each phase p is ``np.correlate(x[p::6], g[p::6], "valid")``.
_DOWN_PHASES: Final = tuple(np.ascontiguousarray(LOWPASS[::-1][p::FACTOR])
                            for p in range(FACTOR))


def _to_int16(y: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.clip(np.rint(y), -32768, 32767).astype(np.int16)
    return out


class Upsampler:
    """8 kHz -> 48 kHz, any number of samples per call; keeps the last 63 inputs."""

    __slots__ = ("_history",)

    def __init__(self) -> None:
        self._history = np.zeros(TAPS_PER_PHASE - 1, dtype=np.float64)

    def process_float(self, x: np.ndarray) -> np.ndarray:
        """float samples at 8 kHz -> 6× as many float samples at 48 kHz."""
        if not len(x):
            return np.zeros(0, dtype=np.float64)
        ext = np.concatenate((self._history, np.asarray(x, dtype=np.float64)))
        self._history = ext[len(ext) - (TAPS_PER_PHASE - 1):].copy()
        out = np.empty((len(ext) - (TAPS_PER_PHASE - 1), FACTOR), dtype=np.float64)
        for p, taps in enumerate(_UP_PHASES):
            out[:, p] = np.convolve(ext, taps, "valid")
        flat: np.ndarray = out.reshape(-1)
        return flat

    def process(self, samples: np.ndarray) -> np.ndarray:
        """int16 at 8 kHz -> int16 at 48 kHz (rounded, clipped)."""
        return _to_int16(self.process_float(samples))

    def process_bytes(self, pcm: bytes) -> bytes:
        """Little-endian PCM16 at 8 kHz -> PCM16 at 48 kHz."""
        return self.process(np.frombuffer(pcm, "<i2")).astype("<i2").tobytes()

    def reset(self) -> None:
        """Forget the history (after a gap: the next frame starts from silence)."""
        self._history[:] = 0.0


class Downsampler:
    """48 kHz -> 8 kHz, any number of samples per call (a remainder that is not a whole
    output sample waits for the next call); keeps the last 383 inputs."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        # The window of output i ends at input 6i: 383 zeros stand for the past.
        self._pending = np.zeros(TAPS - 1, dtype=np.float64)

    def process_float(self, x: np.ndarray) -> np.ndarray:
        """float samples at 48 kHz -> float samples at 8 kHz (``ceil`` of n/6 over calls)."""
        ext = np.concatenate((self._pending, np.asarray(x, dtype=np.float64)))
        count = (len(ext) - TAPS) // FACTOR + 1 if len(ext) >= TAPS else 0
        self._pending = ext[FACTOR * count:].copy()
        if not count:
            return np.zeros(0, dtype=np.float64)
        out = np.zeros(count, dtype=np.float64)
        for p, taps in enumerate(_DOWN_PHASES):
            out += np.correlate(ext[p::FACTOR], taps, "valid")[:count]
        return out

    def process(self, samples: np.ndarray) -> np.ndarray:
        """int16 at 48 kHz -> int16 at 8 kHz (rounded, clipped)."""
        return _to_int16(self.process_float(samples))

    def process_bytes(self, pcm: bytes) -> bytes:
        """Little-endian PCM16 at 48 kHz -> PCM16 at 8 kHz."""
        return self.process(np.frombuffer(pcm, "<i2")).astype("<i2").tobytes()

    def reset(self) -> None:
        self._pending = np.zeros(TAPS - 1, dtype=np.float64)
