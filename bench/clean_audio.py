"""Clean audio (issue 31): what the noise suppressor and the echo canceller buy, and cost.

Noise: espeak-ng speech (made here, tests/transceiver/speech_audio.py) mixed with white
noise and with a babble of other espeak-ng sentences at 0, 5 and 10 dB SNR, through the
``denoise`` stage in both modes. Printed: SNR before/after (lag- and gain-aligned against
the clean speech), and STOI / wideband PESQ of cleaned against clean: ``pystoi`` is in the
speech extra; ``pesq`` is not (no wheel on PyPI, only an sdist compiling the ITU-T P.862 C
code: ``pip install pesq`` where a compiler is present), ``PESQ n/a`` without it.

Echo: a synthetic echo path (40 / 120 / 200 ms, -8 dB direct + a reflection, -60 dBFS noise)
through the ``aec`` stage pair. Printed: the delay it estimated and the ERLE once converged.

CPU: µs of process time per 20 ms frame for each stage, as a ratio to one Opus encode +
decode of the same frame (complexity 5) measured in the same run.

    .venv/bin/python bench/clean_audio.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from transceiver.speech_audio import SR, aligned_snr, espeak, white_noise_like  # noqa: E402

from appliance.transceiver.opus import OpusDecoder, OpusEncoder  # noqa: E402
from appliance.transceiver.stages.aec import make_echo_canceller  # noqa: E402
from appliance.transceiver.stages.denoise import Denoiser  # noqa: E402

FRAME = 960


def through(process: Callable[[bytes, float], bytes], x: np.ndarray) -> tuple[np.ndarray, float]:
    """The frames through ``process``; (output, CPU µs per frame)."""
    pcm = np.clip(x, -32768, 32767).astype("<i2")
    chunks = [pcm[i : i + FRAME].tobytes() for i in range(0, len(pcm) - FRAME + 1, FRAME)]
    t = time.process_time()
    out = [process(c, i * 0.02) for i, c in enumerate(chunks)]
    cpu = (time.process_time() - t) / len(chunks) * 1e6
    return np.frombuffer(b"".join(out), "<i2").astype(np.float64), cpu


def opus_cost(x: np.ndarray) -> float:
    enc, dec = OpusEncoder(complexity=5), OpusDecoder()
    pcm = np.clip(x, -32768, 32767).astype("<i2")
    chunks = [pcm[i : i + FRAME].tobytes() for i in range(0, len(pcm) - FRAME + 1, FRAME)]
    t = time.process_time()
    for c in chunks:
        dec.decode(enc.encode(c))
    return (time.process_time() - t) / len(chunks) * 1e6


def quality(clean: np.ndarray, y: np.ndarray, lag: int) -> str:
    parts = []
    c, o = clean[: len(clean) - lag], y[lag:]
    n = min(len(c), len(o))
    try:
        from pystoi import stoi  # type: ignore[import-not-found]
        parts.append(f"STOI {stoi(c[:n], o[:n], SR):.3f}")
    except ImportError:
        parts.append("STOI n/a")
    try:
        from pesq import pesq  # type: ignore[import-not-found]
        d = 3  # PESQ is defined at 16 kHz: decimate (both alike, after a crude low-pass)
        k = np.ones(d) / d
        c16 = np.convolve(c[:n], k, "same")[::d]
        o16 = np.convolve(o[:n], k, "same")[::d]
        parts.append(f"PESQ-wb {pesq(16000, c16, o16, 'wb'):.2f}")
    except ImportError:
        parts.append("PESQ n/a")
    except Exception as exc:  # pesq refuses some signals (no utterance found)
        parts.append(f"PESQ ({type(exc).__name__})")
    return ", ".join(parts)


def main() -> int:
    clean = espeak(0)
    # Two other talkers at once (another sentence, other voices and speeds), looped.
    babble = (np.resize(espeak(1, voice="en-gb", speed=170), len(clean))
              + np.roll(np.resize(espeak(1, voice="en-us+f3", speed=200), len(clean)), 9000))
    opus_us = opus_cost(clean)
    print(f"Opus encode+decode (complexity 5): {opus_us:.0f} µs per 20 ms frame (the unit below)")
    print("\nnoise suppression (RNNoise, 'denoise' stage)")
    print(f"{'noise':<7}{'SNR in':>8}  {'mode':<11}{'SNR out':>8}{'gain':>7}   quality (against clean)")
    cpu_nr: list[float] = []
    for kind in ("white", "babble"):
        for snr in (0.0, 5.0, 10.0):
            if kind == "white":
                noise = white_noise_like(clean, snr)
            else:
                noise = babble * np.sqrt((clean ** 2).mean() / (babble ** 2).mean()) / 10 ** (snr / 20)
            noisy = clean + noise
            part = slice(SR // 2, len(clean))
            _, snr_in = aligned_snr(clean[part], noisy[part])
            print(f"{kind:<7}{snr_in:8.1f}  {'(none)':<11}{'':>8}{'':>7}   "
                  f"{quality(clean[part], noisy[part], 0)}")
            for mode in ("near_field", "far_field"):
                y, cpu = through(Denoiser(mode).process, noisy)
                cpu_nr.append(cpu)
                lag, snr_out = aligned_snr(clean[part], y[part])
                print(f"{'':<7}{'':>8}  {mode:<11}{snr_out:8.1f}{snr_out - snr_in:7.1f}   "
                      f"{quality(clean[part], y[part], lag)}")
    print("\necho cancellation (speexdsp MDF + residual suppression, 'aec' stages)")
    far = np.concatenate([espeak(0), espeak(1)])
    rng = np.random.default_rng(3)
    cpu_aec: list[float] = []
    for delay_ms in (40.0, 120.0, 200.0):
        d = int(delay_ms * SR / 1000)
        r = int(0.006 * SR)
        mic = rng.normal(0, 30, len(far))
        mic[d:] += 0.4 * far[:-d]
        mic[d + r :] += 0.13 * far[: -d - r]
        near, ref = make_echo_canceller()
        farpcm = np.clip(far, -32768, 32767).astype("<i2")

        def process(pcm: bytes, now: float, farpcm: np.ndarray = farpcm, near: Any = near,
                    ref: Any = ref) -> bytes:
            i = round(now * SR)
            ref.process(farpcm[i : i + FRAME].tobytes(), now)
            return near.process(pcm, now + 0.004)  # type: ignore[no-any-return]

        y, cpu = through(process, mic)
        cpu_aec.append(cpu)
        tail = slice(len(y) // 2, len(y))
        erle = 10 * np.log10((mic[: len(y)][tail] ** 2).sum() / (y[tail] ** 2).sum())
        st = near.stats()
        print(f"echo delay {delay_ms:5.0f} ms: estimated {st['delay_ms']} ms (includes 4 ms "
              f"between the stamps), ERLE {erle:.1f} dB (stage's own {st['erle_db']} dB), "
              f"{st['changes']} re-estimates")
        near.close()
    nr, aec = float(np.median(cpu_nr)), float(np.median(cpu_aec))
    print(f"\nCPU per call per 20 ms frame: denoise {nr:.0f} µs = {nr / opus_us:.1f}x Opus, "
          f"aec {aec:.0f} µs = {aec / opus_us:.1f}x Opus "
          f"(a 20 ms frame is 20 000 µs: denoise {100 * nr / 20000:.1f} %, aec "
          f"{100 * aec / 20000:.1f} % of a core)")
    print(f"load average {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
