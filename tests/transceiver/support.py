"""A test client for the transceiver built on appliance/proto (IceClient, DTLS client, SRTP),
with the test playing the relay: it wraps every datagram in a PROXY v2 header."""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import trio

from appliance.agents import AgentContext
from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
from appliance.proto.ice import IceClient
from appliance.proto.mux import Kind, classify
from appliance.proto.proxy import encode_header, parse_untrusted
from appliance.proto.rtp import RtpPacket, parse_rtcp_untrusted
from appliance.proto.srtp import SrtpSession
from appliance.transceiver.opus import FRAME_BYTES, OpusDecoder, OpusEncoder

CHROME = Path(__file__).resolve().parents[1] / "proto" / "sdp" / "data" / "chrome-audio-only.sdp"
CLIENT = ("203.0.113.7", 53211)  # as the relay saw the client
PUBLIC = ("198.51.100.1", 3478)  # the relay's public address


def make_offer(ufrag: str, pwd: str, fingerprint: str) -> str:
    text = CHROME.read_text()
    text = re.sub(r"a=ice-ufrag:\S+", f"a=ice-ufrag:{ufrag}", text)
    text = re.sub(r"a=ice-pwd:\S+", f"a=ice-pwd:{pwd}", text)
    return re.sub(r"a=fingerprint:[^\r\n]+", f"a=fingerprint:{fingerprint}", text)


def answer_field(answer: str, name: str) -> str:
    m = re.search(rf"^a={name}:([^\r\n]+)", answer, re.M)
    assert m, name
    return m.group(1)


def sine(freq: float, frames: int, start: int = 0) -> list[bytes]:
    t = (np.arange(frames * 960) + start * 960) / 48_000
    pcm = (np.sin(2 * np.pi * freq * t) * 10_000).astype(np.int16).tobytes()
    return [pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES] for i in range(frames)]


@dataclass
class Client:
    """One WebRTC client behind a fake relay socket (the test drives its clock)."""

    sock: socket.socket  # non-blocking: the fake relay's internal socket
    transceiver: tuple[str, int]
    cert: Certificate = field(default_factory=lambda: Certificate.generate(time.time()))
    ufrag: str = "Clnt"
    pwd: str = "clientpasswordclientpass"
    client_addr: tuple[str, int] = CLIENT
    ice: IceClient | None = None
    dtls: DtlsConnection | None = None
    srtp: SrtpSession | None = None
    received_rtp: list[tuple[float, RtpPacket]] = field(default_factory=list)
    received_rtcp: list[object] = field(default_factory=list)
    seq: int = 1000
    ts: int = 0
    dtls_versions: frozenset[str] = frozenset({"1.2"})  # what our DTLS side offers/accepts
    #: Our DTLS role, from the answer's a=setup (RFC 8842 §5.3): the transceiver answers
    #: ``active`` to our ``actpass``, which makes us the server.
    role: Role = Role.CLIENT

    def offer(self) -> str:
        return make_offer(self.ufrag, self.pwd, self.cert.fingerprint)

    def start(self, answer: str, now: float) -> None:
        server_ufrag = answer_field(answer, "ice-ufrag")
        server_pwd = answer_field(answer, "ice-pwd")
        fingerprint = answer_field(answer, "fingerprint")
        self.role = Role.SERVER if answer_field(answer, "setup") == "active" else Role.CLIENT
        self.ice = IceClient(self.ufrag, self.pwd, server_ufrag, server_pwd, PUBLIC)
        self.ice.start(now)
        self.dtls = DtlsConnection(self.role, self.cert, remote_fingerprints=[fingerprint],
                                   versions=self.dtls_versions)

    async def send_raw(self, payload: bytes) -> None:
        self.sock.sendto(encode_header(self.client_addr, PUBLIC) + payload, self.transceiver)
        await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        assert self.ice is not None and self.dtls is not None
        while (out := self.ice.poll_transmit()) is not None:
            await self.send_raw(out[0])
        while (d := self.dtls.poll_transmit()) is not None:
            await self.send_raw(d)

    async def pump(self, now: float) -> None:
        """Receive what is waiting, feed the machines, send what they want."""
        assert self.ice is not None and self.dtls is not None
        while True:
            try:
                data, _ = self.sock.recvfrom(65536)
            except BlockingIOError:
                break
            src, dst, off = parse_untrusted(data)
            assert dst == PUBLIC
            payload = data[off:]
            self.handle(now, src, payload)
        self.ice.handle_timeout(now)
        self.dtls.handle_timeout(now)
        while self.ice.poll_event() is not None:
            pass
        await self.flush()

    def handle(self, now: float, src: tuple[str, int], payload: bytes) -> None:
        assert self.ice is not None and self.dtls is not None
        kind = classify(payload)
        if kind is Kind.STUN:
            self.ice.handle_input(now, payload, PUBLIC)
            if (self.role is Role.CLIENT and self.dtls.state.value == "client-idle"
                    and self.ice.state.value == "nominated"):
                self.dtls.start(now)
        elif kind is Kind.DTLS:
            self.dtls.handle_datagram(now, payload)
            while (ev := self.dtls.poll_event()) is not None:
                if isinstance(ev, HandshakeComplete):
                    assert ev.srtp_profile is not None
                    self.srtp = SrtpSession.from_exporter(
                        self.dtls.export_keying_material, ev.srtp_profile, self.role)
        elif kind is Kind.RTP and self.srtp is not None:
            self.received_rtp.append(
                (now, RtpPacket.parse_untrusted(self.srtp.unprotect_untrusted(payload))))
        elif kind is Kind.RTCP and self.srtp is not None:
            self.received_rtcp += parse_rtcp_untrusted(self.srtp.unprotect_rtcp_untrusted(payload))

    async def send_audio(self, pcm: bytes, encoder: OpusEncoder, pt: int = 111) -> None:
        assert self.srtp is not None
        pkt = RtpPacket(pt, self.seq & 0xFFFF, self.ts & 0xFFFFFFFF, 0x1234,
                        encoder.encode(pcm), marker=self.seq == 1000)
        self.seq += 1
        self.ts += 960
        await self.send_raw(self.srtp.protect(bytes(pkt)))


def decode_all(packets: list[RtpPacket]) -> bytes:
    dec = OpusDecoder()
    return b"".join(dec.decode(p.payload) for p in sorted(packets, key=lambda p: p.sequence))


def dominant_hz(pcm: bytes) -> float:
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * 48_000 / len(x))


#: What :func:`events_agent` saw, by session id (its tests read it).
AGENT_EVENTS: dict[str, list[dict[str, object]]] = {}


async def events_agent(ctx: AgentContext) -> None:
    """An agent task (spec ``transceiver.support:events_agent``) that echoes what it hears
    and keeps every event the transceiver sends it in :data:`AGENT_EVENTS`."""
    seen = AGENT_EVENTS.setdefault(ctx.session_id, [])

    async def echo() -> None:
        async for frame in ctx.frames():
            ctx.send_nowait(frame.pcm)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        async for event in ctx.events():
            seen.append(event)
        nursery.cancel_scope.cancel()


async def reporting_agent(ctx: AgentContext) -> None:
    """An agent (spec ``transceiver.support:reporting_agent``) that echoes what it hears and,
    at its first frame, reports a turn as the assistant does: ``transcript.user.final``,
    ``transcript.agent`` and its ``turn.metrics`` waterfall."""
    reported = False
    async for frame in ctx.frames():
        ctx.send_nowait(frame.pcm)
        if not reported:
            reported = True
            await ctx.send_event({"type": "transcript.user.final", "text": "what time is it"})
            await ctx.send_event({"type": "transcript.agent", "text": "It is noon."})
            await ctx.send_event({"type": "turn.metrics", "turn": 1, "speech_start_ms": -900.0,
                                  "speech_end_ms": -300.0, "transcript_ms": 2.0,
                                  "first_audio_ms": 40.0})
