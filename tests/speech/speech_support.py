"""Test audio for tests/speech and bench/speech_bench.py: speech made with espeak-ng at a voice
and rate unlike the TTS default (en-us, 165 wpm, pitch 50), so the recogniser is not
tested on exactly the voice the assistant speaks with."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np

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
