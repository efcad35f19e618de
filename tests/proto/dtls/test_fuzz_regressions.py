"""Regression tests for bugs the fuzz targets (``fuzz/targets.py``) found in DTLS."""

from __future__ import annotations

from proto.dtls.dtls_pair import NOW, cert

from appliance.proto.dtls import AlertDescription, ConnectionClosed, DtlsConnection, Role

# DER of the OID 1.2.840.10045.3.1.7 (P-256, what Certificate.generate uses) and of
# 1.2.840.10045.3.1.6 (prime239v3: well-formed, but no backend loads it).
P256_OID = bytes.fromhex("06082a8648ce3d030107")
PRIME239V3_OID = bytes.fromhex("06082a8648ce3d030106")


def _client_and_server_flight2() -> tuple[DtlsConnection, list[bytes]]:
    """A started client and the plaintext flight 2 of a real server, to tamper with."""
    client = DtlsConnection(Role.CLIENT, cert("client"), remote_fingerprints=None)
    server = DtlsConnection(Role.SERVER, cert("server"), remote_fingerprints=None)
    client.start(NOW)
    hello = client.poll_transmit()
    assert hello is not None
    server.handle_datagram(NOW, hello)
    flight2 = []
    while (d := server.poll_transmit()) is not None:
        flight2.append(d)
    return client, flight2


def _assert_closed_with(conn: DtlsConnection, alert: AlertDescription) -> None:
    events = []
    while (ev := conn.poll_event()) is not None:
        events.append(ev)
    assert any(isinstance(ev, ConnectionClosed) for ev in events), events
    assert conn.state.value == "closed"
    sent = conn.poll_transmit()
    # A plaintext (epoch 0) fatal alert: 13-byte record header, then level 2, description.
    assert sent is not None and sent[13:15] == bytes([2, alert])


def test_certificate_on_unsupported_curve_is_an_alert_not_a_crash() -> None:
    """Bug: a peer Certificate whose key names a curve ``cryptography`` cannot load (found
    by the ``dtls_client`` and ``dtls_handshake`` fuzz targets as prime239v3) made
    ``x509.Certificate.public_key()`` raise ``UnsupportedAlgorithm``, which escaped
    ``DtlsConnection.handle_datagram`` (documented never to raise for peer bytes); in the
    transceiver that became an "internal-error" session end with a traceback in the log.
    Scenario: a client receives the server's flight 2 with the curve OID in its certificate
    rewritten; it must close with an ``unsupported_certificate`` alert instead."""
    client, flight2 = _client_and_server_flight2()
    assert sum(P256_OID in d for d in flight2) == 1, "the OID sits in one plaintext datagram"
    for d in flight2:
        client.handle_datagram(NOW, d.replace(P256_OID, PRIME239V3_OID))  # must not raise
    _assert_closed_with(client, AlertDescription.unsupported_certificate)


# TBSCertificate's explicit [0] version field: INTEGER 2 (X.509 v3), and the same with 126.
V3_VERSION = bytes.fromhex("a003020102")
BOGUS_VERSION = bytes.fromhex("a00302017e")


def test_certificate_with_unknown_x509_version_is_an_alert_not_a_crash() -> None:
    """Bug: a peer Certificate whose X.509 version field is not v1/v3 (found by the
    ``dtls_client`` and ``dtls_handshake`` atheris targets as versions 126 and 54) made
    ``x509.load_der_x509_certificate`` raise ``cryptography.x509.InvalidVersion`` — not a
    ``ValueError`` — which escaped ``DtlsConnection.handle_datagram``. Scenario: a client
    receives the server's flight 2 with the version byte rewritten; it must close with a
    ``bad_certificate`` alert instead."""
    client, flight2 = _client_and_server_flight2()
    assert sum(V3_VERSION in d for d in flight2) == 1
    for d in flight2:
        client.handle_datagram(NOW, d.replace(V3_VERSION, BOGUS_VERSION))  # must not raise
    _assert_closed_with(client, AlertDescription.bad_certificate)


def test_certificate_with_negative_serial_is_accepted_without_a_warning() -> None:
    """Bug: a peer Certificate whose serial number is negative (found by the ``dtls_client``
    hypothesis target in ``make test``) made ``x509.load_der_x509_certificate`` emit a
    ``CryptographyDeprecationWarning`` ("will cause an exception in a future release"), which
    the suite turns into an error escaping ``handle_datagram``. RFC 5280 §4.1.2.2: users
    SHOULD handle non-positive serials gracefully, and DTLS-SRTP identifies the peer by
    fingerprint, so the handshake goes on. Scenario: the server's certificate gets its
    serial's sign bit set; the client must answer with its flight 3, not raise or close."""
    client, flight2 = _client_and_server_flight2()
    serial = V3_VERSION + b"\x02\x14"  # then 20 bytes of positive serial
    assert sum(serial in d for d in flight2) == 1
    tampered = []
    for d in flight2:
        i = d.find(serial)
        if i >= 0:
            j = i + len(serial)
            assert d[j] < 0x80
            d = d[:j] + bytes([d[j] | 0x80]) + d[j + 1:]
        tampered.append(d)
    for d in tampered:
        client.handle_datagram(NOW, d)  # must not raise (warnings are errors in the suite)
    assert client.state.value != "closed"
    assert client.poll_transmit() is not None  # flight 3 (ClientKeyExchange ...)
