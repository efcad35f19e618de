"""Turn detection on speech in noise (issue 30 item 1, issue 31 item 3): Silero against the
energy VAD, with and without the noise suppressor in front, in the same run.

The signal: 12 phrases spoken by espeak-ng (en-gb, 140 wpm: not the assistant's voice), each
followed by 1.2-2.8 s of pause, mixed with one noise at a time:

* ``quiet``  — a -70 dBFS hiss (a good headset);
* ``white``  — white noise at 10 dB SNR (against the speech's active level);
* ``white0`` — the same at 0 dB SNR;
* ``fan``    — low-passed noise with a 100 Hz hum, 10 dB SNR (a laptop fan, a car);
* ``babble`` — other espeak-ng sentences, reversed (speech-like, no words), 10 dB SNR;
* ``knocks`` — the quiet hiss plus a 15 ms click burst every 0.7 s in the pauses (typing,
  a door): the classic energy-VAD false start.

Ground truth is known by construction (each phrase's first and last loud sample). Each
detector runs as the Realtime ``server_vad`` (:class:`~appliance.speech.vad.TurnDetector`,
defaults: 300 ms prefix, 500 ms silence) frame by frame. Counted per noise × detector:

* ``false`` — turns that overlap no phrase (a false start: the agent would stop talking);
* ``missed`` — phrases no turn overlaps;
* ``split`` — extra turns inside one phrase (a clipped end: the turn closed mid-phrase);
* ``merged`` — phrases that share a turn with the next or previous one (the end of the
  phrase was not heard: the agent would not answer until the noise stops);
* ``late`` — turns whose audio starts after the phrase's first loud sample + 40 ms (the
  prefix padding did not cover the onset: the first syllable is lost);
* ``cpu`` — µs of process time per 20 ms frame (the suppressor's cost included when on).

    .venv/bin/python bench/turn_bench.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parent.parent / "tests")

from speech.speech_support import PHRASES, espeak_pcm48, speech_bounds_ms  # noqa: E402

from appliance.speech.vad import (  # noqa: E402
    FRAME_BYTES,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    make_vad,
)
from appliance.transceiver.stages.denoise import Denoiser  # noqa: E402

SR = 48_000
PHRASE_COUNT = 12


def build_speech() -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The phrases with pauses between them, and each phrase's loud span in ms."""
    rng = np.random.default_rng(7)
    parts: list[np.ndarray] = [np.zeros(SR)]
    truth: list[tuple[int, int]] = []
    at = SR
    for text in PHRASES[:PHRASE_COUNT]:
        pcm = espeak_pcm48(text)
        lo, hi = speech_bounds_ms(pcm)
        x = np.frombuffer(pcm, "<i2").astype(np.float64)
        truth.append((at * 1000 // SR + lo, at * 1000 // SR + hi))
        pause = np.zeros(int(SR * rng.uniform(1.2, 2.8)))
        parts += [x, pause]
        at += len(x) + len(pause)
    return np.concatenate(parts), truth


def active_rms(x: np.ndarray) -> float:
    f = x[: len(x) // 960 * 960].reshape(-1, 960)
    rms = np.sqrt((f**2).mean(axis=1))
    loud = rms[rms > rms.max() * 0.05]
    return float(np.sqrt((loud**2).mean()))


def at_snr(noise: np.ndarray, speech: np.ndarray, snr_db: float) -> np.ndarray:
    n_rms = float(np.sqrt((noise**2).mean())) or 1.0
    return noise * (active_rms(speech) / n_rms) / 10 ** (snr_db / 20)


def noises(speech: np.ndarray, truth: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    n = len(speech)
    rng = np.random.default_rng(11)
    hiss = rng.standard_normal(n) * 32768 * 10 ** (-70 / 20)
    white = at_snr(rng.standard_normal(n), speech, 10)
    white0 = at_snr(rng.standard_normal(n), speech, 0)
    # A fan: white noise low-passed (a 1/(1+(f/300 Hz)^2) response, in the frequency
    # domain) plus a 100 Hz hum.
    spec = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SR)
    lp = np.fft.irfft(spec / (1 + (freqs / 300) ** 2), n)
    fan = at_snr(lp + 0.5 * lp.std() * np.sin(2 * np.pi * 100 * np.arange(n) / SR), speech, 10)
    others = np.concatenate([np.frombuffer(espeak_pcm48(t), "<i2").astype(np.float64)[::-1]
                             for t in PHRASES[PHRASE_COUNT:]])
    babble = np.resize(others, n) + np.resize(np.roll(others, len(others) // 3), n)
    babble = at_snr(babble, speech, 10)
    knocks = hiss.copy()
    step = int(0.7 * SR)
    burst = int(0.015 * SR)
    spans = [(lo * SR // 1000, hi * SR // 1000) for lo, hi in truth]
    for start in range(SR // 2, n - burst, step):
        if any(lo - SR // 4 < start < hi + SR // 4 for lo, hi in spans):
            continue
        knocks[start : start + burst] += rng.standard_normal(burst) * 32768 * 10 ** (-12 / 20)
    return {"quiet": hiss, "white": white, "white0": white0, "fan": fan, "babble": babble, "knocks": knocks}


def turns_of(x: np.ndarray, vad: str, denoise: bool) -> tuple[list[tuple[int, int]], float]:
    pcm = np.clip(x, -32768, 32767).astype("<i2").tobytes()
    pcm += bytes(-len(pcm) % FRAME_BYTES)
    det = TurnDetector(vad=make_vad(vad))
    nr = Denoiser("near_field") if denoise else None
    turns: list[tuple[int, int]] = []
    start: int | None = None
    frames = len(pcm) // FRAME_BYTES
    cpu0 = time.process_time()
    for i in range(frames):
        f = pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES]
        if nr is not None:
            f = nr.process(f, i * 0.02)
        det.handle_input(i * 0.02, f)
        while (ev := det.poll_output()) is not None:
            if isinstance(ev, SpeechStarted):
                start = ev.audio_start_ms
            elif isinstance(ev, SpeechStopped) and start is not None:
                turns.append((start, ev.audio_end_ms))
                start = None
    cpu = (time.process_time() - cpu0) / frames * 1e6
    if start is not None:
        turns.append((start, frames * 20))
    return turns, cpu


def score(turns: list[tuple[int, int]], truth: list[tuple[int, int]]) -> dict[str, int]:
    def overlaps(t: tuple[int, int], p: tuple[int, int]) -> bool:
        return t[0] < p[1] and p[0] < t[1]

    false = sum(1 for t in turns if not any(overlaps(t, p) for p in truth))
    missed = sum(1 for p in truth if not any(overlaps(t, p) for t in turns))
    split = sum(max(0, sum(1 for t in turns if overlaps(t, p)) - 1) for p in truth)
    merged = sum(1 for p in truth
                 if any(overlaps(t, p) and any(overlaps(t, q) for q in truth if q != p)
                        for t in turns))
    late = 0
    for p in truth:
        first = next((t for t in turns if overlaps(t, p)), None)
        if first is not None and first[0] > p[0] + 40:
            late += 1
    return {"turns": len(turns), "false": false, "missed": missed, "split": split,
            "merged": merged, "late": late}


def main() -> int:
    speech, truth = build_speech()
    print(f"{len(truth)} phrases, {len(speech) / SR:.0f} s of audio per noise\n")
    print(f"{'noise':<8}{'detector':<18}{'turns':>6}{'false':>6}{'missed':>7}{'split':>6}"
          f"{'merged':>7}{'late':>5}{'cpu µs/frame':>14}")
    totals: dict[str, dict[str, int]] = {}
    noises_seen = noises(speech, truth)
    for name, noise in noises_seen.items():
        x = speech + noise
        for vad, dn in (("energy", False), ("silero", False), ("energy", True), ("silero", True)):
            label = vad + (" + denoise" if dn else "")
            turns, cpu = turns_of(x, vad, dn)
            s = score(turns, truth)
            tot = totals.setdefault(label, dict.fromkeys(s, 0))
            for k, v in s.items():
                tot[k] += v
            print(f"{name:<8}{label:<18}{s['turns']:>6}{s['false']:>6}{s['missed']:>7}"
                  f"{s['split']:>6}{s['merged']:>7}{s['late']:>5}{cpu:>14.0f}")
    print(f"\ntotals over {len(noises_seen)} noises × {len(truth)} phrases")
    for label, s in totals.items():
        print(f"  {label:<18} false {s['false']:>3}  missed {s['missed']:>3}  "
              f"split {s['split']:>3}  merged {s['merged']:>3}  late {s['late']:>3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
