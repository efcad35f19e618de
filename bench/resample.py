"""The 8 <-> 48 kHz resampling of the G.711 legs (appliance/audio/resample.py, both of its
designs: ``TELEPHONE``, which the legs run, and ``DEFAULT``) against the conversion the
G.711 codec first had (linear interpolation up, 6-sample mean down), in one run: quality
figures (passband ripple to 3.4 kHz, worst alias/image above 4 kHz) and time per 20 ms
frame, printed with the ratio to the baseline.

    .venv/bin/python bench/resample.py [--frames 2000]

Timing is wall time on a shared box: read the ratio, not the absolute figure.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from appliance.audio import g711
from appliance.audio.resample import DEFAULT, TELEPHONE, Design, Resampler

A = 16000.0


def _tone(f: float, rate: int, n: int) -> np.ndarray:
    return np.rint(A * np.sin(2 * np.pi * f * np.arange(n) / rate + 0.3)).astype(np.int16)


def _amp(y: np.ndarray, f: float, rate: int, start: int) -> float:
    seg = y[start:].astype(np.float64)
    t = (np.arange(len(seg)) + start) / rate
    b = np.stack([np.sin(2 * np.pi * f * t), np.cos(2 * np.pi * f * t)], axis=1)
    c, *_ = np.linalg.lstsq(b, seg, rcond=None)
    return float(np.hypot(*c))


def _db(r: float) -> float:
    return 20 * np.log10(max(r, 1e-12))


def _naive_up(x: np.ndarray) -> np.ndarray:
    last, steps = 0.0, np.arange(1, 7) / 6
    out = []
    for i in range(0, len(x), 160):
        f = x[i:i + 160].astype(np.float64)
        prev = np.concatenate(([last], f[:-1]))
        out.append(np.rint((prev[:, None] + (f - prev)[:, None] * steps).reshape(-1)))
        last = float(f[-1])
    return np.concatenate(out).astype(np.int16)


def _naive_down(x: np.ndarray) -> np.ndarray:
    return np.rint(x.astype(np.float64).reshape(-1, 6).mean(axis=1)).astype(np.int16)


def quality(up, down) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    pb = [100, 300, 1000, 2000, 3000, 3400]
    g_down = [_db(_amp(down(_tone(f, 48000, 24000)), f, 8000, 400) / A) for f in pb]
    alias = max(_db(_amp(down(_tone(f, 48000, 24000)), abs(f - 8000 * round(f / 8000)), 8000,
                         400) / A) for f in (4300, 5000, 6100, 9100, 12345, 19700))
    image = max(_db(_amp(up(_tone(f, 8000, 4000)), k * 8000 + s * f, 48000, 2400) / A)
                for f in (300, 1000, 3400) for k in (1, 2) for s in (-1, 1))
    return max(g_down) - min(g_down), alias, image


def per_frame(fn, frame: np.ndarray, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for _ in range(n):
        fn(frame)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=2000)
    n = ap.parse_args().frames

    def fir(design: Design) -> tuple[object, object]:
        def down(x: np.ndarray) -> np.ndarray:
            d = Resampler(48000, 8000, design)
            return np.concatenate([d.process_int16(x[i:i + 960]) for i in range(0, len(x), 960)])

        def up(x: np.ndarray) -> np.ndarray:
            u = Resampler(8000, 48000, design)
            return np.concatenate([u.process_int16(x[i:i + 160]) for i in range(0, len(x), 160)])

        return up, down

    rows = [("g711 naive", _naive_up, _naive_down), ("FIR telephone", *fir(TELEPHONE)),
            ("FIR default", *fir(DEFAULT))]
    for name, up, down in rows:
        ripple, alias, image = quality(up, down)
        print(f"{name:14s} down ripple 0-3.4k {ripple:6.3f} dB   worst alias {alias:7.1f} dB"
              f"   worst up image {image:7.1f} dB")
    f8, f48 = _tone(1000, 8000, 160), _tone(1000, 48000, 960)
    payload = g711.encode("pcmu", f8)
    naive_up = per_frame(_naive_up, f8, n)
    naive_dn = per_frame(_naive_down, f48, n)
    law_only_up = per_frame(lambda p: g711.decode("pcmu", p), payload, n)
    law_only_dn = per_frame(lambda s: g711.encode("pcmu", s), f8, n)
    for name, design in (("telephone", TELEPHONE), ("default", DEFAULT)):
        u, d = Resampler(8000, 48000, design), Resampler(48000, 8000, design)
        fir_u = per_frame(u.process_int16, f8, n)
        fir_d = per_frame(d.process_int16, f48, n)
        print(f"per 20 ms frame, {name:9s}: up   naive {naive_up:6.1f} µs, table only "
              f"{law_only_up:5.1f} µs, FIR {fir_u:6.1f} µs (FIR / naive = {fir_u / naive_up:4.2f})")
        print(f"per 20 ms frame, {name:9s}: down naive {naive_dn:6.1f} µs, table only "
              f"{law_only_dn:5.1f} µs, FIR {fir_d:6.1f} µs (FIR / naive = {fir_d / naive_dn:4.2f})")
    dec, enc = g711.G711Decoder("pcmu"), g711.G711Encoder("pcmu")
    print(f"the legs' codec per 20 ms frame: decode {per_frame(dec.decode, payload, n):6.1f} µs,"
          f" encode {per_frame(enc.encode, f48.tobytes(), n):6.1f} µs")


if __name__ == "__main__":
    main()
