"""Wire constants and a bounds-checked reader shared by the DTLS 1.2 and 1.3 codecs.

Registries: RFC 5246 §7.2 and §7.4 (alerts, handshake types), RFC 8422 §5.1 (groups,
point formats), RFC 8446 §4.2 (extension numbers we only need to *skip*), RFC 5764 §4.1.2
(use_srtp), RFC 7627 §5.1 (extended_master_secret), RFC 5746 §3.2 (renegotiation_info).

Every read goes through :class:`Reader`, which raises :class:`DtlsError` with the alert
``decode_error`` instead of ``IndexError``/``struct.error`` (STYLE.md rule 5).

DTLS 1.3 (RFC 9147, RFC 8446) code points are separate enums (``*13``), not members of
the 1.2 ones: those are iterated by tests and interop suites that only speak 1.2. They are
the version number (RFC 9147 §5.3), the TLS 1.3
cipher suites (RFC 8446 §B.4), groups including the hybrid X25519MLKEM768
(draft-ietf-tls-ecdhe-mlkem §4), the ACK content type (RFC 9147 §7), the new handshake
types and extensions (RFC 8446 §4, §4.2) and the downgrade sentinels (RFC 8446 §4.1.3).
"""

from __future__ import annotations

import enum
import hashlib

from appliance.proto.errors import RemoteProtocolError

# RFC 6347 §4.1: DTLS 1.2 is {254, 253}; DTLS 1.0 is {254, 255} (used in HelloVerifyRequest).
DTLS_1_2 = 0xFEFD
DTLS_1_0 = 0xFEFF


class ContentType(enum.IntEnum):
    CHANGE_CIPHER_SPEC = 20
    ALERT = 21
    HANDSHAKE = 22
    APPLICATION_DATA = 23


class HandshakeType(enum.IntEnum):
    HELLO_REQUEST = 0
    CLIENT_HELLO = 1
    SERVER_HELLO = 2
    HELLO_VERIFY_REQUEST = 3
    CERTIFICATE = 11
    SERVER_KEY_EXCHANGE = 12
    CERTIFICATE_REQUEST = 13
    SERVER_HELLO_DONE = 14
    CERTIFICATE_VERIFY = 15
    CLIENT_KEY_EXCHANGE = 16
    FINISHED = 20


class AlertLevel(enum.IntEnum):
    WARNING = 1
    FATAL = 2


class AlertDescription(enum.IntEnum):
    """RFC 5246 §7.2 (the subset a DTLS 1.2 peer may send or receive)."""

    close_notify = 0
    unexpected_message = 10
    bad_record_mac = 20
    record_overflow = 22
    handshake_failure = 40
    bad_certificate = 42
    unsupported_certificate = 43
    certificate_revoked = 44
    certificate_expired = 45
    certificate_unknown = 46
    illegal_parameter = 47
    unknown_ca = 48
    access_denied = 49
    decode_error = 50
    decrypt_error = 51
    protocol_version = 70
    insufficient_security = 71
    internal_error = 80
    inappropriate_fallback = 86
    user_canceled = 90
    no_renegotiation = 100
    missing_extension = 109  # RFC 8446 §6.2 (DTLS 1.3)
    unsupported_extension = 110
    certificate_required = 116  # RFC 8446 §6.2 (DTLS 1.3)


class CipherSuite(enum.IntEnum):
    """The only suites we speak: ECDHE + ECDSA + AEAD (RFC 5289, RFC 7905)."""

    TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 = 0xC02B
    TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 = 0xC02C
    TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 = 0xCCA9


class NamedGroup(enum.IntEnum):
    secp256r1 = 23
    x25519 = 29


class SignatureScheme(enum.IntEnum):
    """RFC 5246 §7.4.1.4.1 SignatureAndHashAlgorithm as one 16-bit number (hash << 8 | sig)."""

    ecdsa_secp256r1_sha256 = 0x0403
    ecdsa_secp384r1_sha384 = 0x0503
    ecdsa_secp521r1_sha512 = 0x0603


class ExtensionType(enum.IntEnum):
    server_name = 0
    supported_groups = 10
    ec_point_formats = 11
    signature_algorithms = 13
    use_srtp = 14
    application_layer_protocol_negotiation = 16
    encrypt_then_mac = 22
    extended_master_secret = 23
    session_ticket = 35
    supported_versions = 43
    key_share = 51
    renegotiation_info = 0xFF01


# RFC 5746 §3.3: the signalling cipher suite value that stands for an empty
# renegotiation_info extension in a ClientHello.
TLS_EMPTY_RENEGOTIATION_INFO_SCSV = 0x00FF
# RFC 8422 §5.1.2: the only point format anyone still uses.
EC_POINT_FORMAT_UNCOMPRESSED = 0
# RFC 5246 §7.4.4 ClientCertificateType.
CLIENT_CERT_TYPE_ECDSA_SIGN = 64
# RFC 4492 §5.4 ECCurveType.named_curve.
EC_CURVE_TYPE_NAMED = 3


class DtlsError(RemoteProtocolError):
    """The peer's DTLS bytes broke the protocol. ``hint`` is the alert to send."""

    hint: AlertDescription

    def __init__(self, msg: str, *, hint: AlertDescription = AlertDescription.decode_error) -> None:
        super().__init__(msg, hint=hint)


class Reader:
    """A cursor over untrusted bytes; every overrun is a ``decode_error``."""

    __slots__ = ("_buf", "_pos", "_end")

    def __init__(self, buf: bytes | memoryview, start: int = 0, end: int | None = None) -> None:
        self._buf = buf
        self._pos = start
        self._end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def take(self, n: int) -> bytes:
        if n < 0 or self._pos + n > self._end:
            raise DtlsError(f"truncated: need {n} bytes, have {self.remaining}")
        out = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return out

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, len_bytes: int, *, minimum: int = 0, maximum: int | None = None) -> bytes:
        """A TLS ``opaque x<minimum..maximum>`` vector with a ``len_bytes`` length prefix."""
        n = self.uint(len_bytes)
        if n < minimum or (maximum is not None and n > maximum):
            raise DtlsError(f"vector length {n} outside {minimum}..{maximum}")
        return self.take(n)

    def sub(self, len_bytes: int) -> Reader:
        data = self.vector(len_bytes)
        return Reader(data)

    def rest(self) -> bytes:
        return self.take(self.remaining)

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise DtlsError(f"{self.remaining} trailing bytes after {what}")


def u8(v: int) -> bytes:
    return v.to_bytes(1, "big")


def u16(v: int) -> bytes:
    return v.to_bytes(2, "big")


def u24(v: int) -> bytes:
    return v.to_bytes(3, "big")


def vec(len_bytes: int, data: bytes) -> bytes:
    """Encode a TLS vector; ``len_bytes`` is the width of its length prefix."""
    return len(data).to_bytes(len_bytes, "big") + data


# --- DTLS 1.3 code points --------------------

# RFC 9147 §5.3: DTLS 1.3 is {254, 252}; legacy_version stays {254, 253}.
DTLS_1_3 = 0xFEFC


class CipherSuite13(enum.IntEnum):
    TLS_AES_128_GCM_SHA256 = 0x1301
    TLS_AES_256_GCM_SHA384 = 0x1302
    TLS_CHACHA20_POLY1305_SHA256 = 0x1303


class Group13(enum.IntEnum):
    """RFC 8446 §4.2.7 NamedGroup values we can offer in a key_share."""

    secp256r1 = 23
    x25519 = 29
    X25519MLKEM768 = 0x11EC  # draft-ietf-tls-ecdhe-mlkem §4 (Chromium's default)


class ContentType13(enum.IntEnum):
    ALERT = 21
    HANDSHAKE = 22
    APPLICATION_DATA = 23
    ACK = 26  # RFC 9147 §7


class HandshakeType13(enum.IntEnum):
    CLIENT_HELLO = 1
    SERVER_HELLO = 2
    HELLO_VERIFY_REQUEST = 3  # from a DTLS 1.2 server (RFC 9147 §5.3: clients must cope)
    NEW_SESSION_TICKET = 4
    ENCRYPTED_EXTENSIONS = 8
    CERTIFICATE = 11
    CERTIFICATE_REQUEST = 13
    CERTIFICATE_VERIFY = 15
    FINISHED = 20
    KEY_UPDATE = 24
    MESSAGE_HASH = 254  # RFC 8446 §4.4.1, only ever inside the transcript


class Ext13(enum.IntEnum):
    supported_groups = 10
    signature_algorithms = 13
    use_srtp = 14
    application_layer_protocol_negotiation = 16
    pre_shared_key = 41
    early_data = 42
    supported_versions = 43
    cookie = 44
    psk_key_exchange_modes = 45
    certificate_authorities = 47
    signature_algorithms_cert = 50
    key_share = 51
    connection_id = 54


# RFC 8446 §4.1.3: a HelloRetryRequest is a ServerHello with this random.
HRR_RANDOM = hashlib.sha256(b"HelloRetryRequest").digest()
# RFC 8446 §4.1.3: the last 8 bytes of ServerHello.random from a 1.3-capable server that
# negotiates 1.2 (…01) or below (…00). DTLS uses the same values.
DOWNGRADE_TLS12 = b"DOWNGRD\x01"
DOWNGRADE_TLS11 = b"DOWNGRD\x00"
DOWNGRADE_SENTINELS = (DOWNGRADE_TLS12, DOWNGRADE_TLS11)

#: The version names the ``versions=`` constructor option takes.
VERSION_NAMES = frozenset({"1.2", "1.3"})


def parse_versions(text: str) -> frozenset[str]:
    """``"1.2,1.3"`` (a ``--dtls-versions`` flag) -> ``frozenset({"1.2", "1.3"})``."""
    names = frozenset(v.strip() for v in text.split(",") if v.strip())
    if not names or not names <= VERSION_NAMES:
        raise ValueError(f"DTLS versions must be a non-empty subset of 1.2,1.3: {text!r}")
    return names
