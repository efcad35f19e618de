"""The clean-audio stages (issue 31) on synthetic signals, with numbers: RNNoise's noise
attenuation per band and its SNR gain on speech-like audio, far_field against near_field (speech from espeak-ng, tests/transceiver/speech_audio.py);
the echo canceller's delay estimate and ERLE on an echo path of 40-200 ms with attenuation,
a reflection and noise, its tracking of a delay change, and the VAD no longer hearing the
agent's own echo as speech. Needs the ``speech`` extra (pyrnnoise, in ``test``) and
libspeexdsp1 (``make sysdeps``)."""

from __future__ import annotations

import numpy as np
import pytest
from transceiver.speech_audio import aligned_snr, espeak, white_noise_like

from appliance.agents import EnergyVad
from appliance.transceiver.stages import CallStages, MediaConfig
from appliance.transceiver.stages.aec import DelayEstimator, EchoCanceller, make_echo_canceller
from appliance.transceiver.stages.denoise import Denoiser

SR = 48_000
FRAME = 960


def speech_like(seconds: float, seed: int = 0) -> np.ndarray:
    """Voiced 'syllables' for the echo tests (the canceller needs no real speech): a
    gliding 110-170 Hz harmonic series under a 3-5 Hz on/off envelope, int16 scale."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    t = np.arange(n) / SR
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = sum(np.sin(k * phase) / k ** 0.8 for k in range(1, 40))
    rate = rng.uniform(3, 5)
    env = np.clip(np.sin(2 * np.pi * rate * t), 0, None) ** 1.5
    return np.asarray(x * env * 2500, np.float64)


def frames_through(stage_process, x: np.ndarray, t0: float = 0.0) -> np.ndarray:  # type: ignore[no-untyped-def]
    pcm = np.clip(x, -32768, 32767).astype("<i2")
    out = [np.frombuffer(stage_process(pcm[i : i + FRAME].tobytes(), t0 + i / SR), "<i2")
           for i in range(0, len(pcm) - FRAME + 1, FRAME)]
    return np.concatenate(out).astype(np.float64)


def band_power(x: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
    f = np.fft.rfftfreq(len(x), 1 / SR)
    return float(spec[(f >= lo) & (f < hi)].sum())


def db(a: float, b: float) -> float:
    return float(10 * np.log10(a / b))


# -- noise reduction ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["near_field", "far_field"])
def test_rnnoise_attenuates_noise_in_every_band(mode: str) -> None:
    rng = np.random.default_rng(7)
    noise = rng.normal(0, 1000, 3 * SR)  # white, about -30 dBFS
    d = Denoiser(mode)
    y = frames_through(d.process, noise)
    tail = slice(SR, 3 * SR)  # after a second of adaptation
    for lo, hi in ((200, 1000), (1000, 4000), (4000, 8000), (8000, 16000)):
        att = db(band_power(noise[tail], lo, hi), band_power(y[tail], lo, hi))
        assert att > 15, (lo, hi, att)
    d.close()


def test_rnnoise_raises_the_snr_of_speech_in_noise() -> None:
    clean = espeak(0)
    noisy = clean + white_noise_like(clean, 5.0)
    part = slice(SR, len(clean))
    _, snr_in = aligned_snr(clean[part], noisy[part])
    got = {}
    for mode in ("near_field", "far_field"):
        d = Denoiser(mode)
        lag, snr = aligned_snr(clean[part], frames_through(d.process, noisy)[part])
        got[mode] = snr - snr_in
        assert lag == 960, lag  # RNNoise's own delay in our two-call framing: 20 ms
        assert got[mode] > 6, (mode, snr_in, got)
        if mode == "far_field":
            assert d.stats()["gated"] > 0  # the gate closed in the pauses...
    assert got["far_field"] > got["near_field"] - 0.5  # ...without costing speech


def test_the_pipeline_takes_noise_reduction_mid_call() -> None:
    stages = CallStages(MediaConfig(recorder_seconds=1.0))
    assert "denoise" not in stages.inbound.names()
    stages.set_noise_reduction("far_field")
    assert stages.inbound.names() == ["recorder-in", "denoise", "level-in"]
    stages.set_noise_reduction("near_field")
    assert stages.describe()["stages"]["denoise"]["mode"] == "near_field"
    stages.set_noise_reduction(None)
    assert stages.inbound.names() == ["recorder-in", "level-in"]
    assert stages.unavailable == {}


# -- echo cancellation ----------------------------------------------------------------------


def echo_call(far: np.ndarray, delays_ms: list[tuple[float, float]], *, gain: float = 0.4,
              noise_rms: float = 20.0, near_talk: np.ndarray | None = None,
              aec: bool = True) -> tuple[np.ndarray, np.ndarray, EchoCanceller | None]:
    """The agent says ``far``; the phone sends back its echo (``delays_ms``: [(from second,
    delay ms)], a direct path at ``gain`` and a reflection 6 ms later at gain/3) plus noise
    and optional near-end speech. Returns (microphone, what the in chain made of it)."""
    n = len(far)
    rng = np.random.default_rng(3)
    mic = rng.normal(0, noise_rms, n)
    t = np.arange(n) / SR
    for i, (start, dms) in enumerate(delays_ms):
        end = delays_ms[i + 1][0] if i + 1 < len(delays_ms) else t[-1] + 1
        d = int(dms * SR / 1000)
        sel = (t >= start) & (t < end)
        idx = np.nonzero(sel)[0]
        src = idx - d
        ok = src >= 0
        mic[idx[ok]] += gain * far[src[ok]]
        src2 = src - int(0.006 * SR)
        ok2 = src2 >= 0
        mic[idx[ok2]] += gain / 3 * far[src2[ok2]]
    if near_talk is not None:
        mic += near_talk
    if not aec:
        return mic, mic.copy(), None
    near_stage, ref_stage = make_echo_canceller()
    farpcm = np.clip(far, -32768, 32767).astype("<i2")
    micpcm = np.clip(mic, -32768, 32767).astype("<i2")
    out = []
    for i in range(0, n - FRAME + 1, FRAME):
        now = i / SR
        ref_stage.process(farpcm[i : i + FRAME].tobytes(), now)  # sent
        out.append(np.frombuffer(near_stage.process(micpcm[i : i + FRAME].tobytes(),
                                                    now + 0.004), "<i2"))
    return micpcm[: len(out) * FRAME].astype(np.float64), np.concatenate(out).astype(
        np.float64), near_stage.aec


@pytest.mark.parametrize("delay_ms", [40, 120, 200])
def test_aec_estimates_the_delay_and_cancels_the_echo(delay_ms: float) -> None:
    far = speech_like(8.0, seed=2)
    mic, out, aec = echo_call(far, [(0.0, delay_ms)])
    assert aec is not None and aec.delay is not None
    # The estimate includes the 4 ms between our stamps of sent and received frames.
    assert aec.delay * 1000 / SR == pytest.approx(delay_ms + 4, abs=1.0)
    tail = slice(4 * SR, 8 * SR)  # converged
    erle = db(float((mic[tail] ** 2).sum()), float((out[tail] ** 2).sum()))
    assert erle > 20, erle
    stats = aec.stats()
    assert stats["erle_db"] is not None and stats["erle_db"] > 15
    assert stats["changes"] == 0


def test_aec_tracks_a_delay_change() -> None:
    far = speech_like(14.0, seed=4)
    mic, out, aec = echo_call(far, [(0.0, 80.0), (6.0, 150.0)])
    assert aec is not None and aec.delay is not None
    assert aec.changes >= 1
    assert aec.delay * 1000 / SR == pytest.approx(154, abs=1.0)
    tail = slice(11 * SR, 14 * SR)
    assert db(float((mic[tail] ** 2).sum()), float((out[tail] ** 2).sum())) > 20


def test_aec_keeps_the_callers_own_speech() -> None:
    far = speech_like(9.0, seed=5)
    near = np.zeros_like(far)
    talk = espeak(1)[: 3 * SR]
    near[6 * SR : 9 * SR] = talk  # the caller talks over the agent
    mic, out, _ = echo_call(far, [(0.0, 100.0)], near_talk=near)
    echo_only = slice(4 * SR, 6 * SR)
    double = slice(6 * SR, 9 * SR)
    # Double talk: the caller's voice comes through (within a few dB of what they said),
    # far above the residual echo of the echo-only stretch before it.
    kept = db(float((out[double] ** 2).sum()), float((near[double] ** 2).sum()))
    assert kept > -8, kept
    residual = db(float((out[double] ** 2).mean()), float((out[echo_only] ** 2).mean()))
    assert residual > 15, residual


def test_aec_keeps_the_vad_from_hearing_the_agents_echo() -> None:
    """The barge-in that echo causes: without AEC the energy VAD calls the agent's own
    returning voice speech (an agent with barge-in would interrupt itself); with it, not."""
    far = speech_like(8.0, seed=7)
    speech = {}
    for aec in (False, True):
        _, out, _ = echo_call(far, [(0.0, 120.0)], aec=aec)
        vad = EnergyVad()
        flags = [vad.update(out[i : i + FRAME].astype("<i2").tobytes())
                 for i in range(0, len(out) - FRAME + 1, FRAME)]
        speech[aec] = sum(flags[4 * 50 :])  # the last 4 s (converged)
    assert speech[False] > 100, speech
    assert speech[True] <= 10, speech


def test_delay_estimator_refuses_unrelated_audio() -> None:
    rng = np.random.default_rng(1)
    est = DelayEstimator(max_delay=24_000, window=48_000)
    mic = rng.normal(0, 1000, 48_000).astype(np.int16)
    ref = rng.normal(0, 1000, 72_000).astype(np.int16)
    assert est.estimate(mic, ref) is None
    assert est.last_confidence < est.min_confidence


def test_aec_passes_audio_through_until_it_knows_the_delay() -> None:
    near, ref = make_echo_canceller()
    pcm = np.full(FRAME, 1234, "<i2").tobytes()
    assert near.process(pcm, 0.0) == pcm  # no reference ever: nothing to cancel
    assert near.stats()["delay_ms"] is None
    near.close()


def test_call_stages_put_the_echo_canceller_first_and_its_reference_last() -> None:
    stages = CallStages(MediaConfig(echo_cancellation=True, noise_reduction="near_field",
                                    recorder_seconds=1.0))
    assert stages.inbound.names() == ["recorder-in", "aec", "denoise", "level-in"]
    assert stages.outbound.names() == ["level-out", "aec-ref", "recorder-out"]
    d = stages.describe()
    assert d["stages"]["aec"]["delay_ms"] is None and d["unavailable"] == {}
    stages.close()
