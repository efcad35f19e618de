"""Level meter: RMS and peak of one direction's audio, in dBFS, for the session object
(``GET /v1/sessions/{id}`` → ``media.levels``) and the dashboard.

Per frame: the frame's mean square and its largest absolute sample (two numpy reductions
over 960 samples, ~2 µs). Reported:

* ``rms_dbfs`` — mean square smoothed over ~300 ms (one-pole, ``alpha`` per 20 ms frame),
  what a VU meter shows;
* ``peak_dbfs`` — the largest sample, held and falling 20 dB/s (a PPM's fall-back), so a
  poll every second still sees a click;
* ``max_peak_dbfs`` — the largest sample of the call, and ``clipped`` — frames that touched
  full scale (±32767/-32768): a microphone driven too hot, or an agent's TTS too loud.

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

    __slots__ = ("name", "direction", "alpha", "frames", "clipped", "_ms", "_peak_db",
                 "max_peak_db", "last_rms_db")

    def __init__(self, direction: str, *, alpha: float = 0.06) -> None:
        self.name = f"level-{direction}"
        self.direction = direction
        self.alpha = alpha  # ~300 ms time constant at 50 frames/s
        self.frames = 0
        self.clipped = 0
        self._ms = 0.0
        self._peak_db = FLOOR_DB
        self.max_peak_db = FLOOR_DB
        self.last_rms_db = FLOOR_DB  # the last frame's own RMS

    def process(self, pcm: bytes, now: float) -> bytes:
        n = len(pcm) >> 1
        if not n:
            return pcm
        x = np.frombuffer(pcm, _INT16, n)
        xf = x.astype(_FLOAT32)
        ms = xf.dot(xf).item() / n
        # max(|x|) without a widened copy: the two extremes of the int16 view.
        peak = max(int(x.max()), -int(x.min()))
        self.frames += 1
        self._ms = ms if self.frames == 1 else self._ms + self.alpha * (ms - self._ms)
        self.last_rms_db = _db(ms)
        pdb = _peak_db(peak)
        held = self._peak_db - _PEAK_FALL_DB
        self._peak_db = pdb if pdb > held else held
        if pdb > self.max_peak_db:
            self.max_peak_db = pdb
        if peak >= 32767:
            self.clipped += 1
        return pcm

    @property
    def rms_db(self) -> float:
        return _db(self._ms) if self.frames else FLOOR_DB

    @property
    def peak_db(self) -> float:
        return max(FLOOR_DB, self._peak_db)

    def stats(self) -> dict[str, Any]:
        return {"rms_dbfs": round(self.rms_db, 1), "peak_dbfs": round(self.peak_db, 1),
                "max_peak_dbfs": round(self.max_peak_db, 1), "clipped": self.clipped,
                "frames": self.frames}

    def close(self) -> None:
        pass
