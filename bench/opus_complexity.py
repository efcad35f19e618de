"""Opus complexity vs a quality proxy, and its cost (docs/performance.md, "Opus complexity").

Our encoder settings (32 kb/s, VoIP, in-band FEC) and decoder, for complexity 0..10, on 8 s
of a synthetic speech-like signal (glottal pulse trains with gliding pitch through three
moving formants, fricative noise bursts, pauses) and on three steady tones. Reported: SNR
after aligning for the codec delay, segmental SNR over active frames, log-spectral distance
(100 Hz-16 kHz) and encode CPU µs per 20 ms frame (minimum of five passes). These are proxies:
they do not replace a PESQ/POLQA-class or listening comparison.

    .venv/bin/python bench/opus_complexity.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from appliance.transceiver.opus import (  # noqa: E402
    FRAME_BYTES,
    _LibOpusDecoder,
    _LibOpusEncoder,
)

SR = 48_000


def speech_like(seconds: float = 8.0, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    out = np.zeros(n)
    t = 0
    while t < n:
        kind = rng.choice(["v", "v", "v", "f", "p"])
        dur = int(SR * rng.uniform(0.08, 0.3))
        seg = np.zeros(dur)
        if kind == "v":
            f0 = np.linspace(rng.uniform(90, 220), rng.uniform(90, 220), dur)
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


def measure(sig: np.ndarray, complexity: int) -> dict[str, float]:
    enc, dec = _LibOpusEncoder(complexity=complexity), _LibOpusDecoder()
    pcm = sig.tobytes()
    frames = [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES)]
    t0 = time.process_time()
    packets = [enc.encode(f) for f in frames]
    cpu = time.process_time() - t0
    y = np.frombuffer(b"".join(dec.decode(p) for p in packets), np.int16).astype(float)
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
    return {"snr": float(10 * np.log10(np.dot(xs, xs) / np.dot(err, err))),
            "segsnr": float(np.mean(np.clip(seg, -10, 35))), "lsd": float(np.mean(lsd)),
            "us": cpu / len(frames) * 1e6, "lag": lag,
            "kbps": sum(map(len, packets)) * 8 / (len(frames) * 0.02) / 1000}


def main() -> None:
    speech, steady = speech_like(), tones()
    print("complexity  speech SNR  segSNR  LSD dB  tones SNR  tones LSD  encode µs/frame  kb/s")
    for c in (0, 2, 3, 4, 5, 6, 7, 10):
        a, b = measure(speech, c), measure(steady, c)
        us = min(measure(speech, c)["us"] for _ in range(5))
        print(f"{c:>10}  {a['snr']:10.2f}  {a['segsnr']:6.2f}  {a['lsd']:6.2f}  {b['snr']:9.2f}"
              f"  {b['lsd']:9.2f}  {us:15.1f}  {a['kbps']:4.1f}")


if __name__ == "__main__":
    main()
