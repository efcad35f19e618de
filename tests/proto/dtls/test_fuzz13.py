"""Hypothesis fuzzing of the DTLS 1.3 codecs and engine: every ``*_untrusted`` parser
raises only DtlsError (whole inputs and every prefix of real messages); the connection
never raises for peer bytes, in either role, at any point of the handshake."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proto.dtls.dtls_frames import drain
from proto.dtls.dtls_pair import NOW, cert

from appliance.proto.dtls import DtlsConnection, DtlsError, Role
from appliance.proto.dtls.messages import (
    _PARSERS13,
    parse_body13_untrusted,
    parse_cookie_untrusted,
    parse_key_share_ch_untrusted,
    parse_key_share_hrr_untrusted,
    parse_key_share_sh_untrusted,
    parse_supported_versions_ch_untrusted,
    parse_supported_versions_sh_untrusted,
)
from appliance.proto.dtls.record import parse_handshake_fragments_untrusted, parse_records_untrusted
from appliance.proto.dtls.record13 import (
    Ack,
    parse_ciphertext_untrusted,
    reconstruct_seq,
    split_inner_plaintext_untrusted,
)

BOTH = frozenset({"1.2", "1.3"})
ONLY13 = frozenset({"1.3"})
EXTENSION_PARSERS: list[Callable[[bytes], object]] = [
    parse_supported_versions_ch_untrusted,
    parse_supported_versions_sh_untrusted,
    parse_key_share_ch_untrusted,
    parse_key_share_sh_untrusted,
    parse_key_share_hrr_untrusted,
    parse_cookie_untrusted,
]


def only_dtls_error(fn: Callable[[bytes], object], data: bytes) -> None:
    try:
        fn(data)
    except DtlsError:
        pass


def flights() -> tuple[list[bytes], list[bytes]]:
    """The datagrams of one clean 1.3 handshake: (client's, server's)."""
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=None, versions=ONLY13)
    server = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None, versions=ONLY13)
    sent: tuple[list[bytes], list[bytes]] = ([], [])
    client.start(NOW)
    for _ in range(5):
        for src, dst, out in ((client, server, sent[0]), (server, client, sent[1])):
            for d in drain(src):
                out.append(d)
                dst.handle_datagram(NOW, d)
    return sent


CLIENT_FLIGHTS, SERVER_FLIGHTS = flights()


def plaintext_bodies() -> list[tuple[int, bytes]]:
    out = []
    for d in CLIENT_FLIGHTS[:1] + SERVER_FLIGHTS[:1]:
        for record in parse_records_untrusted(d[: 13 + int.from_bytes(d[11:13], "big")]):
            for frag in parse_handshake_fragments_untrusted(record.fragment):
                if len(frag.body) == frag.length:
                    out.append((frag.msg_type, frag.body))
    return out


@given(st.binary(max_size=200))
def test_ciphertext_and_ack_parsers(data: bytes) -> None:
    only_dtls_error(lambda b: parse_ciphertext_untrusted(b, 0), data)
    only_dtls_error(Ack.parse_untrusted, data)
    only_dtls_error(split_inner_plaintext_untrusted, data)


@given(st.sampled_from(sorted(_PARSERS13)), st.binary(max_size=300))
def test_body_parsers(msg_type: int, data: bytes) -> None:
    only_dtls_error(lambda b: parse_body13_untrusted(msg_type, b), data)


@given(st.binary(max_size=80))
def test_extension_parsers(data: bytes) -> None:
    for fn in EXTENSION_PARSERS:
        only_dtls_error(fn, data)


def test_every_prefix_of_real_messages() -> None:
    """Byte-at-a-time truncation of our own ClientHello/ServerHello and of each record."""
    for msg_type, body in plaintext_bodies():
        for n in range(len(body)):
            only_dtls_error(lambda b, t=msg_type: parse_body13_untrusted(t, b), body[:n])
    for d in SERVER_FLIGHTS + CLIENT_FLIGHTS:
        for n in range(len(d)):
            only_dtls_error(lambda b: parse_ciphertext_untrusted(b, 0), d[:n])


@given(st.integers(0, 2**48), st.integers(0, 2**48))
def test_sequence_reconstruction_is_closest(actual: int, expected: int) -> None:
    """RFC 9147 §4.2.2: within half the 16-bit span, the full number comes back."""
    if abs(actual - expected) < 2**15:
        assert reconstruct_seq(actual & 0xFFFF, 16, expected) == actual


@pytest.mark.parametrize("role", [Role.CLIENT, Role.SERVER])
@given(datagrams=st.lists(st.binary(max_size=200), max_size=6), cookies=st.booleans())
@settings(max_examples=60, deadline=None)
def test_random_datagrams_never_raise(role: Role, datagrams: list[bytes], cookies: bool) -> None:
    conn = DtlsConnection(role, cert(role.value), remote_fingerprints=None, versions=BOTH,
                          cookie_secret=b"c" * 32 if cookies and role is Role.SERVER else None)
    if role is Role.CLIENT:
        conn.start(NOW)
    for d in datagrams:
        conn.handle_datagram(NOW, d)
    drain(conn)
    while conn.poll_event() is not None:
        pass


@given(st.data())
@settings(max_examples=80, deadline=None)
def test_mutated_real_flights_never_raise(data: st.DataObject) -> None:
    """Bit flips and truncations of a real handshake's datagrams, fed to fresh engines at
    the point of the handshake they belong to."""
    to_server = data.draw(st.booleans())
    source = CLIENT_FLIGHTS if to_server else SERVER_FLIGHTS
    datagrams = [bytearray(d) for d in source]
    for _ in range(data.draw(st.integers(1, 6))):
        d = data.draw(st.sampled_from(datagrams))
        if not d:
            continue
        pos = data.draw(st.integers(0, len(d) - 1))
        if data.draw(st.booleans()):
            d[pos] ^= data.draw(st.integers(1, 255))
        else:
            del d[pos:]
    role = Role.SERVER if to_server else Role.CLIENT
    conn = DtlsConnection(role, cert(role.value), remote_fingerprints=None, versions=BOTH)
    if role is Role.CLIENT:
        conn.start(NOW)
        drain(conn)
    for d in datagrams:
        conn.handle_datagram(NOW, bytes(d))
        drain(conn)
        conn.handle_timeout(NOW + 5)
    while conn.poll_event() is not None:
        pass
