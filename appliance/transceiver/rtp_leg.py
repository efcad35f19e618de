"""``RtpLeg``: a call's audio over plain RTP (RTP/AVP) or SDES-keyed SRTP (RTP/SAVP, RFC
4568 keys) to a remote address taken from SDP — what a SIP trunk sends — as a sans-IO
:class:`MediaLeg`: the PCM pipeline plugs into it exactly as into a WebRTC call.

::

    shell (sockets) ── handle_input(now, data, addr) ──►┌──────── RtpLeg ─────────┐
                                                       │ RFC 5761 demux RTP/RTCP │
                                                       │ SRTP unprotect (SDES)   │
                    ◄── poll_output(): Transmit(..) ────│ latching (below)        │
                        Latched, Dtmf, Ended           │ RTCP SR/RR, BYE         │
                                                       │ DTMF rx/tx (RFC 4733)   │
                                                       └──┬────────────────▲─────┘
                              media.handle_rtp(now, plain, ssrc, …)        │ send_rtp / send_dtmf
                                                          ▼                │
                                                  PcmPipeline (the media slot)

Demultiplexing (STYLE.md rule 7): a pure look at the second byte, RFC 5761 §4 — 192..223
(RTCP packet types 200-207 with their top bit) is RTCP, anything else RTP. It holds with or
without rtcp-mux because we never negotiate a payload type in 64..95 (refused here). With a
separate RTCP port (RFC 3550 §11, or ``a=rtcp``, RFC 3605) our RTCP leaves as
``Transmit(..., rtcp=True)``: the shell sends it from its RTCP socket.

Latching — symmetric RTP (RFC 4961: the peer receives on the port it sends from), moving
our destination to where the peer's media really comes from (a NAT'd phone signals its
private address). The exact rule, one state per component (RTP; RTCP when not muxed):

1. Until latched, we send to the signalled address (SDP ``c=``/``m=``; ``a=rtcp``).
2. **SRTP**: the first packet that *authenticates* (libsrtp unprotect succeeds: the MAC or
   GCM tag verifies and it is not a replay) latches its source. Only key holders can
   produce one, so a stray source cannot. Once latched, packets from any other source are
   dropped *unread* (no decryption attempted), except when nothing has authenticated from
   the latched source for ``rebind_after`` seconds (a NAT rebinding): then the next
   authenticating packet from the new source moves the latch. A replayed packet fails
   libsrtp's replay check; only an on-path attacker holding packets we never received
   could move it (and an on-path attacker can drop our media anyway).
3. **Plain RTP** (nothing authenticates): the source must look like the peer's stream. A
   packet from exactly the signalled address latches at once. Any other source must first
   send ``latch_packets`` consecutive packets (sequence numbers +1 each) with one SSRC and
   a negotiated payload type (and the SSRC from ``a=ssrc`` when the SDP gave one); packets
   before that are not delivered. Once latched, **the latch never moves** for the life of
   the leg: every other source is a stray, dropped and counted. A new remote (re-INVITE)
   is a new leg. Residual risk, inherent to unauthenticated RTP: before the peer's first
   packet, an off-path sender that guesses the port and sends ``latch_packets`` packets
   first wins the race when the peer is not at its signalled address (use SRTP).
4. RTCP follows: SRTCP authenticates like rule 2. Plain RTCP is accepted from the
   latched RTP source (muxed) or, on a separate port, from the signalled RTCP address or
   any port of the latched RTP source's IP (its NAT keeps the address); the first such
   latches the RTCP destination, which then never moves.

Media timeout: no accepted RTP or RTCP for ``media_timeout`` seconds (while we expect to
receive: not on hold) ends the leg, ``Ended("rtp-timeout")``. ``close`` sends an RTCP BYE
(RFC 3550 §6.6) when RTCP is in use.

Outbound sequence numbers: the media slot numbers its audio packets; telephone-events
share the stream (one SSRC, RFC 4733 §2.1) and need numbers too, so the leg keeps an
offset: each DTMF packet takes the next number and shifts the audio after it by one.

RTCP is the one RTP session piece every leg shares (``rtcp.py``): an
:class:`~.rtcp.RtcpMonitor` at the codec's clock rate keeps the statistics and writes the
reports, and the leg queues the same :class:`~.rtcp.RemoteReport` / :class:`~.rtcp.ReportSent`
outputs a WebRTC call does, so the call's shell adapts Opus FEC to the far end's loss and
sends the agent its ``stats`` event whatever the leg. The leg satisfies the seam's
``MediaLeg`` Protocol (``leg.py``) structurally.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp import (
    ReceptionStats,
    RtcpPacket,
    RtpError,
    SenderStats,
    parse_rtcp_untrusted,
    rtp_header,
    rtp_header_fields_untrusted,
)
from appliance.proto.rtp.dtmf import DtmfReceiver, DtmfSender
from appliance.proto.sdp.sdes import CryptoSuite
from appliance.proto.srtp import KeyingMaterial, SrtpError, SrtpProfile, SrtpSession

from .leg import MediaStream
from .rtcp import RemoteReport, ReportSent, RtcpMonitor

Address = tuple[str, int]

RTCP_INTERVAL: Final = 5.0  # RFC 3550 §6.2 minimum for a two-party session
MEDIA_TIMEOUT: Final = 30.0
LATCH_PACKETS: Final = 3
REBIND_AFTER: Final = 1.0
MAX_CANDIDATES: Final = 16  # plain-RTP sources being watched before the latch

#: SDES suite -> DTLS-SRTP profile (same transforms, RFC 5764 §4.1.2 / RFC 7714 §14),
#: whose pylibsrtp Policy constants ``proto/srtp/session.py`` maps.
SUITE_PROFILES: Final[dict[CryptoSuite, SrtpProfile]] = {
    CryptoSuite.AES_CM_128_HMAC_SHA1_80: SrtpProfile.AES128_CM_HMAC_SHA1_80,
    CryptoSuite.AES_CM_128_HMAC_SHA1_32: SrtpProfile.AES128_CM_HMAC_SHA1_32,
    CryptoSuite.AEAD_AES_128_GCM: SrtpProfile.AEAD_AES_128_GCM,
    CryptoSuite.AEAD_AES_256_GCM: SrtpProfile.AEAD_AES_256_GCM,
}


# -- configuration and outputs ------------------------------------------------------------


@dataclass(frozen=True, slots=True, repr=False)
class SdesKeys:
    """Both directions' SDES key material: ``local`` is what our ``a=crypto`` carried (we
    protect with it), ``remote`` the peer's (we unprotect with it). Each is key || salt."""

    suite: CryptoSuite
    local: bytes
    remote: bytes

    def __post_init__(self) -> None:
        n = self.suite.material_length
        if len(self.local) != n or len(self.remote) != n:
            raise LocalProtocolError(f"{self.suite.value} keys must be {n} bytes each")

    def __repr__(self) -> str:
        return f"SdesKeys(suite={self.suite.value}, local=<redacted>, remote=<redacted>)"

    __str__ = __repr__

    def session(self) -> SrtpSession:
        k = self.suite.key_length
        return SrtpSession(SUITE_PROFILES[self.suite],
                           KeyingMaterial(self.local[:k], self.local[k:]),
                           KeyingMaterial(self.remote[:k], self.remote[k:]))


@dataclass(frozen=True, slots=True)
class RtpLegConfig:
    """What the offer/answer decided for one audio m= section (the SIP layer fills it)."""

    remote: Address  # c= address and m= port
    ssrc: int  # ours
    payload_type: int  # the audio codec: 0 PCMU, 8 PCMA, Opus's dynamic pt
    clock_rate: int = 8000  # the codec's RTP clock (Opus: 48000), telephone-event's too
    dtmf_payload_type: int | None = None  # telephone-event's dynamic pt, if negotiated
    srtp: SdesKeys | None = None  # None: plain RTP/AVP
    rtcp_mux: bool = False  # a=rtcp-mux in both offer and answer (RFC 5761)
    remote_rtcp: Address | None = None  # a=rtcp (RFC 3605); None: RTP port + 1
    rtcp: bool = True  # False: the peer wants no RTCP (b=RR:0 / b=RS:0, RFC 3556)
    remote_ssrc: int | None = None  # a=ssrc from the peer's SDP, when it gave one
    cname: str = "appliance"
    media_timeout: float | None = MEDIA_TIMEOUT
    rtcp_interval: float = RTCP_INTERVAL
    latch_packets: int = LATCH_PACKETS
    rebind_after: float = REBIND_AFTER
    dtmf_interval: float = 0.05  # RFC 4733 update spacing (0.02 to follow a 20 ms ptime)
    wall_offset: float = 0.0  # now + wall_offset = Unix time, for SR NTP timestamps

    def __post_init__(self) -> None:
        for pt in (self.payload_type, self.dtmf_payload_type):
            # RFC 5761 §4: 64-95 would collide with RTCP packet types when demuxing.
            if pt is not None and not (0 <= pt <= 127 and not 64 <= pt <= 95):
                raise LocalProtocolError(f"payload type {pt} is not usable (0..63, 96..127)")
        if self.latch_packets < 1:
            raise LocalProtocolError("latch_packets must be at least 1")

    @property
    def rtcp_address(self) -> Address:
        if self.rtcp_mux:
            return self.remote
        return self.remote_rtcp or (self.remote[0], self.remote[1] + 1)


@dataclass(frozen=True, slots=True)
class Transmit:
    """A datagram for the shell: send ``payload`` to ``addr`` from our RTP socket, or from
    our RTCP socket when ``rtcp`` (separate-port RTCP only; with rtcp-mux always False)."""

    payload: bytes
    addr: Address
    rtcp: bool = False


@dataclass(frozen=True, slots=True)
class Latched:
    """Our destination for RTP (``rtcp`` False) or RTCP moved to ``addr``."""

    addr: Address
    previous: Address
    rtcp: bool = False


@dataclass(frozen=True, slots=True)
class Dtmf:
    """A digit the peer pressed (RFC 4733): reported once, ``duration`` in seconds;
    ``ended`` is False when its end packets were lost."""

    digit: str | None
    duration: float
    ended: bool = True


@dataclass(frozen=True, slots=True)
class Ended:
    """The leg is over: ``reason`` is the ``close`` reason or ``"rtp-timeout"``."""

    reason: str


LegOutput = Transmit | Latched | Dtmf | RemoteReport | ReportSent | Ended


@dataclass(slots=True)
class LegCounters:
    rtp_in: int = 0  # delivered (audio) or consumed (DTMF)
    rtcp_in: int = 0
    stray: int = 0  # from a source other than the latched one
    learning: int = 0  # plain RTP held back while a source proves itself
    wrong_pt: int = 0
    wrong_ssrc: int = 0
    malformed: int = 0
    auth_failed: int = 0  # includes replays
    rtp_out: int = 0
    dtmf_out: int = 0
    rtcp_out: int = 0


@dataclass(slots=True)
class _Latch:
    """One component's latching state (module docstring, rules 1-4)."""

    dest: Address
    latched: Address | None = None
    last_auth: float = float("-inf")  # last packet accepted from ``latched``
    candidates: dict[Address, tuple[int, int, int]] = field(default_factory=dict)


def _source(addr: tuple[object, ...]) -> Address:
    # Socket addresses may be (host, port, flowinfo, scope): only host and port identify.
    host, port = addr[0], addr[1]
    assert isinstance(host, str) and isinstance(port, int)
    return host, port


class RtpLeg:
    """One audio stream over RTP/AVP or RTP/SAVP (module docstring). Sans-IO: the shell
    feeds :meth:`handle_input`, drains :meth:`poll_output`, sleeps to :meth:`poll_timeout`
    and calls :meth:`handle_timeout`."""

    def __init__(self, config: RtpLegConfig, now: float, *,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self.media: MediaStream | None = None
        self.counters = LegCounters()
        self._rng = rng or random.Random()
        self._srtp = config.srtp.session() if config.srtp is not None else None
        self._out: deque[LegOutput] = deque()
        self._rtp = _Latch(config.remote)
        self._rtcp = _Latch(config.rtcp_address)
        self._closed = False
        self._now = now
        self._send = True  # direction: we may send (not recvonly / inactive)
        self._receive = True  # we expect media (not sendonly / inactive: hold)
        self._deadline = now + config.media_timeout if config.media_timeout else None
        self.rtcp = RtcpMonitor(config.ssrc, config.cname, wall_offset=config.wall_offset,
                                interval=config.rtcp_interval, rng=self._rng,
                                clock_rate=config.clock_rate)
        if config.rtcp:  # (False: no reports; the peer's are still read)
            self.rtcp.start(now)
        self._seq_offset = 0
        self._last_seq: int | None = None
        self._initial_ts = self._rng.getrandbits(32)
        self._dtmf_rx = DtmfReceiver(config.clock_rate)
        self._dtmf_tx = DtmfSender(config.clock_rate, interval=config.dtmf_interval)

    # -- MediaLeg ------------------------------------------------------------------------

    @property
    def ssrc(self) -> int:
        return self.config.ssrc

    @property
    def payload_type(self) -> int | None:
        return self.config.payload_type

    @property
    def rx(self) -> ReceptionStats | None:
        """The peer's stream's reception statistics (the RTCP monitor's)."""
        return self.rtcp.rx

    @property
    def tx(self) -> SenderStats:
        return self.rtcp.tx

    @property
    def rtt(self) -> float | None:
        return self.rtcp.rtt

    @property
    def remote_loss(self) -> float | None:
        return self.rtcp.remote_loss

    @property
    def destination(self) -> Address:
        """Where our RTP goes now (the signalled address until a latch moves it)."""
        return self._rtp.dest

    @property
    def rtcp_destination(self) -> Address:
        return self._rtp.dest if self.config.rtcp_mux else self._rtcp.dest

    @property
    def latched(self) -> Address | None:
        return self._rtp.latched

    @property
    def closed(self) -> bool:
        return self._closed

    def can_send(self) -> bool:
        return not self._closed and self._send

    def set_direction(self, direction: str) -> None:
        """Our side's SDP direction after a re-INVITE (hold): ``sendrecv``, ``sendonly``,
        ``recvonly`` or ``inactive``. Not receiving pauses the media timeout."""
        if direction not in ("sendrecv", "sendonly", "recvonly", "inactive"):
            raise LocalProtocolError(f"not an SDP direction: {direction!r}")
        self._send = direction in ("sendrecv", "sendonly")
        self._receive = direction in ("sendrecv", "recvonly")

    def send_rtp(self, now: float, seq: int, ts: int, marker: bool, payload: bytes) -> None:
        if not self.can_send():
            return
        self._now = now
        if self._last_seq is not None and self.tx.packet_count == self.counters.dtmf_out:
            # The first audio packet after DTMF-only packets: continue their numbering.
            self._seq_offset = (self._last_seq + 1 - seq) & 0xFFFF
        out_seq = (seq + self._seq_offset) & 0xFFFF
        self._last_seq = out_seq
        packet = rtp_header(self.config.payload_type, out_seq, ts, self.config.ssrc,
                            marker) + payload
        self.tx.on_packet(len(payload), ts, now)
        self.counters.rtp_out += 1
        self._transmit_rtp(packet)

    def send_dtmf(self, now: float, digit: str, duration: float = 0.1) -> None:
        """Press ``digit`` (``0-9 * # A-D``) for ``duration`` seconds (RFC 4733 §2.5.1);
        queued behind a digit still being sent."""
        if self.config.dtmf_payload_type is None:
            raise LocalProtocolError("telephone-event was not negotiated")
        if self._closed:
            return
        self._now = now
        if self.tx.packet_count > self.counters.dtmf_out:
            ts = self.tx.rtp_timestamp_at(now)
        else:
            ts = self._initial_ts
        self._dtmf_tx.send(now, digit, duration, ts)
        self._drain_dtmf_tx()

    def close(self, reason: str) -> None:
        if self._closed:
            return
        if self.config.rtcp and self._send:
            self._send_report(bye=True)
        self._closed = True
        self._out.append(Ended(reason))

    # -- sans-IO verbs -------------------------------------------------------------------

    def handle_input(self, now: float, data: bytes, addr: tuple[object, ...]) -> None:
        """One datagram from ``addr`` on our RTP or RTCP socket."""
        if self._closed:
            return
        self._now = now
        if len(data) < 2 or data[0] >> 6 != 2:
            self.counters.malformed += 1
            return
        src = _source(addr)
        if 192 <= data[1] <= 223:  # RFC 5761 §4: RTCP packet types 192..223
            self._handle_rtcp(now, data, src)
        else:
            self._handle_rtp(now, data, src)

    def poll_output(self) -> LegOutput | None:
        """The next output in the order it was queued; None when drained."""
        return self._out.popleft() if self._out else None

    def poll_timeout(self) -> float | None:
        if self._closed:
            return None
        times = [t for t in (self._deadline if self._receive else None, self.rtcp.next_report,
                             self._dtmf_tx.poll_timeout(), self._dtmf_rx.poll_timeout(),
                             self.media.poll_timeout() if self.media is not None else None)
                 if t is not None]
        return min(times) if times else None

    def handle_timeout(self, now: float) -> None:
        if self._closed:
            return
        self._now = now
        if self._receive and self._deadline is not None and now >= self._deadline:
            self.close("rtp-timeout")
            return
        if self.rtcp.due(now):
            self._send_report(bye=False)  # (the monitor schedules the next one)
        self._dtmf_tx.handle_timeout(now)
        self._drain_dtmf_tx()
        self._dtmf_rx.handle_timeout(now)
        self._drain_dtmf_rx()
        if self.media is not None:
            due = self.media.poll_timeout()
            if due is not None and now >= due:
                self.media.handle_timeout(now)

    # -- inbound -------------------------------------------------------------------------

    def _handle_rtp(self, now: float, data: bytes, src: Address) -> None:
        latch = self._rtp
        cfg = self.config
        if self._srtp is not None:
            if not self._may_try(latch, src, now):
                self.counters.stray += 1
                return
            try:
                plain = self._srtp.unprotect_untrusted(data)
            except SrtpError:
                self.counters.auth_failed += 1
                return
        else:
            plain = data
        try:
            pt, seq, ts, ssrc, marker, off, end = rtp_header_fields_untrusted(plain)
        except RtpError:
            self.counters.malformed += 1
            return
        if self._srtp is not None:
            # Rule 2: it authenticated, whatever its payload type (comfort noise counts).
            self._latch_to(latch, src, now, rtcp=False)
        if pt != cfg.payload_type and pt != cfg.dtmf_payload_type:
            self.counters.wrong_pt += 1
            return
        if self._srtp is None and not self._plain_rtp_source_ok(latch, src, ssrc, seq, now):
            return
        self._deadline = now + cfg.media_timeout if cfg.media_timeout else None
        self.rtcp.on_rtp(now, ssrc, seq, ts)
        self.counters.rtp_in += 1
        if pt == cfg.payload_type:
            if self.media is not None:
                self.media.handle_rtp(now, plain, ssrc, seq, ts, marker, off, end)
        else:
            self._dtmf_rx.handle_input(now, plain[off:end], ts)
            self._drain_dtmf_rx()

    def _may_try(self, latch: _Latch, src: Address, now: float) -> bool:
        """SRTP rule 2: whether a packet from ``src`` is worth decrypting at all."""
        return (latch.latched is None or src == latch.latched
                or now - latch.last_auth >= self.config.rebind_after)

    def _plain_rtp_source_ok(self, latch: _Latch, src: Address, ssrc: int, seq: int,
                             now: float) -> bool:
        """Plain-RTP rule 3. True: deliver this packet."""
        cfg = self.config
        if latch.latched is not None:
            if src != latch.latched:
                self.counters.stray += 1
                return False
            latch.last_auth = now
            return True
        if cfg.remote_ssrc is not None and ssrc != cfg.remote_ssrc:
            self.counters.wrong_ssrc += 1
            return False
        if src == cfg.remote:
            self._latch_to(latch, src, now, rtcp=False)
            return True
        prior = latch.candidates.pop(src, None)
        count = 1
        if prior is not None and prior[0] == ssrc and (prior[1] + 1) & 0xFFFF == seq:
            count = prior[2] + 1
        if count >= cfg.latch_packets:
            latch.candidates.clear()
            self._latch_to(latch, src, now, rtcp=False)
            return True
        if len(latch.candidates) >= MAX_CANDIDATES:
            latch.candidates.pop(next(iter(latch.candidates)))  # the longest unheard
        latch.candidates[src] = (ssrc, seq, count)
        self.counters.learning += 1
        return False

    def _latch_to(self, latch: _Latch, src: Address, now: float, *, rtcp: bool) -> None:
        latch.last_auth = now
        if latch.latched == src:
            return
        latch.latched = src
        previous, latch.dest = latch.dest, src
        self._out.append(Latched(src, previous, rtcp))

    def _handle_rtcp(self, now: float, data: bytes, src: Address) -> None:
        cfg = self.config
        # Muxed RTCP shares the RTP component's latch (rule 4) but never moves it.
        latch = self._rtp if cfg.rtcp_mux else self._rtcp
        if self._srtp is not None:
            if not self._may_try(latch, src, now):
                self.counters.stray += 1
                return
            try:
                plain = self._srtp.unprotect_rtcp_untrusted(data)
            except SrtpError:
                self.counters.auth_failed += 1
                return
            if not cfg.rtcp_mux:
                self._latch_to(latch, src, now, rtcp=True)
            elif src == latch.latched:
                latch.last_auth = now
        else:
            plain = data
            if not self._plain_rtcp_source_ok(src, now):
                self.counters.stray += 1
                return
        try:
            packets = parse_rtcp_untrusted(plain)
        except RtpError:
            self.counters.malformed += 1
            return
        self.counters.rtcp_in += 1
        self._deadline = now + cfg.media_timeout if cfg.media_timeout else None
        self._on_rtcp(now, packets)

    def _plain_rtcp_source_ok(self, src: Address, now: float) -> bool:
        cfg = self.config
        rtp = self._rtp
        if cfg.rtcp_mux:
            return src == (rtp.latched or cfg.remote)
        latch = self._rtcp
        if latch.latched is not None:
            return src == latch.latched
        if src == cfg.rtcp_address or (rtp.latched is not None and src[0] == rtp.latched[0]):
            self._latch_to(latch, src, now, rtcp=True)
            return True
        return False

    def _on_rtcp(self, now: float, packets: list[RtcpPacket]) -> None:
        # SR timing for our next report block, RTT and the peer's view of our stream; a
        # BYE changes nothing (the SIP BYE ends the call).
        if self.rtcp.on_rtcp(now, packets):
            self._out.append(self.rtcp.remote_report())  # the shell: Opus FEC follows it

    def _drain_dtmf_rx(self) -> None:
        while (press := self._dtmf_rx.poll_output()) is not None:
            self._out.append(Dtmf(press.digit, press.duration, press.ended))

    # -- outbound ------------------------------------------------------------------------

    def _transmit_rtp(self, packet: bytes) -> None:
        if self._srtp is not None:
            packet = self._srtp.protect(packet)
        self._out.append(Transmit(packet, self._rtp.dest))

    def _drain_dtmf_tx(self) -> None:
        pt = self.config.dtmf_payload_type
        assert pt is not None or not self._dtmf_tx.busy
        while (pkt := self._dtmf_tx.poll_output()) is not None:
            assert pt is not None
            if self._last_seq is None:
                self._last_seq = self._rng.getrandbits(16)
            seq = (self._last_seq + 1) & 0xFFFF
            self._last_seq = seq
            self._seq_offset = (self._seq_offset + 1) & 0xFFFF
            self.tx.packet_count += 1
            self.tx.octet_count += len(pkt.payload)
            self.counters.dtmf_out += 1
            if not self.can_send():
                continue
            self._transmit_rtp(rtp_header(pt, seq, pkt.timestamp, self.config.ssrc,
                                          pkt.marker) + pkt.payload)

    def _send_report(self, *, bye: bool) -> None:
        now = self._now  # close() has no ``now``: the latest time any input gave us
        # An SR once audio went out (§6.4.1): telephone-events alone leave it an RR.
        data = self.rtcp.report(now, bye=bye,
                                sent_media=self.tx.packet_count > self.counters.dtmf_out)
        if self._srtp is not None:
            data = self._srtp.protect_rtcp(data)
        self.counters.rtcp_out += 1
        self._out.append(Transmit(data, self.rtcp_destination, rtcp=not self.config.rtcp_mux))
        if not bye:
            self._out.append(ReportSent())  # the shell: the agent's ``stats`` event
