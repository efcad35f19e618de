"""Echo cancellation: the agent's own voice taken out of what the caller's microphone sends
back — for calls whose far end does not cancel it (telephones, speakerphones, many SIP
softphones). Browsers cancel their own echo: leave this off for them.

Two stages share one :class:`EchoCanceller`::

    out chain: … ─► EchoReference("aec-ref") ─► recorder ─► encode        (what we send)
    in chain:  decode ─► recorder(raw) ─► EchoCancelStage("aec") ─► denoise ─► … ─► VAD

**Streams on one time axis.** Both sides stamp their frames with the call clock (``now``).
The reference (what was sent) is a contiguous sample stream while the agent talks and is
re-anchored to the clock when it starts again after a silence (the gap becomes zeros); the
microphone is anchored on the clock at its first frame and placed from then on by each
frame's **media time** (the sender's RTP timestamp, ``StageChain.media_time``), not by when
it arrives: a stall and the burst after it, or a slot the jitter buffer conceals, leave
every frame in place, and a gap in what the sender sent (silence suppression, DTX, an outage
the jitter buffer resyncs over) stays a gap — counting frames collapsed it and slid the
microphone early against the reference by its length. The echo in microphone sample ``m``
is reference sample ``m - D``: ``D`` covers everything between our send and the echo's
return — the network both ways, the far end's jitter buffer and audio path, ours.

**Delay estimation** (:class:`DelayEstimator`): every ``estimate_every`` frames while the
reference carries sound, GCC-PHAT (generalised cross-correlation with phase transform,
Knapp & Carter 1976) between the last second of microphone and the reference around it,
both decimated 4:1 to 12 kHz, searched over 0 … ``max_delay``. A peak that stands far enough
above the correlation's spread is an estimate; the first sets ``D``; later, two consecutive
estimates that agree with each other and not with ``D`` move it (the jitter buffer grew or
shrank, a clock drifted) and reset the adaptive filter. Until ``D`` is known the stage
passes the microphone through unchanged.

**Cancellation**: speexdsp's MDF adaptive filter (``tail_ms`` of echo response, fed the
reference ``guard_ms`` early so a slightly late estimate still falls inside the filter) and
its preprocessor's residual-echo suppressor, 10 ms at a time at 48 kHz (speexdsp.py).

**Echo gate** (the non-linear part, for the moments the filter cannot help): a frame is
brought down to the microphone's background level (a slow minimum of its frame power: a
gated frame sounds like the line's own noise, so a VAD that tracks the noise floor sees no
step when the gate opens again; at most :data:`GATE_DB`) when the reference says echo may be in it and the frame is
quieter than that reference would make it — *before* ``D`` is known, when it is quieter
than the loudest reference frame of the last ``max_delay`` (the echo of any of them may be
arriving: a phone's echo path attenuates, so an echo is quieter than what caused it); once
``D`` is known, by the same rule for :data:`CONVERGE_FRAMES` while the fresh filter
converges (and a first estimate may still move), then when what the filter left is more
than :data:`GATE_MARGIN_DB` below the reference around ``m - D`` — unless the filter has
slipped (its ERLE over the last few frames below :data:`ADRIFT_DB`: the echo path stepped,
a far end's playout moving by a frame or a stall's worth under load, and until the filter
re-adapts or two estimates move ``D`` it cancels nothing): then, as while ``D`` is unknown,
against the loudest reference of the last ``max_delay``, and echo when quieter than the
echo path's loss (learnt while the filter worked) makes it, plus :data:`ERL_SLACK_DB` — a
caller talking over the agent also keeps the output loud, and is louder than that. So the agent's returning voice does not reach the VAD while the
delay is being found, the filter converges or it has lost the echo (an agent with barge-in
would otherwise interrupt itself); a caller talking over the agent at a normal level is
louder than that and passes. Counted as ``gated`` (and ``adrift``: gated only because the
filter had slipped).

Reported (``media.stages.aec``): ``delay_ms``, the estimates made/accepted/changes, and
``erle_db`` — echo return loss enhancement, 10·log10(microphone power / output power) over
the frames where the reference carried sound, smoothed.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .base import FRAME_SAMPLES, SAMPLE_RATE
from .speexdsp import SpeexEcho, load

_DECIM = 4
GATE_DB = -30.0  # what the echo gate does to a frame it judges echo
GATE_MARGIN_DB = 12.0  # once D is known: echo when this far below the aligned reference
CONVERGE_FRAMES = 100  # 2 s after D is set or moved: the filter is still converging
_GATE = 10 ** (GATE_DB / 20)
_MARGIN = 10 ** (-GATE_MARGIN_DB / 10)
#: Short-term ERLE below this (dB) after convergence: the filter has slipped (see process).
ADRIFT_DB = 6.0
_QUICK = 0.25  # smoothing of the short-term powers: ~4 frames
_FIT = 10 ** (12.0 / 10)  # short-term ERLE above 12 dB: the filter is working
ERL_SLACK_DB = 10.0  # a slipped filter's gate: echo up to this much above the learnt loss
_ERL_SLACK = 10 ** (ERL_SLACK_DB / 10)
_REF_ACTIVE = 30.0 ** 2  # mean power of a reference frame that carries sound
_INT16 = np.dtype("<i2")


class _Ring:
    """Samples at absolute positions; reads outside what is held come back as zeros."""

    __slots__ = ("buf", "size", "end")

    def __init__(self, size: int) -> None:
        self.buf = np.zeros(size, np.int16)
        self.size = size
        self.end = 0  # absolute position one past the last sample written

    def write(self, pos: int, data: np.ndarray) -> None:
        """Write ``data`` at ``pos`` (>= end; a gap in between becomes zeros)."""
        if pos > self.end:
            self._put(self.end, np.zeros(min(pos - self.end, self.size), np.int16))
        self._put(pos, data)
        self.end = pos + len(data)

    def _put(self, pos: int, data: np.ndarray) -> None:
        n = len(data)
        if n >= self.size:
            data, pos, n = data[-self.size:], pos + n - self.size, self.size
        i = pos % self.size
        first = min(n, self.size - i)
        self.buf[i : i + first] = data[:first]
        if first < n:
            self.buf[: n - first] = data[first:]

    def read(self, pos: int, n: int) -> np.ndarray:
        out = np.zeros(n, np.int16)
        lo = max(pos, self.end - self.size)
        hi = min(pos + n, self.end)
        if hi <= lo:
            return out
        idx = np.arange(lo, hi) % self.size
        out[lo - pos : hi - pos] = self.buf[idx]
        return out


class DelayEstimator:
    """GCC-PHAT lag between a microphone window and the reference before it."""

    def __init__(self, *, max_delay: int, window: int, min_confidence: float = 6.0) -> None:
        self.max_delay = max_delay
        self.window = window
        self.min_confidence = min_confidence
        self.last_confidence = 0.0

    def estimate(self, mic: np.ndarray, ref: np.ndarray) -> int | None:
        """``mic``: ``window`` samples; ``ref``: ``window + max_delay`` samples ending where
        ``mic`` ends. The lag ``d`` (samples, ``mic[t] ~ ref[t - d]``), or None."""
        m = mic.astype(np.float32).reshape(-1, _DECIM).mean(axis=1)
        r = ref.astype(np.float32).reshape(-1, _DECIM).mean(axis=1)
        m -= m.mean()
        r -= r.mean()
        n = 1 << int(len(m) + len(r) - 1).bit_length()
        cross = np.fft.rfft(r, n) * np.conj(np.fft.rfft(m, n))
        mag = np.abs(cross)
        cross /= mag + 1e-3 * (mag.max() + 1e-12)  # PHAT, floored where nothing is
        cc = np.fft.irfft(cross, n)
        span = self.max_delay // _DECIM
        # ref[k + tau] ~ mic[k] at tau = max_delay - d: search tau in 0..max_delay.
        search = cc[: span + 1]
        tau = int(np.argmax(search))
        spread = float(np.std(search)) + 1e-12
        self.last_confidence = float((search[tau] - np.mean(search)) / spread)
        if self.last_confidence < self.min_confidence:
            return None
        return self.max_delay - tau * _DECIM


class EchoCanceller:
    SUB = 480  # speexdsp works 10 ms at a time

    def __init__(self, *, tail_ms: float = 60.0, max_delay_ms: float = 500.0,
                 guard_ms: float = 10.0, window_ms: float = 1000.0,
                 estimate_every: int = 25, adrift_db: float | None = ADRIFT_DB) -> None:
        self.rate = SAMPLE_RATE
        self.tail = round(tail_ms * SAMPLE_RATE / 1000)
        self.max_delay = round(max_delay_ms * SAMPLE_RATE / 1000) // _DECIM * _DECIM
        self.guard = round(guard_ms * SAMPLE_RATE / 1000)
        self.window = round(window_ms * SAMPLE_RATE / 1000) // _DECIM * _DECIM
        self.estimate_every = estimate_every
        span = self.window + self.max_delay + 4 * FRAME_SAMPLES
        self.ref = _Ring(span)
        self.mic = _Ring(self.window + 2 * FRAME_SAMPLES)
        self.estimator = DelayEstimator(max_delay=self.max_delay, window=self.window)
        self.speex = SpeexEcho(self.SUB, self.tail, SAMPLE_RATE)
        self.t0: float | None = None
        self.mic_pos: int | None = None  # where the next frame goes if none is missing
        self._mic_anchor = 0  # mic position = anchor + the frame's media time in samples
        self.mic_gaps = 0  # frames placed after a gap in the sender's media time
        self.mic_reanchors = 0  # media time went back or leapt ahead of the call clock
        self._adrift = None if adrift_db is None else 10 ** (adrift_db / 10)
        self.delay: int | None = None  # D, samples
        self._pending: int | None = None  # a differing estimate waiting for confirmation
        self.frames = 0
        self.cancelled = 0
        self.estimates = 0
        self.accepted = 0
        self.changes = 0
        self._p_mic = 0.0
        self._p_out = 0.0
        self._q_mic = 0.0  # the same powers over the last few frames (the filter's state now)
        self._q_out = 0.0
        self._ref_loud_end = 0  # one past the last reference frame that carried sound
        self._erl = 1.0  # the echo path's power loss, learnt while the filter works
        self._ref_active_frames = 0
        self.gated = 0
        self.adrift = 0  # frames gated only because the filter slipped (the fresh rule)
        self._floor: float | None = None  # the microphone's background power
        self._converging = 0  # frames left of CONVERGE_FRAMES

    def _pos(self, now: float) -> int:
        if self.t0 is None:
            self.t0 = now
        return round((now - self.t0) * SAMPLE_RATE)

    # -- the out chain ---------------------------------------------------------------------

    def push_reference(self, pcm: bytes, now: float) -> None:
        x = np.frombuffer(pcm, _INT16)
        pos = self._pos(now)
        ref = self.ref
        # Contiguous while the agent talks; after a silence (more than a frame late) the
        # stream is re-anchored on the clock and the gap is zeros.
        at = pos if pos > ref.end + FRAME_SAMPLES else ref.end
        if _power(x) > _REF_ACTIVE:
            self._ref_loud_end = at + len(x)
        ref.write(at, x)

    # -- the in chain ----------------------------------------------------------------------

    def _mic_position(self, now: float, media_time: float | None) -> int:
        """Where this microphone frame starts on the call clock's sample axis.

        Anchored on the call clock at the first frame, then on the sender's media time (its
        RTP timestamp, ``media_time`` seconds since the call's first packet) — not on when
        frames arrive: a stall and the burst after it, or a frame the jitter buffer
        conceals, leave every frame at its media position. A sender that stops sending
        (silence suppression, DTX, an outage the jitter buffer resynchronises over) leaves
        a gap in media time that arrival order would collapse, shifting the microphone
        against the reference by the gap: here the gap stays a gap (zeros). Without media
        time (``None``), frames are taken as contiguous."""
        expected = self.mic_pos
        if expected is None:
            start = self._pos(now)
            if media_time is not None:
                self._mic_anchor = start - round(media_time * SAMPLE_RATE)
            return start
        if media_time is None:
            return expected
        at = self._mic_anchor + round(media_time * SAMPLE_RATE)
        if at == expected:
            return at
        if expected < at <= self._pos(now) + self.window:
            # A gap the call clock saw pass too (the slack covers a first frame that came
            # late and so anchored the stream late).
            self.mic_gaps += 1
            return at
        # Media time went backwards or leapt past the call clock: the sender restarted
        # its timestamps. Carry on from here, on the call clock if it is ahead.
        self.mic_reanchors += 1
        at = max(expected, self._pos(now))
        self._mic_anchor = at - round(media_time * SAMPLE_RATE)
        return at

    def process(self, pcm: bytes, now: float, media_time: float | None = None) -> bytes:
        x = np.frombuffer(pcm, _INT16)
        pos = self._mic_position(now, media_time)
        self.mic_pos = pos + len(x)
        self.mic.write(pos, x)
        self.frames += 1
        p_mic = _power(x)
        f = self._floor
        # Down fast, up slowly (~2 dB/s): the quiet between words, not the words.
        self._floor = p_mic if f is None or p_mic < f else f * 1.01
        if self.frames % self.estimate_every == 0:
            self._estimate(pos + len(x))
        if self.delay is None:
            if self.ref.end <= pos - self.max_delay:
                return pcm  # nothing sent lately: no echo can be in this frame
            # Any frame sent in the last max_delay may be echoing now.
            p_ref = self._ref_peak_power(pos - self.max_delay, self.max_delay + len(x))
            if p_ref > _REF_ACTIVE and p_mic < p_ref:
                return self._gate(x, p_mic)
            return pcm
        lead = self.delay - self.guard
        far = self.ref.read(pos - lead, len(x))
        far_active = bool(np.any(far))
        sub = self.SUB
        out = b"".join(self.speex.process(pcm[2 * i : 2 * (i + sub)], far[i : i + sub].tobytes())
                       for i in range(0, len(x), sub))
        self.cancelled += 1
        y = np.frombuffer(out, _INT16)
        p_out = _power(y)
        if far_active:
            a = 0.05
            self._p_mic += a * (p_mic - self._p_mic)
            self._p_out += a * (p_out - self._p_out)
            self._ref_active_frames += 1
        if self._ref_loud_end > pos - self.max_delay:
            # Echo of something sent may be in this frame, wherever D is now: how much of
            # the microphone the filter takes out, over the last few frames.
            b = _QUICK
            self._q_mic += b * (p_mic - self._q_mic)
            self._q_out += b * (p_out - self._q_out)
        slipped = False
        if self._converging > 0:
            # A fresh filter (and perhaps a first estimate that is not yet right): the
            # rule of the unknown delay, any reference of the last max_delay.
            self._converging -= 1
            start, n, margin = pos - self.max_delay, self.max_delay + len(x), 1.0
        else:
            # The reference around m - D, the filter's tail either side: where echo (or
            # what a misadjusted filter makes of it) may be in this frame.
            start, n, margin = pos - lead - self.tail, len(x) + 2 * self.tail, _MARGIN
            if self._adrift is not None and self._q_out * self._adrift > self._q_mic:
                # The filter is not cancelling: the echo path stepped (a far end's playout
                # slipped by a frame or a stall's worth) and D is not known again until
                # the filter re-adapts or two estimates move it. So, as for an unknown
                # delay, any reference of the last max_delay may be echoing (an aligned
                # span misses a step longer than the tail); but not "quieter than that
                # reference", which a caller talking over the agent (the other reason
                # the output stays loud) often is: quieter than what the echo path,
                # its loss learnt while the filter worked, makes of it, +ERL_SLACK_DB.
                start, n = pos - self.max_delay, self.max_delay + len(x)
                margin, slipped = min(1.0, self._erl * _ERL_SLACK), True
        if self.ref.end > start:
            p_ref = self._ref_peak_power(start, n)
            if not slipped and p_ref > _REF_ACTIVE and self._q_out * _FIT < self._q_mic:
                # The filter is working, so the microphone is mostly echo: learn the echo
                # path's loss (the microphone against the peak of the aligned reference).
                self._erl += 0.05 * (min(1.0, p_mic / p_ref) - self._erl)
            if p_ref > _REF_ACTIVE and p_out < p_ref * margin:
                if slipped and p_out >= p_ref * _MARGIN:
                    self.adrift += 1  # gated only because the filter slipped
                return self._gate(y, p_out)
        return out

    def _gate(self, x: np.ndarray, p: float) -> bytes:
        self.gated += 1
        floor = self._floor if self._floor is not None else 0.0
        g = max(_GATE, min(1.0, float(np.sqrt(floor / p)) if p > 0 else 1.0))
        return (x * g).astype(_INT16).tobytes()

    def _ref_peak_power(self, start: int, n: int) -> float:
        """The mean power of the loudest 10 ms of the reference in [start, start + n)."""
        r = self.ref.read(start, n // self.SUB * self.SUB).astype(np.float32)
        return float((r.reshape(-1, self.SUB) ** 2).mean(axis=1).max())

    def _estimate(self, mic_end: int) -> None:
        if mic_end < self.window or self.mic.end - self.mic.size > mic_end - self.window:
            return
        ref = self.ref.read(mic_end - self.window - self.max_delay, self.window + self.max_delay)
        # Only while the reference carries sound (nothing to find in silence).
        if float(np.abs(ref[-self.window:]).mean()) < 30.0:
            return
        mic = self.mic.read(mic_end - self.window, self.window)
        if float(np.abs(mic).mean()) < 3.0:
            return
        self.estimates += 1
        d = self.estimator.estimate(mic, ref)
        if d is None:
            return
        self.accepted += 1
        tol = round(0.002 * SAMPLE_RATE)
        if self.delay is None:
            self.delay = d
            self._converging = CONVERGE_FRAMES
            return
        if abs(d - self.delay) <= tol:
            self._pending = None
            return
        if self._pending is not None and abs(d - self._pending) <= tol:
            self.delay = d
            self._pending = None
            self.changes += 1
            self.speex.reset()
            self._converging = CONVERGE_FRAMES
        else:
            self._pending = d

    def erle_db(self) -> float | None:
        if self._ref_active_frames < 10 or self._p_out <= 0:
            return None
        return float(10 * np.log10(max(self._p_mic, 1e-9) / self._p_out))

    def stats(self) -> dict[str, Any]:
        erle = self.erle_db()
        return {
            "delay_ms": None if self.delay is None else round(self.delay * 1000 / SAMPLE_RATE, 1),
            "estimates": self.estimates, "accepted": self.accepted, "changes": self.changes,
            "erle_db": None if erle is None else round(erle, 1),
            "frames": self.frames, "cancelled": self.cancelled, "gated": self.gated,
            "adrift": self.adrift, "mic_gaps": self.mic_gaps,
            "mic_reanchors": self.mic_reanchors,
        }

    def close(self) -> None:
        self.speex.close()


def _power(x: np.ndarray) -> float:
    f = x.astype(np.float32)
    return float(f.dot(f)) / len(f)


class MediaClock(Protocol):
    """What tells the in side each frame's media time: the in :class:`StageChain`, whose
    ``media_time`` the pipeline sets before it runs a frame through the chain."""

    media_time: float | None


class EchoCancelStage:
    """The in-chain side (named ``aec``)."""

    name = "aec"

    def __init__(self, aec: EchoCanceller, media: MediaClock | None = None) -> None:
        self.aec = aec
        self.media = media

    def process(self, pcm: bytes, now: float) -> bytes:
        media = self.media
        return self.aec.process(pcm, now, None if media is None else media.media_time)

    def stats(self) -> dict[str, Any]:
        return self.aec.stats()

    def close(self) -> None:
        self.aec.close()


class EchoReference:
    """The out-chain side (named ``aec-ref``): remembers what was sent."""

    name = "aec-ref"

    def __init__(self, aec: EchoCanceller) -> None:
        self.aec = aec

    def process(self, pcm: bytes, now: float) -> bytes:
        self.aec.push_reference(pcm, now)
        return pcm

    def stats(self) -> dict[str, Any]:
        return {"reference_samples": self.aec.ref.end}

    def close(self) -> None:
        pass  # the in side owns the native state


def make_echo_canceller(media: MediaClock | None = None,
                        **options: Any) -> tuple[EchoCancelStage, EchoReference]:
    """The two stages of one call's echo canceller (StageUnavailable without speexdsp);
    ``media`` gives the in side each microphone frame's media time (the in chain)."""
    load()
    aec = EchoCanceller(**options)
    return EchoCancelStage(aec, media), EchoReference(aec)
