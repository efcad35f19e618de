"""DTLS 1.2 and 1.3 handshake message bodies: ``X.parse_untrusted(body)`` and ``bytes(x)``.

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

DTLS 1.3 handshake bodies and extension payloads (RFC 8446 §4 as used by RFC 9147 §5).

ClientHello and ServerHello keep the 1.2 wire layout (RFC 9147 §5.3, §5.4) and reuse
:class:`.messages.ClientHello` / :class:`.messages.ServerHello`; a HelloRetryRequest is a
ServerHello with :data:`._wire.HRR_RANDOM`. New here: EncryptedExtensions (§4.3.1),
CertificateRequest (§4.3.2), Certificate (§4.4.2, X.509 entries only), Finished with a
hash-length verify_data (§4.4.4), KeyUpdate (§4.6.3), and the extension payloads
supported_versions (§4.2.1), cookie (§4.2.2), key_share (§4.2.8). Deliberately omitted:
NewSessionTicket, pre_shared_key, early_data (no resumption, no 0-RTT), raw public keys.

Certificate (RFC 8446 §4.4.2)::

    struct { opaque cert_data<1..2^24-1>; Extension extensions<0..2^16-1>; } CertificateEntry;
    struct {
        opaque certificate_request_context<0..2^8-1>;
        CertificateEntry certificate_list<0..2^24-1>;
    } Certificate;
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from appliance.proto.dtls._wire import (
    AlertDescription,
    DtlsError,
    HandshakeType,
    HandshakeType13,
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
    def parse_untrusted(cls, body: bytes, *, stream: bool = False) -> ClientHello:
        """``stream``: a TLS (not DTLS) ClientHello, which has no cookie field (RFC 5246
        §7.4.1.2, RFC 8446 §4.1.2); ``cookie`` is then ``b""``. Used by :mod:`.tlspeek`."""
        r = Reader(body)
        version = r.uint(2)
        random = r.take(32)
        session_id = r.vector(1, maximum=32)
        cookie = b"" if stream else r.vector(1)
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


def parse_server_name_untrusted(data: bytes) -> bytes | None:
    """RFC 6066 §3 ``ServerNameList``: the first ``host_name`` (type 0), or None.

    ::

        struct { NameType name_type; select (name_type) { case host_name: HostName; } name;
        } ServerName;                                   // NameType host_name(0)
        struct { ServerName server_name_list<1..2^16-1> } ServerNameList;
    """
    r = Reader(data)
    names = r.sub(2)
    r.expect_end("server_name")
    while names.remaining:
        name_type = names.uint(1)
        name = names.vector(2, minimum=1)
        if name_type == 0:
            return name
    return None


def parse_alpn_untrusted(data: bytes) -> tuple[bytes, ...]:
    """RFC 7301 §3.1 ``ProtocolNameList``: ``ProtocolName protocol_name_list<2..2^16-1>``,
    each ``opaque ProtocolName<1..2^8-1>``."""
    r = Reader(data)
    names = r.sub(2)
    r.expect_end("application_layer_protocol_negotiation")
    out: list[bytes] = []
    while names.remaining:
        out.append(names.vector(1, minimum=1))
    if not out:
        raise DtlsError("empty ALPN list")
    return tuple(out)


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


# --- DTLS 1.3 bodies --------------------

__all__ = [
    "Certificate13",
    "CertificateRequest13",
    "CertificateVerify",
    "ClientHello",
    "EncryptedExtensions",
    "Finished13",
    "KeyUpdate",
    "ServerHello",
]


def _extensions_block_untrusted(r: Reader) -> tuple[Extension, ...]:
    """A mandatory ``Extension extensions<0..2^16-1>`` (1.3 messages always carry it)."""
    if r.remaining < 2:
        raise DtlsError("missing extensions block")
    return _parse_extensions_untrusted(r)


def _encode_block(extensions: Sequence[Extension]) -> bytes:
    return _encode_extensions(extensions) or b"\x00\x00"


@dataclass(frozen=True, slots=True)
class EncryptedExtensions:
    msg_type: ClassVar[int] = HandshakeType13.ENCRYPTED_EXTENSIONS
    extensions: tuple[Extension, ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> EncryptedExtensions:
        return cls(_extensions_block_untrusted(Reader(body)))

    def __bytes__(self) -> bytes:
        return _encode_block(self.extensions)


@dataclass(frozen=True, slots=True)
class CertificateRequest13:
    msg_type: ClassVar[int] = HandshakeType13.CERTIFICATE_REQUEST
    context: bytes
    extensions: tuple[Extension, ...]

    @classmethod
    def parse_untrusted(cls, body: bytes) -> CertificateRequest13:
        r = Reader(body)
        context = r.vector(1)
        return cls(context, _extensions_block_untrusted(r))

    def __bytes__(self) -> bytes:
        return vec(1, self.context) + _encode_block(self.extensions)


@dataclass(frozen=True, slots=True)
class Certificate13:
    msg_type: ClassVar[int] = HandshakeType13.CERTIFICATE
    context: bytes
    certificates: tuple[bytes, ...]  # DER, leaf first; per-entry extensions are dropped

    @classmethod
    def parse_untrusted(cls, body: bytes) -> Certificate13:
        r = Reader(body)
        context = r.vector(1)
        entries = r.sub(3)
        r.expect_end("Certificate")
        certs = []
        while entries.remaining:
            certs.append(entries.vector(3, minimum=1))
            entries.vector(2)  # CertificateEntry.extensions (OCSP, SCT): unused in WebRTC
        return cls(context, tuple(certs))

    def __bytes__(self) -> bytes:
        entries = b"".join(vec(3, c) + u16(0) for c in self.certificates)
        return vec(1, self.context) + vec(3, entries)


@dataclass(frozen=True, slots=True)
class Finished13:
    msg_type: ClassVar[int] = HandshakeType13.FINISHED
    verify_data: bytes

    @classmethod
    def parse_untrusted(cls, body: bytes) -> Finished13:
        # RFC 8446 §4.4.4: Hash.length bytes; checked against the suite by the caller.
        if len(body) not in (32, 48):
            raise DtlsError("Finished of unexpected length")
        return cls(body)

    def __bytes__(self) -> bytes:
        return self.verify_data


@dataclass(frozen=True, slots=True)
class KeyUpdate:
    msg_type: ClassVar[int] = HandshakeType13.KEY_UPDATE
    update_requested: bool

    @classmethod
    def parse_untrusted(cls, body: bytes) -> KeyUpdate:
        r = Reader(body)
        value = r.uint(1)
        r.expect_end("KeyUpdate")
        # RFC 8446 §4.6.3: any other value is illegal_parameter.
        if value > 1:
            raise DtlsError("bad KeyUpdate value", hint=AlertDescription.illegal_parameter)
        return cls(bool(value))

    def __bytes__(self) -> bytes:
        return u8(int(self.update_requested))


Body13 = (ClientHello | ServerHello | EncryptedExtensions | CertificateRequest13 | Certificate13
          | CertificateVerify | Finished13 | KeyUpdate)

_PARSERS13: dict[int, type[Body13]] = {
    HandshakeType13.CLIENT_HELLO: ClientHello,
    HandshakeType13.SERVER_HELLO: ServerHello,
    HandshakeType13.ENCRYPTED_EXTENSIONS: EncryptedExtensions,
    HandshakeType13.CERTIFICATE_REQUEST: CertificateRequest13,
    HandshakeType13.CERTIFICATE: Certificate13,
    HandshakeType13.CERTIFICATE_VERIFY: CertificateVerify,
    HandshakeType13.FINISHED: Finished13,
    HandshakeType13.KEY_UPDATE: KeyUpdate,
}


def parse_body13_untrusted(msg_type: int, body: bytes) -> Body13:
    cls = _PARSERS13.get(msg_type)
    if cls is None:
        raise DtlsError(f"unexpected handshake type {msg_type}",
                        hint=AlertDescription.unexpected_message)
    return cls.parse_untrusted(body)


# --- extension payloads ----------------------------------------------------------------


def parse_supported_versions_ch_untrusted(data: bytes) -> tuple[int, ...]:
    """RFC 8446 §4.2.1 ClientHello form: ``ProtocolVersion versions<2..254>``."""
    r = Reader(data)
    raw = r.vector(1, minimum=2, maximum=254)
    r.expect_end("supported_versions")
    if len(raw) % 2:
        raise DtlsError("odd supported_versions length")
    return tuple(int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2))


def parse_supported_versions_sh_untrusted(data: bytes) -> int:
    """ServerHello / HelloRetryRequest form: one ``selected_version``."""
    r = Reader(data)
    v = r.uint(2)
    r.expect_end("supported_versions")
    return v


def encode_versions_ch(versions: Sequence[int]) -> bytes:
    return vec(1, b"".join(u16(v) for v in versions))


def parse_key_share_ch_untrusted(data: bytes) -> tuple[tuple[int, bytes], ...]:
    """RFC 8446 §4.2.8 ``KeyShareEntry client_shares<0..2^16-1>``; one entry per group."""
    r = Reader(data)
    block = r.sub(2)
    r.expect_end("key_share")
    out: list[tuple[int, bytes]] = []
    while block.remaining:
        group = block.uint(2)
        key = block.vector(2, minimum=1)
        if any(g == group for g, _ in out):
            raise DtlsError("duplicate key_share group", hint=AlertDescription.illegal_parameter)
        out.append((group, key))
    return tuple(out)


def encode_key_share_ch(shares: Sequence[tuple[int, bytes]]) -> bytes:
    return vec(2, b"".join(u16(g) + vec(2, k) for g, k in shares))


def parse_key_share_sh_untrusted(data: bytes) -> tuple[int, bytes]:
    """ServerHello form: a single ``KeyShareEntry server_share``."""
    r = Reader(data)
    group = r.uint(2)
    key = r.vector(2, minimum=1)
    r.expect_end("key_share")
    return group, key


def parse_key_share_hrr_untrusted(data: bytes) -> int:
    """HelloRetryRequest form: ``NamedGroup selected_group``."""
    r = Reader(data)
    group = r.uint(2)
    r.expect_end("key_share")
    return group


def parse_cookie_untrusted(data: bytes) -> bytes:
    """RFC 8446 §4.2.2 ``opaque cookie<1..2^16-1>``."""
    r = Reader(data)
    cookie = r.vector(2, minimum=1)
    r.expect_end("cookie")
    return cookie
