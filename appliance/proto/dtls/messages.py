"""DTLS 1.2 handshake message bodies: ``X.parse_untrusted(body)`` and ``bytes(x)``.

RFC 5246 §7.4 (messages) as changed by RFC 6347 §4.2.1 (ClientHello cookie,
HelloVerifyRequest), RFC 8422 §5.4-5.7 (ECDHE ServerKeyExchange / ClientKeyExchange),
RFC 5764 §4.1.1 (use_srtp), RFC 7627 (extended_master_secret), RFC 5746 (renegotiation_info).

The bodies are the bytes after the 12-byte DTLS handshake header. Extensions are kept as
raw ``(type, data)`` pairs in wire order; only those we act on are decoded, by the
``*_untrusted`` helpers at the bottom. Unknown extensions (DTLS 1.3's supported_versions,
key_share, psk_key_exchange_modes, GREASE, …) are skipped, which is how a 1.2 server
tolerates a 1.3-capable ClientHello (RFC 8446 §4.1.2, §D.1).

ClientHello (RFC 6347 §4.2.1)::

    struct {
      ProtocolVersion client_version;
      Random random;                                    // 32 bytes
      SessionID session_id;                             // <0..32>
      opaque cookie<0..2^8-1>;
      CipherSuite cipher_suites<2..2^16-2>;
      CompressionMethod compression_methods<1..2^8-1>;
      Extension extensions<0..2^16-1>;                  // optional
    } ClientHello;
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from appliance.proto.dtls._wire import (
    AlertDescription,
    DtlsError,
    HandshakeType,
    Reader,
    u8,
    u16,
    vec,
)

Extension = tuple[int, bytes]


def _parse_extensions_untrusted(r: Reader) -> tuple[Extension, ...]:
    # RFC 5246 §7.4.1.2: the extensions block is optional (absent when no bytes remain).
    if not r.remaining:
        return ()
    block = r.sub(2)
    r.expect_end("extensions")
    out: list[Extension] = []
    seen: set[int] = set()
    while block.remaining:
        ext_type = block.uint(2)
        data = block.vector(2)
        # RFC 5246 §7.4.1.4: "There MUST NOT be more than one extension of the same type."
        if ext_type in seen:
            raise DtlsError(
                f"duplicate extension {ext_type}", hint=AlertDescription.illegal_parameter
            )
        seen.add(ext_type)
        out.append((ext_type, data))
    return tuple(out)


def _encode_extensions(extensions: Sequence[Extension]) -> bytes:
    if not extensions:
        return b""
    return vec(2, b"".join(u16(t) + vec(2, d) for t, d in extensions))


def find_extension(extensions: Sequence[Extension], ext_type: int) -> bytes | None:
    for t, d in extensions:
        if t == ext_type:
            return d
    return None


@dataclass(frozen=True, slots=True)
class ClientHello:
    msg_type: ClassVar[HandshakeType] = HandshakeType.CLIENT_HELLO
    client_version: int
    random: bytes
    session_id: bytes
    cookie: bytes
    cipher_suites: tuple[int, ...]
    compression_methods: bytes
    extensions: tuple[Extension, ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> ClientHello:
        r = Reader(body)
        version = r.uint(2)
        random = r.take(32)
        session_id = r.vector(1, maximum=32)
        cookie = r.vector(1)
        suites_raw = r.vector(2, minimum=2)
        if len(suites_raw) % 2:
            raise DtlsError("odd cipher_suites length")
        suites = tuple(
            int.from_bytes(suites_raw[i : i + 2], "big") for i in range(0, len(suites_raw), 2)
        )
        compression = r.vector(1, minimum=1)
        extensions = _parse_extensions_untrusted(r)
        return cls(version, random, session_id, cookie, suites, compression, extensions)

    def __bytes__(self) -> bytes:
        return (
            u16(self.client_version)
            + self.random
            + vec(1, self.session_id)
            + vec(1, self.cookie)
            + vec(2, b"".join(u16(s) for s in self.cipher_suites))
            + vec(1, self.compression_methods)
            + _encode_extensions(self.extensions)
        )


@dataclass(frozen=True, slots=True)
class ServerHello:
    msg_type: ClassVar[HandshakeType] = HandshakeType.SERVER_HELLO
    server_version: int
    random: bytes
    session_id: bytes
    cipher_suite: int
    compression_method: int
    extensions: tuple[Extension, ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> ServerHello:
        r = Reader(body)
        version = r.uint(2)
        random = r.take(32)
        session_id = r.vector(1, maximum=32)
        suite = r.uint(2)
        compression = r.uint(1)
        extensions = _parse_extensions_untrusted(r)
        return cls(version, random, session_id, suite, compression, extensions)

    def __bytes__(self) -> bytes:
        return (
            u16(self.server_version)
            + self.random
            + vec(1, self.session_id)
            + u16(self.cipher_suite)
            + u8(self.compression_method)
            + _encode_extensions(self.extensions)
        )


@dataclass(frozen=True, slots=True)
class HelloVerifyRequest:
    """RFC 6347 §4.2.1: ``server_version`` then ``opaque cookie<0..2^8-1>``."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.HELLO_VERIFY_REQUEST
    server_version: int
    cookie: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> HelloVerifyRequest:
        r = Reader(body)
        version = r.uint(2)
        cookie = r.vector(1)
        r.expect_end("HelloVerifyRequest")
        return cls(version, cookie)

    def __bytes__(self) -> bytes:
        return u16(self.server_version) + vec(1, self.cookie)


@dataclass(frozen=True, slots=True)
class CertificateMessage:
    """RFC 5246 §7.4.2: ``ASN.1Cert certificate_list<0..2^24-1>``."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.CERTIFICATE
    certificates: tuple[bytes, ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> CertificateMessage:
        r = Reader(body)
        lst = r.sub(3)
        r.expect_end("Certificate")
        certs = []
        while lst.remaining:
            certs.append(lst.vector(3, minimum=1))
        return cls(tuple(certs))

    def __bytes__(self) -> bytes:
        return vec(3, b"".join(vec(3, c) for c in self.certificates))


@dataclass(frozen=True, slots=True)
class ServerKeyExchange:
    """RFC 8422 §5.4: ECParameters, ECPoint, then a digitally-signed struct."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.SERVER_KEY_EXCHANGE
    named_group: int
    public: bytes
    signature_scheme: int
    signature: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> ServerKeyExchange:
        r = Reader(body)
        curve_type = r.uint(1)
        if curve_type != 3:  # named_curve; explicit curves are gone (RFC 8422 §5.4)
            raise DtlsError("not a named curve", hint=AlertDescription.illegal_parameter)
        group = r.uint(2)
        public = r.vector(1, minimum=1)
        scheme = r.uint(2)
        signature = r.vector(2)
        r.expect_end("ServerKeyExchange")
        return cls(group, public, scheme, signature)

    def params(self) -> bytes:
        """ServerECDHParams: the bytes the signature covers after the two randoms."""
        return u8(3) + u16(self.named_group) + vec(1, self.public)

    def __bytes__(self) -> bytes:
        return self.params() + u16(self.signature_scheme) + vec(2, self.signature)


@dataclass(frozen=True, slots=True)
class CertificateRequest:
    """RFC 5246 §7.4.4."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.CERTIFICATE_REQUEST
    certificate_types: bytes
    signature_schemes: tuple[int, ...]
    authorities: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> CertificateRequest:
        r = Reader(body)
        types = r.vector(1, minimum=1)
        schemes_raw = r.vector(2, minimum=2)
        if len(schemes_raw) % 2:
            raise DtlsError("odd supported_signature_algorithms length")
        schemes = tuple(
            int.from_bytes(schemes_raw[i : i + 2], "big") for i in range(0, len(schemes_raw), 2)
        )
        authorities = r.vector(2)
        r.expect_end("CertificateRequest")
        return cls(types, schemes, authorities)

    def __bytes__(self) -> bytes:
        return (
            vec(1, self.certificate_types)
            + vec(2, b"".join(u16(s) for s in self.signature_schemes))
            + vec(2, self.authorities)
        )


@dataclass(frozen=True, slots=True)
class ServerHelloDone:
    msg_type: ClassVar[HandshakeType] = HandshakeType.SERVER_HELLO_DONE

    @classmethod
    def parse_untrusted(cls, body: bytes) -> ServerHelloDone:
        Reader(body).expect_end("ServerHelloDone")
        return cls()

    def __bytes__(self) -> bytes:
        return b""


@dataclass(frozen=True, slots=True)
class ClientKeyExchange:
    """RFC 8422 §5.7: ``ECPoint ecdh_Yc`` (opaque point <1..2^8-1>)."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.CLIENT_KEY_EXCHANGE
    public: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> ClientKeyExchange:
        r = Reader(body)
        public = r.vector(1, minimum=1)
        r.expect_end("ClientKeyExchange")
        return cls(public)

    def __bytes__(self) -> bytes:
        return vec(1, self.public)


@dataclass(frozen=True, slots=True)
class CertificateVerify:
    """RFC 5246 §7.4.8: a digitally-signed struct (scheme + ``opaque signature<0..2^16-1>``)."""

    msg_type: ClassVar[HandshakeType] = HandshakeType.CERTIFICATE_VERIFY
    signature_scheme: int
    signature: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> CertificateVerify:
        r = Reader(body)
        scheme = r.uint(2)
        signature = r.vector(2)
        r.expect_end("CertificateVerify")
        return cls(scheme, signature)

    def __bytes__(self) -> bytes:
        return u16(self.signature_scheme) + vec(2, self.signature)


@dataclass(frozen=True, slots=True)
class Finished:
    msg_type: ClassVar[HandshakeType] = HandshakeType.FINISHED
    verify_data: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> Finished:
        # RFC 5246 §7.4.9: verify_data_length is 12 for every suite we negotiate.
        if len(body) != 12:
            raise DtlsError("Finished verify_data is not 12 bytes")
        return cls(body)

    def __bytes__(self) -> bytes:
        return self.verify_data


HandshakeBody = (
    ClientHello
    | ServerHello
    | HelloVerifyRequest
    | CertificateMessage
    | ServerKeyExchange
    | CertificateRequest
    | ServerHelloDone
    | ClientKeyExchange
    | CertificateVerify
    | Finished
)

_PARSERS: dict[int, type[HandshakeBody]] = {
    cls.msg_type: cls
    for cls in (
        ClientHello,
        ServerHello,
        HelloVerifyRequest,
        CertificateMessage,
        ServerKeyExchange,
        CertificateRequest,
        ServerHelloDone,
        ClientKeyExchange,
        CertificateVerify,
        Finished,
    )
}


def parse_handshake_body_untrusted(msg_type: int, body: bytes) -> HandshakeBody:
    """Dispatch on ``msg_type``; an unknown type is ``unexpected_message``."""
    cls = _PARSERS.get(msg_type)
    if cls is None:
        raise DtlsError(
            f"unexpected handshake type {msg_type}", hint=AlertDescription.unexpected_message
        )
    return cls.parse_untrusted(body)


# --- extension payloads -------------------------------------------------------------


def _u16_list_untrusted(data: bytes, what: str, len_bytes: int = 2) -> tuple[int, ...]:
    r = Reader(data)
    raw = r.vector(len_bytes, minimum=2)
    r.expect_end(what)
    if len(raw) % 2:
        raise DtlsError(f"odd {what} length")
    return tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2))


def parse_supported_groups_untrusted(data: bytes) -> tuple[int, ...]:
    """RFC 8422 §5.1.1 ``NamedGroup named_group_list<2..2^16-1>``."""
    return _u16_list_untrusted(data, "supported_groups")


def parse_signature_algorithms_untrusted(data: bytes) -> tuple[int, ...]:
    """RFC 5246 §7.4.1.4.1 ``supported_signature_algorithms<2..2^16-2>``."""
    return _u16_list_untrusted(data, "signature_algorithms")


def parse_ec_point_formats_untrusted(data: bytes) -> bytes:
    """RFC 8422 §5.1.2 ``ECPointFormat ec_point_format_list<1..2^8-1>``."""
    r = Reader(data)
    formats = r.vector(1, minimum=1)
    r.expect_end("ec_point_formats")
    return formats


def parse_use_srtp_untrusted(data: bytes) -> tuple[tuple[int, ...], bytes]:
    """RFC 5764 §4.1.1: ``SRTPProtectionProfiles<2..2^16-1>`` then ``opaque srtp_mki<0..255>``."""
    r = Reader(data)
    raw = r.vector(2, minimum=2)
    if len(raw) % 2:
        raise DtlsError("odd use_srtp profile list")
    mki = r.vector(1)
    r.expect_end("use_srtp")
    return tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)), mki


def encode_use_srtp(profiles: Sequence[int], mki: bytes = b"") -> bytes:
    return vec(2, b"".join(u16(p) for p in profiles)) + vec(1, mki)


def parse_renegotiation_info_untrusted(data: bytes) -> bytes:
    """RFC 5746 §3.2 ``opaque renegotiated_connection<0..255>``."""
    r = Reader(data)
    value = r.vector(1)
    r.expect_end("renegotiation_info")
    return value
