"""Media passthrough: the ``media`` slot of a call whose agent is ``passthrough`` — the
caller's RTP goes straight back under our SSRC, sequence and timestamp space, without a
codec (capacity measurements; the cheapest possible "agent").

The caller's (SSRC, sequence, timestamp) map onto our stream by fixed offsets, re-anchored
whenever the caller's SSRC changes (a restarted stream), so what we send stays one
continuous RTP stream (RFC 3550 §5.1: sequence numbers and timestamps of one SSRC run on
from a random start). The packet is rebuilt with a plain 12-byte header (no CSRCs, header
extensions or padding: we negotiate none).
"""

from __future__ import annotations

import secrets

from .leg import MediaLeg

#: RTP clock ticks per 20 ms packet at 48 kHz (RFC 7587 §4.1), and packets per second.
_TICKS_PER_PACKET = 960
_PACKETS_PER_SECOND = 50


class PassthroughStream:
    __slots__ = ("leg", "_src", "_seq_off", "_ts_off", "_seq", "_ts", "_sent_at")

    def __init__(self, leg: MediaLeg) -> None:
        self.leg = leg
        self._src: int | None = None  # the caller's SSRC the offsets are anchored to
        self._seq_off = self._ts_off = 0
        self._seq = secrets.randbits(16)  # last sequence number / timestamp we sent
        self._ts = secrets.randbits(32)
        self._sent_at: float | None = None

    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None:
        if ssrc != self._src:
            # First packet, or the caller restarted its stream: continue ours from the last
            # packet we sent (one sequence number on, the elapsed time on the RTP clock).
            gap = (1 if self._sent_at is None
                   else max(1, round((now - self._sent_at) * _PACKETS_PER_SECOND)))
            self._src = ssrc
            self._seq_off = (self._seq + 1 - seq) & 0xFFFF
            self._ts_off = (self._ts + _TICKS_PER_PACKET * gap - ts) & 0xFFFFFFFF
            marker = True
        oseq = (seq + self._seq_off) & 0xFFFF
        ots = (ts + self._ts_off) & 0xFFFFFFFF
        if (oseq - self._seq) & 0xFFFF < 0x8000:  # newer than the last one sent
            self._seq, self._ts, self._sent_at = oseq, ots, now
        self.leg.send_rtp(now, oseq, ots, marker, plain[off:end])

    def poll_timeout(self) -> float | None:
        return None

    def handle_timeout(self, now: float) -> None:
        pass
