"""A Piper voice model run in this process: text → phonemes (the ``espeak-ng`` program) →
phoneme ids (the voice's own table) → audio (its ONNX model in onnxruntime).

Piper voices are VITS models trained on espeak-ng's IPA phonemes; a voice is an ONNX file
and a JSON file beside it (sample rate, inference scales, ``phoneme_id_map``). piper-tts,
the program that usually runs them, is GPL-3.0 and imports espeak-ng's library, so the
appliance does not run it (docs/adr-piper-tts.md): the phonemes come from the
``espeak-ng`` program (a separate process, the Debian package the espeak engine already
uses; ``-q --ipa``, one line per clause) and the model runs here, which is what halves
the CPU of a sentence (docs/speech.md, "Piper"): one onnxruntime thread per rendering with
no spinning (its default spins idle threads, which on a 2-core box takes the core the
calls' Whisper and Smart Turn need) and no WAV file between processes.

What a rendering does is what piper 1.x does with a line of text: clauses' punctuation
kept as phonemes (``,`` ``:`` ``;`` followed by a space), language-switch marks dropped,
NFD-decomposed codepoints mapped through ``phoneme_id_map`` (``^`` first, ``_`` after
each, ``$`` last; unknown ones skipped), one model run per sentence, each peak-normalised
to full scale.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .vad import SpeechUnavailable

#: espeak-ng's clause punctuation as it reaches the text: kept after the clause's phonemes
_TERMINATOR = re.compile(r"([.,!?;:]+)(?=\s|$)")
_LANG_SWITCH = re.compile(r"\([^)]+\)")  # "(fr)" … "(en)" around a foreign word
_SENTENCE_END = frozenset(".!?")
PHONEMIZE_TIMEOUT_S = 5.0


class PiperError(RuntimeError):
    """A rendering failed (the phonemizer or the model): the caller's TTS error to raise."""


@dataclass(frozen=True)
class VoiceConfig:
    sample_rate: int
    espeak_voice: str
    noise_scale: float
    length_scale: float
    noise_w: float
    id_map: dict[str, list[int]]

    @classmethod
    def load(cls, path: Path) -> VoiceConfig:
        cfg = json.loads(path.read_text())
        inference = cfg.get("inference", {})
        if cfg.get("phoneme_type", "espeak") != "espeak":
            raise SpeechUnavailable(f"{path.name}: only espeak-phoneme voices are supported")
        return cls(
            sample_rate=int(cfg["audio"]["sample_rate"]),
            espeak_voice=str(cfg.get("espeak", {}).get("voice", "en-us")),
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
            noise_w=float(inference.get("noise_w", 0.8)),
            id_map={k: list(v) for k, v in cfg["phoneme_id_map"].items()},
        )


def phoneme_sentences(espeak_lines: list[str], text: str) -> list[str]:
    """espeak-ng's ``--ipa`` output (a line per clause, punctuation gone) joined with the
    punctuation that ended each clause in ``text``, as piper joins them, and grouped into
    sentences (each ends at ``.`` ``!`` ``?``). Clauses espeak-ng ended where the text has
    no punctuation (a long run of words) join the next with a space."""
    terminators = _TERMINATOR.findall(text)
    sentences: list[str] = []
    current = ""
    for i, line in enumerate(espeak_lines):
        phonemes = _LANG_SWITCH.sub("", line).strip()
        if not phonemes:
            continue
        mark = terminators[i][-1] if i < len(terminators) else ""
        current += phonemes + mark
        if mark in _SENTENCE_END and mark:
            sentences.append(current)
            current = ""
        else:
            current += " "
    if current.strip():
        sentences.append(current.strip())
    return sentences


class PiperVoice:
    """One voice: its model loaded once (lazily, or by :meth:`load`) and shared by every
    rendering of the process; :meth:`render` may run in several threads at once."""

    def __init__(self, model: Path, *, threads: int = 1) -> None:
        self.model = model
        self.config = VoiceConfig.load(model.with_name(model.name + ".json"))
        espeak = shutil.which("espeak-ng")
        if espeak is None:
            raise SpeechUnavailable("the piper TTS engine needs the espeak-ng program for its "
                                    "phonemes (apt-get install espeak-ng)")
        self._espeak = espeak
        self.threads = threads
        self._session: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the model and run it once (a fresh session's first run is 3-5x slower)."""
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort  # noqa: PLC0415 (the speech extra's)
            except ImportError as exc:
                raise SpeechUnavailable("the piper TTS engine needs onnxruntime (the speech "
                                        "extra)") from exc
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            try:
                self._session = ort.InferenceSession(str(self.model), sess_options=options,
                                                     providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own, unexported, types
                raise SpeechUnavailable(f"{self.model.name}: {exc}") from exc
        self.render("Hello.")

    def phonemes(self, text: str) -> list[str]:
        """``text``'s sentences as IPA phoneme strings (the espeak-ng program)."""
        try:
            done = subprocess.run(
                [self._espeak, "-q", "--ipa", "-v", self.config.espeak_voice],
                input=text.encode(), capture_output=True, timeout=PHONEMIZE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PiperError(f"espeak-ng (phonemes): {exc}") from exc
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[-200:]
            raise PiperError(f"espeak-ng (phonemes) exited {done.returncode}: {said}")
        lines = done.stdout.decode(errors="replace").splitlines()
        return phoneme_sentences(lines, text)

    def ids(self, phonemes: str) -> list[int]:
        table = self.config.id_map
        out = [*table["^"], *table["_"]]
        for ch in unicodedata.normalize("NFD", phonemes):
            found = table.get(ch)
            if found is not None:
                out += found
                out += table["_"]
        out += table["$"]
        return out

    def render(self, text: str) -> bytes:
        """``text`` spoken: PCM16 mono at ``config.sample_rate`` (blocking: call it from a
        worker thread). Raises :class:`PiperError`."""
        import numpy as np  # noqa: PLC0415 (onnxruntime's dependency)

        if self._session is None:
            self.load()
        c = self.config
        scales = np.array([c.noise_scale, c.length_scale, c.noise_w], dtype=np.float32)
        parts: list[bytes] = []
        for sentence in self.phonemes(text):
            ids = np.array([self.ids(sentence)], dtype=np.int64)
            try:
                audio = self._session.run(None, {
                    "input": ids, "input_lengths": np.array([ids.shape[1]], dtype=np.int64),
                    "scales": scales})[0].squeeze()
            except Exception as exc:  # onnxruntime's own error types
                raise PiperError(f"{self.model.name}: {exc}") from exc
            peak = float(np.max(np.abs(audio))) if audio.size else 0.0
            if peak > 1e-8:
                audio = audio / peak
            parts.append((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())
        return b"".join(parts)
