"""Hypothesis fuzzing: every ``*_untrusted`` parser raises only DtlsError; the connection
never raises at all for peer bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proto.dtls.dtls_frames import handshake_datagram
from proto.dtls.dtls_pair import NOW, cert

from appliance.proto.dtls import DtlsConnection, DtlsError, Role
from appliance.proto.dtls.messages import (
    _PARSERS,
    parse_ec_point_formats_untrusted,
    parse_handshake_body_untrusted,
    parse_renegotiation_info_untrusted,
    parse_signature_algorithms_untrusted,
    parse_supported_groups_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import (
    HandshakeFragment,
    Record,
    is_client_hello,
    parse_handshake_fragments_untrusted,
    parse_records_untrusted,
)

VECTOR_DIR = Path(__file__).resolve().parents[2] / "vectors"
CHROMIUM = (VECTOR_DIR / "chromium156-dtls-clienthello.bin").read_bytes()
OPENSSL = (VECTOR_DIR / "openssl-dtls12-clienthello.bin").read_bytes()


def only_dtls_error(fn: object, data: bytes) -> None:
    try:
        fn(data)  # type: ignore[operator]
    except DtlsError:
        pass


@given(st.binary(max_size=200))
def test_record_parser(data: bytes) -> None:
    only_dtls_error(parse_records_untrusted, data)


@given(st.binary(max_size=200))
def test_handshake_fragment_parser(data: bytes) -> None:
    only_dtls_error(parse_handshake_fragments_untrusted, data)


@given(st.sampled_from(sorted(_PARSERS)), st.binary(max_size=300))
def test_message_parsers(msg_type: int, data: bytes) -> None:
    only_dtls_error(lambda b: parse_handshake_body_untrusted(msg_type, b), data)


@given(st.binary(max_size=64))
def test_extension_parsers(data: bytes) -> None:
    for fn in (
        parse_supported_groups_untrusted,
        parse_signature_algorithms_untrusted,
        parse_ec_point_formats_untrusted,
        parse_use_srtp_untrusted,
        parse_renegotiation_info_untrusted,
    ):
        only_dtls_error(fn, data)


@pytest.mark.parametrize("body", [CHROMIUM, OPENSSL], ids=["chromium", "openssl"])
def test_client_hello_every_prefix(body: bytes) -> None:
    """Byte-at-a-time truncation of real ClientHellos."""
    for n in range(len(body)):
        only_dtls_error(lambda b: parse_handshake_body_untrusted(1, b), body[:n])


@given(st.data())
def test_mutated_client_hello(data: st.DataObject) -> None:
    body = bytearray(data.draw(st.sampled_from([CHROMIUM, OPENSSL])))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(body) - 1))
        body[i] = data.draw(st.integers(0, 255))
    only_dtls_error(lambda b: parse_handshake_body_untrusted(1, b), bytes(body))


def fresh_server(cookies: bool = False) -> DtlsConnection:
    return DtlsConnection(
        Role.SERVER,
        cert("server"),
        remote_fingerprints=None,
        cookie_secret=b"c" * 32 if cookies else None,
    )


def drain_all(conn: DtlsConnection) -> None:
    while conn.poll_transmit() is not None:
        pass
    while conn.poll_event() is not None:
        pass


@given(st.lists(st.binary(max_size=120), max_size=5), st.booleans())
def test_handle_datagram_random_bytes(datagrams: list[bytes], cookies: bool) -> None:
    server = fresh_server(cookies)
    for d in datagrams:
        server.handle_datagram(NOW, d)  # must not raise
    drain_all(server)


records = st.builds(
    Record,
    content_type=st.sampled_from([20, 21, 22, 23]),
    version=st.sampled_from([0xFEFD, 0xFEFF]),
    epoch=st.integers(0, 2),
    sequence_number=st.integers(0, 2**48 - 1),
    fragment=st.one_of(
        st.binary(max_size=60),
        st.builds(
            lambda t, length, seq, off, body: bytes(HandshakeFragment(t, length, seq, off, body)),
            st.integers(0, 25),
            st.integers(0, 300),
            st.integers(0, 20),
            st.integers(0, 300),
            st.binary(max_size=40),
        ),
    ),
)


@given(st.lists(st.lists(records, min_size=1, max_size=4), max_size=6), st.booleans())
def test_handle_datagram_structured_records(datagrams: list[list[Record]], cookies: bool) -> None:
    server = fresh_server(cookies)
    for recs in datagrams:
        server.handle_datagram(NOW, b"".join(bytes(r) for r in recs))
    drain_all(server)


@given(st.data())
def test_handle_datagram_mutated_real_hello(data: st.DataObject) -> None:
    server = fresh_server(data.draw(st.booleans()))
    body = data.draw(st.sampled_from([CHROMIUM, OPENSSL]))
    datagrams = [
        bytearray(d)
        for d in handshake_datagram(
            body, split=data.draw(st.sampled_from([None, 100, 1175])) if len(body) > 1175 else None
        )
    ]
    for _ in range(data.draw(st.integers(0, 6))):
        d = data.draw(st.sampled_from(datagrams))
        d[data.draw(st.integers(0, len(d) - 1))] = data.draw(st.integers(0, 255))
    for d in datagrams:
        server.handle_datagram(NOW, bytes(d))
    drain_all(server)


@given(st.binary(min_size=1, max_size=80))
def test_client_handles_garbage_mid_handshake(data: bytes) -> None:
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=None)
    client.start(NOW)
    client.handle_datagram(NOW, data)
    client.handle_datagram(NOW, bytes(Record(22, 0xFEFD, 0, 0, data)))
    drain_all(client)


def test_is_client_hello_knows_real_hellos_and_never_raises() -> None:
    """The transceiver's peek (cookie mode) on records of the captured ClientHellos and of
    a ServerHello."""
    assert is_client_hello(handshake_datagram(CHROMIUM)[0])
    assert is_client_hello(memoryview(handshake_datagram(OPENSSL)[0]))
    assert not is_client_hello(handshake_datagram(b"\x00" * 40, 2)[0])  # a ServerHello


@given(st.binary(max_size=64))
def test_is_client_hello_on_any_bytes(data: bytes) -> None:
    assert is_client_hello(data) in (True, False)
