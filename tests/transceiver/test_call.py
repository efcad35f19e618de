"""Whole calls on a virtual clock, no sockets (call_pair.py): a real ClientPeer and a real
ServerCall — ICE, DTLS, SRTP, RTCP, passthrough or the PCM pipeline — through a simulated
network with seeded loss, reordering, duplication and delay. Each test runs minutes of
virtual time in a few milliseconds of CPU."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from transceiver.call_pair import CLIENT, PUBLIC, RELAY, SERVER_SSRC, CallPair, Netem

from appliance.agents import AgentContext, AgentHost, AgentIdentity, resolve
from appliance.client.peer import Connected as ClientConnected
from appliance.client.peer import Failed, RtcpReceived, RtpReceived
from appliance.proto.dtls import ApplicationData
from appliance.proto.mux import Kind, classify
from appliance.proto.rtp import (
    ReportBlock,
    RtcpReceiverReport,
    RtcpSenderReport,
    parse_rtcp_untrusted,
    serialize_rtcp,
)
from appliance.proto.sctp import datachannel as dc
from appliance.transceiver.call import (
    CallState,
    Connected,
    Ended,
    FlowNominated,
    RemoteReport,
    ReportSent,
    Timeout,
    Transmit,
)
from appliance.transceiver.media import PcmPipeline
from appliance.transceiver.opus import FRAME_BYTES, OpusEncoder

#: CPU seconds one test may take (the point of a virtual clock); generous for a loaded box.
CPU_BUDGET = 0.5


@pytest.fixture(autouse=True)
def _fast() -> Iterator[None]:
    t0 = time.process_time()
    yield
    assert time.process_time() - t0 < CPU_BUDGET


def connected(pair: CallPair) -> bool:
    return (pair.server.state is CallState.CONNECTED
            and any(isinstance(e, ClientConnected) for e in pair.client_events))


def start_media(pair: CallPair, payload: bytes = b"\xfc" + bytes(40)) -> list[int]:
    """The client sends one RTP packet per 20 ms; returns the list of timestamps sent."""
    sent: list[int] = []

    def tick(now: float) -> None:
        if pair.client.srtp is not None and not pair.client.closed:
            ts = (960 * len(sent)) & 0xFFFFFFFF
            pair.client.send_rtp(payload, ts, marker=not sent)
            sent.append(ts)

    pair.tick = tick
    return sent


def echoes(pair: CallPair) -> list[RtpReceived]:
    return [e for e in pair.client_events if isinstance(e, RtpReceived)]


def test_setup_on_a_clean_network() -> None:
    pair = CallPair()
    assert pair.server.state is CallState.NEW
    assert pair.run_until(lambda: connected(pair), within=1.0)
    server = pair.server
    # Two round trips of ICE and DTLS at 10 ms each way, and nothing lost: well under 0.1 s.
    assert pair.now < 0.1
    kinds = [type(e) for e in pair.server_events]
    assert kinds == [FlowNominated, Connected]
    assert server.media_flow is not None and server.media_flow.client == CLIENT
    assert set(server.flows) == {CLIENT}
    assert server.srtp_profile is not None and server.cipher_suite is not None
    tl = server.timeline
    assert tl["offer_received"] == 0.0
    steps = [tl[s] for s in ("first_stun", "ice_nominated", "dtls_done")]
    assert all(isinstance(s, float) for s in steps) and steps == sorted(steps)  # type: ignore[type-var]
    assert tl["first_rtp_in"] is None and tl["first_rtp_out"] is None


@pytest.mark.parametrize("seed", range(6))
def test_setup_and_media_both_ways_on_a_terrible_network(seed: int) -> None:
    """10 % loss, 5 % duplicates, 10 % reordered by 30 ms, 10-30 ms delay, both ways: the
    call still comes up (ICE and DTLS retransmit) and the passthrough echo flows."""
    net = Netem(delay=0.010, jitter=0.020, loss=0.10, duplicate=0.05, reorder=0.10)
    pair = CallPair(seed=seed, net=net)
    assert pair.run_until(lambda: connected(pair), within=20.0), pair.server_events
    sent = start_media(pair)
    pair.run_for(3.0)
    pair.tick = None
    pair.run_for(0.5)  # the last echoes land
    server, got = pair.server, echoes(pair)
    assert len(sent) >= 140
    # Each packet crosses twice at 10 % loss (+5 % duplicates): ~81 % come back.
    assert server.packets_in >= 0.75 * len(sent)
    assert len({e.packet.sequence for e in got}) >= 0.6 * len(sent)
    for e in got:
        assert e.packet.ssrc == SERVER_SSRC and e.packet.payload_type == pair.client.opus_pt
        assert e.packet.payload == b"\xfc" + bytes(40)
    # Passthrough keeps our stream's timestamps tied to the client's: same step per seq.
    first = got[0].packet
    for e in got:
        p = e.packet
        steps = ((p.sequence - first.sequence + 0x8000) & 0xFFFF) - 0x8000  # signed
        assert (p.timestamp - first.timestamp) & 0xFFFFFFFF == (960 * steps) & 0xFFFFFFFF
    assert server.timeline["first_rtp_in"] is not None
    assert server.timeline["first_rtp_out"] is not None
    assert server.rtcp.rx is not None and server.rtcp.rx.received == server.packets_in
    assert server.state is CallState.CONNECTED


def test_rtcp_reports_both_ways() -> None:
    """Our SR reaches the client; the client's RR about our stream gives an RTT."""
    pair = CallPair()
    pair.server.rtcp.interval = 0.5
    assert pair.run_until(lambda: connected(pair), within=1.0)
    start_media(pair)
    pair.run_for(2.0)
    rtcp = [parse_rtcp_untrusted(e.data) for e in pair.client_events
            if isinstance(e, RtcpReceived)]
    srs = [p for c in rtcp for p in c if isinstance(p, RtcpSenderReport)]
    assert srs and srs[-1].ssrc == SERVER_SSRC and srs[-1].packet_count > 0
    assert sum(isinstance(e, ReportSent) for e in pair.server_events) >= 2
    # The client answers with a receiver report about our SSRC (as a browser would).
    sr = srs[-1]
    lsr = ((sr.ntp_msw & 0xFFFF) << 16) | (sr.ntp_lsw >> 16)
    block = ReportBlock(ssrc=SERVER_SSRC, fraction_lost=64, cumulative_lost=3,
                        highest_sequence=100, jitter=480, lsr=lsr, dlsr=0)
    pair.client.send_rtcp(serialize_rtcp([RtcpReceiverReport(pair.client.ssrc, (block,))]))
    pair.run_for(0.1)
    reports = [e for e in pair.server_events if isinstance(e, RemoteReport)]
    assert reports and reports[-1].loss == 0.25 and reports[-1].jitter == 0.01
    assert reports[-1].rtt is not None and 0 < reports[-1].rtt < 1.0


def test_consent_keeps_the_call_and_its_loss_ends_it() -> None:
    """RFC 7675: the client's consent checks (every ~5 s) keep the call for a minute with no
    media; once they stop, the call ends ``consent-expired`` 30 s after the last one."""
    last_check = [0.0]
    blocked = [False]
    pair = CallPair()

    def drop(direction: str, data: bytes) -> bool:
        if direction == "c2s" and classify(data) is Kind.STUN:
            if blocked[0]:
                return True
            last_check[0] = pair.now
        return False

    pair.drop = drop
    assert pair.run_until(lambda: connected(pair), within=1.0)
    pair.run_for(60.0)
    assert pair.server.state is CallState.CONNECTED
    blocked[0] = True
    ended = pair.run_until(lambda: pair.server.state is CallState.ENDED, within=40.0)
    assert ended and pair.server.end_reason == "consent-expired"
    assert 30.0 <= pair.now - last_check[0] <= 30.0 + 0.2
    assert [e for e in pair.server_events if isinstance(e, Ended)] == [Ended("consent-expired")]
    assert pair.server.poll_timeout() is None
    # close_notify went out; the client's own consent then lapses too.
    assert pair.run_until(lambda: any(isinstance(e, Failed) for e in pair.client_events), 40.0)


def test_ice_restart_keeps_media_flowing() -> None:
    """RFC 8445 §9: new credentials both ways mid-call; media stays on the old pair until
    the client nominates with the new ones, which the call reports as a new nomination."""
    pair = CallPair(net=Netem(delay=0.01, jitter=0.005))
    assert pair.run_until(lambda: connected(pair), within=1.0)
    sent = start_media(pair)
    pair.run_for(1.0)
    before = len(echoes(pair))
    pair.server.restart_ice("newsrvufrag", "q" * 24, "newclnt", "r" * 24)
    assert pair.server.local_ufrag == "newsrvufrag"
    assert pair.client.ice is not None
    pair.client.ice.restart("newclnt", "r" * 24, "newsrvufrag", "q" * 24, pair.now)
    pair.run_for(1.0)
    nominations = [e for e in pair.server_events if isinstance(e, FlowNominated)]
    assert len(nominations) == 2 and nominations[-1].client == CLIENT
    assert len(echoes(pair)) >= before + 45  # no gap: ~50 packets in the second second
    assert pair.server.state is CallState.CONNECTED
    assert pair.server.ice.local_ufrag == "newsrvufrag" and len(sent) >= 99


def test_dtls_server_flight_lost_then_retransmitted() -> None:
    """Regression guard (DTLS retransmission, RFC 6347 §4.2.4), server in the passive role: its first flight
    (ServerHello … ServerHelloDone) is lost; the client's ClientHello retransmission (0.1 s
    timer) brings it again and the call comes up."""
    lost = [0]

    def drop(direction: str, data: bytes) -> bool:
        if direction == "s2c" and classify(data) is Kind.DTLS and lost[0] < 1:
            lost[0] += 1
            return True
        return False

    pair = CallPair(drop=drop, offer_setup="active")  # we are the DTLS server
    assert pair.run_until(lambda: connected(pair), within=5.0)
    assert lost[0] == 1
    assert pair.server.dtls.counters.retransmissions >= 1
    assert pair.client.dtls is not None and pair.client.dtls.counters.retransmissions >= 1


def test_dtls_server_final_flight_lost_then_retransmitted() -> None:
    """The server's last flight (ChangeCipherSpec + Finished) is lost: the server counts
    itself connected, the client retransmits its flight 5 and the server must answer it with
    its last flight again (RFC 6347 §4.2.4) — else the client never connects."""
    dtls_s2c = [0]

    def drop(direction: str, data: bytes) -> bool:
        if direction == "s2c" and classify(data) is Kind.DTLS:
            dtls_s2c[0] += 1
            return pair.server.state is CallState.CONNECTED and dtls_s2c[0] <= 3
        return False

    pair = CallPair(drop=drop, offer_setup="active")  # we are the DTLS server
    assert pair.run_until(lambda: connected(pair), within=5.0)
    assert pair.dropped["s2c"] >= 1
    assert pair.server.dtls.counters.retransmissions >= 1


def test_setup_timeouts() -> None:
    """No authenticated check within 30 s of the answer: ``ice-timeout``; ICE but no DTLS:
    ``setup-timeout``."""
    silent = CallPair(drop=lambda d, data: d == "c2s")
    assert silent.run_until(lambda: silent.server.state is CallState.ENDED, within=31.0)
    assert silent.server.end_reason == "ice-timeout" and 29.9 < silent.now <= 30.01

    no_dtls = CallPair(drop=lambda d, data: classify(data) is Kind.DTLS)
    assert no_dtls.run_until(lambda: no_dtls.server.state is CallState.ENDED, within=31.0)
    assert no_dtls.server.end_reason == "setup-timeout"


class LoopbackAssociation:
    """A stand-in for the SCTP association (the slot's contract, not SCTP): every packet
    handed in comes back out once, reversed, and is reported as a channel message."""

    def __init__(self) -> None:
        self.inputs: list[bytes] = []
        self.out: list[bytes] = []
        self.events: list[dc.EndpointEvent] = []
        self.connects: list[float] = []

    def connect(self, now: float) -> None:
        self.connects.append(now)

    def handle_input(self, now: float, packet: bytes) -> None:
        self.inputs.append(packet)
        self.out.append(packet[::-1])
        self.events.append(dc.ChannelMessage(0, packet))

    def poll_transmit(self) -> bytes | None:
        return self.out.pop(0) if self.out else None

    def poll_event(self) -> dc.EndpointEvent | None:
        return self.events.pop(0) if self.events else None

    def poll_timeout(self) -> float | None:
        return None

    def handle_timeout(self, now: float) -> None:
        pass


def _client_app_data(pair: CallPair) -> list[bytes]:
    """Record the client's DTLS application data (ClientPeer has no data channels)."""
    got: list[bytes] = []
    dtls = pair.client.dtls
    assert dtls is not None
    real = dtls.poll_event

    def poll_event():  # type: ignore[no-untyped-def]
        ev = real()
        if isinstance(ev, ApplicationData):
            got.append(ev.data)
        return ev

    dtls.poll_event = poll_event  # type: ignore[method-assign]
    return got


def _client_sends_app_data(pair: CallPair, data: bytes) -> None:
    dtls = pair.client.dtls
    assert dtls is not None
    dtls.send_application_data(data)
    while (out := dtls.poll_transmit()) is not None:
        pair._send(True, out)


def test_dtls_application_data_goes_to_the_sctp_slot_and_back() -> None:
    pair = CallPair()
    assoc = LoopbackAssociation()
    pair.server.sctp = assoc
    assert pair.run_until(lambda: connected(pair), within=1.0)
    got = _client_app_data(pair)
    _client_sends_app_data(pair, b"INIT-chunk")
    pair.run_for(0.1)
    assert assoc.inputs == [b"INIT-chunk"]
    assert got == [b"knuhc-TINI"]  # out through DTLS, on the media flow
    assert dc.ChannelMessage(0, b"INIT-chunk") in pair.server_events  # unwrapped
    assert len(assoc.connects) == 1  # the call connected its slot once DTLS was up


def test_dtls_application_data_without_an_association_is_dropped() -> None:
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    got = _client_app_data(pair)
    _client_sends_app_data(pair, b"stray")
    pair.run_for(0.1)
    assert got == [] and pair.server.state is CallState.CONNECTED


def test_datagrams_from_an_unauthenticated_address_are_dropped() -> None:
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    stranger = ("192.0.2.99", 4444)
    pair.server.handle_input(pair.now, b"\x17\xfe\xfd" + bytes(30), (stranger, PUBLIC, RELAY))
    pair.server.handle_input(pair.now, b"\x80\x6f" + bytes(30), (stranger, PUBLIC, RELAY))
    assert pair.counters["drop_unknown_flow"] == 2
    outs = []
    while (o := pair.server.poll_output()) is not None:
        outs.append(o)
    assert not any(isinstance(o, Transmit) for o in outs)
    assert pair.server.state is CallState.CONNECTED


def test_close_sends_close_notify_and_ends_once() -> None:
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    pair.server.close("deleted")
    pair.server.close("again")  # idempotent
    pair._collect()
    assert [e for e in pair.server_events if isinstance(e, Ended)] == [Ended("deleted")]
    assert pair.run_until(lambda: any(isinstance(e, Failed) for e in pair.client_events), 1.0)
    assert pair.server.end_reason == "deleted"


def test_pcm_echo_through_the_pipeline() -> None:
    """The PCM slot: Opus in, jitter buffer, decode, the built-in echo frame handler,
    packetizer, encode, out — on the same virtual network, with jitter."""
    pair = CallPair(passthrough=False, net=Netem(delay=0.01, jitter=0.01))
    call = pair.server
    scheduled: list[float] = []
    pipeline: PcmPipeline

    def output() -> None:
        pipeline.output_queued(pair.now)

    host = AgentHost(on_output=output)
    agent = resolve("echo")
    ctx = AgentContext(host, AgentIdentity(agent.name, "pcm", 0, {}))
    pipeline = PcmPipeline(call, host, ctx, on_frame=agent.on_frame, schedule=scheduled.append)
    call.media = pipeline
    assert pair.run_until(lambda: connected(pair), within=1.0)
    enc = OpusEncoder()
    t = np.arange(960) / 48_000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    assert len(tone) == FRAME_BYTES
    ticks = sent = 0

    def tick(now: float) -> None:
        nonlocal ticks, sent
        while scheduled and scheduled[0] <= now:  # the shell's pacer, in miniature
            pipeline.pace(now, scheduled.pop(0))
        ticks += 1
        if ticks % 4 == 1 and sent < 50:  # a packet per 20 ms, the pacer every 5 ms
            pair.client.send_rtp(enc.encode(tone), (960 * sent) & 0xFFFFFFFF, marker=not sent)
            sent += 1

    pair.tick, pair.tick_every = tick, 0.005
    pair.run_for(1.3)
    got = echoes(pair)
    assert len(got) >= 40
    assert all(e.packet.ssrc == SERVER_SSRC for e in got)
    seqs = [e.packet.sequence for e in got]
    assert len(set(seqs)) == len(seqs)


def test_one_input_one_output_and_an_rtp_packet_costs_no_timeout() -> None:
    """handle_input takes every kind; poll_output gives the echo as a Transmit. A packet
    that moves no deadline (in-order RTP to passthrough) yields no Timeout: the echo path
    does not recompute the call's timers per packet; a STUN check does."""
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    srtp = pair.client.srtp
    assert srtp is not None
    pair._collect()
    source = (CLIENT, PUBLIC, RELAY)
    for seq in (100, 101):
        plain = bytes([0x80, pair.client.opus_pt]) + seq.to_bytes(2, "big") + bytes(8) + b"x"
        pair.server.handle_input(pair.now, srtp.protect(plain), source)
        outs = []
        while (o := pair.server.poll_output()) is not None:
            outs.append(o)
        assert [type(o) for o in outs] == [Transmit]
    pair.server.handle_input(pair.now, b"\x00\x01" + bytes(30), source)  # a bad STUN
    outs = []
    while (o := pair.server.poll_output()) is not None:
        outs.append(o)
    assert isinstance(outs[-1], Timeout) and outs[-1].at == pair.server.poll_timeout()
