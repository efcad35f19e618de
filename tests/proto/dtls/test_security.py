"""Attacks and broken peers: each ends with the right alert or a silent drop."""

from __future__ import annotations

from pathlib import Path

import pytest
from proto.dtls.dtls_frames import alerts, drain, handshake_datagram, with_extensions
from proto.dtls.dtls_pair import NOW, Pair, cert

import appliance.proto.dtls.handshake12_client as client_flights
import appliance.proto.dtls.handshake12_server as server_flights
from appliance.proto.dtls import (
    AlertDescription,
    ConnectionClosed,
    DtlsConnection,
    Role,
    State,
)
from appliance.proto.dtls._wire import ExtensionType
from appliance.proto.dtls.engine12 import Engine12
from appliance.proto.dtls.messages import ClientHello
from appliance.proto.dtls.record import Record, parse_records_untrusted

WRONG = "sha-256 " + ":".join(["AB"] * 32)


def openssl_hello(vectors: Path) -> ClientHello:
    return ClientHello.parse_untrusted((vectors / "openssl-dtls12-clienthello.bin").read_bytes())


def fatal(pair: Pair, name: str) -> ConnectionClosed:
    closed = pair.closed(name)
    assert closed is not None, pair.events
    return closed


def test_wrong_client_fingerprint_is_fatal_bad_certificate() -> None:
    server = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=[WRONG])
    pair = Pair(None, server)
    pair.run()
    assert fatal(pair, "server") == ConnectionClosed(
        AlertDescription.bad_certificate, False, "CERTIFICATE refused"
    )
    peer = fatal(pair, "client")
    assert peer.alert is AlertDescription.bad_certificate and peer.by_peer
    assert pair.server.state is State.CLOSED and pair.completed("server") is None


def test_wrong_server_fingerprint_is_fatal_bad_certificate() -> None:
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=[WRONG])
    pair = Pair(client, None)
    pair.run()
    assert fatal(pair, "client").alert is AlertDescription.bad_certificate
    assert fatal(pair, "server").alert is AlertDescription.bad_certificate
    assert pair.completed("client") is None and pair.completed("server") is None


def _flight5_with(monkeypatch: pytest.MonkeyPatch, name: str, fake: object) -> Pair:
    """Run to flight 5 with one crypto helper replaced while the *client* builds it
    (flight 5 is built in handshake12_client.py)."""
    pair = Pair()
    pair.client.start(pair.now)
    pair.server.handle_datagram(pair.now, pair.client.poll_transmit() or b"")
    with monkeypatch.context() as m:
        m.setattr(client_flights, name, fake)
        pair.client.handle_datagram(pair.now, pair.server.poll_transmit() or b"")
    for d in drain(pair.client):
        pair.server.handle_datagram(pair.now, d)
    pair.step()
    return pair


def test_bad_certificate_verify_is_decrypt_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = client_flights.sign
    pair = _flight5_with(monkeypatch, "sign", lambda key, data: real(key, data + b"x"))
    assert fatal(pair, "server").alert is AlertDescription.decrypt_error
    assert fatal(pair, "client").alert is AlertDescription.decrypt_error


def test_tampered_finished_is_decrypt_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = client_flights.finished_verify_data

    def tampered(hash_name: str, master: bytes, label: bytes, transcript: bytes) -> bytes:
        data = real(hash_name, master, label, transcript)
        return bytes([data[0] ^ 1]) + data[1:]

    pair = _flight5_with(monkeypatch, "finished_verify_data", tampered)
    assert fatal(pair, "server").alert is AlertDescription.decrypt_error
    assert pair.completed("server") is None


def test_tampered_server_key_exchange_signature_is_decrypt_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pair = Pair()
    real = server_flights.sign  # the server signs its ServerKeyExchange there
    monkeypatch.setattr(server_flights, "sign", lambda key, data: real(key, b"other" + data))
    pair.run()
    assert fatal(pair, "client").alert is AlertDescription.decrypt_error


def _answer(server: DtlsConnection, hello: ClientHello) -> list[tuple[int, int, int]]:
    for d in handshake_datagram(bytes(hello)):
        server.handle_datagram(NOW, d)
    out = drain(server)
    return [a for d in out for a in alerts(d)]


def fresh_server() -> DtlsConnection:
    return DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None)


def test_client_hello_without_ems_is_refused(vectors: Path) -> None:
    hello = with_extensions(openssl_hello(vectors), drop={ExtensionType.extended_master_secret})
    server = fresh_server()
    assert _answer(server, hello) == [(0, 2, AlertDescription.handshake_failure)]
    closed = server.poll_event()
    assert (
        isinstance(closed, ConnectionClosed) and closed.alert is AlertDescription.handshake_failure
    )


@pytest.mark.parametrize(
    "suites",
    [
        (0xC02F, 0xC030),  # ECDHE_RSA: no ECDSA certificate on our side
        (0x009C, 0x002F, 0x0035),  # static RSA: no forward secrecy
        (0xC009, 0xC00A),  # ECDHE_ECDSA CBC: not AEAD
        (0x1301, 0x1302),  # TLS 1.3 suites only
    ],
)
def test_non_ecdhe_ecdsa_aead_offer_is_handshake_failure(
    vectors: Path, suites: tuple[int, ...]
) -> None:
    hello = openssl_hello(vectors)
    hello = ClientHello(
        hello.client_version, hello.random, b"", b"", suites, b"\x00", hello.extensions
    )
    assert _answer(fresh_server(), hello) == [(0, 2, AlertDescription.handshake_failure)]


def test_dtls10_only_client_is_protocol_version(vectors: Path) -> None:
    hello = openssl_hello(vectors)
    hello = ClientHello(
        0xFEFF, hello.random, b"", b"", hello.cipher_suites, b"\x00", hello.extensions
    )
    assert _answer(fresh_server(), hello) == [(0, 2, AlertDescription.protocol_version)]


def test_renegotiation_info_with_data_is_refused(vectors: Path) -> None:
    hello = with_extensions(
        openssl_hello(vectors),
        drop={ExtensionType.renegotiation_info},
        add=((ExtensionType.renegotiation_info, b"\x0c" + b"\x00" * 12),),
    )
    assert _answer(fresh_server(), hello) == [(0, 2, AlertDescription.handshake_failure)]


def test_missing_use_srtp_is_refused(vectors: Path) -> None:
    hello = with_extensions(openssl_hello(vectors), drop={ExtensionType.use_srtp})
    assert _answer(fresh_server(), hello) == [(0, 2, AlertDescription.handshake_failure)]


def test_duplicate_extension_is_illegal_parameter(vectors: Path) -> None:
    hello = openssl_hello(vectors)
    hello = with_extensions(hello, add=(hello.extensions[0],))
    assert _answer(fresh_server(), hello) == [(0, 2, AlertDescription.illegal_parameter)]


def test_client_without_certificate_is_refused_when_sdp_promised_one() -> None:
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=None)
    pair = Pair(client, None)
    engine = client.engine
    assert isinstance(engine, Engine12)
    engine._certificate_requested = False  # noqa: SLF001 - simulate a client that ignores CR
    original = client_flights.on_certificate_request

    def ignore(*args: object) -> object:
        result = original(engine, *args)  # type: ignore[arg-type]
        engine._certificate_requested = False  # noqa: SLF001
        return result

    engine._HANDLERS = dict(engine._HANDLERS)  # noqa: SLF001
    engine._HANDLERS[13] = lambda self, *a: ignore(*a)  # noqa: SLF001
    pair.run()
    assert fatal(pair, "server").alert is AlertDescription.handshake_failure


def established() -> Pair:
    pair = Pair()
    pair.run()
    assert pair.completed("server") is not None and pair.completed("client") is not None
    return pair


def test_replayed_application_record_is_dropped() -> None:
    pair = established()
    pair.client.send_application_data(b"once")
    datagram = pair.client.poll_transmit()
    assert datagram is not None
    pair.server.handle_datagram(pair.now, datagram)
    pair.server.handle_datagram(pair.now, datagram)
    pair.step()
    assert pair.app_data("server") == [b"once"]
    assert pair.server.counters.replays_dropped == 1


def test_replay_window_accepts_reordering_within_64() -> None:
    pair = established()
    records = []
    for i in range(70):
        pair.client.send_application_data(bytes([i]))
        records.append(pair.client.poll_transmit())
    for i in [69, *range(0, 69)]:
        d = records[i]
        assert d is not None
        pair.server.handle_datagram(pair.now, d)
    pair.step()
    got = pair.app_data("server")
    # 69 first; then 0..4 are older than the 64-entry window and dropped, 5..68 pass.
    assert got == [bytes([69])] + [bytes([i]) for i in range(6, 69)]
    assert pair.server.counters.replays_dropped == 6


@pytest.mark.parametrize("cut", [1, 5, 12, 13, 20, 40])
def test_truncated_records_are_dropped(cut: int) -> None:
    pair = established()
    pair.client.send_application_data(b"payload-" * 4)
    datagram = pair.client.poll_transmit()
    assert datagram is not None
    pair.server.handle_datagram(pair.now, datagram[:cut])
    pair.server.handle_datagram(pair.now, datagram[:-1])
    assert pair.server.poll_event() is None and pair.server.poll_transmit() is None
    assert pair.server.state is State.ESTABLISHED
    pair.server.handle_datagram(pair.now, datagram)  # the real one still works
    pair.step()
    assert pair.app_data("server") == [b"payload-" * 4]


def test_oversized_and_forged_records_are_dropped() -> None:
    pair = established()
    huge = Record(23, 0xFEFD, 1, 99, b"\x00" * (2**14 + 2049))
    pair.server.handle_datagram(pair.now, bytes(huge))
    forged = Record(23, 0xFEFD, 1, 100, b"\x00" * 8 + b"forged data" + b"\x00" * 16)
    pair.server.handle_datagram(pair.now, bytes(forged))
    plaintext_data = Record(23, 0xFEFD, 0, 100, b"unprotected")
    pair.server.handle_datagram(pair.now, bytes(plaintext_data))
    wrong_epoch = Record(23, 0xFEFD, 2, 0, b"\x00" * 40)
    pair.server.handle_datagram(pair.now, bytes(wrong_epoch))
    plaintext_alert = Record(21, 0xFEFD, 0, 101, b"\x02\x28")
    pair.server.handle_datagram(pair.now, bytes(plaintext_alert))
    assert pair.server.poll_event() is None and pair.server.poll_transmit() is None
    assert pair.server.state is State.ESTABLISHED
    assert pair.server.counters.auth_failures == 1
    assert pair.server.counters.records_dropped >= 4


def test_renegotiation_is_refused_with_a_warning(vectors: Path) -> None:
    pair = established()
    # A ClientHello inside epoch 1 would be a renegotiation; build it with the client's keys.
    hello = bytes(openssl_hello(vectors))
    frag = handshake_datagram(hello, message_seq=5)[0]
    payload = parse_records_untrusted(frag)[0].fragment
    engine = pair.client.engine
    assert isinstance(engine, Engine12)
    engine.rl.queue_record(22, 1, payload)
    for d in drain(pair.client):
        pair.server.handle_datagram(pair.now, d)
    (warning,) = drain(pair.server)
    assert alerts(warning) == [(1, -1, -1)]
    assert pair.server.state is State.ESTABLISHED
    pair.client.handle_datagram(pair.now, warning)
    assert pair.client.state is State.ESTABLISHED


def test_handshake_buffer_is_bounded() -> None:
    server = DtlsConnection(
        Role.SERVER, cert("server"), remote_fingerprints=None, max_handshake_buffer=4096
    )
    # Fragments that claim huge messages are not buffered beyond the bound.
    from appliance.proto.dtls.record import HandshakeFragment

    for seq in range(16):
        frag = HandshakeFragment(1, 1_000_000, seq, 0, b"\x00" * 100)
        server.handle_datagram(NOW, bytes(Record(22, 0xFEFD, 0, seq, bytes(frag))))
    assert isinstance(server.engine, Engine12)
    assert server.engine._reassembler._held <= 4096  # noqa: SLF001
    assert server.poll_transmit() is None and server.state is State.SERVER_WAIT_CLIENT_HELLO
