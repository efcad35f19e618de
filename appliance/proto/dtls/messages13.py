"""DTLS 1.3 handshake bodies and extension payloads (RFC 8446 §4 as used by RFC 9147 §5).

ClientHello and ServerHello keep the 1.2 wire layout (RFC 9147 §5.3, §5.4) and reuse
:class:`.messages.ClientHello` / :class:`.messages.ServerHello`; a HelloRetryRequest is a
ServerHello with :data:`._wire13.HRR_RANDOM`. New here: EncryptedExtensions (§4.3.1),
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

from appliance.proto.dtls._wire import AlertDescription, DtlsError, Reader, u8, u16, vec
from appliance.proto.dtls._wire13 import HandshakeType13
from appliance.proto.dtls.messages import (
    CertificateVerify,
    ClientHello,
    Extension,
    ServerHello,
    _encode_extensions,
    _parse_extensions_untrusted,
)

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
