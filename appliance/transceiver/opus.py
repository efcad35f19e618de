"""Opus (RFC 6716, RTP payload RFC 7587) decode/encode for the media pipeline: libopus
called directly through ctypes, or PyAV when no libopus can be loaded.

Why ctypes: the profile of the transceiver under load (docs/performance.md, "Transceiver")
put the codec at ~65 % of its CPU, and a fifth of that was PyAV's wrapping (an
``AudioFrame``, a resampler pass and ``Packet`` objects per 20 ms frame): 188 µs per encode
through PyAV against 144 µs calling ``opus_encode`` with the same settings. The library is
the system's ``libopus.so.0`` or else the copy bundled inside PyAV's wheel (``av.libs``).

Agents see **mono PCM16, 48 kHz, 20 ms frames** (960 samples, 1920 bytes, native byte
order — little-endian on every platform we run on). Opus in WebRTC is always signalled as
``opus/48000/2`` (RFC 7587 §7) whatever the real channel count; the decoder is opened mono,
so libopus downmixes a stereo packet itself.

Codec names in PyAV 18: ``libopus`` for both directions. FFmpeg's native ``opus`` decoder
also exists but only produces float planar samples; libopus gives s16 directly, which saves a
conversion per frame on the hot path.

Loss concealment (:meth:`OpusDecoder.conceal`), with libopus called directly:

* **FEC** when the packet *after* the lost one is already here (the jitter buffer releases a
  hole together with the packet that ended it): ``opus_decode(next, decode_fec=1)`` decodes
  the low-bit-rate copy of the lost frame that the sender put in the next packet (in-band
  FEC, RFC 6716 §2.1.7; browsers send it: ``useinbandfec=1``). A next packet without FEC data
  makes libopus fall back to PLC by itself;
* **PLC** otherwise: ``opus_decode(NULL)``, libopus's own concealment (pitch-synchronous
  extrapolation that fades out over consecutive losses), which also keeps the decoder state
  continuous so the next real packet does not click.

Through PyAV (the fallback) neither is reachable — an empty packet means "drain" to
libavcodec and there is no FEC option — so that path repeats the last frame with a linear
fade, then silence.

Our encoder puts FEC in its packets too (``fec=1``, ``packet_loss``), so the far end's
decoder can recover our losses the same way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fractions
import glob
import os
from typing import Any, Protocol

import av
import numpy as np

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms at 48 kHz
FRAME_BYTES = FRAME_SAMPLES * 2  # mono PCM16
FRAME_SECONDS = FRAME_SAMPLES / SAMPLE_RATE
SILENCE = bytes(FRAME_BYTES)

_FADE = np.linspace(1.0, 0.0, FRAME_SAMPLES, dtype=np.float32)


#: Encoder complexity (0-10), ``--opus-complexity`` of ``appliance up``/``transceiver``. 5:
#: half the CPU of libopus's default 10. Measured (bench/opus_complexity.py; docs/performance.md,
#: "Opus complexity"): 3 would save ~10 % of a PCM session's CPU (~+12 % sessions per core)
#: but costs 0.13 PESQ-WB on average (0.05-0.26, worse on every one of six voice-like
#: signals; the largest single step of the 0-10 scale: below 4 SILK drops its delayed-decision
#: quantiser, NLSF interpolation and warped noise shaping, silk/control_codec.c), so the
#: default stays 5. 4 encodes bit-identically to 5 with libopus 1.3.1 (same SILK settings).
DEFAULT_COMPLEXITY = 5
MAX_FRAME_SAMPLES = 5760  # 120 ms at 48 kHz: the longest Opus packet
_APPLICATION_VOIP = 2048
_SET_BITRATE, _SET_COMPLEXITY, _SET_INBAND_FEC, _SET_PACKET_LOSS_PERC = 4002, 4010, 4012, 4014
_GET_COMPLEXITY = 4011
MIN_EXPECTED_LOSS, MAX_EXPECTED_LOSS = 5, 30  # percent, for OPUS_SET_PACKET_LOSS_PERC


def _load_libopus() -> Any:
    names = [n for n in (ctypes.util.find_library("opus"), "libopus.so.0") if n]
    names += glob.glob(os.path.join(os.path.dirname(av.__file__) + ".libs", "libopus*.so*"))
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
        lib.opus_encoder_create.restype = vp
        lib.opus_encoder_create.argtypes = [i32, ctypes.c_int, ctypes.c_int,
                                            ctypes.POINTER(ctypes.c_int)]
        lib.opus_encoder_destroy.argtypes = [vp]
        lib.opus_encode.restype = i32
        lib.opus_encode.argtypes = [vp, cp, ctypes.c_int, ctypes.c_void_p, i32]
        lib.opus_decoder_create.restype = vp
        lib.opus_decoder_create.argtypes = [i32, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        lib.opus_decoder_destroy.argtypes = [vp]
        lib.opus_decode.restype = ctypes.c_int
        lib.opus_decode.argtypes = [vp, cp, i32, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        return lib
    return None


_lib = _load_libopus()


class _LibOpusDecoder:
    """Opus packets → mono PCM16 through ``opus_decode`` (one preallocated output buffer)."""

    __slots__ = ("_dec", "_pcm", "_view", "errors", "fec", "plc")

    def __init__(self) -> None:
        #: Packets libopus rejected (corrupt payloads from a broken peer); they are concealed.
        self.errors = 0
        #: Lost frames decoded from the next packet (its FEC data if it has any; libopus
        #: falls back to PLC by itself when it has none).
        self.fec = 0
        self.plc = 0  # lost frames made up by libopus PLC
        err = ctypes.c_int()
        self._dec = _lib.opus_decoder_create(SAMPLE_RATE, 1, ctypes.byref(err))
        if not self._dec:
            raise MemoryError(f"opus_decoder_create failed ({err.value})")
        self._pcm = ctypes.create_string_buffer(MAX_FRAME_SAMPLES * 2)
        # Copy-out through a memoryview slice: ~0.2 µs against ~0.5 µs for string_at.
        self._view = memoryview(self._pcm).cast("B")

    def __del__(self) -> None:
        if getattr(self, "_dec", None):
            _lib.opus_decoder_destroy(self._dec)
            self._dec = None

    def decode(self, payload: bytes) -> bytes:
        """Decode one RTP payload to PCM16; a corrupt or empty packet is concealed."""
        if not payload:
            return self.conceal()
        n = _lib.opus_decode(self._dec, payload, len(payload), self._pcm, MAX_FRAME_SAMPLES, 0)
        if n <= 0:
            self.errors += n < 0
            return self.conceal()
        return self._view[: n * 2].tobytes()

    def conceal(self, fec_from: bytes | None = None) -> bytes:
        """One 20 ms frame for a lost packet: FEC from ``fec_from`` (the next packet) when
        given, libopus PLC otherwise (module docstring)."""
        if fec_from:
            n = _lib.opus_decode(self._dec, fec_from, len(fec_from), self._pcm,
                                 FRAME_SAMPLES, 1)
            if n == FRAME_SAMPLES:
                self.fec += 1
                return self._view[:FRAME_BYTES].tobytes()
        n = _lib.opus_decode(self._dec, None, 0, self._pcm, FRAME_SAMPLES, 0)
        if n != FRAME_SAMPLES:  # pragma: no cover - PLC of one 20 ms frame does not fail
            return SILENCE
        self.plc += 1
        return self._view[:FRAME_BYTES].tobytes()


class _LibOpusEncoder:
    """20 ms mono PCM16 frames → Opus packets through ``opus_encode``."""

    __slots__ = ("_enc", "_out", "_view", "expected_loss")

    def __init__(self, *, bitrate: int = 32_000, complexity: int = DEFAULT_COMPLEXITY,
                 expected_loss: int = MIN_EXPECTED_LOSS) -> None:
        err = ctypes.c_int()
        self._enc = _lib.opus_encoder_create(SAMPLE_RATE, 1, _APPLICATION_VOIP,
                                             ctypes.byref(err))
        if not self._enc:
            raise MemoryError(f"opus_encoder_create failed ({err.value})")
        # The same settings as the PyAV path: speech tuning, in-band FEC for the far end's
        # decoder, complexity 5 (half the CPU of the default 10, barely audible).
        for request, value in ((_SET_BITRATE, bitrate), (_SET_COMPLEXITY, complexity),
                               (_SET_INBAND_FEC, 1)):
            _lib.opus_encoder_ctl(ctypes.c_void_p(self._enc), request, ctypes.c_int(value))
        self.expected_loss = -1
        self.set_expected_loss(expected_loss)
        self._out = ctypes.create_string_buffer(1500)
        self._view = memoryview(self._out).cast("B")

    def set_expected_loss(self, percent: int) -> None:
        """Tell the encoder how much loss the far end reports (RTCP fraction lost): libopus
        adds in-band FEC only when this is high enough for the bit rate (at 32 kb/s, 1.3.1
        sends none at 5 % and does at 20 %), as a browser's encoder does from its RTCP."""
        percent = max(MIN_EXPECTED_LOSS, min(MAX_EXPECTED_LOSS, percent))
        if percent != self.expected_loss:
            self.expected_loss = percent
            _lib.opus_encoder_ctl(ctypes.c_void_p(self._enc), _SET_PACKET_LOSS_PERC,
                                  ctypes.c_int(percent))

    def set_complexity(self, complexity: int) -> None:
        """Change the encoder's complexity (0-10) between two frames: libopus applies it
        from the next ``opus_encode`` on, with no reset of its state (degrade.py uses it)."""
        _lib.opus_encoder_ctl(ctypes.c_void_p(self._enc), _SET_COMPLEXITY,
                              ctypes.c_int(max(0, min(10, complexity))))

    @property
    def complexity(self) -> int:
        """The encoder's complexity as libopus reports it (``OPUS_GET_COMPLEXITY``)."""
        value = ctypes.c_int()
        _lib.opus_encoder_ctl(ctypes.c_void_p(self._enc), _GET_COMPLEXITY, ctypes.byref(value))
        return value.value

    def __del__(self) -> None:
        if getattr(self, "_enc", None):
            _lib.opus_encoder_destroy(self._enc)
            self._enc = None

    def encode(self, pcm: bytes) -> bytes:
        """Encode exactly one 20 ms frame (1920 bytes of mono PCM16)."""
        if len(pcm) != FRAME_BYTES:
            raise ValueError(f"an Opus frame is {FRAME_BYTES} bytes of PCM16, got {len(pcm)}")
        n = _lib.opus_encode(self._enc, pcm, FRAME_SAMPLES, self._out, 1500)
        if n < 0:
            raise RuntimeError(f"opus_encode failed ({n})")
        return self._view[:n].tobytes()


class _AvOpusDecoder:
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

    def conceal(self, fec_from: bytes | None = None) -> bytes:
        """One 20 ms frame standing in for a lost packet (see the module docstring; no FEC
        through PyAV: ``fec_from`` is ignored)."""
        self._lost_run += 1
        if self._lost_run > 1 or self._last is SILENCE:
            return SILENCE
        faded = np.frombuffer(self._last, dtype=np.int16).astype(np.float32) * _FADE
        return faded.astype(np.int16).tobytes()


class _AvOpusEncoder:
    """20 ms mono PCM16 frames → Opus packets, one packet per frame (no lookahead queue:
    libopus returns a packet for every frame it is given, so nothing is buffered here)."""

    __slots__ = ("_ctx", "_pts")

    def __init__(self, *, bitrate: int = 32_000, complexity: int = DEFAULT_COMPLEXITY) -> None:
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

    def set_expected_loss(self, percent: int) -> None:
        """Not reachable through PyAV once the codec is open: ignored."""

    def set_complexity(self, complexity: int) -> None:
        """Not reachable through PyAV once the codec is open: ignored."""

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


class Decoder(Protocol):
    errors: int

    def decode(self, payload: bytes) -> bytes: ...
    def conceal(self, fec_from: bytes | None = None) -> bytes: ...


class Encoder(Protocol):
    def encode(self, pcm: bytes) -> bytes: ...
    def set_expected_loss(self, percent: int) -> None: ...
    def set_complexity(self, complexity: int) -> None: ...


OpusDecoder: type[_LibOpusDecoder] | type[_AvOpusDecoder]
OpusEncoder: type[_LibOpusEncoder] | type[_AvOpusEncoder]
if _lib is not None:
    OpusDecoder, OpusEncoder = _LibOpusDecoder, _LibOpusEncoder
else:  # pragma: no cover - no libopus anywhere: PyAV's wrapping of it
    OpusDecoder, OpusEncoder = _AvOpusDecoder, _AvOpusEncoder
