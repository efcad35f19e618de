"""The DTLS 1.2 client's flight handlers (RFC 5246 §7.3, RFC 6347 §4.2.4 flights 1, 3, 5).

One handler per message the client receives, each ``(next_flight, alert | None)``
(STYLE.md rule 4, pion's ``flight*handler.go``); Finished, shared with the server, is in
:mod:`.handshake12`. :func:`client_hello_out` builds flight 1 (and flight 3, the same
ClientHello with the server's cookie, RFC 6347 §4.2.1); ServerHelloDone triggers flight 5:
[Certificate] ClientKeyExchange [CertificateVerify] ChangeCipherSpec Finished. The server
is authenticated (certificate against the SDP fingerprint, RFC 8122 §5; ServerKeyExchange
signature, RFC 8422 §5.4) before flight 5 is sent, which False Start relies on (RFC 7918
§3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from appliance.proto.dtls._wire import (
    CLIENT_CERT_TYPE_ECDSA_SIGN,
    DOWNGRADE_SENTINELS,
    DTLS_1_2,
    AlertDescription,
    CipherSuite,
    ContentType,
    ExtensionType,
    NamedGroup,
    SignatureScheme,
    u16,
)
from appliance.proto.dtls.conn_protocol import Conn12, HandlerResult
from appliance.proto.dtls.crypto import (
    SUITES,
    SUPPORTED_SIGNATURE_SCHEMES,
    KeyShare,
    finished_verify_data,
    sign,
    verify_untrusted,
)
from appliance.proto.dtls.events import State
from appliance.proto.dtls.handshake12 import (
    append_transcript,
    derive_keys,
    handshake_out,
)
from appliance.proto.dtls.messages import (
    CertificateMessage,
    CertificateRequest,
    CertificateVerify,
    ClientHello,
    ClientKeyExchange,
    Extension,
    Finished,
    HandshakeBody,
    HelloVerifyRequest,
    ServerHello,
    ServerKeyExchange,
    encode_use_srtp,
    find_extension,
    parse_renegotiation_info_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import HandshakeMessage, handshake_header
from appliance.proto.dtls.recordlayer12 import Flight, Outgoing
from appliance.proto.srtp.profile import SrtpProfile


def _u16_vector(values: Sequence[int]) -> bytes:
    data = b"".join(u16(v) for v in values)
    return u16(len(data)) + data


def client_hello_out(c: Conn12, cookie: bytes) -> Outgoing:
    extensions: list[Extension] = [
        (ExtensionType.supported_groups, _u16_vector(c._groups)),
        (ExtensionType.ec_point_formats, b"\x01\x00"),
        (ExtensionType.signature_algorithms, _u16_vector(SUPPORTED_SIGNATURE_SCHEMES)),
        (ExtensionType.extended_master_secret, b""),
        (ExtensionType.renegotiation_info, b"\x00"),
    ]
    if c._srtp_profiles:
        extensions.append((ExtensionType.use_srtp, encode_use_srtp(c._srtp_profiles)))
    hello = ClientHello(
        DTLS_1_2, c._client_random, b"", cookie, c._suites, b"\x00", tuple(extensions)
    ) if c._hello_template is None else replace(c._hello_template, cookie=cookie)
    c._client_hello = hello
    out = handshake_out(c, hello)
    # RFC 6347 §4.2.6: the first ClientHello and the HelloVerifyRequest are not part
    # of the transcript, so the transcript restarts with each ClientHello we send.
    c._transcript = bytearray(
        handshake_header(out.msg_type, len(out.body), out.message_seq) + out.body
    )
    return out


def on_hello_verify_request(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, HelloVerifyRequest)
    c._hvr_count += 1
    # A server that keeps asking is broken or hostile; RFC 6347 expects one round.
    if c._hvr_count > 3 or not body.cookie:
        return None, AlertDescription.illegal_parameter
    return [client_hello_out(c, body.cookie)], None


def on_server_hello(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, ServerHello) and c._client_hello is not None
    if body.server_version != DTLS_1_2:
        return None, AlertDescription.protocol_version
    if c._hello_template is not None and body.random[-8:] in DOWNGRADE_SENTINELS:
        return None, AlertDescription.illegal_parameter  # RFC 8446 §4.1.3 downgrade
    if body.cipher_suite not in c._suites or body.compression_method != 0:
        return None, AlertDescription.illegal_parameter
    offered = {t for t, _ in c._client_hello.extensions}
    for ext_type, _ in body.extensions:
        # RFC 5246 §7.4.1.4: the server may only answer extensions we sent.
        if ext_type not in offered:
            return None, AlertDescription.unsupported_extension
    # RFC 7627 §5.2: a client that requires EMS aborts if the server does not echo it.
    if find_extension(body.extensions, ExtensionType.extended_master_secret) is None:
        return None, AlertDescription.handshake_failure
    reneg = find_extension(body.extensions, ExtensionType.renegotiation_info)
    if reneg is not None and parse_renegotiation_info_untrusted(reneg) != b"":
        return None, AlertDescription.handshake_failure
    srtp = find_extension(body.extensions, ExtensionType.use_srtp)
    if c._srtp_profiles:
        if srtp is None:
            return None, AlertDescription.handshake_failure
        chosen, mki = parse_use_srtp_untrusted(srtp)
        # RFC 5764 §4.1.1: exactly one profile, one we offered, and our (empty) MKI.
        if len(chosen) != 1 or chosen[0] not in c._srtp_profiles or mki:
            return None, AlertDescription.illegal_parameter
        c._srtp_profile = SrtpProfile(chosen[0])
    c._suite = CipherSuite(body.cipher_suite)
    c._server_random = body.random
    c._transcript += raw
    c._state = State.CLIENT_WAIT_CERTIFICATE
    return None, None


def on_server_key_exchange(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, ServerKeyExchange) and c._peer_public_key is not None
    if body.named_group not in c._groups:
        return None, AlertDescription.illegal_parameter
    # RFC 8422 §5.4: the signature binds both randoms to the server's ECDH share.
    verify_untrusted(
        c._peer_public_key,
        body.signature_scheme,
        body.signature,
        c._client_random + c._server_random + body.params(),
    )
    c._group = NamedGroup(body.named_group)
    c._key_share = KeyShare(c._group)
    c._peer_ecdh_public = body.public
    c._transcript += raw
    c._state = State.CLIENT_WAIT_HELLO_DONE
    return None, None


def on_certificate_request(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, CertificateRequest)
    # We can only answer with an ECDSA certificate signed with SHA-256.
    if CLIENT_CERT_TYPE_ECDSA_SIGN not in body.certificate_types or (
        SignatureScheme.ecdsa_secp256r1_sha256 not in body.signature_schemes
    ):
        return None, AlertDescription.handshake_failure
    c._certificate_requested = True
    c._transcript += raw
    return None, None  # stay in CLIENT_WAIT_HELLO_DONE


def on_server_hello_done(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert c._key_share is not None and c._suite is not None
    c._transcript += raw
    # Flight 5 (RFC 6347 §4.2.4): [Certificate] ClientKeyExchange [CertificateVerify]
    # ChangeCipherSpec Finished.
    flight: Flight = []
    if c._certificate_requested:
        flight.append(
            append_transcript(c, handshake_out(c, CertificateMessage((c.certificate.der,))))
        )
    pre_master = c._key_share.exchange_untrusted(c._peer_ecdh_public)
    flight.append(
        append_transcript(c, handshake_out(c, ClientKeyExchange(c._key_share.public)))
    )
    # RFC 7627 §4: the session hash runs through ClientKeyExchange.
    derive_keys(c, pre_master)
    if c._certificate_requested:
        scheme, signature = sign(c.certificate.private_key, bytes(c._transcript))
        flight.append(
            append_transcript(c, handshake_out(c, CertificateVerify(scheme, signature)))
        )
    flight.append(Outgoing(ContentType.CHANGE_CIPHER_SPEC, 0, 0, 0, b"\x01"))
    assert c._master_secret is not None
    verify = finished_verify_data(
        SUITES[c._suite].hash_name,
        c._master_secret,
        b"client finished",
        bytes(c._transcript),
    )
    flight.append(append_transcript(c, handshake_out(c, Finished(verify), epoch=1)))
    c._state = State.CLIENT_WAIT_FINISHED
    return flight, None
