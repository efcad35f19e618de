"""One WebRTC voice session inside a transceiver: the object that joins ICE-lite, DTLS,
SRTP, RTP/RTCP, the media pipeline and the agent (STYLE.md rule 8: the protocol cores do
not know each other; this is where they meet).

Datagrams are handed in synchronously by the server's socket loop (``handle_*``); what a
session sends goes straight out through the server's ``send`` callable. Three tasks run in
the session's own nursery (:meth:`Session.run`):

* the **timer** task sleeps until the earliest protocol deadline (ICE consent, DTLS
  retransmission, jitter-buffer hole, RTCP report, setup reaping) and fires it;
* the **agent** task, started when DTLS completes (media can flow from then on) — unless
  the agent is a synchronous frame handler (the built-in ``echo``), which is called from
  the network loop for each decoded frame instead.

Outbound frames (Opus encode → RTP → SRTP) leave the moment they are queued if they are
due, from the task that queued them; an early frame is left to the transceiver's shared
:class:`~appliance.transceiver.pacer.Pacer`, which calls the session back at its due time.
So the echo path — decode, agent, encode, send — runs without a task switch per packet.

Anything that escapes a handler or task ends this session only (``internal-error``).

Lifecycle: ``new`` (answer sent) → ``connecting`` (first authenticated STUN check) →
``connected`` (DTLS done, SRTP keyed) → ``ended`` (``end_reason`` says why).
"""

from __future__ import annotations

import logging
import math
import secrets
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

import trio

from appliance.agents import (
    AgentContext,
    AgentHost,
    AgentIdentity,
    EnergyVad,
    Frame,
    ResolvedAgent,
)
from appliance.logs import loggable_url, redact
from appliance.proto.dtls import (
    ConnectionClosed,
    DtlsConnection,
    HandshakeComplete,
)
from appliance.proto.ice import IceLiteAgent
from appliance.proto.ice.events import CheckReceived, ConsentExpired, Nominated
from appliance.proto.proxy import encode_header
from appliance.proto.rtp import (
    ReceptionStats,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    RtpError,
    SdesChunk,
    SdesItem,
    SenderStats,
    parse_rtcp_untrusted,
    rtp_header_fields_untrusted,
    rtt_from_report_block,
    serialize_rtcp,
)
from appliance.proto.sdp import Answer
from appliance.proto.srtp import (
    SrtpError,
    SrtpSession,
)

from .jitter import JitterBuffer
from .opus import (
    DEFAULT_COMPLEXITY,
    FRAME_BYTES,
    Decoder,
    Encoder,
    OpusDecoder,
    OpusEncoder,
)
from .pacer import Pacer
from .packetizer import Packetizer

log = logging.getLogger(__name__)

Addr = tuple[str, int]
#: ``send(datagram_with_proxy_header, internal_relay_address)``
SendFn = Callable[[bytes, Addr], None]

SETUP_TIMEOUT = 30.0  # no ICE (or no DTLS) within 30 s of the answer: reaped
CONSENT_TIMEOUT = 30.0  # RFC 7675 §5.1
RTCP_INTERVAL = 5.0  # RFC 3550 §6.2 minimum for a two-party session is 5 s
MAX_CLIENT_ADDRS = 8  # addresses a session answers checks from (candidate pairs)
#: A lone outbound frame may leave this much before its due time (packetizer.py: lets the
#: schedule settle on the source's phase instead of making early arrivals wait).
EARLY = 0.002
_RTP_HEADER = struct.Struct("!BBHII")  # V=2 P X CC | M PT | seq | timestamp | SSRC
TIMELINE_STEPS = ("offer_received", "answer_sent", "first_stun", "ice_nominated",
                  "dtls_done", "first_rtp_in", "first_rtp_out")


class Flow:
    """One client address as the relay presented it: the PROXY header for replies and the
    internal address of the relay that last forwarded a packet of this flow."""

    __slots__ = ("client", "public", "relay", "header")

    def __init__(self, client: Addr, public: Addr, relay: Addr) -> None:
        self.client = client
        self.public = public
        self.relay = relay
        self.header = encode_header(client, public)


class Session:
    def __init__(
        self,
        *,
        session_id: str,
        transceiver: int,
        agent: ResolvedAgent,
        answer: Answer,
        candidates: list[tuple[str, int]],
        local_ufrag: str,
        local_pwd: str,
        dtls: DtlsConnection,
        ssrc: int,
        cname: str,
        send: SendFn,
        now: float,
        on_end: Callable[[Session], None],
        counters: dict[str, int],
        pacer: Pacer | None = None,
        opus_complexity: int = DEFAULT_COMPLEXITY,
    ) -> None:
        self.id = session_id
        self.transceiver = transceiver
        self.agent = agent
        self.answer = answer
        self.candidates = candidates  # our advertised (relay public) addresses
        self.state = "new"
        self.end_reason: str | None = None
        self.created_at = time.time()
        self.ended_at: float | None = None
        self._t0 = now
        self.timeline: dict[str, float | None] = dict.fromkeys(TIMELINE_STEPS)
        self.timeline["offer_received"] = 0.0
        self._answered_at = now
        plan = answer.plan
        self.local_ufrag = local_ufrag
        self.ice = IceLiteAgent(local_ufrag, local_pwd, plan.ice_ufrag, plan.ice_pwd,
                                consent_timeout=CONSENT_TIMEOUT)
        self.dtls = dtls
        self.srtp: SrtpSession | None = None
        self.srtp_profile: str | None = None
        self.cipher_suite: str | None = None
        self._send = send
        self._on_end = on_end
        self._counters = counters  # the server's, shared
        self.flows: dict[Addr, Flow] = {}
        self.media_flow: Flow | None = None
        # Media.
        self.ssrc = ssrc
        self.cname = cname
        self.opus_pt = answer.opus_pt
        self.passthrough = agent.passthrough
        self.jitter = JitterBuffer()
        # Passthrough sessions never touch the codec: no libopus state to allocate. The
        # others get theirs from run(), once the answer is on its way: the two libopus
        # states cost ~0.1-0.3 ms, and made inside `create` they held up this answer and
        # every create queued behind it on the control connection (a burst of POSTs is
        # answered one after the other), while the caller still needs ~2 round trips of
        # ICE and DTLS before the first frame arrives (docs/performance.md, "Setup time").
        self._opus_complexity = opus_complexity
        self._decoder: Decoder | None = None
        self._encoder: Encoder | None = None
        self.packetizer = Packetizer(self.ssrc, self.opus_pt, early=EARLY)
        # The shared pacer (one task per transceiver); a session made without one runs its
        # own in its nursery.
        self._own_pacer = pacer is None
        self.pacer = pacer if pacer is not None else Pacer()
        self._pace_at: float | None = None  # when the pacer is due to call us back
        # Passthrough: the caller's (SSRC, seq, ts) map onto our stream by fixed offsets,
        # re-anchored whenever the caller's SSRC changes, so our stream stays continuous.
        self._pt_src: int | None = None
        self._pt_seq_off = self._pt_ts_off = 0
        self._pt_seq = secrets.randbits(16)  # last sequence number / timestamp we sent
        self._pt_ts = secrets.randbits(32)
        self._pt_sent_at: float | None = None
        self.vad = EnergyVad()
        self.rx_stats: ReceptionStats | None = None
        self.tx_stats = SenderStats(self.ssrc)
        self._first_media_ts: int | None = None
        self.rtt: float | None = None
        self.remote_jitter: float | None = None  # the client's view of our stream
        self.remote_loss: float | None = None
        self.packets_in = self.packets_out = self.bytes_in = self.bytes_out = 0
        self._next_rtcp: float | None = None
        # Agent.
        self.host = AgentHost(on_event=self._agent_event, on_output=self._output_queued)
        self._on_frame = agent.on_frame  # synchronous frame handler (no agent task), or None
        self.ctx = AgentContext(
            self.host,
            AgentIdentity(agent.name, session_id, transceiver, {"codec": "opus/48000/2"}),
        )
        # Tasks.
        self._nursery: trio.Nursery | None = None
        self._cancel = trio.CancelScope()
        self._timer_lot = trio.lowlevel.ParkingLot()
        self._timer_at = math.inf

    @property
    def decoder(self) -> Decoder | None:
        """The Opus decoder (None for passthrough), made on first use if run() has not yet."""
        if self._decoder is None and not self.passthrough:
            self._decoder = OpusDecoder()
        return self._decoder

    @property
    def encoder(self) -> Encoder | None:
        """The Opus encoder (None for passthrough), made on first use if run() has not yet."""
        if self._encoder is None and not self.passthrough:
            self._encoder = OpusEncoder(complexity=self._opus_complexity)
        return self._encoder

    # -- snapshot for the control channel ------------------------------------------------

    def describe(self) -> dict[str, Any]:
        flow = self.media_flow
        return {
            "id": self.id,
            "state": self.state,
            "end_reason": self.end_reason,
            "transceiver": self.transceiver,
            "agent": self.agent.name,
            "client_address": _fmt(flow.client) if flow else None,
            "relay_flow": {"public": _fmt(flow.public), "relay": _fmt(flow.relay)}
            if flow else None,
            "codec": "opus/48000/2",
            "srtp_profile": self.srtp_profile,
            "cipher_suite": self.cipher_suite,
            "created_at": round(self.created_at, 3),
            "ended_at": round(self.ended_at, 3) if self.ended_at else None,
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "rtt_ms": round(self.rtt * 1000, 1) if self.rtt is not None else None,
            "jitter_ms": self._jitter_ms(),
            "loss": self._loss(),
            "timeline": dict(self.timeline),
        }

    def _jitter_ms(self) -> float | None:
        if self.rx_stats is not None and self.rx_stats.received > 1:
            return round(self.rx_stats.jitter_seconds * 1000, 2)
        return None

    def _loss(self) -> float | None:
        stats = self.rx_stats
        if stats is None or stats.expected <= 0:
            return None
        return round(max(0, stats.cumulative_lost) / stats.expected, 4)

    def _mark(self, step: str, now: float) -> None:
        if self.timeline[step] is None:
            self.timeline[step] = round((now - self._t0) * 1000, 2)

    def mark_answer_sent(self, now: float) -> None:
        self._answered_at = now
        self._mark("answer_sent", now)

    # -- input from the socket loop (synchronous, never blocks) ---------------------------

    def _flow(self, client: Addr, public: Addr, relay: Addr) -> Flow:
        flow = self.flows.get(client)
        if flow is None:
            flow = Flow(client, public, relay)
        elif flow.relay != relay or flow.public != public:
            # The relay that forwards this flow changed (relay restart, another worker):
            # reply through the internal address the flow's last packet came from.
            if flow.public != public:
                flow = Flow(client, public, relay)
            else:
                flow.relay = relay
        return flow

    def handle_stun(self, now: float, data: bytes, client: Addr, public: Addr, relay: Addr) -> None:
        ice = self.ice
        before = ice.checks_ok
        ice.handle_datagram(now, data, client)
        flow = self.flows.get(client)
        if ice.checks_ok != before:
            # Authenticated: this address may now carry DTLS/RTP for this session.
            if self.state == "new":
                self.state = "connecting"
                self._mark("first_stun", now)
            flow = self._flow(client, public, relay)
            if client not in self.flows and len(self.flows) >= MAX_CLIENT_ADDRS:
                oldest = next(iter(self.flows))
                if self.media_flow is None or oldest != self.media_flow.client:
                    self._forget(oldest)
            self.flows[client] = flow
        self._drain_ice(now)
        # 401s and other answers go to the requester even if it has no flow yet.
        while (out := ice.poll_transmit()) is not None:
            data_out, addr = out
            f = self.flows.get(addr) or (flow if flow and flow.client == addr else None)
            if f is None:
                f = Flow(addr, public, relay)
            self._send(f.header + data_out, f.relay)

    def _forget(self, client: Addr) -> None:
        self.flows.pop(client, None)
        self._counters["flows_forgotten"] += 1

    def _drain_ice(self, now: float) -> None:
        while (ev := self.ice.poll_event()) is not None:
            if isinstance(ev, Nominated):
                flow = self.flows.get(ev.addr)
                if flow is not None:
                    self.media_flow = flow
                self._mark("ice_nominated", now)
                # At debug: "connected" names the address a few ms later, and one log line
                # fewer per setup is CPU off the setup path (docs/performance.md).
                log.debug("session %s nominated %s", self.id, redact(_fmt(ev.addr)))
            elif isinstance(ev, ConsentExpired):
                self.end("consent-expired")
            elif isinstance(ev, CheckReceived):
                pass
        self._poke_timer(self.ice.poll_timeout())

    def handle_dtls(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        if self.media_flow is None:
            self.media_flow = flow  # DTLS may start before USE-CANDIDATE arrives
        self.dtls.handle_datagram(now, data)
        self._drain_dtls(now)

    def _drain_dtls(self, now: float) -> None:
        dtls = self.dtls
        flow = self.media_flow
        while (out := dtls.poll_transmit()) is not None:
            if flow is not None:
                self._send(flow.header + out, flow.relay)
        while (ev := dtls.poll_event()) is not None:
            if isinstance(ev, HandshakeComplete):
                self._on_handshake(now, ev)
            elif isinstance(ev, ConnectionClosed):
                self.end("dtls-closed" if ev.by_peer else f"dtls-failed: {ev.reason}")
        self._poke_timer(dtls.poll_timeout())

    def _on_handshake(self, now: float, ev: HandshakeComplete) -> None:
        profile = ev.srtp_profile
        if profile is None:
            self.end("dtls-failed: no SRTP profile negotiated")
            return
        self.srtp = SrtpSession.from_exporter(self.dtls.export_keying_material, profile, "server")
        self.srtp_profile = profile.name
        self.cipher_suite = ev.cipher_suite.name
        self.state = "connected"
        self._mark("dtls_done", now)
        self._next_rtcp = now + RTCP_INTERVAL * (0.5 + secrets.randbelow(1000) / 1000)
        self._poke_timer(self._next_rtcp)
        flow = self.media_flow
        log.info("session %s connected from %s (%s, %s)", self.id,
                 redact(_fmt(flow.client)) if flow is not None else "-", self.srtp_profile,
                 self.cipher_suite)
        self.host.push_event({"type": "session.started", "session_id": self.id,
                              "sample_rate": 48000, "frame_samples": 960})
        if self._nursery is not None and not self.passthrough and self._on_frame is None:
            self._nursery.start_soon(self._run_agent)

    def handle_rtp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        try:
            plain = srtp.unprotect_untrusted(data)
            pt, seq, ts, ssrc, _m, off, end = rtp_header_fields_untrusted(plain)
        except (SrtpError, RtpError):
            self._counters["drop_srtp"] += 1
            return
        self.packets_in += 1
        self.bytes_in += len(data)
        if pt != self.opus_pt:
            self._counters["drop_rtp_payload_type"] += 1  # telephone-event, CN: ignored
            return
        if self.rx_stats is None or self.rx_stats.ssrc != ssrc:
            self.rx_stats = ReceptionStats(ssrc)
        self.rx_stats.update(seq, ts, now)
        if self.timeline["first_rtp_in"] is None:
            self._mark("first_rtp_in", now)
        if self.passthrough:
            self._echo_rtp(now, plain, ssrc, seq, ts, _m, off, end)
            return
        jb = self.jitter
        jb.push(now, seq, ts, plain[off:end])
        self._drain_jitter(now)
        self._poke_timer(jb.poll_timeout())

    def _echo_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                  marker: bool, off: int, end: int) -> None:
        """Passthrough: the caller's packet back under our SSRC, sequence and timestamp
        space (a plain 12-byte header: no CSRCs, no header extensions, no padding)."""
        srtp = self.srtp
        flow = self.media_flow
        if srtp is None or flow is None:
            return
        if ssrc != self._pt_src:
            # First packet, or the caller restarted its stream: continue ours from the last
            # packet we sent (one sequence number on, the elapsed time on the RTP clock).
            gap = 1 if self._pt_sent_at is None else max(1, round((now - self._pt_sent_at) * 50))
            self._pt_src = ssrc
            self._pt_seq_off = (self._pt_seq + 1 - seq) & 0xFFFF
            self._pt_ts_off = (self._pt_ts + 960 * gap - ts) & 0xFFFFFFFF
            marker = True
        oseq = (seq + self._pt_seq_off) & 0xFFFF
        ots = (ts + self._pt_ts_off) & 0xFFFFFFFF
        if (oseq - self._pt_seq) & 0xFFFF < 0x8000:  # newer than the last one sent
            self._pt_seq, self._pt_ts, self._pt_sent_at = oseq, ots, now
        packet = srtp.protect(
            _RTP_HEADER.pack(0x80, (0x80 if marker else 0) | self.opus_pt, oseq, ots, self.ssrc)
            + plain[off:end])
        self.tx_stats.on_packet(end - off, ots, now)
        self.packets_out += 1
        self.bytes_out += len(packet)
        self._mark("first_rtp_out", now)
        self._send(flow.header + packet, flow.relay)

    def _drain_jitter(self, now: float) -> None:
        jb = self.jitter
        host = self.host
        decoder = self.decoder
        assert decoder is not None
        on_frame = self._on_frame
        vad = self.vad
        ctx = self.ctx
        while (item := jb.poll()) is not None:
            if item.payload is None:
                # Opus FEC when the next packet is already here (its in-band copy of this
                # frame), Opus PLC otherwise.
                nxt = jb.peek()
                fec = nxt.payload if nxt is not None and nxt.seq == item.seq + 1 else None
                pcm = decoder.conceal(fec)
                concealed = True
            else:
                pcm = decoder.decode(item.payload)
                concealed = False
            if self._first_media_ts is None:
                self._first_media_ts = item.timestamp
            base = ((item.timestamp - self._first_media_ts) & 0xFFFFFFFF) / 48_000
            if len(pcm) == FRAME_BYTES:  # WebRTC's 20 ms ptime: one frame, no slicing
                chunks: Iterable[tuple[int, bytes]] = ((0, pcm),)
            else:  # longer packets (40-120 ms) come out as several 20 ms frames
                chunks = ((i, pcm[i : i + FRAME_BYTES])
                          for i in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES))
            for i, chunk in chunks:
                speech = vad.update(chunk)
                frame = Frame(chunk, base + i / 96_000, now, speech, vad.last_level, concealed)
                if on_frame is None:
                    host.push_frame(frame)
                    continue
                try:
                    on_frame(ctx, frame)
                except Exception:
                    log.exception("session %s: agent %s failed", self.id, loggable_url(self.agent.name))
                    self.end("agent-error")
                    return

    def handle_rtcp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        try:
            packets = parse_rtcp_untrusted(srtp.unprotect_rtcp_untrusted(data))
        except (SrtpError, RtpError):
            self._counters["drop_srtp"] += 1
            return
        wall = time.time()
        for p in packets:
            if isinstance(p, RtcpSenderReport):
                if self.rx_stats is not None:
                    self.rx_stats.on_sender_report(p.ntp_msw, p.ntp_lsw, now)
                blocks = p.reports
            elif isinstance(p, RtcpReceiverReport):
                blocks = p.reports
            else:
                continue  # SDES, BYE, NACK, PLI: nothing to do for audio
            for block in blocks:
                if block.ssrc != self.ssrc:
                    continue
                rtt = rtt_from_report_block(wall, block.lsr, block.dlsr)
                if rtt is not None:
                    self.rtt = rtt
                self.remote_jitter = block.jitter / 48_000
                self.remote_loss = block.fraction_lost / 256
                encoder = self.encoder
                if encoder is not None:  # more FEC in our packets when they get lost
                    encoder.set_expected_loss(round(self.remote_loss * 100))

    # -- output ----------------------------------------------------------------------------

    def _send_media(self, packet: bytes) -> None:
        flow = self.media_flow
        if flow is not None:
            self._send(flow.header + packet, flow.relay)

    def send_frame(self, now: float, pcm: bytes, backlog: int = 0) -> None:
        """Encode and send one 20 ms frame now (the pacer decided it is due)."""
        srtp = self.srtp
        encoder = self.encoder
        flow = self.media_flow
        if srtp is None or flow is None or encoder is None:
            return
        seq, ts, marker = self.packetizer.next_header(now, backlog)
        payload = encoder.encode(pcm)
        # A plain 12-byte header, packed directly (no RtpPacket object per frame).
        packet = srtp.protect(
            _RTP_HEADER.pack(0x80, (0x80 if marker else 0) | self.opus_pt, seq, ts, self.ssrc)
            + payload)
        self.tx_stats.on_packet(len(payload), ts, now)
        self.packets_out += 1
        self.bytes_out += len(packet)
        if self.packets_out == 1:
            self._mark("first_rtp_out", now)
        self._send(flow.header + packet, flow.relay)

    def _send_rtcp(self, now: float) -> None:
        srtp = self.srtp
        if srtp is None:
            return
        reports = (self.rx_stats.report_block(now),) if self.rx_stats is not None else ()
        if self.tx_stats.packet_count:
            first: RtcpSenderReport | RtcpReceiverReport = self.tx_stats.sender_report(
                now, time.time(), reports)
        else:
            first = RtcpReceiverReport(self.ssrc, reports)
        # RFC 3550 §6.1: every compound packet carries SDES CNAME.
        sdes = RtcpSdes((SdesChunk(self.ssrc, ((SdesItem.CNAME, self.cname.encode()),)),))
        self._send_media(srtp.protect_rtcp(serialize_rtcp([first, sdes])))

    # -- timers ---------------------------------------------------------------------------

    def _poke_timer(self, deadline: float | None) -> None:
        if deadline is not None and deadline < self._timer_at:
            self._timer_lot.unpark_all()

    def next_deadline(self) -> float:
        candidates = [self.ice.poll_timeout(), self.dtls.poll_timeout(),
                      self.jitter.poll_timeout(), self._next_rtcp]
        if self.state in ("new", "connecting"):
            candidates.append(self._answered_at + SETUP_TIMEOUT)
        return min((c for c in candidates if c is not None), default=math.inf)

    def handle_timeout(self, now: float) -> None:
        if self.state in ("new", "connecting") and now >= self._answered_at + SETUP_TIMEOUT:
            self.end("ice-timeout" if self.state == "new" else "setup-timeout")
            return
        self.ice.handle_timeout(now)
        self._drain_ice(now)
        if self.end_reason is not None:
            return
        self.dtls.handle_timeout(now)
        self._drain_dtls(now)
        jb = self.jitter
        deadline = jb.poll_timeout()
        if deadline is not None and now >= deadline:
            jb.handle_timeout(now)
            self._drain_jitter(now)
        if self._next_rtcp is not None and now >= self._next_rtcp:
            self._send_rtcp(now)
            # RFC 3550 §6.3.1: randomise the interval (0.5..1.5 x) to avoid synchronisation.
            self._next_rtcp = now + RTCP_INTERVAL * (0.5 + secrets.randbelow(1000) / 1000)
            self.host.push_event({"type": "stats", **self._stats_event()})

    def _stats_event(self) -> dict[str, Any]:
        return {"rtt_ms": round(self.rtt * 1000, 1) if self.rtt is not None else None,
                "jitter_ms": self._jitter_ms(), "loss": self._loss(),
                "packets_in": self.packets_in, "packets_out": self.packets_out}

    async def _timer_loop(self) -> None:
        while True:
            self._timer_at = self.next_deadline()
            with trio.move_on_at(self._timer_at):
                await self._timer_lot.park()
            self._timer_at = -math.inf  # awake: no pokes needed while we recompute
            now = trio.current_time()
            if now >= self.next_deadline():
                self.handle_timeout(now)

    # -- pacing ---------------------------------------------------------------------------

    def _output_queued(self) -> None:
        """The agent queued output (called from its task, or from the network loop for a
        synchronous frame handler): send what is due now."""
        if self._pace_at is None:  # else the pacer calls us back at the due time anyway
            self._pump(trio.current_time(), False)

    def pace(self, now: float, at: float) -> None:
        """The shared pacer's call-back (see :meth:`Pacer.schedule`)."""
        if at != self._pace_at or self.state == "ended":
            return  # stale: rescheduled since, or over
        self._pace_at = None
        try:
            self._pump(now, True)
        except Exception:
            self._counters["session_errors"] += 1
            log.exception("session %s: sending failed; ending it", self.id)
            self.end("internal-error")

    def _pump(self, now: float, from_pacer: bool) -> None:
        """Send every queued frame that is due at ``now``; have the pacer call back for the
        next one. A trailing partial frame is sent (zero-padded) only from the pacer's
        call-back, so a producer that queues a frame in pieces gets to finish it."""
        host = self.host
        pk = self.packetizer
        if self.srtp is None or self.media_flow is None or self.state == "ended":
            return  # agents start on connection; nothing is sent before or after
        while host.has_output():
            whole = host.queued_frames
            backlog = whole - 1 if whole else 0
            if not pk.ready(now, backlog):
                due = pk.poll_timeout(backlog)
                assert due is not None
                self._schedule(due)
                return
            if not whole and not from_pacer:
                self._schedule(now)
                return
            pcm = host.pop_output_frame()
            if pcm is None:  # pragma: no cover - has_output() said there was some
                return
            self.send_frame(now, pcm, host.queued_frames)

    def _schedule(self, at: float) -> None:
        if self._pace_at is not None and self._pace_at <= at:
            return
        self._pace_at = at
        self.pacer.schedule(at, self)

    async def _run_agent(self) -> None:
        try:
            await self.agent.run(self.ctx)
        except Exception:
            log.exception("session %s: agent %s failed", self.id, loggable_url(self.agent.name))
            self.end("agent-error")
            return
        # The agent is done: let its last words play out, then hang up.
        await self.host.wait_drained()
        if self.end_reason is None:
            self.end("agent-done")

    def _agent_event(self, event: dict[str, Any]) -> None:
        if event.get("type") == "session.end":
            reason = event.get("reason")
            self.end(f"agent: {reason}" if isinstance(reason, str) else "agent-hangup")
        else:
            log.debug("session %s agent event %s", self.id, event.get("type"))

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The session's tasks, until it ends. Never raises (except Cancelled)."""
        try:
            with self._cancel:
                # The codec states, now that `create` has answered (see __init__).
                _ = self.decoder, self.encoder
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._timer_loop)
                    if not self.passthrough and self._own_pacer:
                        nursery.start_soon(self.pacer.run)
                    task_status.started()
        except Exception:
            log.exception("session %s crashed", self.id)
            self.end("internal-error")
        finally:
            self._nursery = None
            self.end(self.end_reason or "shutdown")

    def end(self, reason: str) -> None:
        """End the session (idempotent): close_notify, agent told, tasks cancelled."""
        if self.state == "ended":
            return
        self.state = "ended"
        self.end_reason = reason
        self.ended_at = time.time()
        try:
            self.dtls.close()
            flow = self.media_flow
            while (out := self.dtls.poll_transmit()) is not None:
                if flow is not None:
                    self._send(flow.header + out, flow.relay)
        except Exception:  # a broken DTLS state must not stop the teardown
            log.exception("session %s: DTLS close failed", self.id)
        self.ice.close()
        self.host.push_event({"type": "session.ended", "reason": reason})
        self.host.close(reason)
        self._cancel.cancel()
        log.info("session %s ended: %s", self.id, reason)
        self._on_end(self)


class EndedSession:
    """What the transceiver keeps of an ended session for ``list``/``get``/``delete``: its
    final :meth:`Session.describe` (a small dict) and nothing else. The :class:`Session`
    itself — Opus encoder/decoder, DTLS, SRTP, jitter buffer, agent queues, ~70 KiB — is
    dropped at once instead of living on for the last ``RECENTLY_ENDED`` calls."""

    __slots__ = ("id", "state", "end_reason", "ended_at", "_info")

    def __init__(self, session: Session) -> None:
        self.id = session.id
        self.state = "ended"
        self.end_reason = session.end_reason
        self.ended_at = session.ended_at
        self._info = session.describe()

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def end(self, reason: str) -> None:
        """Already ended: keeps its own reason (like :meth:`Session.end` on an ended one)."""


def _fmt(addr: Addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
