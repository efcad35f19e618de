"""Opus (RFC 6716, RTP payload RFC 7587) decode/encode for the media pipeline, on PyAV.

Agents see **mono PCM16, 48 kHz, 20 ms frames** (960 samples, 1920 bytes, native byte
order — little-endian on every platform we run on). Opus in WebRTC is always signalled as
``opus/48000/2`` (RFC 7587 §7) whatever the real channel count; the decoder is opened mono,
so libopus downmixes a stereo packet itself.

Codec names in PyAV 18: ``libopus`` for both directions. FFmpeg's native ``opus`` decoder
also exists but only produces float planar samples; libopus gives s16 directly, which saves a
conversion per frame on the hot path.

Loss concealment. libopus has real PLC (``opus_decode(NULL)``) and in-band FEC
(``decode_fec=1`` on the *next* packet), but FFmpeg exposes neither: an empty packet means
"drain" to libavcodec, and there is no FEC option on the decoder. So :meth:`OpusDecoder.conceal`
does what we can from Python and documents it:

* the first lost frame repeats the last decoded frame with a linear fade to silence (a
  repeat avoids the click a hard zero-fill makes mid-word);
* every further consecutive lost frame is silence (repeating longer sounds robotic).

The encoder is told to put FEC in its packets (``fec=1``, ``packet_loss``) so a browser on
the far end, whose decoder *does* use FEC, recovers our losses.
"""

from __future__ import annotations

import fractions
from typing import Any

import av
import numpy as np

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FRAME_BYTES = FRAME_SAMPLES * 2  # mono PCM16
FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
SILENCE = bytes(FRAME_BYTES)

_FADE = np.linspace(1.0, 0.0, FRAME_SAMPLES, dtype=np.float32)


class OpusDecoder:
    """Opus packets → 20 ms mono PCM16 frames (one RTP packet may hold up to 120 ms)."""

    __slots__ = ("_ctx", "_last", "_lost_run", "errors")

    def __init__(self) -> None:
        self._ctx: Any = av.CodecContext.create("libopus", "r")
        self._ctx.sample_rate = SAMPLE_RATE
        self._ctx.layout = "mono"
        self._last = SILENCE
        self._lost_run = 0
        #: Packets libopus rejected (corrupt payloads from a broken peer); they are concealed.
        self.errors = 0

    def decode(self, payload: bytes) -> bytes:
        """Decode one RTP payload to PCM16 (a multiple of 960 samples for WebRTC's 20 ms
        ptime; other packet durations come out whole). A corrupt packet is concealed."""
        try:
            frames = self._ctx.decode(av.Packet(payload))
        except (av.FFmpegError, ValueError):
            self.errors += 1
            return self.conceal()
        if not frames:
            return self.conceal()
        if len(frames) == 1:
            fr = frames[0]
            pcm = bytes(fr.planes[0])[: fr.samples * 2]
        else:
            pcm = b"".join(bytes(fr.planes[0])[: fr.samples * 2] for fr in frames)
        self._last = pcm[-FRAME_BYTES:] if len(pcm) >= FRAME_BYTES else SILENCE
        self._lost_run = 0
        return pcm

    def conceal(self) -> bytes:
        """One 20 ms frame standing in for a lost packet (see the module docstring)."""
        self._lost_run += 1
        if self._lost_run > 1 or self._last is SILENCE:
            return SILENCE
        faded = np.frombuffer(self._last, dtype=np.int16).astype(np.float32) * _FADE
        return faded.astype(np.int16).tobytes()


class OpusEncoder:
    """20 ms mono PCM16 frames → Opus packets, one packet per frame (no lookahead queue:
    libopus returns a packet for every frame it is given, so nothing is buffered here)."""

    __slots__ = ("_ctx", "_pts")

    def __init__(self, *, bitrate: int = 32_000, complexity: int = 5) -> None:
        ctx: Any = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = SAMPLE_RATE
        ctx.layout = "mono"
        ctx.format = "s16"
        ctx.bit_rate = bitrate
        ctx.time_base = fractions.Fraction(1, SAMPLE_RATE)
        # voip: speech tuning; 20 ms frames; in-band FEC for the far end's decoder;
        # complexity 5 halves the CPU of the default 10 for a barely audible difference.
        ctx.options = {
            "application": "voip",
            "frame_duration": "20",
            "fec": "1",
            "packet_loss": "5",
            "compression_level": str(complexity),
        }
        ctx.open()
        self._ctx = ctx
        self._pts = 0

    def encode(self, pcm: bytes) -> bytes:
        """Encode exactly one 20 ms frame (1920 bytes of mono PCM16)."""
        if len(pcm) != FRAME_BYTES:
            raise ValueError(f"an Opus frame is {FRAME_BYTES} bytes of PCM16, got {len(pcm)}")
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm)
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        self._pts += FRAME_SAMPLES
        packets = self._ctx.encode(frame)
        return b"".join(bytes(p) for p in packets)
