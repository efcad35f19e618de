"""The DTLS 1.3 handshake flights: one handler per message, ``(next_flight, alert)``.

The state and record layer live in :mod:`.engine13`, which handlers see only as a
:class:`~.conn_protocol.Conn13` (so neither module imports the other). This module is
the message order of RFC 8446 §2 / §4 (with RFC 9147 §5) written as a transition table
(:data:`_ACCEPTS`) and handlers (STYLE.md rule 4, pion's ``flight*handler.go``).

Stateless HelloRetryRequest cookie (RFC 8446 §4.2.2, RFC 9147 §5.1)::

    cookie = suite(2) ‖ group(2, 0 = none) ‖ hash(ClientHello1)<1..255> ‖ HMAC-SHA256(32)

The MAC covers the caller's peer context (address bytes), a 60 s time bucket, the client
random (ClientHello2 repeats it, RFC 8446 §4.1.2) and the fields before it. From a valid
cookie the server rebuilds the transcript ``message_hash ‖ HelloRetryRequest ‖
ClientHello2`` (RFC 8446 §4.4.1) without having kept anything.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from appliance.proto.dtls._wire import (
    DTLS_1_2,
    DTLS_1_3,
    HRR_RANDOM,
    AlertDescription,
    CipherSuite13,
    DtlsError,
    Ext13,
    Group13,
    HandshakeType13,
    Reader,
    SignatureScheme,
    u16,
    vec,
)
from appliance.proto.dtls.certificate import check_peer_certificate
from appliance.proto.dtls.conn_protocol import S13, Conn13
from appliance.proto.dtls.crypto import SUPPORTED_SIGNATURE_SCHEMES, sign, verify_untrusted
from appliance.proto.dtls.keyschedule13 import (
    SUITES13,
    KeySchedule,
    KeyShare13,
    RecordProtection13,
    server_key_exchange_untrusted,
)
from appliance.proto.dtls.messages import (
    Body13,
    Certificate13,
    CertificateRequest13,
    CertificateVerify,
    ClientHello,
    EncryptedExtensions,
    Finished13,
    KeyUpdate,
    ServerHello,
    encode_key_share_ch,
    encode_use_srtp,
    encode_versions_ch,
    find_extension,
    parse_body13_untrusted,
    parse_cookie_untrusted,
    parse_key_share_ch_untrusted,
    parse_key_share_hrr_untrusted,
    parse_key_share_sh_untrusted,
    parse_signature_algorithms_untrusted,
    parse_supported_groups_untrusted,
    parse_supported_versions_ch_untrusted,
    parse_supported_versions_sh_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import HandshakeMessage
from appliance.proto.dtls.recordlayer13 import OutMessage

_COOKIE_BUCKET_SECONDS = 60.0
_P256 = SignatureScheme.ecdsa_secp256r1_sha256


T = HandshakeType13
_ACCEPTS: dict[S13, frozenset[int]] = {
    S13.C_WAIT_SH: frozenset({T.SERVER_HELLO, T.HELLO_VERIFY_REQUEST}),
    S13.C_WAIT_EE: frozenset({T.ENCRYPTED_EXTENSIONS}),
    S13.C_WAIT_CERT_CR: frozenset({T.CERTIFICATE_REQUEST, T.CERTIFICATE}),
    S13.C_WAIT_CERT: frozenset({T.CERTIFICATE}),
    S13.C_WAIT_CV: frozenset({T.CERTIFICATE_VERIFY}),
    S13.C_WAIT_FIN: frozenset({T.FINISHED}),
    S13.S_WAIT_CH: frozenset({T.CLIENT_HELLO}),
    S13.S_WAIT_CERT: frozenset({T.CERTIFICATE}),
    S13.S_WAIT_CV: frozenset({T.CERTIFICATE_VERIFY}),
    S13.S_WAIT_FIN: frozenset({T.FINISHED}),
    # RFC 8446 §4.6: post-handshake messages; tickets are ignored (no resumption).
    S13.ESTABLISHED: frozenset({T.KEY_UPDATE, T.NEW_SESSION_TICKET}),
}
# The only messages sent in plaintext (epoch 0); everything else must be protected.
_EPOCH0 = frozenset({T.CLIENT_HELLO, T.SERVER_HELLO, T.HELLO_VERIFY_REQUEST})

Flight = list[OutMessage] | None
Result = tuple[Flight, AlertDescription | None]


def _tls_message(msg_type: int, body: bytes) -> bytes:
    """RFC 9147 §5.2: the transcript holds messages as TLS would (no DTLS fields)."""
    return bytes((msg_type,)) + len(body).to_bytes(3, "big") + body


def _hash(suite: CipherSuite13, data: bytes) -> bytes:
    return hashlib.new(SUITES13[suite].hash_name, data).digest()


def _message_hash(suite: CipherSuite13, client_hello1: bytes) -> bytes:
    """RFC 8446 §4.4.1: ClientHello1 replaced by message_hash(Hash(ClientHello1))."""
    return _tls_message(T.MESSAGE_HASH, _hash(suite, client_hello1))


def _u16_list(values: tuple[int, ...] | list[int]) -> bytes:
    return vec(2, b"".join(u16(v) for v in values))


def _signed_content(c: Conn13, context: bytes) -> bytes:
    """RFC 8446 §4.4.3: 64 spaces ‖ context string ‖ 0 ‖ Transcript-Hash."""
    assert c._suite is not None
    return b" " * 64 + context + b"\x00" + _hash(c._suite, bytes(c._transcript))


_SERVER_CV = b"TLS 1.3, server CertificateVerify"
_CLIENT_CV = b"TLS 1.3, client CertificateVerify"


def handle_message(c: Conn13, now: float, msg: HandshakeMessage) -> None:
    allowed = _ACCEPTS.get(c._state, frozenset())
    if msg.msg_type not in allowed:
        raise DtlsError(f"handshake type {msg.msg_type} in state {c._state.value}",
                        hint=AlertDescription.unexpected_message)
    if (msg.msg_type in _EPOCH0) != (msg.epoch == 0):
        raise DtlsError("handshake message in the wrong epoch",
                        hint=AlertDescription.unexpected_message)
    if msg.msg_type == T.HELLO_VERIFY_REQUEST:
        # RFC 9147 §5.3: only a DTLS 1.2 server sends this; continue as 1.2 if allowed.
        if not c._fallback_12 or c._hrr_done:
            raise DtlsError("HelloVerifyRequest to a 1.3-only client",
                            hint=AlertDescription.protocol_version)
        _fall_back(c)
        return
    if msg.msg_type == T.NEW_SESSION_TICKET:
        return
    try:
        body = parse_body13_untrusted(msg.msg_type, msg.body)
    except DtlsError:
        if c._state is S13.S_WAIT_CH:
            return  # stateless phase: drop rather than answer unverified senders
        raise
    raw = _tls_message(msg.msg_type, msg.body)
    flight, alert = _HANDLERS[msg.msg_type](c, now, body, raw, msg)
    if alert is not None:
        raise DtlsError(f"handshake type {msg.msg_type} refused", hint=alert)
    if flight:
        c._send_flight(now, flight)


def _fall_back(c: Conn13) -> None:
    c.fallback = list(c._raw or [])
    c.fallback_hello = c._hello


# --- client -------------------------------------------------------------------------


def client_start(c: Conn13, now: float) -> None:
    c._client_random = c._rng(32)
    c._state = S13.C_WAIT_SH
    first = c._groups[0]
    # Like Chromium: the preferred group, plus an X25519 share when that is the hybrid.
    share_groups = [first]
    if first is Group13.X25519MLKEM768 and Group13.x25519 in c._groups:
        share_groups.append(Group13.x25519)
    c._shares = {g: KeyShare13(g) for g in share_groups}
    c._transcript = bytearray()
    c._hello = _client_hello(c, b"")
    c._send_flight(now, [c._out(T.CLIENT_HELLO, bytes(c._hello), 0)])


def _client_hello(c: Conn13, cookie: bytes) -> ClientHello:
    versions = [DTLS_1_3] + ([DTLS_1_2] if c._fallback_12 else [])
    extensions: list[tuple[int, bytes]] = [
        (Ext13.supported_versions, encode_versions_ch(versions)),
        (Ext13.supported_groups, _u16_list([int(g) for g in c._groups])),
        (Ext13.signature_algorithms, _u16_list(SUPPORTED_SIGNATURE_SCHEMES)),
        (Ext13.key_share, encode_key_share_ch([(g, k.public) for g, k in c._shares.items()])),
    ]
    if c._srtp_profiles:
        extensions.append((Ext13.use_srtp, encode_use_srtp(c._srtp_profiles)))
    extensions.extend(c._hello_12[1])  # what a 1.2 server needs (EMS, point formats, …)
    if cookie:
        extensions.append((Ext13.cookie, vec(2, cookie)))
    suites = tuple(int(s) for s in c._suites) + c._hello_12[0]
    return ClientHello(DTLS_1_2, c._client_random, b"", b"", suites, b"\x00", tuple(extensions))


def _on_server_hello(c: Conn13, now: float, body: Body13, raw: bytes,
                     msg: HandshakeMessage) -> Result:
    assert isinstance(body, ServerHello)
    sv = find_extension(body.extensions, Ext13.supported_versions)
    if sv is None:
        # A 1.2 ServerHello: the 1.2 engine takes over (and checks the downgrade
        # sentinel, RFC 8446 §4.1.3), or we refuse.
        if c._fallback_12 and not c._hrr_done:
            _fall_back(c)
            return None, None
        return None, AlertDescription.protocol_version
    if parse_supported_versions_sh_untrusted(sv) != DTLS_1_3:
        return None, AlertDescription.illegal_parameter
    suite = next((s for s in c._suites if s == body.cipher_suite), None)
    if suite is None or body.compression_method != 0 or body.session_id:
        return None, AlertDescription.illegal_parameter
    if body.random == HRR_RANDOM:
        return _on_hello_retry_request(c, now, body, raw, suite)
    if c._hrr_suite is not None and suite != c._hrr_suite:
        return None, AlertDescription.illegal_parameter  # RFC 8446 §4.1.4
    for ext_type, _ in body.extensions:
        if ext_type not in (Ext13.supported_versions, Ext13.key_share):
            return None, AlertDescription.unsupported_extension
    ks_raw = find_extension(body.extensions, Ext13.key_share)
    if ks_raw is None:
        return None, AlertDescription.missing_extension
    group, share = parse_key_share_sh_untrusted(ks_raw)
    mine = next((k for g, k in c._shares.items() if g == group), None)
    if mine is None:
        return None, AlertDescription.illegal_parameter
    c._suite = suite
    c._ks = KeySchedule(suite, mine.client_finish_untrusted(share))
    c._shares = {}
    c._transcript += raw
    c_hs, s_hs = c._ks.handshake_traffic(bytes(c._transcript))
    c._secrets.update(c_hs=c_hs, s_hs=s_hs)
    c._install(2, c_hs, s_hs)
    c.rl.write_epoch = 2
    # The ServerHello acknowledges our ClientHello (RFC 9147 §7.1).
    c.rl.flight_done()
    c._retransmit_at = None
    c._raw = None
    c._state = S13.C_WAIT_EE
    return None, None


def _on_hello_retry_request(c: Conn13, now: float, body: ServerHello, raw: bytes,
                            suite: CipherSuite13) -> Result:
    if c._hrr_done:
        return None, AlertDescription.unexpected_message  # RFC 8446 §4.1.4: only one
    cookie = b""
    group: int | None = None
    for ext_type, data in body.extensions:
        if ext_type == Ext13.cookie:
            cookie = parse_cookie_untrusted(data)
        elif ext_type == Ext13.key_share:
            group = parse_key_share_hrr_untrusted(data)
        elif ext_type != Ext13.supported_versions:
            return None, AlertDescription.unsupported_extension
    if group is not None and (group not in [int(g) for g in c._groups] or group in c._shares):
        return None, AlertDescription.illegal_parameter
    if group is None and not cookie:
        return None, AlertDescription.illegal_parameter  # an HRR must change something
    c._hrr_done, c._hrr_suite, c._raw = True, suite, None
    c._transcript = bytearray(_message_hash(suite, bytes(c._transcript)) + raw)
    if group is not None:
        c._shares = {Group13(group): KeyShare13(Group13(group))}
    c._hello = _client_hello(c, cookie)
    return [c._out(T.CLIENT_HELLO, bytes(c._hello), 0)], None


def _on_encrypted_extensions(c: Conn13, now: float, body: Body13, raw: bytes,
                             msg: HandshakeMessage) -> Result:
    assert isinstance(body, EncryptedExtensions) and c._hello is not None
    offered = {t for t, _ in c._hello.extensions}
    for ext_type, _ in body.extensions:
        # RFC 8446 §4.3.1 / §4.2: only extensions we offered, and none of the ServerHello's.
        if ext_type not in offered:
            return None, AlertDescription.unsupported_extension
        if ext_type in (Ext13.supported_versions, Ext13.key_share, Ext13.cookie,
                        Ext13.signature_algorithms):
            return None, AlertDescription.illegal_parameter
    if c._srtp_profiles:
        srtp = find_extension(body.extensions, Ext13.use_srtp)
        if srtp is None:
            return None, AlertDescription.handshake_failure
        chosen, mki = parse_use_srtp_untrusted(srtp)
        if len(chosen) != 1 or chosen[0] not in c._srtp_profiles or mki:
            return None, AlertDescription.illegal_parameter  # RFC 5764 §4.1.1
        c._srtp_profile = next(p for p in c._srtp_profiles if p == chosen[0])
    c._transcript += raw
    c._state = S13.C_WAIT_CERT_CR
    return None, None


def _on_certificate_request(c: Conn13, now: float, body: Body13, raw: bytes,
                            msg: HandshakeMessage) -> Result:
    assert isinstance(body, CertificateRequest13)
    sigalgs = find_extension(body.extensions, Ext13.signature_algorithms)
    if sigalgs is None:
        return None, AlertDescription.missing_extension  # RFC 8446 §4.3.2
    if _P256 not in parse_signature_algorithms_untrusted(sigalgs):
        return None, AlertDescription.handshake_failure
    c._cert_request_context = body.context
    c._cert_requested = True
    c._transcript += raw
    c._state = S13.C_WAIT_CERT
    return None, None


def _on_certificate(c: Conn13, now: float, body: Body13, raw: bytes,
                    msg: HandshakeMessage) -> Result:
    assert isinstance(body, Certificate13)
    # Our CertificateRequest context is empty, and a server's Certificate has none.
    if body.context != b"":
        return None, AlertDescription.illegal_parameter
    if not body.certificates:
        if c._state is S13.S_WAIT_CERT and c._remote_fingerprints is None:
            c._transcript += raw
            c._state = S13.S_WAIT_FIN  # RFC 8446 §4.4.2.4: no CertificateVerify follows
            return None, None
        # RFC 8446 §4.4.2.4: an empty server Certificate is decode_error; a client that
        # sends none to a server that needs one gets certificate_required.
        return None, (AlertDescription.decode_error if c._state is not S13.S_WAIT_CERT
                      else AlertDescription.certificate_required)
    alert, c._peer_fingerprint, c._peer_key = check_peer_certificate(
        body.certificates[0], c._remote_fingerprints)
    if alert is not None:
        return None, alert
    c._transcript += raw
    c._state = S13.S_WAIT_CV if c._state is S13.S_WAIT_CERT else S13.C_WAIT_CV
    return None, None


def _on_certificate_verify(c: Conn13, now: float, body: Body13, raw: bytes,
                           msg: HandshakeMessage) -> Result:
    assert isinstance(body, CertificateVerify) and c._peer_key is not None
    from_server = c._state is S13.C_WAIT_CV
    # Only schemes we offered: signature_algorithms in our ClientHello (all ECDSA ones we
    # verify) or our CertificateRequest (P-256 only). RFC 8446 §4.4.3.
    if body.signature_scheme not in (SUPPORTED_SIGNATURE_SCHEMES if from_server else (_P256,)):
        return None, AlertDescription.illegal_parameter
    context = _SERVER_CV if from_server else _CLIENT_CV
    verify_untrusted(c._peer_key, body.signature_scheme, body.signature,
                     _signed_content(c, context))
    c._transcript += raw
    c._state = S13.C_WAIT_FIN if c._state is S13.C_WAIT_CV else S13.S_WAIT_FIN
    return None, None


def _on_finished(c: Conn13, now: float, body: Body13, raw: bytes,
                 msg: HandshakeMessage) -> Result:
    assert isinstance(body, Finished13) and c._ks is not None
    client = c._state is S13.C_WAIT_FIN
    base = c._secrets["s_hs"] if client else c._secrets["c_hs"]
    expected = c._ks.finished(base, bytes(c._transcript))
    if not hmac.compare_digest(expected, body.verify_data):
        return None, AlertDescription.decrypt_error  # RFC 8446 §4.4.4
    c._transcript += raw
    if not client:
        # Server: the client's final flight is complete; ACK it (done after the
        # datagram, RFC 9147 §7) and stop retransmitting ours.
        c.rl.write_epoch = 3
        c.rl.flight_done()
        c._retransmit_at = None
        c._complete()
        return None, None
    c_ap, s_ap, exporter = c._ks.application_traffic(bytes(c._transcript))
    flight: list[OutMessage] = []
    if c._cert_requested:
        cert = Certificate13(c._cert_request_context, (c.certificate.der,))
        flight.append(c._out(T.CERTIFICATE, bytes(cert), 2))
        scheme, sig = sign(c.certificate.private_key, _signed_content(c, _CLIENT_CV))
        flight.append(c._out(T.CERTIFICATE_VERIFY, bytes(CertificateVerify(scheme, sig)), 2))
    fin = c._ks.finished(c._secrets["c_hs"], bytes(c._transcript))
    flight.append(c._out(T.FINISHED, fin, 2))
    c._secrets.update(write=c_ap, read=s_ap, exporter=exporter)
    c._install(3, c_ap, s_ap)
    c.rl.write_epoch = 3
    # TLS 1.3 clients are done once their Finished is sent; the flight is retransmitted
    # until the server ACKs it (RFC 9147 §5.8.3, §7).
    c._complete()
    return flight, None


def _on_key_update(c: Conn13, now: float, body: Body13, raw: bytes,
                   msg: HandshakeMessage) -> Result:
    assert isinstance(body, KeyUpdate) and c._ks is not None and c._suite is not None
    if msg.epoch != c.rl.max_read_epoch:
        return None, AlertDescription.unexpected_message
    # RFC 8446 §4.6.3: the peer sends with the next secret after this message.
    c._secrets["read"] = c._ks.next_secret(c._secrets["read"])
    c.rl.install_read(msg.epoch + 1, RecordProtection13(c._suite, c._secrets["read"]))
    if body.update_requested and not c._ku_pending and c.rl.flight is None:
        c._send_key_update(now, False)
    return None, None


# --- server -------------------------------------------------------------------------


def _on_client_hello(c: Conn13, now: float, body: Body13, raw: bytes,
                     msg: HandshakeMessage) -> Result:
    assert isinstance(body, ClientHello)
    exts = body.extensions
    sv = find_extension(exts, Ext13.supported_versions)
    versions = parse_supported_versions_ch_untrusted(sv) if sv is not None else ()
    if DTLS_1_3 not in versions:
        if c._fallback_12:
            _fall_back(c)
            return None, None
        return None, AlertDescription.protocol_version
    if body.compression_methods != b"\x00":
        return None, AlertDescription.illegal_parameter  # RFC 8446 §4.1.2
    suite = next((s for s in c._suites if s in body.cipher_suites), None)
    if suite is None:
        return None, AlertDescription.handshake_failure
    sigalgs = find_extension(exts, Ext13.signature_algorithms)
    groups_raw = find_extension(exts, Ext13.supported_groups)
    shares_raw = find_extension(exts, Ext13.key_share)
    if sigalgs is None or groups_raw is None or shares_raw is None:
        return None, AlertDescription.missing_extension  # RFC 8446 §9.2
    if _P256 not in parse_signature_algorithms_untrusted(sigalgs):
        return None, AlertDescription.handshake_failure
    client_groups = parse_supported_groups_untrusted(groups_raw)
    shares = dict(parse_key_share_ch_untrusted(shares_raw))
    profile = None
    if c._srtp_profiles:
        srtp = find_extension(exts, Ext13.use_srtp)
        if srtp is None:
            return None, AlertDescription.handshake_failure
        offered, _mki = parse_use_srtp_untrusted(srtp)
        profile = next((p for p in c._srtp_profiles if p in offered), None)
        if profile is None:
            return None, AlertDescription.handshake_failure
    cookie_raw = find_extension(exts, Ext13.cookie)
    cookie = parse_cookie_untrusted(cookie_raw) if cookie_raw is not None else b""
    restored = _check_cookie(c, now, body, cookie) if cookie else None
    if restored is not None:
        ch1_hash, suite_value, group_value = restored
        if suite_value not in body.cipher_suites:
            return None, AlertDescription.illegal_parameter  # RFC 8446 §4.1.2: CH2 ≈ CH1
        suite = CipherSuite13(suite_value)
        group = next((g for g in c._groups if g in shares and g in client_groups), None)
        if group is None or (group_value and group != group_value):
            return None, AlertDescription.illegal_parameter
        prefix = (_tls_message(T.MESSAGE_HASH, ch1_hash)
                  + _tls_message(T.SERVER_HELLO, _hrr_body(suite, group_value or None, cookie)))
    else:
        # RFC 8446 §4.2.8: use a share the client sent if we like one of its groups;
        # otherwise ask (HRR) for our favourite among its supported_groups.
        group = next((g for g in c._groups if g in shares and g in client_groups), None)
        need_group = group is None
        if need_group:
            group = next((g for g in c._groups if g in client_groups), None)
            if group is None:
                return None, AlertDescription.handshake_failure
        if need_group or c._cookie_secret is not None:
            assert group is not None
            _send_hrr(c, now, body, raw, msg, suite, group if need_group else None)
            return None, None
        prefix = b""
    assert group is not None
    return _server_flight(c, body, raw, msg, suite, group, shares[group], profile, prefix)


def _hrr_body(suite: CipherSuite13, group: int | None, cookie: bytes) -> bytes:
    exts: list[tuple[int, bytes]] = [(Ext13.supported_versions, u16(DTLS_1_3))]
    if group is not None:
        exts.append((Ext13.key_share, u16(group)))
    exts.append((Ext13.cookie, vec(2, cookie)))
    # RFC 9147 §5: DTLS servers do not echo the legacy session id.
    return bytes(ServerHello(DTLS_1_2, HRR_RANDOM, b"", suite, 0, tuple(exts)))


def _cookie_mac(secret: bytes, c: Conn13, bucket: int, random: bytes,
                payload: bytes) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    mac.update(u16(len(c._cookie_context)) + c._cookie_context)
    mac.update(bucket.to_bytes(8, "big", signed=True) + random + payload)
    return mac.digest()


def _send_hrr(c: Conn13, now: float, hello: ClientHello, raw: bytes,
              msg: HandshakeMessage, suite: CipherSuite13, group: int | None) -> None:
    """Stateless: the HRR and its cookie are all that is left of this ClientHello."""
    payload = u16(suite) + u16(group or 0) + vec(1, _hash(suite, raw))
    secret = c._cookie_secret or c._hrr_secret
    cookie = payload + _cookie_mac(secret, c, int(now // _COOKIE_BUCKET_SECONDS),
                                   hello.random, payload)
    c.counters.hello_verify_requests += 1
    # As the 1.2 HelloVerifyRequest: reuse the ClientHello's record number and message_seq.
    c.rl.continue_epoch0(c._last_seq0)
    c.rl.new_flight([OutMessage(0, T.SERVER_HELLO, msg.message_seq,
                                _hrr_body(suite, group, cookie))])
    c.rl.flight_done()
    c._raw = []


def _check_cookie(c: Conn13, now: float, hello: ClientHello,
                  cookie: bytes) -> tuple[bytes, int, int] | None:
    try:
        r = Reader(cookie)
        suite, group = r.uint(2), r.uint(2)
        ch1_hash = r.vector(1)
        tag = r.take(32)
        r.expect_end("cookie")
    except DtlsError:
        return None
    if suite not in [int(s) for s in c._suites] or group not in [0, *[int(g) for g in c._groups]]:
        return None
    payload = cookie[: len(cookie) - 32]
    bucket = int(now // _COOKIE_BUCKET_SECONDS)
    for secret in (c._cookie_secret, c._hrr_secret):
        if secret is None:
            continue
        for back in (0, 1):
            if hmac.compare_digest(tag, _cookie_mac(secret, c, bucket - back, hello.random, payload)):
                return ch1_hash, suite, group
    # RFC 9147 §5.1: an invalid cookie is not illegal_parameter; treat it as absent.
    return None


def _server_flight(c: Conn13, hello: ClientHello, raw: bytes, msg: HandshakeMessage,
                   suite: CipherSuite13, group: Group13, client_share: bytes,
                   profile: object, prefix: bytes) -> Result:
    c._suite = suite
    c._srtp_profile = profile  # type: ignore[assignment]
    c._transcript = bytearray(prefix + raw)
    c._send_msg_seq = msg.message_seq
    c.rl.continue_epoch0(c._last_seq0)
    public, shared = server_key_exchange_untrusted(group, client_share)
    c._ks = KeySchedule(suite, shared)
    server_hello = ServerHello(DTLS_1_2, c._rng(32), b"", suite, 0, (
        (Ext13.supported_versions, u16(DTLS_1_3)),
        (Ext13.key_share, u16(group) + vec(2, public)),
    ))
    flight = [c._out(T.SERVER_HELLO, bytes(server_hello), 0)]
    c_hs, s_hs = c._ks.handshake_traffic(bytes(c._transcript))
    c._secrets.update(c_hs=c_hs, s_hs=s_hs)
    c._install(2, s_hs, c_hs)
    c.rl.write_epoch = 2
    ee = [(Ext13.use_srtp, encode_use_srtp([c._srtp_profile]))] if c._srtp_profile else []
    flight.append(c._out(T.ENCRYPTED_EXTENSIONS, bytes(EncryptedExtensions(tuple(ee))), 2))
    # WebRTC authenticates both ends (RFC 8827 §6.5): always ask for the certificate.
    request = CertificateRequest13(b"", ((Ext13.signature_algorithms, _u16_list([_P256])),))
    flight.append(c._out(T.CERTIFICATE_REQUEST, bytes(request), 2))
    flight.append(c._out(T.CERTIFICATE, bytes(Certificate13(b"", (c.certificate.der,))), 2))
    scheme, sig = sign(c.certificate.private_key, _signed_content(c, _SERVER_CV))
    flight.append(c._out(T.CERTIFICATE_VERIFY, bytes(CertificateVerify(scheme, sig)), 2))
    flight.append(c._out(T.FINISHED, c._ks.finished(s_hs, bytes(c._transcript)), 2))
    c_ap, s_ap, exporter = c._ks.application_traffic(bytes(c._transcript))
    c._secrets.update(write=s_ap, read=c_ap, exporter=exporter)
    c._install(3, s_ap, c_ap)
    c._raw = None
    c._state = S13.S_WAIT_CERT
    return flight, None


_Handler = Callable[[Conn13, float, Body13, bytes, HandshakeMessage], Result]
_HANDLERS: dict[int, _Handler] = {
    T.CLIENT_HELLO: _on_client_hello,
    T.SERVER_HELLO: _on_server_hello,
    T.ENCRYPTED_EXTENSIONS: _on_encrypted_extensions,
    T.CERTIFICATE_REQUEST: _on_certificate_request,
    T.CERTIFICATE: _on_certificate,
    T.CERTIFICATE_VERIFY: _on_certificate_verify,
    T.FINISHED: _on_finished,
    T.KEY_UPDATE: _on_key_update,
}
