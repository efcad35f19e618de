"""Opus encoder complexity 0..10: quality beside cost, to choose ``--opus-complexity``
(docs/performance-history.md, "Opus complexity").

Our encoder settings (32 kb/s, VoIP, in-band FEC, ``_LibOpusEncoder``) and decoder, for every
complexity 0..10, on voice-like signals — there is no recorded speech on this machine and no
TTS engine installed, so the signals are synthetic: glottal pulse trains with gliding pitch
through three moving formants, fricative noise bursts and pauses, in a low (male-like) and a
high (female-like) pitch range, three seeds each — and on three steady tones. Reported per
complexity (mean over the voice signals):

* **PESQ-WB** (ITU-T P.862.2, MOS-LQO 1-4.64) of the 16 kHz downsampled decode against the
  16 kHz downsampled original, when the ``pesq`` package is installed
  (``.venv/bin/pip install pesq``): the standard objective speech-quality model;
* SNR and segmental SNR (active 20 ms frames) after aligning for the codec delay, and the
  log-spectral distance (100 Hz-16 kHz, dB) — waveform and spectral proxies;
* encode CPU µs per 20 ms frame (the minimum of ``--passes`` passes over the low voice).

    .venv/bin/python bench/opus_complexity.py
    flock /tmp/bench.lock .venv/bin/python bench/opus_complexity.py --passes 5

A perceptual model on synthetic voice is an indication, not a listening test: it ranks
complexities against each other; it does not say how a real caller hears them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from appliance.transceiver.opus import (  # noqa: E402
    FRAME_BYTES,
    _LibOpusDecoder,
    _LibOpusEncoder,
)

SR = 48_000


def speech_like(seconds: float = 8.0, seed: int = 1,
                pitch: tuple[float, float] = (90.0, 220.0)) -> np.ndarray:
    """Voice-like PCM16: voiced segments (glottal pulses at a gliding pitch in ``pitch`` Hz
    through three formant resonators), fricative noise and pauses of 80-300 ms."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    out = np.zeros(n)
    t = 0
    while t < n:
        kind = rng.choice(["v", "v", "v", "f", "p"])
        dur = int(SR * rng.uniform(0.08, 0.3))
        seg = np.zeros(dur)
        if kind == "v":
            f0 = np.linspace(rng.uniform(*pitch), rng.uniform(*pitch), dur)
            pulses = (np.diff(np.floor(np.cumsum(f0 / SR)), prepend=0) > 0).astype(float)
            src = np.convolve(pulses, np.exp(-np.arange(80) / 12), mode="same")
            centres = rng.uniform([300, 900, 2200], [900, 2200, 3500])
            for fc, bw in zip(centres, (80, 120, 200), strict=True):
                r = np.exp(-np.pi * bw / SR)
                a1, a2 = -2 * r * np.cos(2 * np.pi * fc / SR), r * r
                y = np.zeros(dur)
                y1 = y2 = 0.0
                for i in range(dur):
                    y0 = src[i] - a1 * y1 - a2 * y2
                    y[i] = y0
                    y2, y1 = y1, y0
                seg += y / (np.abs(y).max() + 1e-9)
            seg *= np.hanning(dur)
        elif kind == "f":
            seg = np.diff(rng.standard_normal(dur), prepend=0) * 0.3 * np.hanning(dur)
        out[t : t + dur] = seg[: n - t]
        t += dur
    return (out / np.abs(out).max() * 0.5 * 32767).astype(np.int16)


def tones(seconds: float = 8.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    x = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.15 * np.sin(2 * np.pi * 1250 * t)
         + 0.05 * np.sin(2 * np.pi * 3100 * t))
    return (x * 32767).astype(np.int16)


def _lowpass_16k(x: np.ndarray) -> np.ndarray:
    """48 kHz → 16 kHz: windowed-sinc low-pass at 7.6 kHz (255 taps), keep every third."""
    k = np.arange(-127, 128)
    h = np.sinc(2 * 7600 / SR * k) * np.hamming(len(k))
    return np.convolve(x, h / h.sum(), mode="same")[::3]


def _pesq_wb(ref: np.ndarray, deg: np.ndarray) -> float | None:
    try:
        from pesq import pesq
    except ImportError:
        return None
    return float(pesq(16_000, _lowpass_16k(ref), _lowpass_16k(deg), "wb"))


def encode_decode(sig: np.ndarray, complexity: int) -> tuple[list[bytes], np.ndarray, float]:
    """Packets, the decoded signal and encode CPU seconds for ``sig`` at ``complexity``."""
    enc, dec = _LibOpusEncoder(complexity=complexity), _LibOpusDecoder()
    pcm = sig.tobytes()
    frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES)]
    t0 = time.process_time()
    packets = [enc.encode(f) for f in frames]
    cpu = time.process_time() - t0
    y = np.frombuffer(b"".join(dec.decode(p) for p in packets), np.int16).astype(float)
    return packets, y, cpu


def measure(sig: np.ndarray, complexity: int, *, perceptual: bool = True) -> dict[str, Any]:
    packets, y, cpu = encode_decode(sig, complexity)
    x = sig[: len(y)].astype(float)
    lag = max(range(800), key=lambda d: float(np.dot(x[: len(x) - d], y[d:])))
    xs, ys = x[: len(x) - lag], y[lag:]
    err = xs - ys
    seg = []
    for i in range(0, len(xs) - 960, 960):
        e = float(np.dot(xs[i : i + 960], xs[i : i + 960]))
        if e > 1e3 * 960:  # active frames only
            noise = float(np.dot(err[i : i + 960], err[i : i + 960]))
            seg.append(10 * np.log10(max(e, 1) / max(noise, 1)))
    window, band, lsd = np.hanning(960), slice(2, 321), []
    for i in range(0, len(xs) - 960, 480):
        fx = np.abs(np.fft.rfft(xs[i : i + 960] * window)) ** 2
        fy = np.abs(np.fft.rfft(ys[i : i + 960] * window)) ** 2
        if fx.sum() > 1e3 * 960 * 960:
            diff = 10 * np.log10((fx[band] + 1e3) / (fy[band] + 1e3))
            lsd.append(np.sqrt(np.mean(diff**2)))
    frames = len(packets)
    return {"snr": float(10 * np.log10(np.dot(xs, xs) / np.dot(err, err))),
            "segsnr": float(np.mean(np.clip(seg, -10, 35))), "lsd": float(np.mean(lsd)),
            "pesq": _pesq_wb(xs, ys) if perceptual else None,
            "us": cpu / frames * 1e6, "lag": lag,
            "kbps": sum(map(len, packets)) * 8 / (frames * 0.02) / 1000}


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r[key] is not None]
    return float(np.mean(vals)) if vals else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--complexities", default="0,1,2,3,4,5,6,7,8,9,10")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each voice signal")
    p.add_argument("--seeds", type=int, default=3, help="voice signals per pitch range")
    p.add_argument("--passes", type=int, default=5, help="encode passes for the CPU figure")
    args = p.parse_args(argv)
    levels = [int(c) for c in args.complexities.split(",")]
    voices = [speech_like(args.seconds, seed, pitch)
              for pitch in ((90.0, 220.0), (170.0, 320.0)) for seed in range(1, args.seeds + 1)]
    steady = tones(args.seconds)
    print(f"{len(voices)} voice-like signals of {args.seconds:g} s (low and high pitch), "
          f"32 kb/s, VoIP, FEC; load average {open('/proc/loadavg').read().split()[0]}")
    print("complexity  PESQ-WB  SNR dB  segSNR  LSD dB  tones SNR  tones LSD  "
          "encode µs/frame  kb/s")
    for c in levels:
        rows = [measure(v, c) for v in voices]
        b = measure(steady, c, perceptual=False)
        us = min(measure(voices[0], c, perceptual=False)["us"] for _ in range(args.passes))
        pq = _mean(rows, "pesq")
        print(f"{c:>10}  {'-' if pq is None else f'{pq:7.3f}':>7}  {_mean(rows, 'snr'):6.2f}"
              f"  {_mean(rows, 'segsnr'):6.2f}  {_mean(rows, 'lsd'):6.2f}  {b['snr']:9.2f}"
              f"  {b['lsd']:9.2f}  {us:15.1f}  {_mean(rows, 'kbps'):4.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
