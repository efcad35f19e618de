"""RTCP for one call's audio stream, sans-IO: reception and sending statistics, the reports
we send and what the client's reports tell us (RFC 3550 §6). The one RTCP piece of every
leg: a WebRTC call (``call.py``) and a SIP leg (``rtp_leg.py``) each hold one
:class:`RtcpMonitor` at their codec's RTP clock rate, and both queue the same two outputs
for the call's shell (``shell.py``): :class:`RemoteReport` (the far end's view of our
stream: Opus FEC follows its loss) and :class:`ReportSent` (the agent's ``stats`` event).

* In: every RTP packet's (SSRC, sequence, timestamp) goes into :class:`ReceptionStats`
  (A.1 sequence tracking, A.8 interarrival jitter); a client SR is remembered for the LSR/DLSR
  of our next report block (§6.4.1); a report block about our SSRC gives the round trip
  (§6.4.1, from LSR/DLSR), the client's jitter and its fraction lost.
* Out: one compound packet every ``interval`` (randomised 0.5-1.5x, §6.3.1, to avoid
  synchronisation): an SR once we have sent media (an RR before), always with SDES CNAME
  (§6.1: every compound packet carries it). NACK and PLI are ignored (audio, no
  retransmission); a BYE only when the leg asks (a SIP leg's close: RFC 3550 §6.6; a
  WebRTC call's DTLS close_notify ends it instead).

Time is passed in. NTP wall-clock time (SR timestamps, RTT arithmetic in compact NTP) is
``now + wall_offset``: one offset taken when the call was made, so the monotonic clock the
rest of the call runs on is the only clock read.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from appliance.proto.rtp import (
    ReceptionStats,
    RtcpBye,
    RtcpPacket,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    SdesChunk,
    SdesItem,
    SenderStats,
    rtt_from_report_block,
    serialize_rtcp,
)

RTCP_INTERVAL = 5.0  # RFC 3550 §6.2 minimum for a two-party session is 5 s
CLOCK_RATE = 48_000  # Opus RTP clock (RFC 7587 §4.1); G.711's is 8000


@dataclass(frozen=True, slots=True)
class RemoteReport:
    """An RTCP report block about our stream: the far end's view of it."""

    rtt: float | None  # seconds, None until an SR of ours was echoed
    jitter: float  # seconds
    loss: float  # fraction lost since its previous report, 0..1


@dataclass(frozen=True, slots=True)
class ReportSent:
    """We sent an RTCP report (every ~``rtcp_interval``): a good time to tell the agent the
    call's figures (the ``stats`` event)."""


class RtcpMonitor:
    """Statistics both ways and the report schedule of one audio stream, at the codec's
    RTP ``clock_rate`` (jitter in timestamp units becomes seconds with it)."""

    __slots__ = ("ssrc", "cname", "interval", "wall_offset", "clock_rate", "rx", "tx", "rtt",
                 "remote_jitter", "remote_loss", "next_report", "_rng")

    def __init__(self, ssrc: int, cname: str, *, wall_offset: float,
                 interval: float = RTCP_INTERVAL, rng: random.Random | None = None,
                 clock_rate: int = CLOCK_RATE) -> None:
        self.ssrc = ssrc
        self.cname = cname
        self.interval = interval
        self.wall_offset = wall_offset
        self.clock_rate = clock_rate
        self.rx: ReceptionStats | None = None  # the client's stream, once one packet came
        self.tx = SenderStats(ssrc, clock_rate=clock_rate)
        self.rtt: float | None = None
        self.remote_jitter: float | None = None  # the client's view of our stream, seconds
        self.remote_loss: float | None = None  # fraction 0..1
        self.next_report: float | None = None  # None: not reporting (before SRTP is keyed)
        self._rng = rng or random.Random()

    def start(self, now: float) -> None:
        """SRTP is keyed: the first report goes out within 0.5-1.5 intervals."""
        self.next_report = now + self._jittered()

    def _jittered(self) -> float:
        # RFC 3550 §6.3.1: randomise the interval (0.5..1.5 x) to avoid synchronisation.
        return self.interval * (0.5 + self._rng.random())

    # -- in ---------------------------------------------------------------------------

    def on_rtp(self, now: float, ssrc: int, seq: int, ts: int) -> None:
        """One RTP packet of the client's stream (ServerCall.handle_rtp inlines this)."""
        rx = self.rx
        if rx is None or rx.ssrc != ssrc:  # first packet, or the client changed SSRC
            rx = self.rx = ReceptionStats(ssrc, clock_rate=self.clock_rate)
        rx.update(seq, ts, now)

    def on_rtcp(self, now: float, packets: list[RtcpPacket]) -> bool:
        """Take one compound packet; True if it carried a report block about our stream
        (``rtt``/``remote_jitter``/``remote_loss`` updated)."""
        about_us = False
        for p in packets:
            if isinstance(p, RtcpSenderReport):
                if self.rx is not None:
                    self.rx.on_sender_report(p.ntp_msw, p.ntp_lsw, now)
                blocks = p.reports
            elif isinstance(p, RtcpReceiverReport):
                blocks = p.reports
            else:
                continue  # SDES, BYE (signaling ends the call), NACK, PLI: nothing for audio
            for block in blocks:
                if block.ssrc != self.ssrc:
                    continue
                rtt = rtt_from_report_block(now + self.wall_offset, block.lsr, block.dlsr)
                if rtt is not None:
                    self.rtt = rtt
                self.remote_jitter = block.jitter / self.clock_rate
                self.remote_loss = block.fraction_lost / 256
                about_us = True
        return about_us

    # -- out --------------------------------------------------------------------------

    def on_sent(self, now: float, payload_size: int, ts: int) -> None:
        self.tx.on_packet(payload_size, ts, now)

    def poll_timeout(self) -> float | None:
        return self.next_report

    def due(self, now: float) -> bool:
        return self.next_report is not None and now >= self.next_report

    def report(self, now: float, *, bye: bool = False, sent_media: bool | None = None) -> bytes:
        """The plaintext compound packet due now (with a BYE after SDES when ``bye``);
        schedules the next one. An SR once we have sent media (``sent_media``: the leg's
        own answer when not every packet counted is media, e.g. RFC 4733 events), an RR
        before (§6.4.1)."""
        self.next_report = now + self._jittered()
        reports = (self.rx.report_block(now),) if self.rx is not None else ()
        if self.tx.packet_count if sent_media is None else sent_media:
            first: RtcpSenderReport | RtcpReceiverReport = self.tx.sender_report(
                now, now + self.wall_offset, reports)
        else:
            first = RtcpReceiverReport(self.ssrc, reports)
        sdes = RtcpSdes((SdesChunk(self.ssrc, ((SdesItem.CNAME, self.cname.encode()),)),))
        packets: list[RtcpPacket] = [first, sdes]
        if bye:
            packets.append(RtcpBye((self.ssrc,)))
        return serialize_rtcp(packets)

    def remote_report(self) -> RemoteReport:
        """What the last report block about our stream said (after :meth:`on_rtcp` was
        True)."""
        assert self.remote_jitter is not None and self.remote_loss is not None
        return RemoteReport(self.rtt, self.remote_jitter, self.remote_loss)

    # -- figures for the session object (appliance/session_info.py) ---------------------

    def rtt_ms(self) -> float | None:
        return round(self.rtt * 1000, 1) if self.rtt is not None else None

    def jitter_ms(self) -> float | None:
        if self.rx is not None and self.rx.received > 1:
            return round(self.rx.jitter_seconds * 1000, 2)
        return None

    def loss(self) -> float | None:
        rx = self.rx
        if rx is None or rx.expected <= 0:
            return None
        return round(max(0, rx.cumulative_lost) / rx.expected, 4)
