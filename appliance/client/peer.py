"""``ClientPeer``: the offerer side of one audio call, sans-IO.

Composes :class:`~appliance.proto.ice.IceClient` (controlling, aggressive nomination),
a client-role :class:`~appliance.proto.dtls.DtlsConnection` verified against the answer's
fingerprint, and an :class:`~appliance.proto.srtp.SrtpSession` keyed from the DTLS exporter
(RFC 5764 §4.2). Media is one Opus stream; RTP and RTCP share the 5-tuple (RFC 5761).

Flow: ``offer()`` → (HTTP) → ``accept_answer(text, now)`` → ICE check to the answer's first
candidate → on success the DTLS client starts → ``Connected`` → ``send_rtp``/``RtpReceived``.

With ``false_start=True`` (RFC 7918; off by default, browsers do not do it for DTLS-SRTP)
the call counts as connected, and media may flow, once our DTLS Finished is sent rather
than once the server's arrives: half a round trip earlier for the first packet, a whole one
for its echo. As DTLS client; a bad server Finished still fails the call. As DTLS *1.3
server* (the appliance answers ``a=setup:active``) the same option keys SRTP once our flight
(…Finished) is sent — 0.5-RTT data (RFC 8446 §4.4.4, Appendix E.1) — so the first packet
leaves a round trip before the client's Finished: sent to a client whose certificate has
not been checked yet (a bad one still fails the call). A 1.2 server ignores it.

Data channels (``datachannel=True``): the offer gains an ``m=application ... UDP/DTLS/SCTP
webrtc-datachannel`` section (RFC 8841) bundled with the audio, or alone with
``audio=False`` (a data-only call: no SRTP needed, none keyed). Once DTLS is up, the
``sctp`` slot — a :class:`~appliance.proto.sctp.datachannel.DataChannelEndpoint`, the same
sans-IO core the transceiver uses — sends its INIT and rides DTLS application data
(RFC 8261: one SCTP packet per record). The DTLS role picks the channels' stream-id parity
(RFC 8832 §6: client even). Its events come out as :class:`ChannelEvent`; ``open_channel``,
``send_message``, ``close_channel`` feed it.

Against a full-ICE answerer (aiortc, a browser) two more things happen, both handled here:
the answerer sends its own checks, which are answered (RFC 8445 §7.3; it learns our address
as peer-reflexive, §7.3.1.3, since the offer carries no candidates), and it may answer
``a=setup:active`` (RFC 8842 §5.3: the answerer picks), which makes us the DTLS *server*.
The appliance answers that way too (docs/adr-dtls-active.md). As DTLS server we check the
pair every ``SETUP_CHECK_INTERVAL`` (0.4 s) until the handshake is done, as Chromium pings a pair
that is not yet stable (~0.9 s): an ICE-lite DTLS client sends, and retransmits, a flight
only after a fresh check from us, so these checks are what its retransmissions ride on.
"""

from __future__ import annotations

import math
import random
import secrets
from collections import deque
from dataclasses import dataclass

from appliance.proto.dtls import (
    ApplicationData,
    Certificate,
    DtlsConnection,
    FalseStart,
    HandshakeComplete,
    Role,
)
from appliance.proto.dtls import ConnectionClosed as DtlsClosed
from appliance.proto.dtls import State as DtlsState
from appliance.proto.errors import LocalProtocolError, RemoteProtocolError
from appliance.proto.ice import CheckSucceeded, ConnectFailed, ConsentExpired, IceClient
from appliance.proto.mux import Kind, classify
from appliance.proto.rtp import RtpPacket, rtp_header
from appliance.proto.sctp import datachannel as dc
from appliance.proto.sdp import MAX_MESSAGE_SIZE, SCTP_PORT, MediaKind, Setup, parse_offer_untrusted
from appliance.proto.srtp import (
    DEFAULT_SRTP_PROFILES,
    SrtpProfile,
    SrtpSession,
)
from appliance.proto.stun import (
    Class,
    Message,
    Method,
    StunError,
    binding_success,
    verify_fingerprint,
    verify_integrity,
)

Addr = tuple[str, int]
OPUS_PT = 111
#: The most a DTLS record adds to an SCTP packet with our suites (the transceiver's figure,
#: appliance/transceiver/datachannels.py): an SCTP packet must fit one record (RFC 8261 §5).
DTLS_RECORD_OVERHEAD = 37
#: Seconds between our checks while we are the DTLS server and the handshake is not done
#: (then RFC 7675's 5 s consent interval takes over).
SETUP_CHECK_INTERVAL = 0.4
CONSENT_INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class Connected:
    """ICE and DTLS are up and SRTP is keyed; ``setup`` is seconds since ``accept_answer``.
    With ``false_start``: our DTLS Finished is sent (the server's may still be on its way).
    A data-only call keys no SRTP: ``srtp_profile`` is None."""

    srtp_profile: SrtpProfile | None
    setup: float


@dataclass(frozen=True, slots=True)
class ChannelEvent:
    """An event of the ``sctp`` slot (``dc.ChannelOpened``/``ChannelMessage``/
    ``ChannelClosed``/``ChannelBufferedAmountLow``, or the association's ``Connected``/
    ``Closed``), passed on unchanged with when it happened."""

    event: dc.EndpointEvent
    at: float


@dataclass(frozen=True, slots=True)
class RtpReceived:
    packet: RtpPacket
    at: float


@dataclass(frozen=True, slots=True)
class RtcpReceived:
    data: bytes
    at: float


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str


ClientEvent = Connected | RtpReceived | RtcpReceived | ChannelEvent | Failed


class ClientPeer:
    """One call from the client side. Counters: ``rtp_sent``, ``rtp_received``,
    ``srtp_errors``, ``dropped``."""

    def __init__(
        self,
        certificate: Certificate,
        *,
        rng: random.Random | None = None,
        srtp_profiles: tuple[SrtpProfile, ...] | None = None,
        false_start: bool = False,
        dtls_versions: frozenset[str] = frozenset({"1.2"}),
        audio: bool = True,
        datachannel: bool = False,
    ) -> None:
        if not audio and not datachannel:
            raise LocalProtocolError("a call needs audio, a data channel or both")
        self.audio = audio
        self.datachannel = datachannel
        #: The data-channel endpoint, made by accept_answer when the answer served the
        #: application section; None otherwise.
        self.sctp: dc.DataChannelEndpoint | None = None
        self._rng = rng or random.Random(secrets.randbits(64))
        self.certificate = certificate
        self.local_ufrag = "".join(self._rng.choices(_ICE, k=8))
        self.local_pwd = "".join(self._rng.choices(_ICE, k=24))
        self.ssrc = self._rng.getrandbits(32)
        self._seq = self._rng.getrandbits(16)
        self._srtp_profiles = srtp_profiles
        self._false_start = false_start
        # The DTLS versions we offer (or, as DTLS server, accept). 1.2 only by default: the
        # load generator's figures stay comparable with earlier runs; "1.2,1.3" offers RFC 9147
        # like Chromium does (supported_versions, RFC 8446 §4.2.1) and falls back to 1.2.
        self._dtls_versions = frozenset(dtls_versions)
        self.ice: IceClient | None = None
        self.dtls: DtlsConnection | None = None
        self.srtp: SrtpSession | None = None
        self.remote: Addr | None = None
        self.opus_pt = OPUS_PT
        self.dtls_role = Role.CLIENT
        self._local_key = self.local_pwd.encode()
        self._answered_at = 0.0
        self._events: deque[ClientEvent] = deque()
        self._tx: deque[tuple[bytes, Addr]] = deque()
        self.closed = False
        self._sctp_started = False
        self.peer_max_message_size = 65536
        self.rtp_sent = 0
        self.rtp_received = 0
        self.srtp_errors = 0
        self.dropped = 0

    # -- signaling -------------------------------------------------------------------

    def offer(self) -> str:
        """An SDP offer shaped like a browser's: BUNDLE, rtcp-mux, actpass, Opus; with
        ``datachannel`` an RFC 8841 application section in the same BUNDLE group."""
        sess = self._rng.getrandbits(62)
        mids = [str(i) for i in range(int(self.audio) + int(self.datachannel))]
        lines = [
            "v=0",
            f"o=- {sess} 2 IN IP4 127.0.0.1",
            "s=-",
            "t=0 0",
            "a=group:BUNDLE " + " ".join(mids),
            "a=msid-semantic: WMS",
        ]
        transport = [
            f"a=ice-ufrag:{self.local_ufrag}",
            f"a=ice-pwd:{self.local_pwd}",
            "a=ice-options:trickle",
            f"a=fingerprint:{self.certificate.fingerprint}",
            "a=setup:actpass",
        ]
        if self.audio:
            lines += [
                "m=audio 9 UDP/TLS/RTP/SAVPF 111 0",
                "c=IN IP4 0.0.0.0",
                "a=rtcp:9 IN IP4 0.0.0.0",
                *transport,
                "a=mid:0",
                "a=sendrecv",
                "a=rtcp-mux",
                "a=rtpmap:111 opus/48000/2",
                "a=fmtp:111 minptime=10;useinbandfec=1",
                "a=rtpmap:0 PCMU/8000",
                f"a=ssrc:{self.ssrc} cname:loadgen",
            ]
        if self.datachannel:
            lines += [
                "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
                "c=IN IP4 0.0.0.0",
                *transport,
                f"a=mid:{mids[-1]}",
                f"a=sctp-port:{SCTP_PORT}",
                f"a=max-message-size:{MAX_MESSAGE_SIZE}",
            ]
        return "\r\n".join(lines) + "\r\n"

    def accept_answer(self, text: str, now: float, *, prefer: str | None = None) -> None:
        """Take the server's answer and start ICE towards its first usable candidate.

        ``prefer`` picks the candidate address family ("4" or "6")."""
        ans = parse_offer_untrusted(text)
        audio = next((m for m in ans.media if m.kind is MediaKind.AUDIO and m.port != 0), None)
        app = next((m for m in ans.media
                    if m.kind is MediaKind.APPLICATION and m.port != 0), None)
        if self.audio and audio is None:
            raise RemoteProtocolError("answer has no accepted audio section")
        if self.datachannel and app is None and audio is None:
            raise RemoteProtocolError("answer has no accepted application section")
        # One transport (BUNDLE, RFC 8843): the audio's, or a data-only call's application.
        carrier = audio if audio is not None else app
        assert carrier is not None
        ufrag = carrier.ice_ufrag or ans.ice_ufrag
        pwd = carrier.ice_pwd or ans.ice_pwd
        fps = carrier.fingerprints or ans.fingerprints
        if not ufrag or not pwd or not fps:
            raise RemoteProtocolError("answer lacks ICE credentials or a fingerprint")
        cands = [c for c in carrier.candidates if c.transport.lower() == "udp"]
        if prefer:
            cands.sort(key=lambda c: (":" in c.address) != (prefer == "6"))
        if not cands:
            raise RemoteProtocolError("answer has no UDP candidate")
        if audio is not None and audio.codecs:
            self.opus_pt = audio.codecs[0].pt
        self.remote = (cands[0].address, cands[0].port)
        self._answered_at = now
        # RFC 8842 §5.3: the answerer chose. "active" means it is the DTLS client (aiortc and
        # browsers answer that way); "passive" (our appliance) or absent: we are the client.
        self.dtls_role = (Role.SERVER if ans.effective_setup(carrier) is Setup.ACTIVE
                          else Role.CLIENT)
        self.ice = IceClient(self.local_ufrag, self.local_pwd, ufrag, pwd, self.remote,
                             rng=self._rng,
                             consent_interval=(SETUP_CHECK_INTERVAL if self.dtls_role is Role.SERVER
                                               else CONSENT_INTERVAL))
        self.dtls = DtlsConnection(
            self.dtls_role, self.certificate,
            remote_fingerprints=[str(fp) for fp in fps],
            srtp_profiles=self._srtp_profiles or DEFAULT_SRTP_PROFILES,
            initial_retransmit=0.1,  # loopback and LAN: browsers retransmit after ~50 ms too
            false_start=self._false_start and self.dtls_role is Role.CLIENT,
            # As DTLS 1.3 server, the same option sends media once our flight is out
            # (0.5-RTT data, RFC 8446 §4.4.4): one round trip sooner, before the client's
            # certificate is checked (a bad one still fails the call).
            half_rtt=self._false_start and self.dtls_role is Role.SERVER,
            versions=self._dtls_versions,
        )
        if self.datachannel and app is not None:
            # RFC 8841 §6.1: an absent max-message-size is 64 KiB, 0 means no limit.
            peer_max = app.max_message_size
            self.peer_max_message_size = 65536 if peer_max is None else peer_max
            self.sctp = dc.DataChannelEndpoint(
                dtls_client=self.dtls_role is Role.CLIENT,
                remote_port=SCTP_PORT if app.sctp_port is None else app.sctp_port,
                max_message_size=MAX_MESSAGE_SIZE,
                mtu=self.dtls.mtu - DTLS_RECORD_OVERHEAD, rng=self._rng)
        self.ice.start(now)
        self._pump(now)

    # -- verbs -------------------------------------------------------------------------

    def handle_datagram(self, now: float, data: bytes, addr: Addr) -> None:
        if self.closed or self.ice is None or self.dtls is None:
            return
        kind = classify(data)
        if kind is Kind.STUN:
            if not self._answer_check(data, addr):
                self.ice.handle_input(now, data, addr)
        elif kind is Kind.DTLS:
            self.dtls.handle_datagram(now, data)
        elif kind is Kind.RTP and self.srtp is not None:
            try:
                plain = self.srtp.unprotect_untrusted(data)
                pkt = RtpPacket.parse_untrusted(plain)
            except RemoteProtocolError:
                self.srtp_errors += 1
            else:
                self.rtp_received += 1
                self._events.append(RtpReceived(pkt, now))
        elif kind is Kind.RTCP and self.srtp is not None:
            try:
                self._events.append(RtcpReceived(self.srtp.unprotect_rtcp_untrusted(data), now))
            except RemoteProtocolError:
                self.srtp_errors += 1
        else:
            self.dropped += 1
        self._pump(now)

    def handle_timeout(self, now: float) -> None:
        if self.closed or self.ice is None or self.dtls is None:
            return
        self.ice.handle_timeout(now)
        self.dtls.handle_timeout(now)
        sctp = self.sctp
        if sctp is not None:
            deadline = sctp.poll_timeout()
            if deadline is not None and now >= deadline:
                sctp.handle_timeout(now)
        self._pump(now)

    def poll_timeout(self) -> float | None:
        """When to call ``handle_timeout``; ``-inf`` while datagrams wait in
        ``poll_transmit`` (say, the first ICE check ``accept_answer`` queued), so a loop that
        waits before it drains does not hold them until the first retransmission."""
        if self.closed or self.ice is None or self.dtls is None:
            return None
        if self._tx:
            return -math.inf
        sctp = self.sctp.poll_timeout() if self.sctp is not None else None
        ts = [t for t in (self.ice.poll_timeout(), self.dtls.poll_timeout(), sctp)
              if t is not None]
        return min(ts) if ts else None

    def poll_transmit(self) -> tuple[bytes, Addr] | None:
        return self._tx.popleft() if self._tx else None

    def poll_event(self) -> ClientEvent | None:
        return self._events.popleft() if self._events else None

    # -- media -------------------------------------------------------------------------

    def send_rtp(self, payload: bytes, timestamp: int, *, marker: bool = False) -> None:
        if self.srtp is None or self.remote is None or self.closed:
            raise RuntimeError("call is not connected")
        if not 0 <= timestamp <= 0xFFFFFFFF:
            raise LocalProtocolError("timestamp must be a 32-bit RTP timestamp")
        self._seq = (self._seq + 1) & 0xFFFF
        # The one RTP header packer (proto/rtp), not an RtpPacket object per packet.
        header = rtp_header(self.opus_pt, self._seq, timestamp, self.ssrc, marker)
        self._tx.append((self.srtp.protect(header + payload), self.remote))
        self.rtp_sent += 1

    def send_rtcp(self, plain: bytes) -> None:
        if self.srtp is None or self.remote is None or self.closed:
            raise RuntimeError("call is not connected")
        self._tx.append((self.srtp.protect_rtcp(plain), self.remote))

    # -- data channels (the sctp slot) --------------------------------------------------

    def _endpoint(self) -> dc.DataChannelEndpoint:
        if self.sctp is None or self.closed:
            raise RuntimeError("no data channel on this call")
        return self.sctp

    def open_channel(self, now: float, label: str = "", **options: object) -> int:
        """Open a data channel (``DataChannelEndpoint.open_channel`` options: ``ordered``,
        ``max_retransmits``, ``max_packet_lifetime``, ``negotiated``, ``id``, ``protocol``);
        its stream id. Before SCTP is up the endpoint holds it until the association is."""
        cid = self._endpoint().open_channel(now, label, **options)  # type: ignore[arg-type]
        self._pump_sctp(now)
        return cid

    def send_message(self, now: float, channel_id: int, data: bytes | str) -> None:
        """One message: ``str`` as text (PPID 51), ``bytes`` as binary (53). Larger than the
        answer's a=max-message-size is refused here, never silently dropped."""
        size = len(data.encode()) if isinstance(data, str) else len(data)
        limit = self.peer_max_message_size
        if limit and size > limit:
            raise LocalProtocolError(
                f"message of {size} bytes exceeds the answer's a=max-message-size ({limit})")
        self._endpoint().send(now, channel_id, data)
        self._pump_sctp(now)

    def close_channel(self, now: float, channel_id: int) -> None:
        self._endpoint().close_channel(now, channel_id)
        self._pump_sctp(now)

    def buffered_amount(self, channel_id: int) -> int:
        """Bytes queued on the channel and not yet sent (W3C ``bufferedAmount``)."""
        return self._endpoint().buffered_amount(channel_id)

    def close(self) -> None:
        if self.dtls is not None and not self.closed:
            self.dtls.close()
            self._drain_dtls()
        if self.ice is not None:
            self.ice.close()
        self.closed = True

    # -- internals ---------------------------------------------------------------------

    def _answer_check(self, data: bytes, addr: Addr) -> bool:
        """Answer a full-ICE peer's connectivity check (RFC 8445 §7.3.1.2); True if ``data``
        was a binding request (answered or not), so the controlling agent never sees it.
        Only authenticated checks for our ufrag get a (signed) success response."""
        if len(data) < 20 or data[0] & 0x01 or data[1] & 0x10:  # not the REQUEST class
            return False
        try:
            msg = Message.parse_untrusted(data)
        except StunError:
            return True
        if msg.method is not Method.BINDING or msg.msg_class is not Class.REQUEST:
            return True
        if (not verify_fingerprint(data)
                or (msg.username or "").partition(":")[0] != self.local_ufrag
                or not verify_integrity(data, self._local_key)):
            self.dropped += 1
            return True
        self._tx.append((binding_success(msg.transaction_id, addr,
                                         integrity_key=self._local_key), addr))
        return True

    def _fail(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self._events.append(Failed(reason))

    def _drain_dtls(self) -> None:
        assert self.dtls is not None and self.remote is not None
        while (out := self.dtls.poll_transmit()) is not None:
            self._tx.append((out, self.remote))

    def _pump(self, now: float) -> None:
        ice, dtls = self.ice, self.dtls
        assert ice is not None and dtls is not None
        while (t := ice.poll_transmit()) is not None:
            self._tx.append(t)
        while (ev := ice.poll_event()) is not None:
            if isinstance(ev, CheckSucceeded) and dtls.state is DtlsState.CLIENT_IDLE:
                # (A server-role connection has no CLIENT_IDLE: it waits for ClientHello.)
                dtls.start(now)
            elif isinstance(ev, ConnectFailed):
                self._fail("ICE connectivity check timed out")
            elif isinstance(ev, ConsentExpired):
                self._fail("ICE consent expired")
        self._drain_dtls()
        while (dev := dtls.poll_event()) is not None:
            if isinstance(dev, ApplicationData):
                if self.sctp is not None:  # RFC 8261 §5: one SCTP packet per record
                    self.sctp.handle_input(now, dev.data)
                else:
                    self.dropped += 1
            elif isinstance(dev, HandshakeComplete | FalseStart):
                if self._sctp_started or self.srtp is not None:
                    continue  # connected at False Start already: the keys do not change
                profile = dev.srtp_profile
                if self.audio:
                    if profile is None:
                        self._fail("DTLS did not negotiate SRTP")
                        continue
                    self.srtp = SrtpSession.from_exporter(dtls.export_keying_material,
                                                          profile, self.dtls_role)
                if ice.consent_interval == SETUP_CHECK_INTERVAL:
                    # Setup's quick checks are over (unless the caller set its own interval).
                    ice.consent_interval = CONSENT_INTERVAL
                self._events.append(Connected(profile if self.audio else None,
                                              now - self._answered_at))
                self._sctp_started = True  # (also: "connected", for a data-only call)
                if self.sctp is not None:
                    # RFC 8261 §5: SCTP starts once DTLS is up; either side may send INIT
                    # (the transceiver does too: RFC 9260 §5.2.1 resolves the collision).
                    self.sctp.connect(now)
            elif isinstance(dev, DtlsClosed):
                self._fail(f"DTLS closed: {dev.alert}")
        self._pump_sctp(now)

    def _pump_sctp(self, now: float) -> None:
        """The endpoint's packets out as DTLS records, its events out as ours."""
        sctp, dtls = self.sctp, self.dtls
        if sctp is None or dtls is None or self.remote is None:
            return
        if self._sctp_started:
            while (packet := sctp.poll_transmit()) is not None:
                dtls.send_application_data(packet)
            self._drain_dtls()
        while (ev := sctp.poll_event()) is not None:
            self._events.append(ChannelEvent(ev, now))


_ICE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
