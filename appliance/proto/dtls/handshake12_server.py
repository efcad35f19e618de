"""The DTLS 1.2 server's flight handlers (RFC 5246 §7.3, RFC 6347 §4.2.4 flights 2, 4, 6).

One handler per message the server receives, each ``(next_flight, alert | None)``
(STYLE.md rule 4, pion's ``flight*handler.go``); Finished, shared with the client, is in
:mod:`.handshake12`. The ClientHello answer is either a stateless HelloVerifyRequest
(RFC 6347 §4.2.1: an HMAC over the caller's client-address bytes, a time bucket and the
ClientHello parameters; nothing is committed until the ClientHello comes back with a valid
cookie) or flight 4: ServerHello, Certificate, ServerKeyExchange (ECDHE_ECDSA, RFC 8422),
CertificateRequest (WebRTC authenticates both ends, RFC 8827 §6.5) and ServerHelloDone.
"""

from __future__ import annotations

import hashlib
import hmac

from appliance.proto.dtls._wire import (
    CLIENT_CERT_TYPE_ECDSA_SIGN,
    DTLS_1_0,
    DTLS_1_2,
    EC_POINT_FORMAT_UNCOMPRESSED,
    TLS_EMPTY_RENEGOTIATION_INFO_SCSV,
    AlertDescription,
    ContentType,
    ExtensionType,
    NamedGroup,
    SignatureScheme,
    u16,
)
from appliance.proto.dtls.conn_protocol import Conn12, HandlerResult
from appliance.proto.dtls.crypto import (
    SUPPORTED_SIGNATURE_SCHEMES,
    KeyShare,
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
    HandshakeBody,
    HelloVerifyRequest,
    ServerHello,
    ServerHelloDone,
    ServerKeyExchange,
    encode_use_srtp,
    find_extension,
    parse_ec_point_formats_untrusted,
    parse_renegotiation_info_untrusted,
    parse_signature_algorithms_untrusted,
    parse_supported_groups_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import HandshakeMessage
from appliance.proto.dtls.recordlayer12 import Outgoing

# Cookie lifetime granularity: a cookie minted in this or the previous bucket is valid.
_COOKIE_BUCKET_SECONDS = 60.0


def on_client_hello(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, ClientHello)
    # RFC 6347 §4.2.1: versions count down; {254,253} is 1.2. A client that cannot do
    # 1.2 is refused; supported_versions (a 1.3 offer) is ignored by a 1.2 server.
    if body.client_version > DTLS_1_2:
        return None, AlertDescription.protocol_version
    if c._cookie_secret is not None and not _cookie_valid(c, now, body):
        # Stateless: answer with a HelloVerifyRequest that reuses the ClientHello's
        # record sequence number and message_seq (RFC 6347 §4.2.1, §4.2.2), commit
        # nothing, and do not arm a timer (the client retransmits).
        hvr = HelloVerifyRequest(DTLS_1_0, _make_cookie(c, now, body, 0))
        c.counters.hello_verify_requests += 1
        c.rl.write_seq[0] = max(c.rl.write_seq[0], c._last_epoch0_seq)
        out = Outgoing(ContentType.HANDSHAKE, 0, hvr.msg_type, msg.message_seq, bytes(hvr))
        c.rl.send([out])
        return None, None
    alert = _negotiate(c, body)
    if alert is not None:
        return None, alert
    c._client_hello = body
    c._client_random = body.random
    c._server_random = c._rng(32 - len(c.downgrade_sentinel)) + c.downgrade_sentinel
    # Our message_seq continues from the client's (0, or 1 after a HelloVerifyRequest),
    # and our epoch-0 record numbers from its ClientHello, as OpenSSL does after
    # DTLSv1_listen; clients may run replay detection on epoch 0.
    c._send_message_seq = msg.message_seq
    c.rl.write_seq[0] = max(c.rl.write_seq[0], c._last_epoch0_seq)
    c._transcript = bytearray(raw)

    assert c._suite is not None and c._group is not None
    extensions: list[Extension] = []
    if c._signal_reneg:
        extensions.append((ExtensionType.renegotiation_info, b"\x00"))
    extensions.append((ExtensionType.extended_master_secret, b""))
    if find_extension(body.extensions, ExtensionType.ec_point_formats) is not None:
        extensions.append((ExtensionType.ec_point_formats, b"\x01\x00"))
    if c._srtp_profile is not None:
        extensions.append((ExtensionType.use_srtp, encode_use_srtp([c._srtp_profile])))
    server_hello = ServerHello(
        DTLS_1_2, c._server_random, b"", c._suite, 0, tuple(extensions)
    )

    c._key_share = KeyShare(c._group)
    params = ServerKeyExchange(c._group, c._key_share.public, 0, b"").params()
    scheme, signature = sign(
        c.certificate.private_key, c._client_random + c._server_random + params
    )
    ske = ServerKeyExchange(c._group, c._key_share.public, scheme, signature)
    # RFC 5246 §7.4.4: ask for the browser's certificate; WebRTC authenticates both ends.
    request = CertificateRequest(
        bytes((CLIENT_CERT_TYPE_ECDSA_SIGN,)), SUPPORTED_SIGNATURE_SCHEMES, b""
    )
    flight = [
        append_transcript(c, handshake_out(c, m))
        for m in (
            server_hello,
            CertificateMessage((c.certificate.der,)),
            ske,
            request,
            ServerHelloDone(),
        )
    ]
    c._state = State.SERVER_WAIT_CERTIFICATE
    return flight, None


def _negotiate(c: Conn12, hello: ClientHello) -> AlertDescription | None:
    """Pick suite, group, SRTP profile; enforce the extensions we require."""
    exts = hello.extensions
    # RFC 5246 §7.4.1.2: null compression must be offered.
    if 0 not in hello.compression_methods:
        return AlertDescription.illegal_parameter
    # RFC 7627 §5.3: a server that requires EMS aborts a handshake without it.
    if find_extension(exts, ExtensionType.extended_master_secret) is None:
        return AlertDescription.handshake_failure
    reneg = find_extension(exts, ExtensionType.renegotiation_info)
    if reneg is not None:
        # RFC 5746 §3.6: in an initial handshake the value must be empty.
        if parse_renegotiation_info_untrusted(reneg) != b"":
            return AlertDescription.handshake_failure
        c._signal_reneg = True
    if TLS_EMPTY_RENEGOTIATION_INFO_SCSV in hello.cipher_suites:
        c._signal_reneg = True
    # Server preference (ours), restricted to what the client offers. A client that
    # offers no ECDHE_ECDSA AEAD suite (RSA, PSK, CBC, …) gets handshake_failure.
    suite = next((s for s in c._suites if s in hello.cipher_suites), None)
    if suite is None:
        return AlertDescription.handshake_failure
    groups_raw = find_extension(exts, ExtensionType.supported_groups)
    # RFC 8422 §4: without supported_groups the client accepts any curve; P-256 then.
    client_groups = (
        parse_supported_groups_untrusted(groups_raw)
        if groups_raw is not None
        else (NamedGroup.secp256r1,)
    )
    group = next((g for g in c._groups if g in client_groups), None)
    if group is None:
        return AlertDescription.handshake_failure
    formats = find_extension(exts, ExtensionType.ec_point_formats)
    if (
        formats is not None
        and EC_POINT_FORMAT_UNCOMPRESSED not in parse_ec_point_formats_untrusted(formats)
    ):
        return AlertDescription.illegal_parameter
    sigalgs = find_extension(exts, ExtensionType.signature_algorithms)
    # RFC 5246 §7.4.1.4.1: absent means SHA-1, which we will not sign with.
    if (
        sigalgs is None
        or SignatureScheme.ecdsa_secp256r1_sha256
        not in parse_signature_algorithms_untrusted(sigalgs)
    ):
        return AlertDescription.handshake_failure
    if c._srtp_profiles:
        srtp = find_extension(exts, ExtensionType.use_srtp)
        if srtp is None:
            return AlertDescription.handshake_failure
        offered, _mki = parse_use_srtp_untrusted(srtp)
        # RFC 5764 §4.1.1: the server picks; we use our preference order. We ignore
        # any MKI (WebRTC never uses one) and answer with an empty one.
        profile = next((p for p in c._srtp_profiles if p in offered), None)
        if profile is None:
            return AlertDescription.handshake_failure
        c._srtp_profile = profile
    c._suite = suite
    c._group = group
    return None


def on_client_key_exchange(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, ClientKeyExchange) and c._key_share is not None
    if c.state is State.SERVER_WAIT_CERTIFICATE and c._remote_fingerprints is not None:
        # The client skipped its Certificate although we asked and SDP promised one.
        return None, AlertDescription.handshake_failure
    pre_master = c._key_share.exchange_untrusted(body.public)
    c._transcript += raw
    derive_keys(c, pre_master)
    c._state = (
        State.SERVER_WAIT_CERTIFICATE_VERIFY
        if c._peer_public_key is not None
        else State.SERVER_WAIT_FINISHED
    )
    return None, None


def on_certificate_verify(
    c: Conn12, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
) -> HandlerResult:
    assert isinstance(body, CertificateVerify) and c._peer_public_key is not None
    # RFC 5246 §7.4.8: the signature covers every handshake message so far.
    verify_untrusted(
        c._peer_public_key, body.signature_scheme, body.signature, bytes(c._transcript)
    )
    c._transcript += raw
    c._state = State.SERVER_WAIT_FINISHED
    return None, None


def _cookie_valid(c: Conn12, now: float, hello: ClientHello) -> bool:
    if not hello.cookie:
        return False
    # Accept cookies from this and the previous bucket so one minted just before a
    # bucket boundary still works; older ones are stale (bounded replay of cookies).
    return any(
        hmac.compare_digest(hello.cookie, _make_cookie(c, now, hello, back))
        for back in (0, 1)
    )


def _make_cookie(c: Conn12, now: float, hello: ClientHello, back: int) -> bytes:
    assert c._cookie_secret is not None
    bucket = int(now // _COOKIE_BUCKET_SECONDS) - back
    mac = hmac.new(c._cookie_secret, digestmod=hashlib.sha256)
    mac.update(len(c._cookie_context).to_bytes(2, "big") + c._cookie_context)
    mac.update(bucket.to_bytes(8, "big", signed=True))
    # RFC 6347 §4.2.1: bind the cookie to the ClientHello parameters that must not
    # change between the two ClientHellos (everything but the cookie itself).
    mac.update(
        u16(hello.client_version)
        + hello.random
        + bytes((len(hello.session_id),))
        + hello.session_id
    )
    mac.update(b"".join(u16(s) for s in hello.cipher_suites) + hello.compression_methods)
    return mac.digest()
