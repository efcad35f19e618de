"""``RtpLeg`` (transceiver/rtp_leg.py): two legs on a fake clock exchanging plain RTP and
SDES-SRTP, the latching rule (NAT'd peer learnt, stray source never taking over), DTMF both
ways, RTCP, the media timeout, and SRTP checked against an independent RFC 3711 transform."""

from __future__ import annotations

import hashlib
import hmac
import random
import struct
from dataclasses import dataclass, field

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp import RtpPacket, parse_rtcp_untrusted, rtp_header_fields_untrusted
from appliance.proto.sdp.sdes import CryptoSuite
from appliance.transceiver.leg import MediaLeg
from appliance.transceiver.rtp_leg import (
    Address,
    Dtmf,
    Ended,
    Latched,
    RtpLeg,
    RtpLegConfig,
    SdesKeys,
    Transmit,
)

A_ADDR: Address = ("10.0.0.1", 4000)
B_ADDR: Address = ("10.0.0.2", 5000)
A_PRIVATE: Address = ("192.168.1.10", 4000)  # what a NAT'd phone puts in its SDP
A_PUBLIC: Address = ("203.0.113.7", 40000)  # where its packets really come from
STRAY: Address = ("198.51.100.9", 6666)
PT, DTMF_PT = 0, 101
SUITES = [CryptoSuite.AES_CM_128_HMAC_SHA1_80, CryptoSuite.AES_CM_128_HMAC_SHA1_32,
          CryptoSuite.AEAD_AES_128_GCM, CryptoSuite.AEAD_AES_256_GCM]


@dataclass
class Slot:
    """A media slot recording what the leg hands it."""

    got: list[tuple[int, int, bytes]] = field(default_factory=list)

    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None:
        self.got.append((seq, ts, plain[off:end]))

    def poll_timeout(self) -> float | None:
        return None

    def handle_timeout(self, now: float) -> None:
        raise AssertionError("no timer was asked for")


def _rtcp_port(addr: Address) -> Address:
    return addr[0], addr[1] + 1


class Net:
    """Moves datagrams between leg ``a`` (reachable at, and sending from, ``a_src``) and
    leg ``b`` (at B_ADDR) on a virtual clock; records every other output per leg."""

    def __init__(self, a: RtpLeg, b: RtpLeg, a_src: Address = A_ADDR) -> None:
        self.a, self.b, self.a_src = a, b, a_src
        self.events: dict[str, list[object]] = {"a": [], "b": []}
        self.sent: dict[str, list[Transmit]] = {"a": [], "b": []}
        self.undelivered = 0
        self.now = 0.0
        self.drop: set[int] = set()  # indices of a's transmits to lose
        self.a.media, self.b.media = Slot(), Slot()

    def slot(self, leg: RtpLeg) -> Slot:
        assert isinstance(leg.media, Slot)
        return leg.media

    def flush(self) -> None:
        moved = True
        while moved:
            moved = False
            for name, leg, peer in (("a", self.a, self.b), ("b", self.b, self.a)):
                while (out := leg.poll_output()) is not None:
                    moved = True
                    if not isinstance(out, Transmit):
                        self.events[name].append(out)
                        continue
                    self.sent[name].append(out)
                    if name == "a":
                        if len(self.sent["a"]) - 1 in self.drop:
                            continue
                        ok = out.addr == (_rtcp_port(B_ADDR) if out.rtcp else B_ADDR)
                        src = _rtcp_port(self.a_src) if out.rtcp else self.a_src
                    else:
                        ok = out.addr == (_rtcp_port(self.a_src) if out.rtcp else self.a_src)
                        src = _rtcp_port(B_ADDR) if out.rtcp else B_ADDR
                    if ok:
                        peer.handle_input(self.now, out.payload, src)
                    else:
                        self.undelivered += 1

    def advance(self, until: float) -> None:
        while True:
            due = [(t, leg) for leg in (self.a, self.b)
                   if (t := leg.poll_timeout()) is not None and t <= until]
            if not due:
                break
            t = min(d[0] for d in due)
            self.now = max(self.now, t)
            for when, leg in due:
                if when <= t:
                    leg.handle_timeout(t)
            self.flush()
        self.now = until

    def talk(self, leg: RtpLeg, packets: int, *, start: float | None = None,
             seq0: int = 1000, ts0: int = 50_000) -> None:
        """``leg`` sends ``packets`` 20 ms G.711 packets (payload = its index)."""
        t0 = self.now if start is None else start
        for i in range(packets):
            self.advance(t0 + 0.02 * i)
            leg.send_rtp(self.now, (seq0 + i) & 0xFFFF, (ts0 + 160 * i) & 0xFFFFFFFF, i == 0,
                         bytes([i & 0xFF]) * 160)
            self.flush()


def _keys(suite: CryptoSuite | None) -> tuple[SdesKeys | None, SdesKeys | None]:
    if suite is None:
        return None, None
    rng = random.Random(7)
    ka, kb = rng.randbytes(suite.material_length), rng.randbytes(suite.material_length)
    return SdesKeys(suite, ka, kb), SdesKeys(suite, kb, ka)


def make(suite: CryptoSuite | None = None, *, nat: bool = False, rtcp_mux: bool = True,
         **kw: object) -> Net:
    ka, kb = _keys(suite)
    a = RtpLeg(RtpLegConfig(remote=B_ADDR, ssrc=0xAAAA, payload_type=PT,
                            dtmf_payload_type=DTMF_PT, srtp=ka, rtcp_mux=rtcp_mux,
                            **kw), 0.0, rng=random.Random(1))  # type: ignore[arg-type]
    b = RtpLeg(RtpLegConfig(remote=A_PRIVATE if nat else A_ADDR, ssrc=0xBBBB,
                            payload_type=PT, dtmf_payload_type=DTMF_PT, srtp=kb,
                            rtcp_mux=rtcp_mux, **kw), 0.0,  # type: ignore[arg-type]
               rng=random.Random(2))
    return Net(a, b, A_PUBLIC if nat else A_ADDR)


def test_rtp_leg_is_a_media_leg() -> None:
    leg: MediaLeg = make().a
    assert leg.ssrc == 0xAAAA and leg.payload_type == PT and leg.can_send()


@pytest.mark.parametrize("suite", [None, *SUITES], ids=lambda s: s.value if s else "plain")
def test_pair_exchanges_audio_both_ways(suite: CryptoSuite | None) -> None:
    net = make(suite)
    net.talk(net.a, 10)
    net.talk(net.b, 10, seq0=65530, ts0=0xFFFFFF00)  # both counters wrap
    got_b, got_a = net.slot(net.b).got, net.slot(net.a).got
    assert [g[2][0] for g in got_b] == list(range(10))
    assert [g[0] for g in got_b] == list(range(1000, 1010))
    assert [g[1] for g in got_b] == [50_000 + 160 * i for i in range(10)]
    assert [g[0] for g in got_a] == [(65530 + i) & 0xFFFF for i in range(10)]
    assert net.events["b"] == [Latched(A_ADDR, A_ADDR)]
    assert net.b.counters.rtp_in == 10 and net.b.counters.auth_failed == 0
    if suite is not None:
        # On the wire it is not the plaintext: SRTP really protected it.
        wire = net.sent["a"][0].payload
        assert bytes([0]) * 160 not in wire
        assert len(wire) > 12 + 160


def test_plain_nat_source_is_learnt_after_consecutive_packets() -> None:
    """The phone signals its private address; its NAT's address must prove itself with
    ``latch_packets`` consecutive packets before our audio moves there."""
    net = make(nat=True)
    net.talk(net.b, 2)  # to the private address: unreachable
    assert net.undelivered == 2 and net.slot(net.a).got == []
    net.talk(net.a, 5)
    assert net.b.counters.learning == 2
    assert [g[2][0] for g in net.slot(net.b).got] == [2, 3, 4]
    assert net.events["b"] == [Latched(A_PUBLIC, A_PRIVATE)]
    assert net.b.destination == A_PUBLIC
    net.talk(net.b, 3, seq0=2000)
    assert len(net.slot(net.a).got) == 3


def test_plain_learning_needs_consecutive_sequence_and_one_ssrc() -> None:
    net = make(nat=True)
    b = net.b
    for seq in (10, 12, 14, 16):  # gaps: never consecutive
        b.handle_input(0.0, bytes(RtpPacket(PT, seq, 0, 77, b"x")), A_PUBLIC)
    assert b.latched is None
    for ssrc in (1, 2, 3, 4):  # consecutive numbers, but a different SSRC each
        b.handle_input(0.0, bytes(RtpPacket(PT, 20 + ssrc, 0, ssrc, b"x")), A_PUBLIC)
    assert b.latched is None
    b.handle_input(0.0, bytes(RtpPacket(96, 30, 0, 9, b"x")), A_PUBLIC)  # not negotiated
    assert b.counters.wrong_pt == 1
    for seq in (40, 41, 42):
        b.handle_input(0.0, bytes(RtpPacket(PT, seq, 0, 9, b"x")), A_PUBLIC)
    assert b.latched == A_PUBLIC


def test_plain_stray_source_never_takes_over() -> None:
    """After the latch, a stray sending a perfect copy of the stream (same SSRC, PT,
    consecutive sequence numbers) gets nothing delivered and never moves our audio."""
    net = make(nat=True)
    net.talk(net.a, 4)
    assert net.b.latched == A_PUBLIC
    delivered = len(net.slot(net.b).got)
    for i in range(50):
        net.b.handle_input(1.0, bytes(RtpPacket(PT, 1004 + i, 0, 0xAAAA, b"evil")), STRAY)
    assert len(net.slot(net.b).got) == delivered
    assert net.b.counters.stray == 50 and net.b.destination == A_PUBLIC
    assert [e for e in net.events["b"] if isinstance(e, Latched)] == [
        Latched(A_PUBLIC, A_PRIVATE)]


def test_plain_signalled_address_beats_an_early_stray() -> None:
    """A stray that starts first cannot win while the peer is at its signalled address."""
    net = make()
    b = net.b
    for i in range(2):
        b.handle_input(0.0, bytes(RtpPacket(PT, 500 + i, 0, 5, b"evil")), STRAY)
    net.talk(net.a, 1)
    assert b.latched == A_ADDR
    for i in range(2, 10):
        b.handle_input(0.1, bytes(RtpPacket(PT, 500 + i, 0, 5, b"evil")), STRAY)
    assert all(g[2] != b"evil" for g in net.slot(b).got)
    assert b.counters.stray == 8 and b.destination == A_ADDR


def test_plain_signalled_ssrc_is_enforced_before_the_latch() -> None:
    net = make(nat=True, remote_ssrc=0xAAAA)
    for i in range(5):
        net.b.handle_input(0.0, bytes(RtpPacket(PT, i, 0, 0x1234, b"x")), STRAY)
    assert net.b.latched is None and net.b.counters.wrong_ssrc == 5
    net.talk(net.a, 3)
    assert net.b.latched == A_PUBLIC


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: s.value)
def test_srtp_latches_on_first_authenticated_packet(suite: CryptoSuite) -> None:
    net = make(suite, nat=True)
    b = net.b
    # Forgeries from a stray: plain RTP, and garbage behind a valid header. Never latch.
    b.handle_input(0.0, bytes(RtpPacket(PT, 1, 0, 0xAAAA, bytes(160))), STRAY)
    b.handle_input(0.0, bytes(RtpPacket(PT, 2, 0, 0xAAAA, bytes(180))), STRAY)
    assert b.counters.auth_failed == 2 and b.latched is None
    net.talk(net.a, 1)
    assert b.latched == A_PUBLIC and b.counters.learning == 0
    assert len(net.slot(b).got) == 1


@pytest.mark.parametrize("suite", SUITES[:3], ids=lambda s: s.value)
def test_srtp_stray_cannot_take_over_and_rebinding_needs_silence(suite: CryptoSuite) -> None:
    net = make(suite)
    net.talk(net.a, 3)
    b = net.b
    captured = [t.payload for t in net.sent["a"] if not t.rtcp]
    # While the latched source is live, other sources are not even decrypted.
    b.handle_input(net.now, captured[-1], STRAY)
    assert b.counters.stray == 1 and b.counters.auth_failed == 0
    # After rebind_after of silence, a stray's replay is tried, and fails (replay).
    net.advance(net.now + 2.0)
    b.handle_input(net.now, captured[-1], STRAY)
    assert b.counters.auth_failed == 1 and b.latched == A_ADDR
    # The real peer rebinding to a new NAT port: its authenticated packets move the latch.
    net.a_src = ("10.0.0.1", 4444)
    net.talk(net.a, 2, seq0=1003, ts0=50_000 + 480)
    assert b.latched == ("10.0.0.1", 4444)
    assert Latched(("10.0.0.1", 4444), A_ADDR) in net.events["b"]
    assert len(net.slot(b).got) == 5


@pytest.mark.parametrize("suite", [None, CryptoSuite.AES_CM_128_HMAC_SHA1_80,
                                   CryptoSuite.AEAD_AES_128_GCM],
                         ids=lambda s: s.value if s else "plain")
def test_dtmf_round_trip_alongside_audio(suite: CryptoSuite | None) -> None:
    net = make(suite)
    net.talk(net.a, 5)
    net.a.send_dtmf(net.now, "5", 0.16)
    net.a.send_dtmf(net.now, "#", 0.1)
    net.talk(net.a, 40, seq0=1005, ts0=50_000 + 5 * 160)
    net.advance(net.now + 2.0)
    digits = [e for e in net.events["b"] if isinstance(e, Dtmf)]
    assert digits == [Dtmf("5", 0.16), Dtmf("#", 0.1)]
    # One stream, one numbering: audio and events take consecutive sequence numbers (the
    # RTP header is in the clear under SRTP too, RFC 3711 §3.1).
    headers = [rtp_header_fields_untrusted(t.payload) for t in net.sent["a"] if not t.rtcp]
    seqs = [h[1] for h in headers]
    assert seqs == [(seqs[0] + i) & 0xFFFF for i in range(len(seqs))]
    assert net.a.counters.dtmf_out == (3 + 3) + (1 + 3)  # 160 ms: 3 updates, 100 ms: 1; 3 ends
    # The event timestamps sit on the audio clock.
    ev_ts = sorted({h[2] for h in headers if h[0] == DTMF_PT})
    assert ev_ts[0] == 50_000 + 4 * 160  # "5" starts at the last audio packet's time
    assert [h[4] for h in headers if h[0] == DTMF_PT].count(True) == 2  # a marker per digit
    assert len(net.slot(net.b).got) == 45  # all audio still delivered


def test_dtmf_lost_end_packets_still_one_press() -> None:
    net = make()
    net.drop = {1, 3, 4}  # an update and two of the three end packets
    net.a.send_dtmf(0.0, "9", 0.1)
    net.advance(1.0)
    assert [e for e in net.events["b"] if isinstance(e, Dtmf)] == [Dtmf("9", 0.1)]


def test_dtmf_needs_negotiation() -> None:
    leg = RtpLeg(RtpLegConfig(remote=B_ADDR, ssrc=1, payload_type=8), 0.0)
    with pytest.raises(LocalProtocolError):
        leg.send_dtmf(0.0, "1")


@pytest.mark.parametrize("suite", [None, CryptoSuite.AES_CM_128_HMAC_SHA1_80])
@pytest.mark.parametrize("mux", [True, False])
def test_rtcp_reports_both_ways(suite: CryptoSuite | None, mux: bool) -> None:
    net = make(suite, rtcp_mux=mux)
    net.talk(net.a, 10)
    net.talk(net.b, 10)
    net.advance(20.0)
    rtcp_a = [t for t in net.sent["a"] if 192 <= t.payload[1] <= 223]
    assert rtcp_a and all(t.rtcp is (not mux) for t in rtcp_a)
    assert all(t.addr == (B_ADDR if mux else _rtcp_port(B_ADDR)) for t in rtcp_a)
    assert net.b.counters.rtcp_in >= 2 and net.a.counters.rtcp_in >= 2
    assert net.a.rtt is not None and 0 <= net.a.rtt < 0.01
    assert net.b.counters.stray == 0 and net.b.counters.auth_failed == 0
    if not mux:
        assert Latched(_rtcp_port(A_ADDR), _rtcp_port(A_ADDR), rtcp=True) in net.events["b"]


def test_plain_rtcp_from_a_stray_is_dropped() -> None:
    net = make(rtcp_mux=False)
    net.talk(net.a, 3)
    rr = bytes.fromhex("81c90007") + struct.pack("!I", 99) + bytes(24)
    net.b.handle_input(1.0, rr, STRAY)
    assert net.b.counters.stray == 1 and net.b.counters.rtcp_in == 0
    net.b.handle_input(1.0, rr, (A_ADDR[0], 9999))  # the latched RTP source's IP: accepted
    assert net.b.counters.rtcp_in == 1 and net.b.rtcp_destination == (A_ADDR[0], 9999)
    net.b.handle_input(1.0, rr, _rtcp_port(A_ADDR))  # the RTCP latch never moves again
    assert net.b.counters.stray == 2


def test_media_timeout_ends_the_leg_with_a_bye() -> None:
    net = make(media_timeout=30.0)
    net.talk(net.a, 3)
    net.b.set_direction("sendonly")  # on hold: nothing expected, no timeout
    net.advance(100.0)
    assert not net.b.closed
    net.b.set_direction("sendrecv")
    net.a.close("test-over")  # a stops sending, so b times out
    net.advance(200.0)
    assert Ended("rtp-timeout") in net.events["b"] and net.b.closed
    assert net.events["a"][-1] == Ended("test-over")
    last = net.sent["b"][-1]
    assert any(p.__class__.__name__ == "RtcpBye" for p in parse_rtcp_untrusted(last.payload))
    assert not net.b.can_send() and net.b.poll_timeout() is None
    net.b.close("again")  # idempotent
    assert net.b.poll_output() is None


def test_config_is_checked_and_keys_are_redacted() -> None:
    with pytest.raises(LocalProtocolError):
        RtpLegConfig(remote=B_ADDR, ssrc=1, payload_type=72)  # RTCP's range under mux
    with pytest.raises(LocalProtocolError):
        SdesKeys(CryptoSuite.AEAD_AES_128_GCM, bytes(30), bytes(28))
    keys = SdesKeys(CryptoSuite.AEAD_AES_128_GCM, b"\x42" * 28, b"\x43" * 28)
    assert "42" not in repr(keys) and "B" not in str(keys).replace("SdesKeys", "")
    cfg = RtpLegConfig(remote=B_ADDR, ssrc=1, payload_type=0, srtp=keys)
    assert "\\x42" not in repr(cfg) and "redacted" in repr(cfg)
    with pytest.raises(LocalProtocolError):
        RtpLeg(cfg, 0.0).set_direction("sideways")


@given(st.binary(max_size=200), st.sampled_from([None, CryptoSuite.AEAD_AES_128_GCM]))
def test_fuzz_handle_input_never_raises(data: bytes, suite: CryptoSuite | None) -> None:
    net = make(suite)
    net.b.handle_input(0.0, data, STRAY)
    net.b.handle_input(0.0, data, A_ADDR)
    net.b.handle_timeout(1.0)


# -- SRTP against an independent RFC 3711 implementation -------------------------------------


def _aes_cm(key: bytes, iv: int, n: int) -> bytes:
    enc = Cipher(algorithms.AES(key), modes.CTR(iv.to_bytes(16, "big"))).encryptor()
    return enc.update(bytes(n)) + enc.finalize()


def _kdf(master_key: bytes, master_salt: bytes, label: int, n: int) -> bytes:
    """RFC 3711 §4.3.1 with kdr = 0: x = (label << 48) XOR salt, keystream at x·2^16."""
    x = (label << 48) ^ int.from_bytes(master_salt, "big")
    return _aes_cm(master_key, x << 16, n)


def _ref_protect(material: bytes, packet: bytes, tag_len: int, roc: int = 0) -> bytes:
    """RFC 3711 §3.1 / §4.1.1 / §4.2 AES-CM + HMAC-SHA1, written from the RFC."""
    mk, ms = material[:16], material[16:30]
    ke, ka, ks = _kdf(mk, ms, 0, 16), _kdf(mk, ms, 1, 20), _kdf(mk, ms, 2, 14)
    pt, seq, ts, ssrc, marker, off, end = rtp_header_fields_untrusted(packet)
    index = (roc << 16) | seq
    iv = (int.from_bytes(ks, "big") << 16) ^ (ssrc << 64) ^ (index << 16)
    payload = packet[off:end]
    cipher = bytes(a ^ b for a, b in zip(payload, _aes_cm(ke, iv, len(payload)), strict=True))
    body = packet[:off] + cipher
    tag = hmac.new(ka, body + struct.pack("!I", roc), hashlib.sha1).digest()[:tag_len]
    return body + tag


def test_reference_kdf_matches_rfc3711_b3() -> None:
    """RFC 3711 Appendix B.3 key derivation test vectors."""
    mk = bytes.fromhex("E1F97A0D3E018BE0D64FA32C06DE4139")
    ms = bytes.fromhex("0EC675AD498AFEEBB6960B3AABE6")
    assert _kdf(mk, ms, 0, 16) == bytes.fromhex("C61E7A93744F39EE10734AFE3FF7A087")
    assert _kdf(mk, ms, 2, 14) == bytes.fromhex("30CBBC08863D8C85D49DB34A9AE1")
    assert _kdf(mk, ms, 1, 20) == bytes.fromhex("CEBE321F6FF7716B6FD4AB49AF256A156D38BAA4")


@pytest.mark.parametrize(("suite", "tag_len"), [(CryptoSuite.AES_CM_128_HMAC_SHA1_80, 10),
                                                (CryptoSuite.AES_CM_128_HMAC_SHA1_32, 4)])
def test_srtp_interop_with_reference_implementation(suite: CryptoSuite, tag_len: int) -> None:
    """Our leg's SRTP output equals the RFC-written transform, and the leg accepts what the
    reference produces: the SDES key material is used exactly as RFC 4568/3711 say."""
    net = make(suite)
    assert net.a.config.srtp is not None and net.b.config.srtp is not None
    a_key = net.a.config.srtp.local
    net.talk(net.a, 3)
    for i, t in enumerate(x for x in net.sent["a"] if not x.rtcp):
        plain = bytes(RtpPacket(PT, 1000 + i, 50_000 + 160 * i, 0xAAAA, bytes([i]) * 160,
                                marker=i == 0))
        assert t.payload == _ref_protect(a_key, plain, tag_len)
    # The other way: a reference-protected packet is accepted by leg a (b's key protects).
    b_key = net.b.config.srtp.local
    ref = _ref_protect(b_key, bytes(RtpPacket(PT, 7, 123, 0xBBBB, b"reference" * 10)), tag_len)
    net.a.handle_input(5.0, ref, B_ADDR)
    assert net.slot(net.a).got[-1] == (7, 123, b"reference" * 10)
    tampered = ref[:-1] + bytes([ref[-1] ^ 1])
    net.a.handle_input(5.0, tampered, B_ADDR)
    assert net.a.counters.auth_failed == 1


def _ref_protect_gcm(material: bytes, packet: bytes, key_len: int, roc: int = 0) -> bytes:
    """RFC 7714 §8-§11 AEAD_AES_*_GCM, written from the RFC: session key and 96-bit session
    salt from the RFC 3711 KDF (the 96-bit master salt as the high bits of its 112-bit x,
    §11), IV = salt XOR (00 00 || SSRC || ROC || SEQ) (§8.1), AAD = the header (§8.2)."""
    mk, ms = material[:key_len], material[key_len:key_len + 12]
    ke, ks = _kdf(mk, ms + bytes(2), 0, key_len), _kdf(mk, ms + bytes(2), 2, 12)
    pt, seq, ts, ssrc, marker, off, end = rtp_header_fields_untrusted(packet)
    iv = bytes(a ^ b for a, b in zip(ks, struct.pack("!HIIH", 0, ssrc, roc, seq), strict=True))
    return packet[:off] + AESGCM(ke).encrypt(iv, packet[off:end], packet[:off])


@pytest.mark.parametrize("suite", [CryptoSuite.AEAD_AES_128_GCM, CryptoSuite.AEAD_AES_256_GCM])
def test_srtp_gcm_interop_with_reference_implementation(suite: CryptoSuite) -> None:
    net = make(suite)
    assert net.a.config.srtp is not None and net.b.config.srtp is not None
    net.talk(net.a, 3)
    for i, t in enumerate(x for x in net.sent["a"] if not x.rtcp):
        plain = bytes(RtpPacket(PT, 1000 + i, 50_000 + 160 * i, 0xAAAA, bytes([i]) * 160,
                                marker=i == 0))
        assert t.payload == _ref_protect_gcm(net.a.config.srtp.local, plain, suite.key_length)
    ref = _ref_protect_gcm(net.b.config.srtp.local,
                           bytes(RtpPacket(PT, 9, 321, 0xBBBB, b"gcm" * 20)), suite.key_length)
    net.a.handle_input(5.0, ref, B_ADDR)
    assert net.slot(net.a).got[-1] == (9, 321, b"gcm" * 20)


def test_opus_leg_at_48_khz_with_telephone_event_48000() -> None:
    """Opus (a dynamic pt, 48 kHz RTP clock) with telephone-event/48000: durations are
    counted on the 48 kHz clock, and a payload type the SDP did not give is dropped."""
    ka, kb = _keys(CryptoSuite.AEAD_AES_128_GCM)
    common = {"payload_type": 111, "clock_rate": 48_000, "dtmf_payload_type": 126,
              "rtcp_mux": True}
    a = RtpLeg(RtpLegConfig(remote=B_ADDR, ssrc=1, srtp=ka, **common), 0.0)  # type: ignore[arg-type]
    b = RtpLeg(RtpLegConfig(remote=A_ADDR, ssrc=2, srtp=kb, **common), 0.0)  # type: ignore[arg-type]
    net = Net(a, b)
    for i in range(5):
        net.advance(0.02 * i)
        a.send_rtp(net.now, i, 960 * i, i == 0, b"opus-frame")
        net.flush()
    a.send_dtmf(net.now, "*", 0.25)
    net.advance(2.0)
    assert [g[1] for g in net.slot(b).got] == [960 * i for i in range(5)]
    assert [e for e in net.events["b"] if isinstance(e, Dtmf)] == [Dtmf("*", 0.25)]
    stray_pt = RtpLeg(RtpLegConfig(remote=B_ADDR, ssrc=1, srtp=ka, payload_type=0,
                                   clock_rate=8000, rtcp_mux=True), 0.0)
    stray_pt.send_rtp(3.0, 500, 0, False, b"pcmu")  # same key, a fresh index
    out = stray_pt.poll_output()
    assert isinstance(out, Transmit)
    b.handle_input(3.0, out.payload, A_ADDR)
    assert b.counters.wrong_pt == 1 and len(net.slot(b).got) == 5


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("suite", [None, CryptoSuite.AES_CM_128_HMAC_SHA1_80,
                                   CryptoSuite.AEAD_AES_128_GCM],
                         ids=lambda s: s.value if s else "plain")
def test_terrible_network(suite: CryptoSuite | None, seed: int) -> None:
    """Seeded loss (10 %), duplication (10 %) and reordering (neighbours swapped, 15 %) on
    a's packets, DTMF in the middle: every surviving audio packet is delivered (SRTP: once,
    its replay window drops duplicates), and the digit is reported exactly once."""
    rng = random.Random(seed)
    net = make(suite)
    a, b = net.a, net.b
    wire: list[Transmit] = []
    for i in range(100):
        t = 0.02 * i
        a.handle_timeout(t)
        if i == 30:
            a.send_dtmf(t, "3", 0.2)
        a.send_rtp(t, 1000 + i, 160 * i, False, bytes([i]) * 160)
        while (out := a.poll_output()) is not None:
            if isinstance(out, Transmit) and not out.rtcp and out.payload[1] < 192:
                wire.append(out)
    arriving: list[Transmit] = []
    for w in wire:
        if rng.random() < 0.1:
            continue
        arriving.append(w)
        if rng.random() < 0.1:
            arriving.append(w)
    for i in range(len(arriving) - 1):
        if rng.random() < 0.15:
            arriving[i], arriving[i + 1] = arriving[i + 1], arriving[i]
    for n, w in enumerate(arriving):
        b.handle_input(0.01 * n, w.payload, A_ADDR)
    b.handle_timeout(100.0)
    net.flush()
    got = [g[0] for g in net.slot(b).got]
    survived = {rtp_header_fields_untrusted(w.payload)[1] for w in arriving
                if rtp_header_fields_untrusted(w.payload)[0] == PT}
    assert set(got) == survived
    if suite is not None:
        assert len(got) == len(set(got))  # duplicates are replays under SRTP
    dtmf_arrived = any(rtp_header_fields_untrusted(w.payload)[0] == DTMF_PT for w in arriving)
    digits = [e for e in net.events["b"] if isinstance(e, Dtmf)]
    assert [d.digit for d in digits] == (["3"] if dtmf_arrived else [])
