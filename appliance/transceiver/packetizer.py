"""Outbound RTP packetisation and pacing for 20 ms audio frames (sans-IO: time is passed in).

RFC 3550 §5.1 and RFC 7587 §4.1 (Opus): one packet per 20 ms frame; the timestamp advances
by 960 (48 kHz clock) per frame and keeps counting through silence, so after a pause the
next packet's timestamp reflects the wall time that passed; the **marker bit** is set on the
first packet of each talkspurt (RFC 3551 §4.1); the sequence number advances by one per
packet sent, whatever the gap; initial sequence number and timestamp are random (§5.1).

Pacing: a frame may leave at its *due* time, ``nominal(previous) + 20 ms``. The schedule
does **not** follow a late frame: a frame that leaves late (its source was delayed by the
network, the caller or the CPU) keeps its nominal slot, so the next frame, arriving on time,
is due at once and the delay is gone — re-anchoring at ``now`` instead ratcheted every
delay into the rest of the call (docs/performance.md, "Transceiver"). Only a schedule more
than ``max_lag`` (40 ms) behind is dragged along to ``now - max_lag``, so a source slightly
slower than real time does not build up lag until it looks like silence. While frames are
queued behind the one leaving (``backlog``) the schedule may lag by up to ``burst`` (60 ms)
and the backlog leaves back-to-back, so latency does not accumulate either. A frame later
than ``burst`` starts a new talkspurt (marker set, timestamp jumped by the elapsed time).

Sending faster than real time is never allowed with a backlog. A *lone* frame (nothing
queued behind it) may leave up to ``early`` before its due time and then moves the
schedule to ``now``: that lets the schedule settle on the phase of a real-time source (its
earliest arrivals) instead of on whichever frame came first, at a worst-case rate of
20 / (20 - early) ms for a producer that hands over one frame at a time too fast
(``early`` is 0 unless asked for; the transceiver uses 2 ms: ≤ 1.11×).

Deliberately omitted: DTX/comfort noise and multi-frame packets (ptime > 20).
"""

from __future__ import annotations

import secrets

FRAME_SECONDS = 0.020
SAMPLES_PER_FRAME = 960


class Packetizer:
    __slots__ = ("ssrc", "payload_type", "_seq", "_ts", "_nominal", "_next_due", "burst",
                 "early", "max_lag", "packets", "talkspurts", "_step")

    def __init__(
        self,
        ssrc: int,
        payload_type: int,
        *,
        initial_seq: int | None = None,
        initial_timestamp: int | None = None,
        burst: float = 0.060,
        max_lag: float = 0.040,
        early: float = 0.0,
        samples_per_frame: int = SAMPLES_PER_FRAME,
    ) -> None:
        self.ssrc = ssrc
        # RTP timestamp units per 20 ms frame: 960 at Opus's 48 kHz clock, 160 at G.711's 8 kHz.
        self._step = samples_per_frame
        self.payload_type = payload_type
        # The seq/ts of the packet *before* the first one: the first sent is +1 / +960.
        seq0 = secrets.randbits(16) if initial_seq is None else initial_seq
        ts0 = secrets.randbits(32) if initial_timestamp is None else initial_timestamp
        self._seq = (seq0 - 1) & 0xFFFF
        self._ts = (ts0 - samples_per_frame) & 0xFFFFFFFF
        self._nominal: float | None = None  # nominal send time of the last packet
        self._next_due: float | None = None
        self.burst = burst
        self.max_lag = max_lag
        self.early = early
        self.packets = 0
        self.talkspurts = 0

    def poll_timeout(self, backlog: int = 0) -> float | None:
        """Earliest time the next frame may be sent (``None``: any time); ``backlog`` is
        how many frames are queued behind it."""
        if self._next_due is None:
            return None
        return self._next_due - (0.0 if backlog else self.early)

    def ready(self, now: float, backlog: int = 0) -> bool:
        due = self.poll_timeout(backlog)
        return due is None or now >= due - 1e-6

    def next_header(self, now: float, backlog: int = 0) -> tuple[int, int, bool]:
        """Allocate ``(sequence, timestamp, marker)`` for one frame sent at ``now``;
        ``backlog`` is how many frames are queued behind it.

        Call only when :meth:`ready`; sending earlier would run ahead of real time.
        """
        if self._next_due is None or self._nominal is None:
            marker = True
            self._ts = (self._ts + self._step) & 0xFFFFFFFF
            nominal = now
        elif now - self._next_due > self.burst:
            # Silence since the last packet: a new talkspurt. The timestamp keeps counting
            # the 48 kHz clock through the silence (at least one frame's worth).
            marker = True
            frames = max(1, round((now - self._nominal) / FRAME_SECONDS))
            self._ts = (self._ts + self._step * frames) & 0xFFFFFFFF
            nominal = now
        else:
            marker = False
            self._ts = (self._ts + self._step) & 0xFFFFFFFF
            if backlog:
                nominal = self._next_due  # catch up: back-to-back until on schedule
            elif now < self._next_due:
                nominal = now  # a lone frame, early (≤ ``early``): the schedule follows it
            else:
                # Late: keep the slot (the next frame may catch up) unless the schedule is
                # more than max_lag behind, then drag it (a slow source).
                nominal = max(self._next_due, now - self.max_lag)
        if marker:
            self.talkspurts += 1
        self._seq = (self._seq + 1) & 0xFFFF
        self._nominal = nominal
        self._next_due = nominal + FRAME_SECONDS
        self.packets += 1
        return self._seq, self._ts, marker

    @property
    def last_timestamp(self) -> int:
        """RTP timestamp of the last packet (for RTCP SR's RTP↔NTP mapping)."""
        return self._ts

    @property
    def last_nominal_time(self) -> float | None:
        return self._nominal
