"""A simple energy voice-activity detector for 20 ms PCM16 frames.

"Speech likely" means: the frame's RMS level is at least ``margin_db`` above an adaptive
noise floor *and* above an absolute floor (``min_dbfs``), with a hangover so the flag does
not flicker between syllables. The floor follows quiet frames quickly and loud ones slowly,
so steady background noise stops counting as speech after a second or two. This is a hint
for turn-taking in simple agents, not a classifier: agents that need more bring their own.
"""

from __future__ import annotations

import math

import numpy as np

_INT16 = np.dtype(np.int16)
_FLOAT32 = np.dtype(np.float32)
_FULL_SCALE_SQ = 32768.0 * 32768.0


def level_dbfs(pcm: bytes) -> float:
    """RMS level of mono PCM16 in dB relative to full scale (silence is -120)."""
    n = len(pcm) >> 1
    if not n:
        return -120.0
    # Called for every 20 ms frame of every session (~1.8 µs): three numpy calls (view,
    # convert, dot) are the floor; positional dtypes and ``.item()`` skip keyword parsing.
    samples = np.frombuffer(pcm, _INT16, n).astype(_FLOAT32)
    mean_sq = samples.dot(samples).item() / n
    if mean_sq <= 1.0:
        return -120.0
    return 10.0 * math.log10(mean_sq / _FULL_SCALE_SQ)


class EnergyVad:
    __slots__ = ("floor_db", "margin_db", "min_dbfs", "hangover", "_hang", "last_level")

    def __init__(
        self, *, margin_db: float = 12.0, min_dbfs: float = -50.0, hangover_frames: int = 10
    ) -> None:
        self.floor_db = -70.0
        self.margin_db = margin_db
        self.min_dbfs = min_dbfs
        self.hangover = hangover_frames  # 200 ms at 20 ms frames
        self._hang = 0
        self.last_level = -120.0

    def update(self, pcm: bytes) -> bool:
        """Feed one frame; return whether speech is likely in it."""
        level = level_dbfs(pcm)
        self.last_level = level
        # Noise floor: fall fast (quiet frames are noise), rise slowly (~2 s time constant).
        if level < self.floor_db:
            self.floor_db = 0.5 * self.floor_db + 0.5 * level
        else:
            self.floor_db += 0.01 * (level - self.floor_db)
        self.floor_db = max(self.floor_db, -90.0)
        if level >= self.min_dbfs and level >= self.floor_db + self.margin_db:
            self._hang = self.hangover
            return True
        if self._hang > 0:
            self._hang -= 1
            return True
        return False
