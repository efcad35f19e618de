"""RTP reception/sender statistics and NTP arithmetic (RFC 3550 §6.4, A.1, A.3, A.8).

Time is always passed in (STYLE.md rule 1): ``arrival`` and ``now`` are seconds on any
monotonic clock for intervals, and Unix seconds where an NTP timestamp is made.

Implemented: A.1 sequence tracking (cycles, MAX_DROPOUT/MAX_MISORDER, re-sync after two
sequential packets following a big jump), A.3 expected/lost/fraction lost, A.8 jitter,
§6.4.1 LSR/DLSR and the RTT computation, §4 NTP timestamp format.
Deliberately omitted: A.1 *probation* (MIN_SEQUENTIAL): it defends unauthenticated
sessions against stray packets, but every packet reaching us passed SRTP authentication;
A.7 RTCP interval computation (the transceiver sends a report every few seconds, which
is inside the RFC's bounds for one sender and one receiver).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from appliance.proto.rtp.rtcp import ReportBlock, RtcpSenderReport

#: Seconds from 1900-01-01 (NTP era 0) to 1970-01-01 (Unix epoch), RFC 868.
NTP_UNIX_OFFSET: Final = 2_208_988_800

# RFC 3550 A.1 constants.
MAX_DROPOUT: Final = 3000
MAX_MISORDER: Final = 100
RTP_SEQ_MOD: Final = 1 << 16


def ntp_from_unix(seconds: float) -> tuple[int, int]:
    """Unix seconds -> 64-bit NTP timestamp as ``(msw, lsw)`` (RFC 3550 §4).

    The seconds word wraps in 2036 (era 1); that wrap is harmless because only the
    middle 32 bits are ever compared (``compact_ntp``).
    """
    ntp = seconds + NTP_UNIX_OFFSET
    msw = math.floor(ntp)
    lsw = min(int((ntp - msw) * (1 << 32)), 0xFFFFFFFF)
    return msw & 0xFFFFFFFF, lsw


def unix_from_ntp(msw: int, lsw: int) -> float:
    """Inverse of :func:`ntp_from_unix` for era 0 (until 2036)."""
    return msw - NTP_UNIX_OFFSET + lsw / (1 << 32)


def compact_ntp(msw: int, lsw: int) -> int:
    """The middle 32 bits of an NTP timestamp (16.16 fixed point), as in LSR (§6.4.1)."""
    return ((msw & 0xFFFF) << 16) | (lsw >> 16)


def rtt_from_compact(a: int, lsr: int, dlsr: int) -> float | None:
    """RFC 3550 §6.4.1: RTT = A - LSR - DLSR, all 16.16 fixed point, in seconds.

    ``None`` when LSR is 0 (the peer has not seen an SR from us) or the result is
    clearly negative (clock trouble or a forged report); a tiny negative from rounding
    the 1/65536 s fields is reported as 0.
    """
    if lsr == 0:
        return None
    diff = (a - lsr - dlsr) & 0xFFFFFFFF
    if diff >= 1 << 31:  # negative in 32-bit two's complement
        return 0.0 if (1 << 32) - diff <= 65 else None  # within ~1 ms
    return diff / 65536


def rtt_from_report_block(now_unix: float, lsr: int, dlsr: int) -> float | None:
    """RTT in seconds from a report block about our stream, received at ``now_unix``."""
    return rtt_from_compact(compact_ntp(*ntp_from_unix(now_unix)), lsr, dlsr)


@dataclass(slots=True)
class ReceptionStats:
    """Receiver-side statistics for one remote SSRC (RFC 3550 A.1, A.3, A.8).

    Feed every authenticated packet to :meth:`update`; call :meth:`report_block` when
    writing an RR/SR and :meth:`on_sender_report` when the peer's SR arrives.
    """

    ssrc: int
    clock_rate: int = 48000
    _init: bool = False
    max_seq: int = 0
    cycles: int = 0  # count of wraps, times 65536
    base_seq: int = 0
    bad_seq: int = RTP_SEQ_MOD + 1  # "not a valid sequence number"
    received: int = 0
    expected_prior: int = 0
    received_prior: int = 0
    jitter: float = 0.0  # RTP timestamp units, A.8 (kept as float; reported truncated)
    _last_ts: int = 0
    _last_arrival: float = 0.0
    _lsr: int = 0
    _lsr_arrival: float = 0.0
    last_fraction_lost: int = 0

    def _init_seq(self, seq: int) -> None:
        self.base_seq = seq
        self.max_seq = seq
        self.bad_seq = RTP_SEQ_MOD + 1
        self.cycles = 0
        self.received = 0
        self.received_prior = 0
        self.expected_prior = 0

    def update(self, seq: int, rtp_timestamp: int, arrival: float) -> bool:
        """Account one packet. Returns False if A.1 judged it a stray (not counted)."""
        if not self._init:
            self._init = True
            self._init_seq(seq)
        else:
            udelta = (seq - self.max_seq) & 0xFFFF
            if udelta < MAX_DROPOUT:
                # In order, with a permissible gap. A smaller seq means a wrap.
                if seq < self.max_seq:
                    self.cycles += RTP_SEQ_MOD
                self.max_seq = seq
            elif udelta <= RTP_SEQ_MOD - MAX_MISORDER:
                # A very large jump: believe it only if the next packet continues it
                # (the sender restarted), otherwise it is a stray and is not counted.
                if seq == self.bad_seq:
                    self._init_seq(seq)
                else:
                    self.bad_seq = (seq + 1) & 0xFFFF
                    return False
            # Otherwise a duplicate or a reordered packet: counted, max_seq unchanged.
        self.received += 1
        self._update_jitter(rtp_timestamp, arrival)
        return True

    def _update_jitter(self, rtp_timestamp: int, arrival: float) -> None:
        # A.8: D(i-1, i) = (Rj - Ri) - (Sj - Si) in timestamp units; J += (|D| - J)/16.
        # Computed from deltas rather than absolute "transit" so a 32-bit timestamp wrap
        # between two packets is a small signed difference, not a 2^32 spike.
        if self.received > 1:
            ts_delta = ((rtp_timestamp - self._last_ts + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
            d = (arrival - self._last_arrival) * self.clock_rate - ts_delta
            self.jitter += (abs(d) - self.jitter) / 16
        self._last_ts = rtp_timestamp
        self._last_arrival = arrival

    @property
    def extended_highest_seq(self) -> int:
        return self.cycles + self.max_seq

    @property
    def expected(self) -> int:
        return self.extended_highest_seq - self.base_seq + 1 if self._init else 0

    @property
    def cumulative_lost(self) -> int:
        # A.3: may be negative with duplicates; clamp to the signed 24-bit field.
        return max(-(1 << 23), min((1 << 23) - 1, self.expected - self.received))

    @property
    def jitter_seconds(self) -> float:
        return self.jitter / self.clock_rate

    def on_sender_report(self, ntp_msw: int, ntp_lsw: int, arrival: float) -> None:
        """Remember the peer's last SR for LSR/DLSR in our next report (§6.4.1)."""
        self._lsr = compact_ntp(ntp_msw, ntp_lsw)
        self._lsr_arrival = arrival

    def report_block(self, now: float) -> ReportBlock:
        """A report block as of ``now``; advances the fraction-lost interval (A.3)."""
        expected = self.expected
        expected_interval = expected - self.expected_prior
        self.expected_prior = expected
        received_interval = self.received - self.received_prior
        self.received_prior = self.received
        lost_interval = expected_interval - received_interval
        if expected_interval <= 0 or lost_interval <= 0:
            fraction = 0
        else:
            fraction = min(255, (lost_interval << 8) // expected_interval)
        self.last_fraction_lost = fraction
        dlsr = 0
        if self._lsr:
            dlsr = max(0, min(0xFFFFFFFF, int((now - self._lsr_arrival) * 65536)))
        return ReportBlock(
            ssrc=self.ssrc,
            fraction_lost=fraction,
            cumulative_lost=self.cumulative_lost,
            highest_sequence=self.extended_highest_seq & 0xFFFFFFFF,
            jitter=min(int(self.jitter), 0xFFFFFFFF),
            lsr=self._lsr,
            dlsr=dlsr,
        )


@dataclass(slots=True)
class SenderStats:
    """Sender-side counters for one local SSRC, producing SRs (RFC 3550 §6.4.1)."""

    ssrc: int
    clock_rate: int = 48000
    packet_count: int = 0
    octet_count: int = 0  # payload octets only: no header, no padding (§6.4.1)
    _last_ts: int | None = None
    _last_send: float = 0.0

    def on_packet(self, payload_size: int, rtp_timestamp: int, now: float) -> None:
        self.packet_count = (self.packet_count + 1) & 0xFFFFFFFF
        self.octet_count = (self.octet_count + payload_size) & 0xFFFFFFFF
        self._last_ts = rtp_timestamp
        self._last_send = now

    def rtp_timestamp_at(self, now: float) -> int:
        """The RTP timestamp corresponding to ``now`` (§6.4.1: same instant as NTP)."""
        if self._last_ts is None:
            return 0
        return (self._last_ts + round((now - self._last_send) * self.clock_rate)) & 0xFFFFFFFF

    def sender_report(
        self, now: float, now_unix: float, reports: tuple[ReportBlock, ...] = ()
    ) -> RtcpSenderReport:
        """An SR stamped ``now_unix`` (wall clock for NTP; ``now`` on the media clock)."""
        msw, lsw = ntp_from_unix(now_unix)
        return RtcpSenderReport(
            ssrc=self.ssrc,
            ntp_msw=msw,
            ntp_lsw=lsw,
            rtp_timestamp=self.rtp_timestamp_at(now),
            packet_count=self.packet_count,
            octet_count=self.octet_count,
            reports=reports,
        )
