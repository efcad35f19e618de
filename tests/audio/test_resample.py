"""The one resampler (appliance/audio/resample.py), measured for each of its users.

The telephone design (8 <-> 48 kHz, the G.711 legs): passband flatness to 3.4 kHz,
rejection of everything that would alias (down) or image (up) outside 4 kHz, and frames
that join into exactly the whole stream. The default design (speech engines, WebSocket
agents, the Realtime bridge and machine): 48 -> 16 kHz anti-aliasing, streaming equals one
shot for every rate up to 48 kHz, the whole-buffer :func:`resample` aligned and sized; the
bridges' 48 <-> 24 kHz response is in tests/realtime/test_bridge.py, their 48 <-> 16 kHz in
tests/agents/test_ws.py."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.audio.resample import TELEPHONE, Resampler, resample

FACTOR = 6
HIGH_RATE = 48_000
LOW_RATE = 8_000
TAPS = 384
AMPLITUDE = 16000.0
SECONDS = 0.5
#: Skip the filter's start-up transient (its full length at 48 kHz, with margin).
SETTLE_S = 2 * TAPS / HIGH_RATE


def _tone(freq: float, rate: int, seconds: float = SECONDS) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(AMPLITUDE * np.sin(2 * np.pi * freq * t + 0.3)).astype(np.int16)


def _amplitude(y: np.ndarray, freq: float, rate: int) -> float:
    """Least-squares amplitude of a sinusoid at ``freq`` in the settled part of ``y``."""
    start = int(SETTLE_S * rate)
    seg = y[start:].astype(np.float64)
    t = (np.arange(len(seg)) + start) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, seg, rcond=None)
    return float(np.hypot(*coef))


def Upsampler() -> Resampler:  # noqa: N802 (named as the classes these tests first measured)
    return Resampler(LOW_RATE, HIGH_RATE, TELEPHONE)


def Downsampler() -> Resampler:  # noqa: N802
    return Resampler(HIGH_RATE, LOW_RATE, TELEPHONE)


def _framed(proc: Resampler, x: np.ndarray, frame: int) -> np.ndarray:
    return np.concatenate([proc.process_int16(x[i:i + frame]) for i in range(0, len(x), frame)])


def test_the_telephone_design_is_the_one_measured() -> None:
    """384 taps at 48 kHz both ways (64 per output phase up), ~4 ms of delay each way."""
    up, down = Upsampler(), Downsampler()
    assert (up.up, up.down, up.taps) == (6, 1, 64)
    assert (down.up, down.down, down.taps) == (1, 6, 384)
    assert up.delay_seconds == down.delay_seconds == pytest.approx(191.5 / 48_000)


def _db(ratio: float) -> float:
    return 20 * np.log10(max(ratio, 1e-12))


PASSBAND = [100.0, 300.0, 700.0, 1000.0, 1777.0, 2500.0, 3000.0, 3300.0, 3400.0]


def test_down_passband_ripple_below_half_a_db() -> None:
    gains = []
    for f in PASSBAND:
        y = _framed(Downsampler(), _tone(f, HIGH_RATE), 960)
        gains.append(_db(_amplitude(y, f, LOW_RATE) / AMPLITUDE))
    assert max(gains) - min(gains) < 0.5, gains
    assert all(abs(g) < 0.25 for g in gains), gains


@pytest.mark.parametrize("freq", [4010.0, 4300.0, 5000.0, 6100.0, 7300.0, 9100.0, 12345.0,
                                  15000.0, 19700.0, 23000.0])
def test_down_rejects_what_would_alias_by_60_db(freq: float) -> None:
    y = _framed(Downsampler(), _tone(freq, HIGH_RATE), 960)
    alias = abs(freq - LOW_RATE * round(freq / LOW_RATE))  # where it would land below 4 kHz
    level = _db(_amplitude(y, alias, LOW_RATE) / AMPLITUDE)
    assert level < -60, (freq, alias, level)
    # Nothing else of it got through either: the output is near silence.
    rms = float(np.sqrt(np.mean(y[int(SETTLE_S * LOW_RATE):].astype(np.float64) ** 2)))
    assert _db(rms * np.sqrt(2) / AMPLITUDE) < -60, (freq, rms)


def test_up_passband_ripple_below_half_a_db() -> None:
    gains = []
    for f in PASSBAND:
        y = _framed(Upsampler(), _tone(f, LOW_RATE), 160)
        gains.append(_db(_amplitude(y, f, HIGH_RATE) / AMPLITUDE))
    assert max(gains) - min(gains) < 0.5, gains
    assert all(abs(g) < 0.25 for g in gains), gains


@pytest.mark.parametrize("freq", [300.0, 1000.0, 2222.0, 3400.0])
def test_up_images_are_60_db_down(freq: float) -> None:
    y = _framed(Upsampler(), _tone(freq, LOW_RATE), 160)
    images = [k * LOW_RATE + s * freq for k in (1, 2, 3) for s in (-1, 1)]
    images = [f for f in images if f < HIGH_RATE / 2]
    assert len(images) == 5
    for image in images:
        level = _db(_amplitude(y, image, HIGH_RATE) / AMPLITUDE)
        assert level < -60, (freq, image, level)
    # Everything but the tone itself: residual after removing the fitted tone.
    start = int(SETTLE_S * HIGH_RATE)
    seg = y[start:].astype(np.float64)
    t = (np.arange(len(seg)) + start) / HIGH_RATE
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, seg, rcond=None)
    residual = seg - basis @ coef
    assert _db(float(np.sqrt(np.mean(residual ** 2))) * np.sqrt(2) / AMPLITUDE) < -60


def test_up_frames_equal_the_whole() -> None:
    """Frame boundaries leave no trace (no click): 20 ms frames == one call on the whole."""
    x = _tone(997.0, LOW_RATE)
    whole = Upsampler().process_float(x)
    up = Upsampler()
    framed = np.concatenate([up.process_float(x[i:i + 160]) for i in range(0, len(x), 160)])
    assert len(whole) == len(framed) == FACTOR * len(x)
    assert np.max(np.abs(whole - framed)) < 1e-6
    assert np.array_equal(Upsampler().process_int16(x), _framed(Upsampler(), x, 160))


@pytest.mark.parametrize("frame", [960, 7, 961])
def test_down_frames_equal_the_whole(frame: int) -> None:
    """Any frame size, even ones that are not a multiple of 6, joins seamlessly."""
    x = _tone(1234.0, HIGH_RATE)
    whole = Downsampler().process_float(x)
    down = Downsampler()
    framed = np.concatenate([down.process_float(x[i:i + frame])
                             for i in range(0, len(x), frame)])
    assert len(whole) == len(framed) == len(x) // FACTOR
    assert np.max(np.abs(whole - framed)) < 1e-6
    assert np.array_equal(Downsampler().process_int16(x), _framed(Downsampler(), x, frame))


def test_round_trip_keeps_a_voice_band_tone() -> None:
    """48 -> 8 -> 48 kHz: a 1 kHz tone survives at the same level (two filter passes)."""
    y = Upsampler().process_int16(_framed(Downsampler(), _tone(1000.0, HIGH_RATE), 960))
    assert abs(_db(_amplitude(y, 1000.0, HIGH_RATE) / AMPLITUDE)) < 0.25


def test_bytes_and_clipping() -> None:
    up, down = Upsampler(), Downsampler()
    loud = np.full(160, 32767, dtype=np.int16)
    out = np.frombuffer(up.process(loud.astype("<i2").tobytes()), "<i2")
    assert len(out) == 960 and out.max() <= 32767  # the overshoot is clipped, not wrapped
    assert len(down.process(bytes(1920))) == 320
    assert up.process(b"") == b""
    up.reset()
    down.reset()
    assert not up.process_int16(np.zeros(160, np.int16)).any()
    assert not Upsampler().process_int16(np.zeros(160, np.int16)).any()


# -- the default design --------------------------------------------------------------------


def tone(freq: float, rate: int, seconds: float = 1.0, amp: float = 10000.0) -> bytes:
    t = np.arange(round(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def gain_db(pcm: bytes, amp: float = 10000.0, skip: int = 400) -> float:
    y = np.frombuffer(pcm, "<i2").astype(float)[skip:]
    rms = np.sqrt(np.mean(y * y)) if len(y) else 0.0
    return 20 * np.log10(max(rms, 1e-3) / (amp / np.sqrt(2)))


@pytest.mark.parametrize(("freq", "lo", "hi"), [(300, -0.2, 0.2), (3000, -0.2, 0.2),
                                                  (6500, -1.0, 0.2), (9000, -200, -60),
                                                  (15000, -200, -60), (23000, -200, -60)])
def test_48k_to_16k_passes_speech_and_stops_aliases(freq: float, lo: float, hi: float) -> None:
    r = Resampler(48_000, 16_000)
    x = tone(freq, 48_000)
    out = b"".join(r.process(x[i : i + 1920]) for i in range(0, len(x), 1920))
    assert len(out) == 2 * 16_000
    assert lo <= gain_db(out) <= hi


@pytest.mark.parametrize("src", [8_000, 16_000, 22_050, 24_000])
def test_up_to_48k_streaming_equals_one_shot(src: int) -> None:
    x = tone(1000, src)
    whole = Resampler(src, 48_000).process(x)
    r = Resampler(src, 48_000)
    parts = b"".join(r.process(x[i : i + 666]) for i in range(0, len(x), 666))
    assert parts[: len(whole)] == whole
    assert abs(len(parts) // 2 - 48_000) <= Resampler(src, 48_000).taps * 3
    assert -0.2 <= gain_db(whole, skip=2000) <= 0.2


@pytest.mark.parametrize("dst", [8_000, 16_000, 22_050, 24_000])
def test_down_from_48k_streaming_equals_one_shot(dst: int) -> None:
    x = tone(1000, 48_000)
    whole = Resampler(48_000, dst).process(x)
    r = Resampler(48_000, dst)
    parts = b"".join(r.process(x[i : i + 962]) for i in range(0, len(x), 962))
    assert parts == whole
    assert abs(len(whole) // 2 - dst) <= 1
    assert -0.2 <= gain_db(whole, skip=2000) <= 0.2


def test_equal_rates_are_the_identity() -> None:
    x = tone(1000, 48_000, 0.1)
    r = Resampler(48_000, 48_000)
    assert r.process(x) == x and r.flush() == b"" and r.delay_seconds == 0.0
    assert resample(x, 48_000, 48_000) == x


def test_resample_is_aligned_and_sized() -> None:
    x = tone(440, 22_050, 0.5)
    y = resample(x, 22_050, 48_000)
    assert len(y) == 2 * (len(x) // 2 * 48_000 // 22_050)
    # Aligned: the resampled tone's zero crossings match the original's phase.
    ref = tone(440, 48_000, 0.5)
    a = np.frombuffer(y, "<i2").astype(float)[2000:20000]
    b = np.frombuffer(ref, "<i2").astype(float)[2000:20000]
    assert np.corrcoef(a, b)[0, 1] > 0.99
