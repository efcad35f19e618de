"""DTLS HelloVerifyRequest cookies switched on under load (issue 9): the transceiver's
admission policy on a fake clock, and the DTLS connection's cookie switch."""

from __future__ import annotations

import pytest
from proto.dtls.dtls_pair import NOW, Pair, cert

from appliance.proto.dtls import DtlsConnection, Role
from appliance.proto.errors import LocalProtocolError
from appliance.transceiver.admission import DtlsAdmission


def test_cookies_stay_off_at_a_normal_setup_rate() -> None:
    a = DtlsAdmission(max_handshakes=4, hello_rate=10.0, hello_burst=5.0, hold=2.0)
    for i in range(100):  # 9 ClientHellos/s for 11 s, each handshake done before the next
        now = i / 9
        assert not a.client_hello(now), i
        a.started(i)
        a.finished(i)
    assert a.switched_on == 0 and not a.active(100 / 9)


def test_a_burst_of_client_hellos_switches_cookies_on_for_hold_seconds() -> None:
    a = DtlsAdmission(max_handshakes=100, hello_rate=10.0, hello_burst=5.0, hold=2.0)
    got = [a.client_hello(0.0) for _ in range(8)]
    assert got == [False] * 5 + [True] * 3  # the burst passes; past it, cookies
    assert a.switched_on == 1 and a.active(1.9)
    assert a.client_hello(1.0)  # within hold (the rate has refilled: not extended)
    assert a.active(1.99) and not a.active(2.0)  # hold counts from the last overload
    assert not a.client_hello(2.0)
    assert [a.client_hello(2.0) for _ in range(8)][-1]  # a new burst: on again
    assert a.switched_on == 2 and a.active(3.99) and not a.active(4.0)


def test_handshakes_in_progress_switch_cookies_on_until_they_finish() -> None:
    a = DtlsAdmission(max_handshakes=3, hello_rate=1000.0, hello_burst=1000.0, hold=1.0)
    for k in range(3):
        assert not a.client_hello(0.0)
        a.started(k)
    assert a.handshakes == 3
    assert a.client_hello(0.1)  # a 4th while 3 are in progress
    a.finished(0)
    a.finished(0)  # idempotent (a session that ends after its handshake finished)
    assert a.handshakes == 2
    assert a.client_hello(1.0)  # hold: still on until 1.1
    assert not a.client_hello(1.2)
    assert a.switched_on == 1


def _server() -> DtlsConnection:
    return DtlsConnection(Role.SERVER, cert("server"),
                          remote_fingerprints=[cert("client").fingerprint])


def _client_hello() -> tuple[DtlsConnection, bytes]:
    """A started client and its first datagram (the ClientHello)."""
    client = DtlsConnection(Role.CLIENT, cert("client"),
                            remote_fingerprints=[cert("server").fingerprint])
    client.start(NOW)
    hello = client.poll_transmit()
    assert hello is not None
    return client, hello


def test_cookies_switched_on_after_creation_cost_one_round_trip() -> None:
    """A server made without cookies, switched on before the ClientHello (what the
    transceiver does under load): the client gets a HelloVerifyRequest, echoes the cookie,
    and the handshake completes."""
    server = _server()
    server.require_cookies(b"k" * 32, b"127.0.0.1:5000")
    assert server.cookies_required and server.awaiting_client_hello
    pair = Pair(server=server)
    pair.run()
    assert pair.completed("client") is not None and pair.completed("server") is not None
    assert server.counters.hello_verify_requests == 1


def test_cookie_bound_to_another_address_is_refused() -> None:
    """A cookie is only good from the address it was sent to (the context): switching the
    context between the HelloVerifyRequest and the echo makes the server ask again."""
    server = _server()
    server.require_cookies(b"k" * 32, b"127.0.0.1:5000")
    client, hello = _client_hello()
    server.handle_datagram(NOW, hello)
    hvr = server.poll_transmit()
    assert hvr is not None and server.counters.hello_verify_requests == 1
    client.handle_datagram(NOW, hvr)
    echo = client.poll_transmit()
    assert echo is not None
    server.require_cookies(b"k" * 32, b"127.0.0.9:5000")  # "sent from" elsewhere
    server.handle_datagram(NOW, echo)
    assert server.awaiting_client_hello and server.counters.hello_verify_requests == 2


def test_cookies_cannot_change_once_a_handshake_started() -> None:
    pair = Pair(server=_server())
    pair.client.start(pair.now)
    pair.step()
    assert not pair.server.awaiting_client_hello
    with pytest.raises(LocalProtocolError):
        pair.server.require_cookies(b"k" * 32)
    with pytest.raises(LocalProtocolError):
        _server().require_cookies(b"short")


def test_a_flood_of_repeated_client_hellos_does_not_retransmit_each_time() -> None:
    """Regression (issue 9): every copy of a ClientHello sent to a connection that already
    answered it made the server re-send its whole flight (~1 kB, an amplifier and a CPU
    cost per datagram); now at most once per DUP_RETRANSMIT_INTERVAL."""
    server = _server()
    client, hello = _client_hello()
    server.handle_datagram(NOW, hello)
    while server.poll_transmit() is not None:
        pass
    sent = 0
    for i in range(1000):  # 1000 copies within 10 ms (new record numbers: no replays)
        copy = hello[:5] + (i + 1).to_bytes(6, "big") + hello[11:]
        server.handle_datagram(NOW + i * 1e-5, copy)
        while server.poll_transmit() is not None:
            sent += 1
    assert server.counters.retransmissions == 1
    assert server.counters.retransmissions_suppressed == 999
    assert 0 < sent <= 6  # one flight
    later = hello[:5] + (5000).to_bytes(6, "big") + hello[11:]
    server.handle_datagram(NOW + 0.2, later)  # a genuine retransmission later is answered
    assert server.poll_transmit() is not None
