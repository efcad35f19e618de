"""ClientPeer against a server assembled from the same proto pieces the transceiver uses
(ICE-lite + DTLS server + SRTP), over an in-memory network on a virtual clock."""

from __future__ import annotations

import random

import pytest

from appliance.client.peer import ClientPeer, Connected, Failed, RtpReceived
from appliance.proto.dtls import Certificate, DtlsConnection, HandshakeComplete, Role
from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice import IceLiteAgent
from appliance.proto.mux import Kind, classify
from appliance.proto.rtp import RtpPacket
from appliance.proto.sdp import build_answer, parse_offer_untrusted
from appliance.proto.srtp import (
    SrtpProfile,
    SrtpSession,
)

SERVER = ("198.51.100.1", 3478)
CLIENT = ("203.0.113.9", 50000)


class MiniServer:
    """Just enough of a transceiver: answers ICE, completes DTLS, echoes RTP."""

    def __init__(self, offer: str, now: float, *, srtp_profiles: tuple[SrtpProfile, ...]) -> None:
        self.cert = Certificate.generate(now)
        parsed = parse_offer_untrusted(offer)
        self.answer = build_answer(
            parsed, ice_ufrag="srvufrag", ice_pwd="serverpasswordserverpass",
            fingerprint=self.cert.fingerprint, candidates=[SERVER], ssrc=1234, cname="srv",
            session_id=1, prefer_active=False)  # a DTLS-server MiniServer
        audio = parsed.media[0]
        self.ice = IceLiteAgent("srvufrag", "serverpasswordserverpass", audio.ice_ufrag,
                                audio.ice_pwd)
        self.dtls = DtlsConnection(Role.SERVER, self.cert,
                                   remote_fingerprints=[str(f) for f in audio.fingerprints],
                                   srtp_profiles=srtp_profiles)
        self.srtp: SrtpSession | None = None
        self.out: list[tuple[bytes, tuple[str, int]]] = []

    def handle(self, now: float, data: bytes, addr: tuple[str, int]) -> None:
        kind = classify(data)
        if kind is Kind.STUN:
            self.ice.handle_input(now, data, addr)
        elif kind is Kind.DTLS:
            self.dtls.handle_datagram(now, data)
        elif kind is Kind.RTP and self.srtp is not None:
            pkt = RtpPacket.parse_untrusted(self.srtp.unprotect_untrusted(data))
            self.out.append((self.srtp.protect(bytes(pkt)), addr))  # echo
        self.pump()

    def pump(self) -> None:
        while (t := self.ice.poll_transmit()) is not None:
            self.out.append(t)
        while (d := self.dtls.poll_transmit()) is not None:
            self.out.append((d, CLIENT))
        while (ev := self.dtls.poll_event()) is not None:
            if isinstance(ev, HandshakeComplete):
                assert ev.srtp_profile is not None
                self.srtp = SrtpSession.from_exporter(
                    self.dtls.export_keying_material, ev.srtp_profile, "server")


def run_call(profile: SrtpProfile, *, loss: float, seed: int, false_start: bool = False,
             ) -> tuple[ClientPeer, list[object]]:
    """Each loop turn is one round trip: what the client sent reaches the server, and what
    the server sent back reaches the client. Events are tagged with the turn they came in."""
    rng = random.Random(seed)
    now = 1000.0
    peer = ClientPeer(Certificate.generate(now), rng=random.Random(seed), false_start=false_start)
    server = MiniServer(peer.offer(), now, srtp_profiles=(profile,))
    peer.accept_answer(server.answer.text, now)
    events: list[object] = []
    sent_media = False
    for turn in range(4000):
        while (t := peer.poll_transmit()) is not None:
            if rng.random() >= loss:
                server.handle(now, t[0], CLIENT)
        for data, _addr in server.out:
            if rng.random() >= loss:
                peer.handle_datagram(now, data, SERVER)
        server.out.clear()
        while (ev := peer.poll_event()) is not None:
            events.append(ev)
            TURN[id(ev)] = turn
            if isinstance(ev, Connected) and not sent_media:
                sent_media = True
                for i in range(10):
                    peer.send_rtp(bytes([i]) * 40, 960 * i, marker=i == 0)
        if sum(isinstance(e, RtpReceived) for e in events) >= 10 * (1 - loss) - 3 and sent_media:
            break
        if any(isinstance(e, Failed) for e in events):
            break
        now += 0.01
        peer.handle_timeout(now)
        server.dtls.handle_timeout(now)
        server.ice.handle_timeout(now)
        server.pump()
    return peer, events


TURN: dict[int, int] = {}  # id(event) -> the round trip it arrived in


@pytest.mark.parametrize("profile", [SrtpProfile.AES128_CM_HMAC_SHA1_80,
                                     SrtpProfile.AEAD_AES_128_GCM, SrtpProfile.AEAD_AES_256_GCM])
def test_call_connects_and_echoes(profile: SrtpProfile) -> None:
    peer, events = run_call(profile, loss=0.0, seed=1)
    connected = [e for e in events if isinstance(e, Connected)]
    assert len(connected) == 1
    assert connected[0].srtp_profile is profile
    echoed = [e.packet for e in events if isinstance(e, RtpReceived)]
    assert [p.payload for p in echoed] == [bytes([i]) * 40 for i in range(10)]
    assert peer.srtp_errors == 0


@pytest.mark.parametrize("seed", range(5))
def test_call_survives_loss(seed: int) -> None:
    _, events = run_call(SrtpProfile.AEAD_AES_128_GCM, loss=0.2, seed=seed)
    assert any(isinstance(e, Connected) for e in events)


def test_wrong_server_fingerprint_fails() -> None:
    now = 5.0
    peer = ClientPeer(Certificate.generate(now), rng=random.Random(3))
    server = MiniServer(peer.offer(), now, srtp_profiles=(SrtpProfile.AEAD_AES_128_GCM,))
    other = Certificate.generate(now).fingerprint
    peer.accept_answer(server.answer.text.replace(server.cert.fingerprint, other), now)
    events: list[object] = []
    for _ in range(200):
        while (t := peer.poll_transmit()) is not None:
            server.handle(now, t[0], CLIENT)
        for data, _ in server.out:
            peer.handle_datagram(now, data, SERVER)
        server.out.clear()
        while (ev := peer.poll_event()) is not None:
            events.append(ev)
        if events:
            break
        now += 0.01
        peer.handle_timeout(now)
    assert any(isinstance(e, Failed) for e in events)
    assert not any(isinstance(e, Connected) for e in events)


@pytest.mark.parametrize("profile", [SrtpProfile.AES128_CM_HMAC_SHA1_80,
                                     SrtpProfile.AEAD_AES_128_GCM])
def test_false_start_echoes_one_round_trip_sooner(profile: SrtpProfile) -> None:
    """RFC 7918 (opt-in): media goes out right behind our DTLS Finished, so the server,
    keyed by that Finished, echoes the first packet in the same round trip as its own
    Finished: the first echo comes one round trip sooner (ICE, DTLS x2, echo: 4 -> 3),
    with the same packets and a single Connected."""
    firsts = {}
    for fs in (False, True):
        peer, events = run_call(profile, loss=0.0, seed=1, false_start=fs)
        assert sum(isinstance(e, Connected) for e in events) == 1
        echoed = [e for e in events if isinstance(e, RtpReceived)]
        assert [e.packet.payload for e in echoed] == [bytes([i]) * 40 for i in range(10)]
        assert peer.srtp_errors == 0
        assert peer.dtls is not None and peer.dtls.state.value == "established"
        firsts[fs] = TURN[id(echoed[0])]
    assert firsts == {False: 3, True: 2}  # turns counted from 0


@pytest.mark.parametrize("seed", range(5))
def test_false_start_survives_loss(seed: int) -> None:
    _, events = run_call(SrtpProfile.AEAD_AES_128_GCM, loss=0.2, seed=seed, false_start=True)
    assert sum(isinstance(e, Connected) for e in events) == 1
    assert not any(isinstance(e, Failed) for e in events)


# -- the sctp slot (data channels; whole calls in tests/transceiver/test_call_datachannel.py) --


@pytest.mark.parametrize("audio", [True, False])
def test_datachannel_offer_is_served_by_our_answerer(audio: bool) -> None:
    from appliance.proto.sdp import choose_plans

    peer = ClientPeer(Certificate.generate(0.0), audio=audio, datachannel=True)
    offer = parse_offer_untrusted(peer.offer())
    plan, app, transport = choose_plans(offer)
    assert (plan is not None) is audio and app is not None
    assert app.sctp_port == 5000 and app.max_message_size == 262144
    assert offer.bundle == (("0", "1") if audio else ("0",))
    assert transport.ice_ufrag == peer.local_ufrag


def test_channel_verbs_need_a_data_channel() -> None:
    with pytest.raises(LocalProtocolError):
        ClientPeer(Certificate.generate(0.0), audio=False, datachannel=False)
    peer = ClientPeer(Certificate.generate(0.0))
    with pytest.raises(RuntimeError, match="no data channel"):
        peer.open_channel(0.0, "chat")
    assert "m=application" not in peer.offer()
