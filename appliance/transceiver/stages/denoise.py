"""Noise suppression: RNNoise (Valin 2018, a small recurrent network over 22 Bark bands
with a pitch filter) on the caller's audio, before the VAD and the agent.

RNNoise runs natively at 48 kHz on 480-sample (10 ms) frames, so a 20 ms frame is two calls
and nothing is resampled. The native library is the one the ``pyrnnoise`` wheel ships
(``pyrnnoise/librnnoise.so``, RNNoise 0.2 with its built-in model: no weights are loaded
at run time); we find it through the package's location and bind the four functions we
need with ctypes ourselves, so neither pyrnnoise's Python layer (audiolab, matplotlib) nor
a copy per frame is on the media path. Missing wheel: :class:`StageUnavailable` naming it.

The two modes (``audio.input.noise_reduction.type``, OpenAI's names):

* ``near_field`` — a headset or handset: RNNoise's own per-band gains and nothing more.
  Speech is well above the noise; RNNoise's gains already take stationary and most
  non-stationary noise down by 15-25 dB and leave speech nearly untouched.
* ``far_field`` — a laptop, a speakerphone, a room: speech nearer the noise floor, more
  reverberant. RNNoise has no strength parameter, so on top of its band gains its own voice
  probability gates the frame: 10 ms frames whose probability stays below
  ``gate_threshold`` for longer than the hangover (200 ms) are pulled down by a further
  ``gate_db`` (12 dB), with an instant attack so onsets are not clipped. Measured
  (bench/clean_audio.py), the difference is small: RNNoise already leaves little between
  words, and it rates stationary broadband noise as fairly voice-like (so the gate stays
  open there); the gate removes what RNNoise lets through in long pauses.

Reported (``media.stages.denoise``): the mode, frames, mean voice probability, and how
much of the time the far-field gate was closed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from typing import Any

import numpy as np

from .base import FRAME_SAMPLES, StageUnavailable
from .config import NOISE_REDUCTION

RNN_FRAME = 480
_INT16 = np.dtype("<i2")
_lib: Any = None


def load() -> Any:
    """librnnoise from the ``pyrnnoise`` wheel (its package is not imported)."""
    global _lib
    if _lib is not None:
        return _lib
    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        raise StageUnavailable("needs pyrnnoise (pip install 'appliance[speech]')")
    path = None
    for folder in spec.submodule_search_locations:
        candidate = os.path.join(folder, "librnnoise.so")
        if os.path.exists(candidate):
            path = candidate
            break
    if path is None:
        raise StageUnavailable("pyrnnoise is installed without its librnnoise.so "
                               "(this platform's wheel does not ship one)")
    lib = ctypes.CDLL(path)
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    fptr = ctypes.POINTER(ctypes.c_float)
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, fptr, fptr]
    lib.rnnoise_process_frame.restype = ctypes.c_float
    if lib.rnnoise_get_frame_size() != RNN_FRAME:  # pragma: no cover - a foreign build
        raise StageUnavailable("librnnoise has an unexpected frame size")
    _lib = lib
    return lib


class Denoiser:
    """A stage (named ``denoise``): RNNoise, plus the far-field gate."""

    name = "denoise"

    def __init__(self, mode: str = "near_field", *, gate_threshold: float = 0.3,
                 gate_db: float = 12.0, hangover_frames: int = 20) -> None:
        if mode not in NOISE_REDUCTION:
            raise ValueError(f"noise reduction mode must be one of {NOISE_REDUCTION}")
        lib = self._lib = load()
        self.mode = mode
        self._state = lib.rnnoise_create(None)
        if not self._state:
            raise MemoryError("rnnoise_create failed")
        self._buf = np.zeros(FRAME_SAMPLES, np.float32)  # in and out, in place
        f = ctypes.POINTER(ctypes.c_float)
        self._ptrs = [self._buf[i:].ctypes.data_as(f) for i in range(0, FRAME_SAMPLES, RNN_FRAME)]
        self._gate = mode == "far_field"
        self._threshold = gate_threshold
        self._floor = 10 ** (-gate_db / 20)
        self._hangover = hangover_frames
        self._hang = 0
        self._gain = 1.0
        self.frames = 0
        self._prob_sum = 0.0
        self.gated = 0  # 10 ms frames the gate held down

    def process(self, pcm: bytes, now: float) -> bytes:
        buf = self._buf
        buf[:] = np.frombuffer(pcm, _INT16)  # RNNoise takes floats on the int16 scale
        run = self._lib.rnnoise_process_frame
        state = self._state
        gains = None
        for k, p in enumerate(self._ptrs):
            prob = float(run(state, p, p))
            self._prob_sum += prob
            if self._gate:
                gains = gains if gains is not None else np.ones(FRAME_SAMPLES, np.float32)
                gains[k * RNN_FRAME : (k + 1) * RNN_FRAME] = self._gate_gain(prob)
        self.frames += 1
        if gains is not None:
            buf *= gains
        return np.clip(buf, -32768, 32767).astype(_INT16).tobytes()

    def _gate_gain(self, prob: float) -> float:
        if prob >= self._threshold:
            self._hang = self._hangover
            self._gain = 1.0  # attack at once: never clip an onset
        elif self._hang > 0:
            self._hang -= 1
        else:
            self._gain = max(self._floor, self._gain * 0.7)  # release over ~60 ms
            self.gated += 1
        return self._gain

    def stats(self) -> dict[str, Any]:
        n = 2 * self.frames
        return {"mode": self.mode, "frames": self.frames,
                "voice_probability": round(self._prob_sum / n, 3) if n else None,
                "gated": round(self.gated / n, 3) if n else 0.0}

    def close(self) -> None:
        if self._state:
            self._lib.rnnoise_destroy(self._state)
            self._state = None


def make_denoiser(mode: str) -> Denoiser:
    return Denoiser(mode)
