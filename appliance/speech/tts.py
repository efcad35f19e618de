"""Text-to-speech engines behind one streaming interface.

``async for frame in engine.synthesize(text)`` yields 48 kHz mono PCM16 in 20 ms frames
(1920 bytes; the last one zero-padded) as the engine produces them, so playback can start
before the sentence is synthesised. Closing the iterator early (barge-in) stops the engine.

* :class:`EspeakTts` (``"espeak"``, the offline default): the ``espeak-ng`` program (Debian
  package ``espeak-ng``), run per utterance with ``--stdout`` (a 22.05 kHz WAV stream read
  as it is written) and resampled to 48 kHz. The program loads its voice data in a few
  milliseconds, so there is nothing to keep loaded between calls.
* :class:`HttpTts` (``"http"``): any OpenAI-compatible ``POST /v1/audio/speech`` with
  ``response_format: "pcm"`` (raw 24 kHz PCM16), resampled to 48 kHz. The assistant asks
  for one sentence at a time, and each answer is read whole before it plays.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import trio

from .audio import Resampler, WavError, parse_wav_header
from .stt import _httpx
from .vad import FRAME_BYTES, SpeechUnavailable

OUT_RATE = 48_000


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
    """``"espeak"`` or ``"http"`` (with ``base_url``, ``api_key``, ``model``, ``voice``)."""
    if kind == "espeak":
        return EspeakTts(**kw)
    if kind == "http":
        return HttpTts(**kw)
    raise ValueError(f"unknown TTS engine {kind!r} (espeak, http)")
