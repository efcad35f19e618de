"""Level meter: RMS and peak of one direction's audio, in dBFS, for the session object
(``GET /v1/sessions/{id}`` → ``media.levels``) and the dashboard.

Every ``every``-th frame (default 4: one in 80 ms, plenty for a meter read once a second):
the frame's mean square and its largest absolute sample. Sampling keeps the default path
cheap — a full measurement is ~6 numpy calls, several µs per frame per direction, while a
skipped frame is a counter (bench/pcm_path.py measures both); ``every=1`` measures all.
Reported (over the measured frames):

* ``rms_dbfs`` — mean square smoothed over ~300 ms (one-pole, ``alpha`` per 20 ms frame),
  what a VU meter shows;
* ``peak_dbfs`` — the largest sample, held and falling 20 dB/s (a PPM's fall-back), so a
  poll every second still sees a click;
* ``max_peak_dbfs`` — the largest sample measured in the call, and ``clipped`` — measured
  frames that touched full scale (±32767/-32768): a microphone driven too hot, or an
  agent's TTS too loud (sustained clipping shows; a lone click between samples may not).

Silence is -120 dBFS (as :func:`appliance.agents.vad.level_dbfs`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_INT16 = np.dtype(np.int16)
_FLOAT32 = np.dtype(np.float32)
_FULL_SQ = 32768.0 * 32768.0
FLOOR_DB = -120.0
#: Peak hold falls this much per 20 ms frame (20 dB/s).
_PEAK_FALL_DB = 0.4


def _db(mean_sq: float) -> float:
    return FLOOR_DB if mean_sq <= 1e-2 else max(FLOOR_DB, 10.0 * math.log10(mean_sq / _FULL_SQ))


def _peak_db(peak: int) -> float:
    return FLOOR_DB if peak <= 0 else max(FLOOR_DB, 20.0 * math.log10(peak / 32768.0))


class LevelMeter:
    """A stage that only looks: returns every frame unchanged."""

    __slots__ = ("name", "direction", "alpha", "every", "frames", "measured", "clipped", "_ms",
                 "_peak_db", "max_peak_db", "last_rms_db", "_fall")

    def __init__(self, direction: str, *, every: int = 4, alpha: float | None = None) -> None:
        self.name = f"level-{direction}"
        self.direction = direction
        self.every = max(1, every)
        # ~300 ms RMS time constant and 20 dB/s peak fall, whatever the sampling.
        self.alpha = alpha if alpha is not None else min(1.0, 0.06 * self.every)
        self._fall = _PEAK_FALL_DB * self.every
        self.frames = 0
        self.measured = 0
        self.clipped = 0
        self._ms = 0.0
        self._peak_db = FLOOR_DB
        self.max_peak_db = FLOOR_DB
        self.last_rms_db = FLOOR_DB  # the last frame's own RMS

    def process(self, pcm: bytes, now: float) -> bytes:
        self.frames += 1
        if self.frames % self.every:
            return pcm
        n = len(pcm) >> 1
        xf = np.frombuffer(pcm, _INT16, n).astype(_FLOAT32)
        ms = xf.dot(xf).item() / n
        peak = int(max(xf.max(), -xf.min()))
        self.measured += 1
        self._ms = ms if self.measured == 1 else self._ms + self.alpha * (ms - self._ms)
        self.last_rms_db = _db(ms)
        pdb = _peak_db(peak)
        held = self._peak_db - self._fall
        self._peak_db = pdb if pdb > held else held
        if pdb > self.max_peak_db:
            self.max_peak_db = pdb
        if peak >= 32767:
            self.clipped += 1
        return pcm

    @property
    def rms_db(self) -> float:
        return _db(self._ms) if self.measured else FLOOR_DB

    @property
    def peak_db(self) -> float:
        return max(FLOOR_DB, self._peak_db)

    def stats(self) -> dict[str, Any]:
        return {"rms_dbfs": round(self.rms_db, 1), "peak_dbfs": round(self.peak_db, 1),
                "max_peak_dbfs": round(self.max_peak_db, 1), "clipped": self.clipped,
                "frames": self.frames, "measured": self.measured}

    def close(self) -> None:
        pass
