"""Captured ClientHellos from Chromium 156 (DTLS 1.3-capable) and OpenSSL get a 1.2 answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from proto.dtls.dtls_frames import drain, handshake_datagram, plaintext_messages
from proto.dtls.dtls_pair import NOW, cert

from appliance.proto.dtls import CipherSuite, DtlsConnection, Role, State
from appliance.proto.dtls._wire import DTLS_1_2, ExtensionType
from appliance.proto.dtls.messages import (
    CertificateMessage,
    CertificateRequest,
    ClientHello,
    HelloVerifyRequest,
    ServerHello,
    ServerHelloDone,
    ServerKeyExchange,
    find_extension,
    parse_use_srtp_untrusted,
)
from appliance.proto.srtp import SrtpProfile

VECTORS = {
    "chromium": ("chromium156-dtls-clienthello.bin", 1175),
    "openssl": ("openssl-dtls12-clienthello.bin", None),
}


def load(vectors: Path, name: str) -> tuple[bytes, int | None]:
    filename, split = VECTORS[name]
    return (vectors / filename).read_bytes(), split


def test_chromium_client_hello_parses_and_round_trips(vectors: Path) -> None:
    body, _ = load(vectors, "chromium")
    assert len(body) == 1413
    hello = ClientHello.parse_untrusted(body)
    assert bytes(hello) == body
    assert hello.client_version == DTLS_1_2
    assert CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 in hello.cipher_suites
    types = [t for t, _ in hello.extensions]
    for required in (
        ExtensionType.supported_versions,
        ExtensionType.key_share,
        ExtensionType.use_srtp,
        ExtensionType.extended_master_secret,
        ExtensionType.renegotiation_info,
    ):
        assert required in types
    srtp = find_extension(hello.extensions, ExtensionType.use_srtp)
    assert srtp is not None
    profiles, mki = parse_use_srtp_untrusted(srtp)
    assert set(profiles) == {1, 7, 8} and mki == b""


def test_openssl_client_hello_round_trips(vectors: Path) -> None:
    body, _ = load(vectors, "openssl")
    hello = ClientHello.parse_untrusted(body)
    assert bytes(hello) == body and len(body) == 144


@pytest.mark.parametrize("name", list(VECTORS))
def test_server_answers_captured_hello_with_dtls12_flight_4(vectors: Path, name: str) -> None:
    body, split = load(vectors, name)
    server = DtlsConnection(
        Role.SERVER, cert("server"), remote_fingerprints=[cert("client").fingerprint]
    )
    datagrams = handshake_datagram(body, split=split)
    for d in datagrams[:-1]:
        server.handle_datagram(NOW, d)
        assert server.poll_transmit() is None  # waiting for the second fragment
    server.handle_datagram(NOW, datagrams[-1])
    assert server.state is State.SERVER_WAIT_CERTIFICATE
    out = drain(server)
    assert len(out) == 1
    messages = plaintext_messages(out[0])
    assert [type(m) for m in messages] == [
        ServerHello,
        CertificateMessage,
        ServerKeyExchange,
        CertificateRequest,
        ServerHelloDone,
    ]
    hello = messages[0]
    assert isinstance(hello, ServerHello)
    assert hello.server_version == DTLS_1_2
    assert hello.cipher_suite == CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    types = {t for t, _ in hello.extensions}
    # Only 1.2 extensions in the answer: no supported_versions / key_share.
    assert ExtensionType.supported_versions not in types and ExtensionType.key_share not in types
    assert ExtensionType.extended_master_secret in types
    srtp = find_extension(hello.extensions, ExtensionType.use_srtp)
    assert srtp is not None and parse_use_srtp_untrusted(srtp)[0] == (SrtpProfile.AEAD_AES_128_GCM,)
    # Not a TLS 1.3 downgrade sentinel: we are not a 1.3 server (RFC 8446 §4.1.3).
    assert hello.random[-8:-1] != b"DOWNGRD"
    # Chromium's retransmission (fresh record numbers) gets flight 4 again.
    for d in handshake_datagram(body, split=split, record_seq=5):
        server.handle_datagram(NOW + 0.06, d)
    assert len(drain(server)) == 1
    assert server.state is State.SERVER_WAIT_CERTIFICATE


@pytest.mark.parametrize("name", list(VECTORS))
def test_captured_hello_gets_cookie_then_proceeds(vectors: Path, name: str) -> None:
    body, split = load(vectors, name)
    server = DtlsConnection(
        Role.SERVER,
        cert("server"),
        remote_fingerprints=None,
        cookie_secret=b"k" * 32,
        cookie_context=b"198.51.100.7:5000",
    )
    for d in handshake_datagram(body, split=split, record_seq=3):
        server.handle_datagram(NOW, d)
    (out,) = drain(server)
    # HVR reuses the record seq of the (last fragment of the) ClientHello, RFC 6347 §4.2.1.
    assert int.from_bytes(out[5:11], "big") == 3 + (split is not None)
    (hvr,) = plaintext_messages(out)
    assert isinstance(hvr, HelloVerifyRequest) and len(hvr.cookie) == 32
    assert server.state is State.SERVER_WAIT_CLIENT_HELLO
    hello = ClientHello.parse_untrusted(body)
    again = ClientHello(
        hello.client_version,
        hello.random,
        hello.session_id,
        hvr.cookie,
        hello.cipher_suites,
        hello.compression_methods,
        hello.extensions,
    )
    for d in handshake_datagram(bytes(again), message_seq=1, record_seq=10, split=split):
        server.handle_datagram(NOW + 1, d)
    assert server.state is State.SERVER_WAIT_CERTIFICATE
    # A cookie from another address, or a stale one, is not accepted.
    other = DtlsConnection(
        Role.SERVER,
        cert("server"),
        remote_fingerprints=None,
        cookie_secret=b"k" * 32,
        cookie_context=b"203.0.113.9:5000",
    )
    for d in handshake_datagram(bytes(again), message_seq=1, split=split):
        other.handle_datagram(NOW + 1, d)
    assert other.state is State.SERVER_WAIT_CLIENT_HELLO
    stale = DtlsConnection(
        Role.SERVER,
        cert("server"),
        remote_fingerprints=None,
        cookie_secret=b"k" * 32,
        cookie_context=b"198.51.100.7:5000",
    )
    for d in handshake_datagram(bytes(again), message_seq=1, split=split):
        stale.handle_datagram(NOW + 600, d)
    assert stale.state is State.SERVER_WAIT_CLIENT_HELLO
