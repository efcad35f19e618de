"""Client ↔ server handshakes over the in-memory network (sans-IO, virtual clock)."""

from __future__ import annotations

import pytest
from proto.dtls.dtls_pair import NOW, Network, Pair, cert

from appliance.proto.dtls import (
    AlertDescription,
    ApplicationData,
    CipherSuite,
    ConnectionClosed,
    DtlsConnection,
    FalseStart,
    HandshakeComplete,
    NamedGroup,
    Role,
    State,
)
from appliance.proto.dtls.record import parse_records_untrusted
from appliance.proto.errors import LocalProtocolError
from appliance.proto.srtp import SrtpProfile

LABEL = b"EXTRACTOR-dtls_srtp"


def make_pair(
    suite: CipherSuite | None = None,
    profile: SrtpProfile | None = None,
    *,
    cookies: bool = False,
    network: Network | None = None,
    mtu: int = 1200,
    group: NamedGroup | None = None,
) -> Pair:
    kwargs: dict[str, object] = {"mtu": mtu}
    if suite is not None:
        kwargs["cipher_suites"] = [suite]
    if profile is not None:
        kwargs["srtp_profiles"] = [profile]
    if group is not None:
        kwargs["groups"] = [group]
    client = DtlsConnection(
        Role.CLIENT,
        cert("client"),
        remote_fingerprints=[cert("server").fingerprint],
        initial_retransmit=0.1,
        **kwargs,  # type: ignore[arg-type]
    )
    server = DtlsConnection(
        Role.SERVER,
        cert("server"),
        remote_fingerprints=[cert("client").fingerprint],
        cookie_secret=b"s" * 32 if cookies else None,
        cookie_context=b"\x7f\x00\x00\x01\x13\x88",
        initial_retransmit=0.1,
        **kwargs,  # type: ignore[arg-type]
    )
    return Pair(client, server, network)


def assert_complete(pair: Pair) -> tuple[HandshakeComplete, HandshakeComplete]:
    c, s = pair.completed("client"), pair.completed("server")
    assert c is not None, pair.events
    assert s is not None, pair.events
    assert c.cipher_suite == s.cipher_suite
    assert c.srtp_profile == s.srtp_profile
    assert c.peer_fingerprint == cert("server").fingerprint
    assert s.peer_fingerprint == cert("client").fingerprint
    assert pair.client.export_keying_material(LABEL, 60) == pair.server.export_keying_material(
        LABEL, 60
    )
    return c, s


@pytest.mark.parametrize("cookies", [False, True], ids=["no-cookie", "cookie"])
@pytest.mark.parametrize(
    "profile",
    [
        SrtpProfile.AEAD_AES_128_GCM,
        SrtpProfile.AEAD_AES_256_GCM,
        SrtpProfile.AES128_CM_HMAC_SHA1_80,
    ],
)
@pytest.mark.parametrize("suite", list(CipherSuite))
def test_every_suite_and_profile_over_a_terrible_network(
    suite: CipherSuite, profile: SrtpProfile, cookies: bool
) -> None:
    seed = hash((suite, profile, cookies)) & 0xFFFF
    pair = make_pair(suite, profile, cookies=cookies, network=Network(0.25, 0.2, 0.5, seed))
    pair.run()
    c, _ = assert_complete(pair)
    assert c.cipher_suite is suite and c.srtp_profile is profile
    # Application data both ways (records may be lost: retry a few times like an app).
    pair.network = Network()
    pair.client.send_application_data(b"ping")
    pair.server.send_application_data(b"pong")
    pair.step()
    assert pair.app_data("server") == [b"ping"]
    assert pair.app_data("client") == [b"pong"]


@pytest.mark.parametrize("seed", range(25))
def test_random_loss_duplication_reordering_seeds(seed: int) -> None:
    pair = make_pair(cookies=bool(seed % 2), network=Network(0.3, 0.3, 0.7, seed))
    pair.run(max_time=300)
    assert_complete(pair)


@pytest.mark.parametrize("group", list(NamedGroup))
def test_each_group(group: NamedGroup) -> None:
    pair = make_pair(group=group)
    pair.run()
    assert_complete(pair)


def test_lossless_handshake_takes_four_flights() -> None:
    pair = make_pair()
    pair.run()
    assert_complete(pair)
    # flight 1, 4, 5, 6: each fits one datagram at the default MTU.
    assert pair.datagrams == {"client": 2, "server": 2}
    assert pair.now == NOW  # no timer fired


def test_cookie_exchange_adds_one_round_trip() -> None:
    pair = make_pair(cookies=True)
    pair.run()
    assert_complete(pair)
    assert pair.datagrams == {"client": 3, "server": 3}


@pytest.mark.parametrize("mtu", [256, 300, 500])
def test_small_mtu_fragments_both_ways(mtu: int) -> None:
    pair = make_pair(mtu=mtu, network=Network(0.1, 0.1, 0.5, mtu))
    pair.run()
    assert_complete(pair)
    assert pair.datagrams["server"] >= 3 and pair.datagrams["client"] >= 3


def test_datagrams_pack_several_records() -> None:
    pair = make_pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    flight4 = pair.server.poll_transmit()
    assert flight4 is not None and pair.server.poll_transmit() is None
    assert len(parse_records_untrusted(flight4)) == 5  # SH, Certificate, SKE, CR, SHD


def test_retransmission_timer_doubles_to_sixty_seconds_then_gives_up() -> None:
    client = DtlsConnection(
        Role.CLIENT,
        cert("client"),
        remote_fingerprints=[cert("server").fingerprint],
        max_retransmissions=9,
    )
    now = NOW
    client.start(now)
    assert client.poll_transmit() is not None
    gaps = []
    while (deadline := client.poll_timeout()) is not None:
        gaps.append(deadline - now)
        now = deadline
        client.handle_timeout(now - 0.001)  # early: nothing happens
        assert client.poll_transmit() is None
        client.handle_timeout(now)
        if client.state is State.CLOSED:
            break
        assert client.poll_transmit() is not None  # the same flight again
    assert gaps == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    closed = client.poll_event()
    assert isinstance(closed, ConnectionClosed) and closed.alert is None and not closed.by_peer


def test_retransmitted_client_hello_makes_server_resend_its_flight() -> None:
    """Chromium retransmits its ClientHello after ~60 ms; the server must answer each
    retransmission with its flight 4 again (RFC 6347 §4.2.4) and keep one handshake."""
    pair = make_pair()
    pair.client.start(pair.now)
    hello = pair.client.poll_transmit()
    assert hello is not None
    pair.server.handle_datagram(pair.now, hello)
    first = pair.server.poll_transmit()
    # The client retransmits (new record sequence number, same message).
    pair.client.handle_timeout(pair.now + 0.1)
    again = pair.client.poll_transmit()
    assert again is not None and again != hello
    pair.server.handle_datagram(pair.now + 0.1, again)
    resent = pair.server.poll_transmit()
    assert resent is not None and first is not None
    assert resent != first  # fresh record sequence numbers ...
    assert resent[13:].__len__() == first[13:].__len__()  # ... same flight
    # An identical copy (network duplication) is a replay and is not answered.
    pair.server.handle_datagram(pair.now + 0.1, again)
    assert pair.server.poll_transmit() is None
    pair.client.handle_datagram(pair.now + 0.1, first)
    pair.client.handle_datagram(pair.now + 0.1, resent)
    pair.run()
    assert_complete(pair)


def test_server_resends_final_flight_when_client_retransmits_flight_5() -> None:
    pair = make_pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    pair.client.handle_datagram(pair.now, pair.server.poll_transmit() or b"")
    flight5 = pair.client.poll_transmit()
    assert flight5 is not None
    pair.server.handle_datagram(pair.now, flight5)
    assert pair.server.poll_transmit() is not None  # flight 6, "lost"
    assert pair.server.state is State.ESTABLISHED and pair.server.poll_timeout() is None
    pair.client.handle_timeout(pair.now + 0.1)
    retransmitted = pair.client.poll_transmit()
    assert retransmitted is not None
    pair.server.handle_datagram(pair.now + 0.1, retransmitted)
    flight6 = pair.server.poll_transmit()
    assert flight6 is not None
    pair.client.handle_datagram(pair.now + 0.1, flight6)
    assert pair.client.state is State.ESTABLISHED


def test_close_notify_both_ways() -> None:
    pair = make_pair()
    pair.run()
    pair.client.close()
    pair.step()
    closed = pair.closed("server")
    assert closed == ConnectionClosed(AlertDescription.close_notify, True, "peer sent close_notify")
    client_closed = pair.closed("client")
    assert client_closed is not None and not client_closed.by_peer
    with pytest.raises(LocalProtocolError):
        pair.client.send_application_data(b"late")


def test_api_misuse_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=[])
    with pytest.raises(LocalProtocolError):
        DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=["md5 00:11"])
    with pytest.raises(LocalProtocolError):
        DtlsConnection(Role.CLIENT, cert("c"), remote_fingerprints=None, cookie_secret=b"x")
    server = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None)
    with pytest.raises(LocalProtocolError):
        server.start(NOW)
    with pytest.raises(LocalProtocolError):
        server.export_keying_material(LABEL, 60)
    pair = make_pair()
    pair.run()
    with pytest.raises(LocalProtocolError):
        pair.client.send_application_data(b"x" * 2000)
    with pytest.raises(LocalProtocolError):
        pair.client.export_keying_material(b"master secret", 48)


def test_opting_out_of_fingerprints_still_reports_the_peer() -> None:
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=None)
    server = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None)
    pair = Pair(client, server)
    pair.run()
    assert_complete(pair)


def test_fingerprint_spelling_is_normalised() -> None:
    fp = cert("server").fingerprint
    client = DtlsConnection(
        Role.CLIENT, cert("client"), remote_fingerprints=["SHA-256 " + fp.split()[1].lower()]
    )
    pair = Pair(client, None)
    pair.run()
    assert_complete(pair)


def test_sha1_and_sha512_fingerprints_are_accepted() -> None:
    from appliance.proto.dtls import fingerprint_of

    der = cert("server").der
    client = DtlsConnection(
        Role.CLIENT,
        cert("client"),
        remote_fingerprints=[fingerprint_of(der, "sha-1"), fingerprint_of(der, "sha-512")],
    )
    pair = Pair(client, None)
    pair.run()
    c = pair.completed("client")
    assert c is not None and c.peer_fingerprint == fingerprint_of(der, "sha-1")


def _false_start_pair() -> Pair:
    client = DtlsConnection(Role.CLIENT, cert("client"),
                            remote_fingerprints=[cert("server").fingerprint], false_start=True)
    return Pair(client=client)


def test_false_start_keys_the_client_before_the_server_finished() -> None:
    """RFC 7918: with ``false_start`` the client's exporter works as soon as flight 5 is
    queued, gives the keys the server derives from that flight, and the ordinary
    HandshakeComplete still follows the server's Finished (flight 6)."""
    pair = _false_start_pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    flight4 = pair.server.poll_transmit()
    assert flight4 is not None
    with pytest.raises(LocalProtocolError):
        pair.client.export_keying_material(LABEL, 60)  # not before flight 5
    pair.client.handle_datagram(pair.now, flight4)
    assert pair.client.state is State.CLIENT_WAIT_FINISHED
    flight5 = pair.client.poll_transmit()
    assert flight5 is not None
    event = pair.client.poll_event()
    assert isinstance(event, FalseStart) and event.srtp_profile is not None
    assert event.peer_fingerprint == cert("server").fingerprint
    assert pair.client.poll_event() is None  # not complete yet
    early = pair.client.export_keying_material(LABEL, 60)
    pair.server.handle_datagram(pair.now, flight5)
    assert pair.server.state is State.ESTABLISHED
    assert pair.server.export_keying_material(LABEL, 60) == early
    flight6 = pair.server.poll_transmit()
    assert flight6 is not None
    pair.client.handle_datagram(pair.now, flight6)
    done = pair.client.poll_event()
    assert isinstance(done, HandshakeComplete) and done.srtp_profile == event.srtp_profile
    assert pair.client.export_keying_material(LABEL, 60) == early


def test_false_start_sends_application_data_behind_flight_5() -> None:
    """RFC 7918 §3: application data sent on FalseStart leaves after our Finished and the
    server reads it on completing (the transceiver's SCTP INIT, docs/sctp.md)."""
    pair = _false_start_pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    pair.client.handle_datagram(pair.now, pair.server.poll_transmit() or b"")
    assert isinstance(pair.client.poll_event(), FalseStart)
    pair.client.send_application_data(b"INIT")
    datagrams = list(iter(pair.client.poll_transmit, None))
    for d in datagrams:
        pair.server.handle_datagram(pair.now, d)
    events = list(iter(pair.server.poll_event, None))
    assert isinstance(events[0], HandshakeComplete)
    assert [e.data for e in events if isinstance(e, ApplicationData)] == [b"INIT"]
    pair.client.handle_datagram(pair.now, pair.server.poll_transmit() or b"")
    assert isinstance(pair.client.poll_event(), HandshakeComplete)
    # Without false start the client still refuses before the server's Finished.
    plain = make_pair()
    plain.client.start(plain.now)
    plain.server.handle_datagram(plain.now, plain.client.poll_transmit() or b"")
    plain.client.handle_datagram(plain.now, plain.server.poll_transmit() or b"")
    assert plain.client.state is State.CLIENT_WAIT_FINISHED
    with pytest.raises(LocalProtocolError):
        plain.client.send_application_data(b"INIT")


def test_false_start_still_fails_on_a_bad_server_finished() -> None:
    """False Start sends early, it does not trust early: a flight 6 that is not this
    server's (here another handshake's: its Finished is under other keys) is dropped, and
    the client stays waiting for the real one instead of reporting HandshakeComplete."""
    pair = _false_start_pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    pair.client.handle_datagram(pair.now, pair.server.poll_transmit() or b"")
    assert isinstance(pair.client.poll_event(), FalseStart)
    # A different server's flight 6: same keys are impossible, so its records fail to
    # decrypt and are dropped; the client keeps waiting, retransmits, and never completes.
    other = make_pair()
    other.run()
    pair.client.handle_datagram(pair.now, bytes(other.server.poll_transmit() or b""))
    assert pair.client.state is State.CLIENT_WAIT_FINISHED
    assert not any(isinstance(e, HandshakeComplete) for e in iter(pair.client.poll_event, None))


def test_false_start_handshake_over_a_terrible_network() -> None:
    """The early event comes once, even with flight 5 retransmitted many times."""
    for seed in range(5):
        pair = _false_start_pair()
        pair.network = Network(loss=0.3, duplicate=0.3, reorder=0.5, seed=seed)
        pair.run()
        assert_complete(pair)
        starts = [e for e in pair.events["client"] if isinstance(e, FalseStart)]
        assert len(starts) == 1
        assert pair.events["client"].index(starts[0]) < pair.events["client"].index(
            next(e for e in pair.events["client"] if isinstance(e, HandshakeComplete)))


def test_false_start_is_client_only_and_off_by_default() -> None:
    with pytest.raises(LocalProtocolError):
        DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None, false_start=True)
    pair = make_pair()
    pair.run()
    assert not any(isinstance(e, FalseStart) for e in pair.events["client"])
