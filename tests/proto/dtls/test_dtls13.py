"""DTLS 1.3 (RFC 9147) end to end on the virtual network: our client against our server,
version negotiation against the 1.2 engine, HRR and stateless cookies, KeyUpdate, ACKs,
alerts, and the recorded Chromium 156 ClientHello."""

from __future__ import annotations

from pathlib import Path

import pytest
from proto.dtls.dtls_frames import drain, handshake_datagram
from proto.dtls.dtls_pair import NOW, Network, Pair, cert

from appliance.proto.dtls import (
    HAVE_MLKEM,
    AlertDescription,
    CipherSuite13,
    ConnectionClosed,
    DtlsConnection,
    Group13,
    HandshakeComplete,
    Role,
    State,
    parse_versions,
)
from appliance.proto.dtls._wire import DOWNGRADE_TLS12, HRR_RANDOM, Ext13
from appliance.proto.dtls.engine import Options
from appliance.proto.dtls.engine12 import Engine12
from appliance.proto.dtls.engine13 import Engine13
from appliance.proto.dtls.messages import ServerHello, find_extension, parse_key_share_sh_untrusted
from appliance.proto.dtls.record import parse_handshake_fragments_untrusted, parse_records_untrusted
from appliance.proto.errors import LocalProtocolError

BOTH = frozenset({"1.2", "1.3"})
ONLY13 = frozenset({"1.3"})
ONLY12 = frozenset({"1.2"})
LABEL = b"EXTRACTOR-dtls_srtp"
CHROMIUM = (Path(__file__).resolve().parents[2] / "vectors" / "chromium156-dtls-clienthello.bin").read_bytes()


def client(versions: frozenset[str] = BOTH, **kw: object) -> DtlsConnection:
    kw.setdefault("remote_fingerprints", [cert("server").fingerprint])
    return DtlsConnection(Role.CLIENT, cert("client"), versions=versions, **kw)  # type: ignore[arg-type]


def server(versions: frozenset[str] = BOTH, **kw: object) -> DtlsConnection:
    kw.setdefault("remote_fingerprints", [cert("client").fingerprint])
    return DtlsConnection(Role.SERVER, cert("server"), versions=versions, **kw)  # type: ignore[arg-type]


def settle(pair: Pair, rounds: int = 50) -> None:
    """Run the clock on until no side has anything left to (re)send (ACKs delivered)."""
    for _ in range(rounds):
        while pair.step():
            pass
        timeouts = [t for t in (pair.client.poll_timeout(), pair.server.poll_timeout()) if t]
        if not timeouts:
            return
        pair.now = max(pair.now, min(timeouts))
        pair.client.handle_timeout(pair.now)
        pair.server.handle_timeout(pair.now)


def assert_established(pair: Pair, version: str) -> None:
    c, s = pair.completed("client"), pair.completed("server")
    assert c is not None and s is not None, (pair.closed("client"), pair.closed("server"))
    assert c.version == s.version == version == pair.client.version == pair.server.version
    assert c.peer_fingerprint == cert("server").fingerprint
    assert s.peer_fingerprint == cert("client").fingerprint
    assert c.srtp_profile is not None and c.srtp_profile == s.srtp_profile
    # RFC 5764 §4.2 keys, from RFC 8446 §7.5 for 1.3: both ends derive the same bytes.
    assert pair.client.export_keying_material(LABEL, 60) == pair.server.export_keying_material(LABEL, 60)


def exchange(pair: Pair) -> None:
    pair.client.send_application_data(b"ping")
    pair.server.send_application_data(b"pong")
    settle(pair)
    assert pair.app_data("server")[-1] == b"ping" and pair.app_data("client")[-1] == b"pong"


def test_default_is_dtls12_only() -> None:
    """Nothing changes for existing callers until they pass ``versions``."""
    conn = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None)
    assert isinstance(conn.engine, Engine12) and conn.versions == ONLY12
    assert parse_versions("1.2, 1.3") == BOTH
    with pytest.raises(ValueError, match="subset"):
        parse_versions("1.4")
    with pytest.raises(LocalProtocolError):
        DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None,
                       versions=frozenset({"1.0"}))


@pytest.mark.parametrize("suite", list(CipherSuite13))
@pytest.mark.parametrize(
    "group", [g for g in Group13 if g is not Group13.X25519MLKEM768 or HAVE_MLKEM])
def test_handshake_13(suite: CipherSuite13, group: Group13) -> None:
    pair = Pair(client(ONLY13, cipher_suites_13=[suite], groups_13=[group]),
                server(ONLY13, groups_13=[group]))
    pair.run()
    assert_established(pair, "1.3")
    assert pair.client.cipher_suite is suite
    exchange(pair)
    # RFC 9147 §7: the client's final flight was ACKed, so nothing is left to resend.
    assert pair.client.poll_timeout() is None and pair.server.poll_timeout() is None


@pytest.mark.parametrize("versions", [ONLY12, ONLY13], ids=["dtls12", "dtls13"])
@pytest.mark.parametrize("seed", range(8))
def test_terrible_network(versions: frozenset[str], seed: int) -> None:
    """Seeded loss, duplication and reordering (trio's "terrible network" test)."""
    net = Network(loss=0.25, duplicate=0.2, reorder=0.5, seed=seed)
    pair = Pair(client(versions, initial_retransmit=0.2), server(versions, initial_retransmit=0.2),
                net)
    pair.run(max_time=600)
    assert_established(pair, "1.3" if "1.3" in versions else "1.2")
    for _ in range(20):  # application data under the same network, retried until through
        if pair.app_data("server") and pair.app_data("client"):
            break
        pair.client.send_application_data(b"ping")
        pair.server.send_application_data(b"pong")
        settle(pair)
    assert pair.app_data("server") and pair.app_data("client")


def test_small_mtu_fragments_every_flight() -> None:
    pair = Pair(client(ONLY13, mtu=300), server(ONLY13, mtu=300), Network(reorder=1.0, seed=3))
    pair.run()
    assert_established(pair, "1.3")


@pytest.mark.parametrize(
    ("cv", "sv", "expected"),
    [(BOTH, ONLY12, "1.2"), (ONLY12, BOTH, "1.2"), (BOTH, BOTH, "1.3"), (BOTH, ONLY13, "1.3"),
     (ONLY13, BOTH, "1.3")],
    ids=["13client-12server", "12client-13server", "both", "both-13server", "13client-both"],
)
def test_version_negotiation(cv: frozenset[str], sv: frozenset[str], expected: str) -> None:
    pair = Pair(client(cv), server(sv))
    pair.run()
    assert_established(pair, expected)
    exchange(pair)


def test_13_capable_client_against_12_server_with_cookies() -> None:
    """A 1.2 server's HelloVerifyRequest (RFC 9147 §5.3: clients must cope) makes the
    client resend its combined ClientHello, cookie added, from the 1.2 engine."""
    pair = Pair(client(BOTH), server(ONLY12, cookie_secret=b"k" * 32))
    pair.run()
    assert_established(pair, "1.2")
    assert pair.server.counters.hello_verify_requests == 1


@pytest.mark.parametrize(("cv", "sv"), [(ONLY13, ONLY12), (ONLY12, ONLY13)])
def test_no_common_version(cv: frozenset[str], sv: frozenset[str]) -> None:
    pair = Pair(client(cv), server(sv))
    pair.run()
    assert pair.completed("client") is None and pair.completed("server") is None
    alerts = {c.alert for c in (pair.closed("client"), pair.closed("server")) if c}
    # A 1.2 server finds none of its suites/extensions in a 1.3-only ClientHello
    # (handshake_failure); a 1.3-only server refuses a 1.2 ClientHello (protocol_version).
    assert alerts & {AlertDescription.protocol_version, AlertDescription.handshake_failure}


def test_downgrade_sentinel_set_by_13_capable_server() -> None:
    """RFC 8446 §4.1.3: a 1.3-capable server negotiating 1.2 ends ServerHello.random in
    DOWNGRD\\x01; a 1.2-only server does not."""
    for versions, marked in ((BOTH, True), (ONLY12, False)):
        pair = Pair(client(ONLY12), server(versions))
        pair.client.start(NOW)
        for d in drain(pair.client):
            pair.server.handle_datagram(NOW, d)
        first = parse_records_untrusted(drain(pair.server)[0])[0]
        frag = parse_handshake_fragments_untrusted(first.fragment)[0]
        hello = ServerHello.parse_untrusted(frag.body)
        assert (hello.random[-8:] == DOWNGRADE_TLS12) is marked


def test_downgrade_sentinel_checked_by_client() -> None:
    """A 1.3-capable client refuses a 1.2 ServerHello carrying the sentinel (an attacker
    stripped 1.3 from the ClientHello, or a server was made to downgrade)."""
    forced = Engine12(Role.SERVER, cert("server"), Options([cert("client").fingerprint]))
    forced.downgrade_sentinel = DOWNGRADE_TLS12
    c = client(BOTH)
    c.start(NOW)
    for d in drain(c):
        forced.handle_input(NOW, d)
    for d in drain(forced):
        c.handle_datagram(NOW, d)
    closed = c.poll_event()
    assert isinstance(closed, ConnectionClosed) and closed.alert is AlertDescription.illegal_parameter


@pytest.mark.parametrize("side", ["client", "server"])
def test_fingerprint_mismatch_fails(side: str) -> None:
    wrong = [cert("intruder").fingerprint]
    pair = (Pair(client(ONLY13, remote_fingerprints=wrong), server(ONLY13)) if side == "client"
            else Pair(client(ONLY13), server(ONLY13, remote_fingerprints=wrong)))
    pair.run()
    settle(pair)
    assert pair.completed("server") is None
    checker = pair.closed(side)
    assert checker is not None and checker.alert is AlertDescription.bad_certificate
    assert not checker.by_peer
    assert pair.closed("server" if side == "client" else "client") is not None


def test_hello_retry_request_for_key_share() -> None:
    """The client's only share is P-256, the server wants X25519: HRR (RFC 8446 §4.1.4)."""
    pair = Pair(client(ONLY13, groups_13=[Group13.secp256r1, Group13.x25519]),
                server(ONLY13, groups_13=[Group13.x25519]))
    pair.run()
    assert_established(pair, "1.3")
    assert pair.server.counters.hello_verify_requests == 1  # counts HRRs too


def test_acceptable_share_means_no_hrr() -> None:
    pair = Pair(client(ONLY13), server(ONLY13))
    pair.run()
    assert pair.server.counters.hello_verify_requests == 0
    assert_established(pair, "1.3")


def test_cookie_mode_hrr_is_stateless() -> None:
    """With cookies required, ClientHello1 gets an HRR with a cookie and nothing else; a
    *different* server object with the same secret accepts ClientHello2."""
    secret, ctx = b"s" * 32, b"198.51.100.7:5000"
    c = client(ONLY13)
    first = server(ONLY13, cookie_secret=secret, cookie_context=ctx)
    c.start(NOW)
    for d in drain(c):
        first.handle_datagram(NOW, d)
    (hrr_datagram,) = drain(first)
    hrr = ServerHello.parse_untrusted(
        parse_handshake_fragments_untrusted(parse_records_untrusted(hrr_datagram)[0].fragment)[0].body)
    assert hrr.random == HRR_RANDOM and find_extension(hrr.extensions, Ext13.cookie)
    assert first.awaiting_client_hello and first.poll_timeout() is None
    c.handle_datagram(NOW, hrr_datagram)
    other = server(ONLY13, cookie_secret=secret, cookie_context=ctx)
    pair = Pair(c, other)
    pair.run()
    assert_established(pair, "1.3")
    # The cookie is bound to the peer context (address): elsewhere it is no good.
    c2, first2 = client(ONLY13), server(ONLY13, cookie_secret=secret, cookie_context=ctx)
    c2.start(NOW)
    for d in drain(c2):
        first2.handle_datagram(NOW, d)
    hrr2 = drain(first2)
    c2.handle_datagram(NOW, hrr2[0])
    elsewhere = server(ONLY13, cookie_secret=secret, cookie_context=b"203.0.113.9:1")
    for d in drain(c2):
        elsewhere.handle_datagram(NOW, d)
    assert elsewhere.awaiting_client_hello and elsewhere.counters.hello_verify_requests == 1


def test_require_cookies_switch_for_13() -> None:
    s = server(BOTH)
    s.require_cookies(b"c" * 32, b"peer")
    assert s.cookies_required
    pair = Pair(client(BOTH), s)
    pair.run()
    assert_established(pair, "1.3")
    assert s.counters.hello_verify_requests == 1


@pytest.mark.parametrize("initiator", ["client", "server"])
def test_key_update_both_directions(initiator: str) -> None:
    pair = Pair(client(ONLY13), server(ONLY13))
    pair.run()
    settle(pair)
    for n in range(1, 6):  # past four updates the epoch's low two bits wrap (§4.2.2)
        conn = pair.client if initiator == "client" else pair.server
        conn.key_update(pair.now, request_peer=True)
        settle(pair)
        for side in (pair.client, pair.server):
            engine = side.engine
            assert isinstance(engine, Engine13)
            assert engine.rl.write_epoch == 3 + n
        exchange(pair)
    with pytest.raises(LocalProtocolError):
        Pair().client.key_update(NOW)  # a 1.2 association cannot


def test_close_notify_and_post_handshake_alert() -> None:
    pair = Pair(client(ONLY13), server(ONLY13))
    pair.run()
    pair.client.close()
    settle(pair)
    closed = pair.closed("server")
    assert closed is not None and closed.alert is AlertDescription.close_notify and closed.by_peer
    assert pair.server.state is State.CLOSED


def test_unexpected_handshake_after_established_is_fatal() -> None:
    pair = Pair(client(ONLY13), server(ONLY13))
    pair.run()
    settle(pair)
    engine = pair.client.engine
    assert isinstance(engine, Engine13)
    # A ClientHello under epoch 3 keys: never valid after the handshake (RFC 8446 §4).
    from appliance.proto.dtls.recordlayer13 import OutMessage

    engine.rl.new_flight([OutMessage(3, 1, engine._send_msg_seq, CHROMIUM)])
    settle(pair)
    closed = pair.closed("server")
    assert closed is not None and closed.alert is AlertDescription.unexpected_message


def _chromium_datagrams() -> list[bytes]:
    """The recorded body as Chromium sent it: 1175 + 238 bytes in two datagrams."""
    return handshake_datagram(CHROMIUM, split=1175)


@pytest.mark.parametrize("order", ["in-order", "reversed"])
def test_chromium156_client_hello_gets_13_server_hello(order: str) -> None:
    s = server(BOTH, remote_fingerprints=None)
    datagrams = _chromium_datagrams()
    for d in datagrams if order == "in-order" else datagrams[::-1]:
        s.handle_datagram(NOW, d)
    out = drain(s)
    assert out and s.state is State.SERVER_WAIT_CERTIFICATE and s.version == "1.3"
    first = parse_records_untrusted(out[0])[0]
    frags = parse_handshake_fragments_untrusted(first.fragment)
    body = b"".join(f.body for f in frags if f.msg_type == 2)
    hello = ServerHello.parse_untrusted(body) if len(body) == frags[0].length else None
    # Its X25519MLKEM768 share may push the ServerHello over one record: reassemble.
    if hello is None:
        records = [r for d in out for r in parse_records_untrusted(d) if r.epoch == 0]
        parts = sorted((f.fragment_offset, f.body) for r in records
                       for f in parse_handshake_fragments_untrusted(r.fragment) if f.msg_type == 2)
        hello = ServerHello.parse_untrusted(b"".join(p for _, p in parts))
    ks = find_extension(hello.extensions, Ext13.key_share)
    assert ks is not None
    group, share = parse_key_share_sh_untrusted(ks)
    if HAVE_MLKEM:
        assert group == Group13.X25519MLKEM768 and len(share) == 1088 + 32
    else:
        assert group == Group13.x25519


def test_chromium156_client_hello_hrr_cases() -> None:
    # Cookie mode: HRR with a cookie, nothing kept.
    s = server(BOTH, remote_fingerprints=None, cookie_secret=b"x" * 32)
    for d in _chromium_datagrams():
        s.handle_datagram(NOW, d)
    (hrr,) = drain(s)
    assert s.awaiting_client_hello and s.counters.hello_verify_requests == 1
    assert HRR_RANDOM in hrr
    # A server that only does P-256 asks Chromium for a P-256 share.
    p256 = server(BOTH, remote_fingerprints=None, groups_13=[Group13.secp256r1])
    for d in _chromium_datagrams():
        p256.handle_datagram(NOW, d)
    (hrr,) = drain(p256)
    assert HRR_RANDOM in hrr and b"\x00\x33\x00\x02\x00\x17" in hrr  # key_share: secp256r1
    # A 1.2-only server answers Chromium with 1.2, as before.
    old = server(ONLY12, remote_fingerprints=None)
    for d in _chromium_datagrams():
        old.handle_datagram(NOW, d)
    assert drain(old) and old.version == "1.2"


def test_handshake_complete_event_carries_version() -> None:
    pair = Pair(client(ONLY13), server(ONLY13))
    pair.run()
    ev = pair.completed("client")
    assert isinstance(ev, HandshakeComplete) and ev.version == "1.3"


@pytest.mark.skipif(not HAVE_MLKEM, reason="the client needs ML-KEM to offer the hybrid share")
def test_hybrid_only_share_to_server_without_mlkem_gets_hrr() -> None:
    """A server without ML-KEM (groups_13 without the hybrid, as when ``cryptography``
    lacks it) answers a ClientHello whose only share is X25519MLKEM768 with an HRR for a
    group from its supported_groups (docs/dtls13.md, "ML-KEM status")."""
    pair = Pair(client(ONLY13, groups_13=[Group13.X25519MLKEM768, Group13.secp256r1]),
                server(ONLY13, groups_13=[Group13.x25519, Group13.secp256r1]))
    pair.run()
    assert_established(pair, "1.3")
    assert pair.server.counters.hello_verify_requests == 1
