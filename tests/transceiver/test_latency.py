"""Issue 6 item 5: the appliance adds at most one frame (20 ms) of buffering between the RTP
that arrives and the PCM an agent sees, and between the PCM an agent sends and the RTP that
leaves — measured on trio's fake clock (``autojump_clock``), so the figures are exact.

A real :class:`~appliance.transceiver.session.Session` (ICE-lite, DTLS, SRTP, jitter
buffer, Opus, packetizer, pacer) is driven in memory: the test plays the client and the
relay, hands each SRTP packet to :meth:`Session.handle_input` at a chosen clock time and
timestamps every datagram the session sends with the clock time it was sent at. Agents are
ordinary agent tasks (``ctx.frames()`` / ``ctx.send()``) that timestamp what they see and
send; the built-in ``echo`` (a synchronous frame handler in the network loop) is measured
too. With the fake clock a task switch takes no time, so "0 ms" means the pipeline holds
the frame for no clock time at all — what is measured is buffering, not CPU speed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
import trio.testing
from transceiver.support import PUBLIC, make_offer, sine

from appliance.agents import AgentContext, ResolvedAgent, resolve
from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
from appliance.proto.ice import IceClient
from appliance.proto.mux import Kind, classify
from appliance.proto.proxy import parse_untrusted
from appliance.proto.rtp import RtpPacket
from appliance.proto.sdp import build_answer, parse_offer_untrusted
from appliance.proto.srtp import SrtpSession
from appliance.transceiver.media import EARLY
from appliance.transceiver.opus import Encoder, OpusEncoder
from appliance.transceiver.session import Session

FRAME = 0.020
CLIENT = ("203.0.113.7", 53211)
RELAY = ("10.0.0.2", 4000)  # the relay's internal address
EPS = 1e-6  # float slack on clock arithmetic


@dataclass
class Harness:
    """A Session with the test as its client and relay; ``out`` is every RTP packet the
    session sent, with the clock time it left at."""

    session: Session
    ice: IceClient
    dtls: DtlsConnection
    srtp: SrtpSession | None = None
    out: list[tuple[float, RtpPacket]] = field(default_factory=list)
    seq: int = 5000
    ts: int = 0
    encoder: Encoder = field(default_factory=lambda: OpusEncoder())

    def on_send(self, data: bytes, relay: tuple[str, int]) -> None:
        assert relay == RELAY
        src, dst, off = parse_untrusted(data)
        assert src == CLIENT and dst == PUBLIC
        payload = bytes(data[off:])
        now = trio.current_time()
        kind = classify(payload)
        if kind is Kind.STUN:
            self.ice.handle_input(now, payload, PUBLIC)
            if self.dtls.state.value == "client-idle" and self.ice.state.value == "nominated":
                self.dtls.start(now)
        elif kind is Kind.DTLS:
            self.dtls.handle_datagram(now, payload)
            while (ev := self.dtls.poll_event()) is not None:
                if isinstance(ev, HandshakeComplete):
                    assert ev.srtp_profile is not None
                    self.srtp = SrtpSession.from_exporter(
                        self.dtls.export_keying_material, ev.srtp_profile, "client")
        elif kind is Kind.RTP and self.srtp is not None:
            self.out.append((now, RtpPacket.parse_untrusted(self.srtp.unprotect_untrusted(payload))))

    def flush(self) -> None:
        """Hand the client's pending STUN/DTLS datagrams to the session (synchronously;
        the session's replies come back through :meth:`on_send`)."""
        now = trio.current_time()
        moved = True
        while moved:
            moved = False
            while (out := self.ice.poll_transmit()) is not None:
                self.session.handle_input(now, out[0], (CLIENT, PUBLIC, RELAY))
                moved = True
            while (d := self.dtls.poll_transmit()) is not None:
                self.session.handle_input(now, d, (CLIENT, PUBLIC, RELAY))
                moved = True

    def send_rtp(self, pcm: bytes, *, seq: int | None = None) -> None:
        """One 20 ms packet, handed in now (the socket loop would call exactly this)."""
        assert self.srtp is not None
        s = self.seq if seq is None else seq
        pkt = RtpPacket(111, s & 0xFFFF, (self.ts + 960 * (s - 5000)) & 0xFFFFFFFF, 0x1234,
                        self.encoder.encode(pcm), s == 5000)
        if seq is None:
            self.seq += 1
        self.session.handle_input(trio.current_time(), self.srtp.protect(bytes(pkt)),
                                  (CLIENT, PUBLIC, RELAY))


AgentFn = Callable[[AgentContext], Awaitable[None]]


async def open_session(nursery: trio.Nursery, agent: ResolvedAgent) -> Harness:
    cert = Certificate.generate(time.time())
    offer = parse_offer_untrusted(make_offer("Clnt", "clientpasswordclientpass", cert.fingerprint))
    server_cert = Certificate.generate(time.time())
    ufrag, pwd = "srvufrag", secrets.token_hex(12)
    answer = build_answer(offer, ice_ufrag=ufrag, ice_pwd=pwd,
                          fingerprint=server_cert.fingerprint, candidates=[PUBLIC],
                          ssrc=0xABCDEF, cname="latency", session_id=1,
                          prefer_active=False)  # the harness client is the DTLS client
    harness: Harness

    def send(data: bytes, relay: tuple[str, int]) -> None:
        harness.on_send(data, relay)

    session = Session(
        session_id="lat", transceiver=0, agent=agent, answer=answer, candidates=[PUBLIC],
        local_ufrag=ufrag, local_pwd=pwd,
        dtls=DtlsConnection(Role.SERVER, server_cert,
                            remote_fingerprints=[str(f) for f in answer.transport.fingerprints]),
        ssrc=0xABCDEF, cname="latency", send=send, now=trio.current_time(),
        on_end=lambda s: None, counters=_Counters(),
    )
    harness = Harness(
        session,
        IceClient("Clnt", "clientpasswordclientpass", ufrag, pwd, PUBLIC),
        DtlsConnection(Role.CLIENT, cert, remote_fingerprints=[server_cert.fingerprint]),
    )
    await nursery.start(session.run)
    harness.ice.start(trio.current_time())
    for _ in range(20):
        harness.flush()
        if harness.srtp is not None and session.state == "connected":
            break
        await trio.sleep(0.001)
        harness.ice.handle_timeout(trio.current_time())
        harness.dtls.handle_timeout(trio.current_time())
    assert session.state == "connected" and harness.srtp is not None
    await trio.testing.wait_all_tasks_blocked()  # the agent task is up and waiting
    return harness


class _Counters(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return 0


def agent_of(fn: AgentFn) -> ResolvedAgent:
    return ResolvedAgent(name="latency-test", run=fn)


@dataclass
class Recorder:
    """What a generic agent saw and sent, with clock times."""

    seen: list[tuple[float, int]] = field(default_factory=list)  # (clock, frame index)
    sent: list[float] = field(default_factory=list)  # clock time of each send() call


async def drive(h: Harness, arrivals: list[tuple[float, int]], frames: list[bytes]) -> None:
    """Hand packet ``seq_index`` in at each ``(time, seq_index)`` (times are offsets from
    now); then let the clock run on long enough for everything to leave."""
    t0 = trio.current_time()
    for at, index in arrivals:
        await trio.sleep_until(t0 + at)
        h.send_rtp(frames[index], seq=5000 + index)
    await trio.sleep(0.2)


def in_delays(arrivals: list[tuple[float, int]], seen: list[tuple[float, int]],
              t0: float) -> list[float]:
    """Per frame the agent saw: clock time seen − clock time its packet arrived."""
    arrived = {index: t0 + at for at, index in arrivals}
    return [t - arrived[index] for t, index in seen]


# -- inbound: RTP arrives → the agent sees the frame ----------------------------------------


def echo_recording(rec: Recorder) -> AgentFn:
    """A generic agent (its own task): records each frame's clock time and index (from the
    RTP-derived media timestamp), sends it straight back and records when it sent it."""

    async def agent(ctx: AgentContext) -> None:
        async for frame in ctx.frames():
            rec.seen.append((trio.current_time(), round(frame.timestamp / FRAME)))
            rec.sent.append(trio.current_time())
            await ctx.send(frame.pcm)

    return agent


async def test_in_order_packets_reach_a_generic_agent_with_no_added_delay(autojump_clock: trio.testing.MockClock) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(echo_recording(rec)))
        frames = sine(440, 50)
        t0 = trio.current_time()
        # Arrival jitter of up to ±6 ms around the 20 ms grid, still in order.
        arrivals = [(i * FRAME + (0.006 if i % 3 == 1 else -0.004 if i % 3 == 2 else 0)
                     + 0.05, i) for i in range(50)]
        await drive(h, arrivals, frames)
        delays = in_delays(arrivals, rec.seen, t0)
        assert [i for _, i in rec.seen] == list(range(50))
        assert max(delays) <= EPS, delays  # 0 ms: decoded and handed over on arrival
        nursery.cancel_scope.cancel()


async def test_reordered_packet_waits_only_for_the_hole(autojump_clock: trio.testing.MockClock) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(echo_recording(rec)))
        frames = sine(440, 12)
        t0 = trio.current_time()
        arrivals = [(0.05 + i * FRAME, i) for i in range(12) if i not in (4, 5)]
        arrivals += [(0.05 + 5 * FRAME, 5), (0.05 + 5 * FRAME + 0.007, 4)]  # 5 before 4
        arrivals.sort()
        await drive(h, arrivals, frames)
        delays = dict(zip([i for _, i in rec.seen], in_delays(arrivals, rec.seen, t0),
                          strict=True))
        assert sorted(delays) == list(range(12))
        assert delays[4] <= EPS  # the late packet is handed over the moment it comes
        assert abs(delays[5] - 0.007) <= EPS  # held only until the hole filled (7 ms)
        assert all(delays[i] <= EPS for i in delays if i not in (5,))
        nursery.cancel_scope.cancel()


async def test_a_lost_packet_holds_the_next_frame_at_most_one_frame(autojump_clock: trio.testing.MockClock) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(echo_recording(rec)))
        frames = sine(440, 12)
        t0 = trio.current_time()
        arrivals = [(0.05 + i * FRAME, i) for i in range(12) if i != 4]
        await drive(h, arrivals, frames)
        seen = dict((i, t) for t, i in rec.seen)
        assert sorted(seen) == list(range(12))  # frame 4 is concealment (Opus FEC/PLC)
        arrived = {i: t0 + at for at, i in arrivals}
        assert seen[5] - arrived[5] <= FRAME + EPS  # the jitter buffer's initial wait
        assert seen[4] == seen[5]
        assert all(seen[i] - arrived[i] <= EPS for i in arrived if i != 5)
        nursery.cancel_scope.cancel()


# -- outbound: the agent sends PCM → RTP leaves -------------------------------------------


def send_times(h: Harness) -> list[float]:
    return [t for t, _ in h.out]


async def test_generic_agent_echo_leaves_the_moment_it_is_sent(autojump_clock: trio.testing.MockClock) -> None:
    rec = Recorder()
    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(echo_recording(rec)))
        frames = sine(440, 50)
        t0 = trio.current_time()
        arrivals = [(0.05 + i * FRAME + (0.005 if i % 4 == 1 else 0), i) for i in range(50)]
        await drive(h, arrivals, frames)
        out = send_times(h)
        assert len(out) == 50 and len(rec.sent) == 50
        delays = [o - s for o, s in zip(out, rec.sent, strict=True)]
        assert min(delays) >= -EPS
        assert max(delays) <= EPS, delays  # 0 ms: real-time input, output follows at once
        # RTP in → RTP out, the whole round trip through the agent task: 0 ms too.
        assert max(o - (t0 + at) for o, (at, _) in zip(out, arrivals, strict=True)) <= EPS
        nursery.cancel_scope.cancel()


async def test_real_time_producer_out_of_phase_with_input_is_not_delayed(autojump_clock: trio.testing.MockClock) -> None:
    """A tone agent: one frame every 20 ms on its own clock (no input at all)."""
    sent: list[float] = []

    async def tone(ctx: AgentContext) -> None:
        frames = sine(300, 40)
        await trio.sleep(0.0137)  # an arbitrary phase
        start = trio.current_time()
        for i, pcm in enumerate(frames):
            await trio.sleep_until(start + i * FRAME)
            sent.append(trio.current_time())
            await ctx.send(pcm)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(tone))
        await trio.sleep(1.0)
        out = send_times(h)
        assert len(out) == 40
        assert max(o - s for o, s in zip(out, sent, strict=True)) <= EPS
        nursery.cancel_scope.cancel()


async def test_a_burst_leaves_at_real_time_with_no_added_buffering(autojump_clock: trio.testing.MockClock) -> None:
    """A TTS-like agent hands over 1 s at once: frame k leaves at its real-time slot,
    start + k × 20 ms — the queue paces it, it adds nothing on top."""
    sent: list[float] = []

    async def speak(ctx: AgentContext) -> None:
        await trio.sleep(0.05)
        sent.append(trio.current_time())
        await ctx.send(b"".join(sine(300, 50)))
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(speak))
        await trio.sleep(1.5)
        out = send_times(h)
        assert len(out) == 50
        slots = [sent[0] + k * FRAME for k in range(50)]
        dev = [o - s for o, s in zip(out, slots, strict=True)]
        assert max(abs(d) for d in dev[:-1]) <= EPS, dev
        # The last frame has nothing queued behind it: like any lone frame it may leave up
        # to EARLY (2 ms) ahead of its slot (packetizer.py), never after it.
        assert -EARLY - EPS <= dev[-1] <= EPS
        seqs = [p.sequence for _, p in h.out]
        assert seqs == [(seqs[0] + k) & 0xFFFF for k in range(50)]
        nursery.cancel_scope.cancel()


async def test_jittery_producer_waits_at_most_one_frame(autojump_clock: trio.testing.MockClock) -> None:
    """An agent whose frames come irregularly (some early, some late, some in pairs) never
    has a frame wait more than one frame before it leaves."""
    sent: list[float] = []
    offsets = [0, 0.003, -0.001, 0.011, -0.009, 0.0, 0.019, -0.018, 0.004, 0.0] * 4

    async def jittery(ctx: AgentContext) -> None:
        start = trio.current_time() + 0.03
        for i, off in enumerate(offsets):
            await trio.sleep_until(start + i * FRAME + off)
            sent.append(trio.current_time())
            await ctx.send(sine(300, 1, i)[0])
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent_of(jittery))
        await trio.sleep(1.5)
        out = send_times(h)
        assert len(out) == len(offsets)
        delays = [o - s for o, s in zip(out, sent, strict=True)]
        assert min(delays) >= -EPS and max(delays) <= FRAME + EPS, delays
        nursery.cancel_scope.cancel()


# -- the built-in echo (synchronous, in the network loop) ---------------------------------


async def test_builtin_echo_round_trip_is_zero_on_the_fake_clock(autojump_clock: trio.testing.MockClock) -> None:
    agent = resolve("echo")
    assert agent.on_frame is not None  # the in-loop fast path
    async with trio.open_nursery() as nursery:
        h = await open_session(nursery, agent)
        frames = sine(440, 50)
        t0 = trio.current_time()
        arrivals = [(0.05 + i * FRAME + (0.006 if i % 5 == 2 else 0), i) for i in range(50)]
        await drive(h, arrivals, frames)
        out = send_times(h)
        assert len(out) == 50
        # RTP in → (decode → echo → encode → SRTP) → RTP out, at the same clock instant.
        assert max(o - (t0 + at) for o, (at, _) in zip(out, arrivals, strict=True)) <= EPS
        nursery.cancel_scope.cancel()
