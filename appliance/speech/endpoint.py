"""Semantic end of turn: Pipecat's Smart Turn v3.2 on the turn's audio at a pause.

Smart Turn v3.2 (Daily, BSD-2-Clause) is a Whisper-tiny encoder with a classifier head,
exported to ONNX (8.7 MB). It reads the last 8 s of a turn at 16 kHz and answers the
probability that the speaker has finished (prosody and words both: a falling
"…with mushrooms." scores high, a rising "I would like to…" low). The file ships inside the
``pipecat-ai`` wheel (``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``);
nothing is downloaded at run time. We only read that file: pipecat is never imported (its
import pulls in loguru, pydantic and its whole frame pipeline), the file is found through
``importlib.util.find_spec("pipecat")``, which locates the top-level package without
executing it. See docs/speech.md, "Why Smart Turn".

What the model expects, as pipecat's ``LocalSmartTurnAnalyzerV3._predict_endpoint`` feeds
it (pipecat 1.14):

* 16 kHz mono float audio in [-1, 1], the **last** 8 s of the turn, zero-padded **on the
  left** to exactly 128 000 samples;
* Whisper log-mel features of that window as ``transformers.WhisperFeatureExtractor
  (chunk_length=8)`` computes them with ``do_normalize=True``: the waveform normalised to
  zero mean and unit variance (over the padded window), a centred 400-point STFT (periodic
  Hann, reflect padding, hop 160), power spectrum, 80 Slaney mel filters over 0-8 kHz,
  ``log10`` floored at 1e-10, the last frame dropped, clamped to 8 below the maximum,
  then ``(x + 4) / 4``: shape ``(80, 800)``, float32 (:func:`log_mel_features`; checked
  against pipecat's vendored copy of the transformers code in tests/speech/test_endpoint.py);
* input ``input_features`` of shape ``(batch, 80, 800)``; output ``logits`` of shape
  ``(batch, 1)``, already a sigmoid probability despite its name.

One inference costs ~50 ms of one core on the 2-core test box. The model is loaded once per
process (:func:`smart_turn_session`, under a lock, one intra-op thread like Silero and
Whisper); onnxruntime's ``run`` is thread-safe, so calls share the session without a lock
around inference. :meth:`SmartTurn.probability` blocks: run it in a worker thread, never on
the trio loop (the turn detector in vad.py asks for it with an ``EndOfTurnQuery`` event and
takes the answer back with ``handle_verdict``; see listen.py for the shell).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .vad import SpeechUnavailable

SMART_TURN_RATE = 16_000
WINDOW_SAMPLES = 8 * SMART_TURN_RATE  # the model's 8 s window
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
_MODEL_DIR = ("audio", "turn", "smart_turn", "data")  # inside the pipecat package
EXTRA = ("semantic end of turn needs the 'speech' extra (Smart Turn v3.2 ships inside "
         "pipecat-ai): pip install 'appliance[speech]'")

_N_FFT = 400
_HOP = 160
_N_MELS = 80

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


def smart_turn_model_path() -> str:
    """The ONNX file inside the installed ``pipecat-ai`` (without importing pipecat)."""
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise SpeechUnavailable(EXTRA)
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*_MODEL_DIR, MODEL_FILE)
        if path.is_file():
            return str(path)
    raise SpeechUnavailable(f"{EXTRA} (pipecat is installed without {MODEL_FILE})")


# -- features ---------------------------------------------------------------------------------


def _hz_to_mel(f: F64) -> F64:
    """Slaney's mel scale: linear to 1 kHz, logarithmic above (librosa ``htk=False``)."""
    f = np.asarray(f, dtype=np.float64)
    lin = 3.0 * f / 200.0
    log = 15.0 + np.log(np.maximum(f, 1e-12) / 1000.0) * (27.0 / np.log(6.4))
    out: F64 = np.where(f >= 1000.0, log, lin)
    return out


def _mel_to_hz(m: F64) -> F64:
    m = np.asarray(m, dtype=np.float64)
    lin = 200.0 * m / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0))
    out: F64 = np.where(m >= 15.0, log, lin)
    return out


def _mel_filters() -> F64:
    """80 triangular Slaney-normalised filters over 0-8 kHz, shape ``(80, 201)``."""
    bins = np.linspace(0.0, SMART_TURN_RATE / 2, _N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(8000.0)),
                                   _N_MELS + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - bins[None, :]
    down = -ramps[:-2] / width[:-1, None]
    up = ramps[2:] / width[1:, None]
    filters = np.maximum(0.0, np.minimum(down, up))
    # Slaney normalisation: each filter's area is the same.
    filters *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return filters


_FILTERS = _mel_filters()
_HANN = np.hanning(_N_FFT + 1)[:-1]  # periodic, as torch.hann_window


def log_mel_features(audio: F32) -> F32:
    """Whisper log-mel features of exactly 8 s of 16 kHz float audio: ``(80, 800)``."""
    if audio.shape != (WINDOW_SAMPLES,):
        raise ValueError(f"expected {WINDOW_SAMPLES} samples, got {audio.shape}")
    # The reference normalises in float32, then the STFT runs in float64.
    x = audio.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + np.float32(1e-7))
    padded = np.pad(x.astype(np.float64), _N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, _N_FFT)[::_HOP]
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # (801, 201)
    mel = np.log10(np.maximum(1e-10, _FILTERS @ power.T))[:, :-1]  # (80, 800)
    mel = np.maximum(mel, mel.max() - 8.0)
    out: F32 = ((mel + 4.0) / 4.0).astype(np.float32)
    return out


def model_window(pcm16_16k: bytes) -> F32:
    """The model's input audio: the last 8 s as floats, zero-padded on the left."""
    x = np.frombuffer(pcm16_16k, dtype="<i2")[-WINDOW_SAMPLES:].astype(np.float32) / 32768.0
    if len(x) < WINDOW_SAMPLES:
        x = np.concatenate((np.zeros(WINDOW_SAMPLES - len(x), dtype=np.float32), x))
    return x


# -- the model --------------------------------------------------------------------------------

_session: Any = None
_session_lock = threading.Lock()


def smart_turn_session() -> Any:
    """The process-wide onnxruntime session for Smart Turn (loaded on first use)."""
    global _session
    with _session_lock:
        if _session is None:
            path = smart_turn_model_path()
            try:
                import onnxruntime
            except ModuleNotFoundError as exc:
                raise SpeechUnavailable(EXTRA) from exc
            opts = onnxruntime.SessionOptions()
            opts.inter_op_num_threads = 1
            opts.intra_op_num_threads = 1  # one core per inference: calls run side by side
            opts.log_severity_level = 3
            _session = onnxruntime.InferenceSession(
                path, providers=["CPUExecutionProvider"], sess_options=opts)
        return _session


def available() -> bool:
    """Whether the model can be loaded here (the speech extra is installed)."""
    try:
        smart_turn_model_path()
    except SpeechUnavailable:
        return False
    return importlib.util.find_spec("onnxruntime") is not None


class SmartTurn:
    """P(turn complete) for a turn's audio (see the module docstring)."""

    def __init__(self) -> None:
        self._session = smart_turn_session()

    def preload(self) -> None:
        """Load the model now and run it once (onnxruntime's first run builds its kernels:
        ~3x a warm one), so the first caller's pause does not pay for it."""
        self.probability(bytes(2 * SMART_TURN_RATE))

    def probability(self, pcm16_16k: bytes) -> float:
        """P(the speaker has finished) for the turn so far (16 kHz mono PCM16, the pause
        included); blocking, ~50 ms of CPU."""
        features = log_mel_features(model_window(pcm16_16k))[None]
        out = self._session.run(None, {"input_features": features})
        return float(np.asarray(out[0]).reshape(-1)[0])
