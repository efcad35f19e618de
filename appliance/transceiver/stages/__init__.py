"""PCM stages: what works on a call's 20 ms frames between decode and VAD (in) and between
the agent and encode (out). The seam is :class:`Stage` (base.py); one call's chains are
:class:`CallStages`, built from its :class:`MediaConfig` (config.py). docs/media-stages.md.
"""

from .base import FRAME_BYTES, SAMPLE_RATE, Stage, StageChain, StageUnavailable
from .call_stages import CallStages
from .config import NOISE_REDUCTION, MediaConfig, VadConfig
from .level import LevelMeter
from .recorder import RecorderTap, TapFrame

__all__ = ["FRAME_BYTES", "NOISE_REDUCTION", "SAMPLE_RATE", "CallStages", "LevelMeter",
           "MediaConfig", "RecorderTap", "Stage", "StageChain", "StageUnavailable", "TapFrame",
           "VadConfig"]
