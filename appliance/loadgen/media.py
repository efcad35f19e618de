"""The load generator's test signal and the two ways of recognising its echo.

The signal is one cycle of audio, repeated: by default one second, 45 frames of a 440 Hz
tone then a 5-frame (100 ms) silent gap, encoded once at start-up with libopus (PyAV) at
48 kHz mono, 20 ms frames. The tone keeps the server's codec as busy as speech would; the gap
gives every cycle one sharp onset that survives any re-encoding. For turn-taking agents
(``--pattern turns``) the cycle is a *turn*: ``--talk`` seconds of tone, then ``--listen``
seconds of silence in which the caller waits for the answer (:func:`encode_tone` with
``tone_frames``/``gap_frames``). ``--pattern conversational`` is the same cycle shaped as a
conversation's duty cycle (:func:`conversational_frames`).

Opus padding (RFC 6716 §3.2.5) carries the sequence tag. A single-frame packet (code 0)
is rewritten as a code-3 packet with one CBR frame and padding::

     0                   1                   2
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | config  |s|1|1|0|1|    M=1    | pad len = 8   |  frame bytes ... | tag (8 bytes) |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

The decoder "MUST accept any value for the padding bytes" (§3.2.5), so the decoded audio is
the same as the untagged packet's; a passthrough server returns the tag untouched.
"""

from __future__ import annotations

import fractions
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any

import av
import numpy as np

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
CYCLE = 50  # frames per second at 20 ms
GAP = 5  # silent frames at the end of each cycle; the onset is frame 0
TONE_HZ = 440.0
AMPLITUDE = 0.3  # of full scale
LOUD = int(AMPLITUDE * 32767 * 0.25)  # a decoded sample above this is "tone"
QUIET = LOUD // 4  # a decoded frame whose peak is below this is "gap"

TAG_MAGIC = b"\xa7\x1e"
TAG_LEN = 8  # magic (2) + session index (2) + packet counter (4)
_TAG = struct.Struct("!2sHI")


def tag(session: int, counter: int) -> bytes:
    return _TAG.pack(TAG_MAGIC, session & 0xFFFF, counter & 0xFFFFFFFF)


def read_tag(payload: bytes) -> tuple[int, int] | None:
    """``(session, counter)`` if ``payload`` ends in one of our tags, else None.

    Only code-3 packets with padding can carry one, which rules out false matches on
    ordinary Opus packets whose last bytes happen to equal the magic."""
    if len(payload) < 3 + TAG_LEN or payload[0] & 3 != 3 or not payload[1] & 0x40:
        return None
    if payload[-TAG_LEN:-TAG_LEN + 2] != TAG_MAGIC:
        return None
    _, session, counter = _TAG.unpack_from(payload, len(payload) - TAG_LEN)
    return session, counter


def padded_prefix(packet: bytes) -> bytes | None:
    """Everything of the tagged packet but the tag, or None if ``packet`` is not code 0.

    libopus emits code-0 packets (one frame) for 20 ms frames; anything else is sent
    untagged rather than re-framed."""
    if not packet or packet[0] & 3 != 0:
        return None
    return bytes([packet[0] | 3, 0x40 | 1, TAG_LEN]) + packet[1:]


@dataclass(frozen=True, slots=True)
class ToneStream:
    """The encoded cycle. ``prefixes[i]`` + ``tag(...)`` is frame ``i``'s payload (or
    ``plain[i]`` when the frame could not be tagged); ``onset_sample`` is where the tone
    starts inside decoded frame 0 (the encoder's look-ahead shifts it)."""

    plain: tuple[bytes, ...]
    prefixes: tuple[bytes | None, ...]
    onset_sample: int
    gap: int = GAP  # the silent frames at the end of the cycle (the listening part of a turn)

    @property
    def cycle(self) -> int:
        """Frames per cycle: the tone (talking) then the ``gap`` (silence)."""
        return len(self.plain)

    @property
    def tone_frames(self) -> int:
        return self.cycle - self.gap

    def payload(self, index: int, session: int, counter: int) -> bytes:
        prefix = self.prefixes[index]
        if prefix is None:
            return self.plain[index]
        return prefix + tag(session, counter)


#: A conversation's shares of time (issue 32): the caller talks, the agent talks, both are silent.
CONVERSATION = (0.4, 0.4, 0.2)


def conversational_frames(cycle: float, shares: tuple[float, float, float] = CONVERSATION,
                          ) -> tuple[int, int]:
    """``(tone frames, silent frames)`` of one ``cycle``-second conversational cycle.

    What the server pays for per direction is how much of each direction is speech. In a
    conversation (caller ``c``, agent ``a``, both silent ``s`` of the time; 40/40/20) the
    caller's stream is speech ``c`` of the time and the agent's ``a``. Against an echo the
    agent's speech *is* the caller's, played back as it arrives, so the caller talks ``c``
    of the cycle and then listens: the echo returns speech ``c`` of the time too, and both
    directions are silent for the rest (the agent's turn ``a`` plus ``s``). This needs
    ``a == c``: an echo cannot talk more or less than it heard. The frame count is rounded
    to whole 20 ms packets, the tone share to the nearest frame (2.5 s: 50 + 75, 40.0 %).
    """
    caller, agent, silent = shares
    if min(shares) < 0 or abs(caller + agent + silent - 1) > 1e-9:
        raise ValueError(f"shares must be >= 0 and add up to 1, not {shares}")
    if abs(caller - agent) > 1e-9:
        raise ValueError("against an echo the agent talks exactly as long as the caller")
    frames = round(cycle / 0.020)
    tone = round(frames * caller)
    if tone < 1 or frames - tone < 1:
        raise ValueError(f"a {cycle:g} s cycle leaves no frame of tone or of silence")
    return tone, frames - tone


def _pcm_cycle(cycle: int, gap: int) -> np.ndarray[Any, np.dtype[np.int16]]:
    t = np.arange(cycle * FRAME_SAMPLES) / SAMPLE_RATE
    pcm = (AMPLITUDE * 32767 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.int16)
    pcm[(cycle - gap) * FRAME_SAMPLES:] = 0
    return pcm


def encode_tone(*, bitrate: int = 32_000, tone_frames: int = CYCLE - GAP,
                gap_frames: int = GAP) -> ToneStream:
    """Encode the cycle (``tone_frames`` of tone, then ``gap_frames`` of silence) once.
    Three cycles go through the encoder and the last is kept, so frame 0 was coded after a
    real gap, exactly as it is played on the wire."""
    if tone_frames < 1 or gap_frames < 1:
        raise ValueError("a cycle needs at least one frame of tone and one of silence")
    n = tone_frames + gap_frames  # frames per cycle
    ctx: Any = av.CodecContext.create("libopus", "w")
    ctx.sample_rate = SAMPLE_RATE
    ctx.layout = "mono"
    ctx.format = "s16"
    ctx.bit_rate = bitrate
    ctx.time_base = fractions.Fraction(1, SAMPLE_RATE)
    ctx.options = {"application": "voip", "frame_duration": "20"}
    ctx.open()
    pcm = _pcm_cycle(n, gap_frames)
    packets: list[bytes] = []
    for i in range(3 * n):
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        start = (i % n) * FRAME_SAMPLES
        frame.planes[0].update(pcm[start:start + FRAME_SAMPLES].tobytes())
        frame.sample_rate = SAMPLE_RATE
        frame.pts = i * FRAME_SAMPLES
        packets.extend(bytes(p) for p in ctx.encode(frame))
    if len(packets) < 3 * n:
        raise RuntimeError(f"libopus returned {len(packets)} packets for {3 * n} frames")
    cycle = packets[-n:]
    # Where does the onset land in decoded frame 0? Decode the stream as a receiver would.
    dec = Decoder()
    for p in packets[:-n]:
        dec.decode(p)
    onset = dec.onset(cycle[0])
    if onset is None:
        raise RuntimeError("the encoded tone has no detectable onset in frame 0")
    return ToneStream(tuple(cycle), tuple(padded_prefix(p) for p in cycle), onset[0],
                      gap_frames)


class Decoder:
    """A mono libopus decoder that answers "how loud" and "where does the tone start"."""

    __slots__ = ("_ctx",)

    def __init__(self) -> None:
        self._ctx: Any = av.CodecContext.create("libopus", "r")
        self._ctx.sample_rate = SAMPLE_RATE
        self._ctx.layout = "mono"
        self._ctx.format = "s16"

    def decode(self, payload: bytes) -> np.ndarray[Any, np.dtype[np.int32]] | None:
        """Absolute sample values of the decoded packet (int32: |-32768| fits)."""
        try:
            frames = self._ctx.decode(av.Packet(payload))
        except av.error.FFmpegError:  # a payload that is not Opus: no verdict
            return None
        if not frames:
            return None
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
        return np.abs(pcm.astype(np.int32))

    def onset(self, payload: bytes) -> tuple[int, int] | None:
        """``(first loud sample, samples in the packet)``, or None if none is loud."""
        mag = self.decode(payload)
        if mag is None:
            return None
        loud = np.flatnonzero(mag > LOUD)
        return (int(loud[0]), len(mag)) if len(loud) else None

    def is_quiet(self, payload: bytes) -> bool:
        mag = self.decode(payload)
        return mag is not None and int(mag.max(initial=0)) < QUIET

    def is_loud(self, payload: bytes) -> bool:
        """Any sample above :data:`LOUD`: the far end is saying something (turn taking)."""
        mag = self.decode(payload)
        return mag is not None and int(mag.max(initial=0)) > LOUD


class Phase(Enum):
    IDLE = "idle"
    WAIT_QUIET = "wait-quiet"  # armed at the gap: the echo of the gap must come back first
    WAIT_LOUD = "wait-loud"  # then the first loud sample is the echoed onset


class OnsetDetector:
    """RTT by onset, for servers that re-encode. Times are seconds on one clock.

    ``arm(t)`` when the gap's first frame is sent, ``onset_sent(t)`` when frame 0 is sent,
    ``feed(payload, at)`` for every echoed packet; it returns an RTT when it finds the echoed
    onset. Audio times are placed at the sample: a packet that arrives at ``at`` with ``n``
    samples holds audio up to ``at``, so sample ``k`` is at ``at - (n - k) / 48000``; the
    same convention on the sending side makes a zero-delay echo read as 0.
    """

    __slots__ = ("_dec", "_onset_sample", "_sent", "missed", "phase")

    def __init__(self, onset_sample: int) -> None:
        self._dec: Decoder | None = None  # created on first use: passthrough never needs it
        self._onset_sample = onset_sample
        self._sent: float | None = None
        self.phase = Phase.IDLE
        self.missed = 0  # onsets sent whose echo was not found before the next gap

    def arm(self) -> None:
        if self.phase is not Phase.IDLE:
            self.missed += 1
        self.phase = Phase.WAIT_QUIET
        self._sent = None

    def onset_sent(self, at: float) -> None:
        if self.phase is not Phase.IDLE:
            self._sent = at - (FRAME_SAMPLES - self._onset_sample) / SAMPLE_RATE

    def feed(self, payload: bytes, at: float) -> float | None:
        if self.phase is Phase.IDLE:
            return None
        if self._dec is None:
            self._dec = Decoder()
        if self.phase is Phase.WAIT_QUIET:
            if self._dec.is_quiet(payload):
                self.phase = Phase.WAIT_LOUD
            return None
        found = self._dec.onset(payload)
        if found is None:
            return None
        if self._sent is None:
            # Loud before our onset left: the tail of the previous tone after a dip. Start over.
            self.phase = Phase.WAIT_QUIET
            return None
        k, n = found
        rtt = at - (n - k) / SAMPLE_RATE - self._sent
        self.phase = Phase.IDLE
        return rtt if rtt >= 0 else None
