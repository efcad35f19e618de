"""STUN message codec: RFC 8489 (which obsoletes RFC 5389), plus the ICE attributes of
RFC 8445 §16.1.

Implemented:

* §5 message structure (header, magic cookie, 96-bit transaction id, method/class bits);
* §14 attribute TLVs with 32-bit padding, the comprehension-required (0x0000-0x7FFF) /
  comprehension-optional (0x8000-0xFFFF) split of §14 and §18.3 (unknown optional ones are
  skipped, unknown required ones are reported in ``Message.unknown_required`` so the caller
  can answer 420 per §6.3.1);
* §14.5 MESSAGE-INTEGRITY (HMAC-SHA1) with the length-field adjustment, computed on send and
  verified on the raw bytes (``verify_integrity``); attributes after it other than
  MESSAGE-INTEGRITY-SHA256 and FINGERPRINT are ignored as §14.5 requires;
* §14.7 FINGERPRINT (CRC-32 xor 0x5354554e), which must be the last attribute;
* §14.1/§14.2 MAPPED-ADDRESS / XOR-MAPPED-ADDRESS (IPv4 and IPv6), §14.3 USERNAME,
  §14.8 ERROR-CODE, §14.9 REALM, §14.10 NONCE, §14.13 UNKNOWN-ATTRIBUTES, §14.14 SOFTWARE;
* RFC 8445 §16.1 PRIORITY, USE-CANDIDATE, ICE-CONTROLLED, ICE-CONTROLLING;
* §9.2.2 long-term credential key (MD5 of ``username:realm:password``, with SASLprep of
  RFC 4013 as RFC 5389 specified, so the RFC 5769 §2.4 vector verifies), and its SHA-256
  variant (§18.5.1.2) for PASSWORD-ALGORITHM SHA-256;
* §14.6 MESSAGE-INTEGRITY-SHA256 (HMAC-SHA256, 16-32 bytes in steps of 4, truncated
  compare), computed on send (``encode(..., integrity="sha256")``) and verified on the raw
  bytes (``verify_integrity_sha256``); after it only FINGERPRINT is kept (§14.6);
* §14.11/§14.12 PASSWORD-ALGORITHMS / PASSWORD-ALGORITHM, kept as raw bytes with their
  codecs beside (``encode_password_algorithms``, ``parse_password_algorithm_untrusted``);
* the TURN methods and attributes of RFC 8656 §14-§18 (CHANNEL-NUMBER, LIFETIME,
  XOR-PEER-ADDRESS, DATA, XOR-RELAYED-ADDRESS, REQUESTED-ADDRESS-FAMILY, EVEN-PORT,
  REQUESTED-TRANSPORT, DONT-FRAGMENT, RESERVATION-TOKEN, ADDITIONAL-ADDRESS-FAMILY,
  ADDRESS-ERROR-CODE, ICMP): one registry, one parser, for ICE and TURN alike
  (``appliance.proto.turn`` builds its server on this codec).

Deliberately omitted:

* RFC 3489 "classic" STUN (no magic cookie): rejected as malformed;
* USERHASH (§14.4): recognised and kept as raw bytes, never computed (the TURN server does
  not offer username anonymity, so a client never needs it);
* OpaqueString (RFC 8265) preparation of long-term passwords: SASLprep is used instead;
* ALTERNATE-SERVER / ALTERNATE-DOMAIN and RFC 6062's TCP-allocation attributes
  (CONNECTION-ID): unknown to this codec.

Wire layout (§5)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |0 0|     STUN Message Type     |         Message Length        |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                         Magic Cookie                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |                     Transaction ID (96 bits)                  |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

    Message type bits: M11..M7 C1 M6..M4 C0 M3..M0
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import stringprep
import struct
import unicodedata
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "COOKIE",
    "HEADER_LENGTH",
    "Addr",
    "AttrType",
    "AttrValue",
    "Class",
    "Message",
    "Method",
    "StunError",
    "PasswordAlgorithm",
    "encode_password_algorithms",
    "find_attribute",
    "fingerprint_value",
    "long_term_key",
    "message_integrity",
    "message_integrity_sha256",
    "message_type",
    "parse_password_algorithm_untrusted",
    "saslprep",
    "verify_fingerprint",
    "verify_integrity",
    "verify_integrity_sha256",
]

COOKIE = 0x2112A442
COOKIE_BYTES = COOKIE.to_bytes(4, "big")
HEADER_LENGTH = 20
FINGERPRINT_XOR = 0x5354554E
INTEGRITY_LENGTH = 20
#: §14.6: MESSAGE-INTEGRITY-SHA256 carries 16 to 32 bytes of the HMAC, in steps of 4.
SHA256_INTEGRITY_MIN = 16
SHA256_INTEGRITY_LENGTH = 32
#: A STUN message over UDP must fit one datagram; we never build or accept more (§6.1).
MAX_MESSAGE = 65535

Addr: TypeAlias = tuple[str, int]

_HEADER = struct.Struct("!HHI12s")
_TLV = struct.Struct("!HH")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")


class StunError(RemoteProtocolError):
    """The peer's bytes are not a STUN message we accept. ``hint`` is the STUN error code
    to answer with (400 Bad Request unless stated), or ``None`` when no answer is due."""


class Class(enum.IntEnum):
    """The two class bits C1 C0 (§5)."""

    REQUEST = 0b00
    INDICATION = 0b01
    SUCCESS = 0b10
    ERROR = 0b11


class Method(enum.IntEnum):
    """Methods from the IANA registry (§18.1) we recognise: Binding (ICE) and the TURN
    methods of RFC 8656 §18 (appliance.proto.turn)."""

    BINDING = 0x001
    ALLOCATE = 0x003
    REFRESH = 0x004
    SEND = 0x006
    DATA = 0x007
    CREATE_PERMISSION = 0x008
    CHANNEL_BIND = 0x009


_METHODS = frozenset(int(m) for m in Method)


def _message_type(method: int, cls: int) -> int:
    # Interleave the 12 method bits and 2 class bits as in §5 figure 3.
    return (
        (method & 0x000F)
        | ((method & 0x0070) << 1)
        | ((method & 0x0F80) << 2)
        | ((cls & 0b01) << 4)
        | ((cls & 0b10) << 7)
    )


#: The message type of ``(method, class)`` (§5), for tables built outside this module.
message_type = _message_type


def _split_type(mtype: int) -> tuple[int, int]:
    method = (mtype & 0x000F) | ((mtype & 0x00E0) >> 1) | ((mtype & 0x3E00) >> 2)
    cls = ((mtype & 0x0010) >> 4) | ((mtype & 0x0100) >> 7)
    return method, cls


class AttrType(enum.IntEnum):
    """Attribute types of the registry table below (§18.3, RFC 8445 §16.1, RFC 8656 §18)."""

    MAPPED_ADDRESS = 0x0001
    USERNAME = 0x0006
    MESSAGE_INTEGRITY = 0x0008
    ERROR_CODE = 0x0009
    UNKNOWN_ATTRIBUTES = 0x000A
    CHANNEL_NUMBER = 0x000C  # RFC 8656 §18.1
    LIFETIME = 0x000D  # RFC 8656 §18.2
    XOR_PEER_ADDRESS = 0x0012  # RFC 8656 §18.3
    DATA = 0x0013  # RFC 8656 §18.4
    REALM = 0x0014
    NONCE = 0x0015
    XOR_RELAYED_ADDRESS = 0x0016  # RFC 8656 §18.5
    REQUESTED_ADDRESS_FAMILY = 0x0017  # RFC 8656 §18.6
    EVEN_PORT = 0x0018  # RFC 8656 §18.7
    REQUESTED_TRANSPORT = 0x0019  # RFC 8656 §18.8
    DONT_FRAGMENT = 0x001A  # RFC 8656 §18.9
    MESSAGE_INTEGRITY_SHA256 = 0x001C
    PASSWORD_ALGORITHM = 0x001D
    USERHASH = 0x001E
    XOR_MAPPED_ADDRESS = 0x0020
    RESERVATION_TOKEN = 0x0022  # RFC 8656 §18.10
    PRIORITY = 0x0024
    USE_CANDIDATE = 0x0025
    ADDITIONAL_ADDRESS_FAMILY = 0x8000  # RFC 8656 §18.11
    ADDRESS_ERROR_CODE = 0x8001  # RFC 8656 §18.12
    PASSWORD_ALGORITHMS = 0x8002
    ALTERNATE_DOMAIN = 0x8003
    ICMP = 0x8004  # RFC 8656 §18.13
    SOFTWARE = 0x8022
    FINGERPRINT = 0x8028
    ICE_CONTROLLED = 0x8029
    ICE_CONTROLLING = 0x802A


#: Decoded attribute values: str (USERNAME, REALM, NONCE, SOFTWARE), int (PRIORITY,
#: FINGERPRINT, ICE-CONTROLL*), bytes (MESSAGE-INTEGRITY and the raw-only ones), Addr
#: (the address attributes), (code, reason) for ERROR-CODE, a tuple of types for
#: UNKNOWN-ATTRIBUTES and None for the flag USE-CANDIDATE.
AttrValue: TypeAlias = (
    str | int | bytes | None | tuple[str, int] | tuple[int, str] | tuple[int, ...]
)


def _bad(msg: str, code: int = 400) -> StunError:
    return StunError(msg, hint=code)


# --- per-type value codecs --------------------------------------------------------------
# Each decoder gets the value bytes (padding removed) and the transaction id, validates the
# length itself and raises only StunError.


def _dec_text(limit: int) -> Callable[[bytes, bytes], AttrValue]:
    def dec(v: bytes, tid: bytes) -> AttrValue:
        # §14.3/14.9/14.10/14.14: UTF-8 with a byte limit (513 for USERNAME, 763 otherwise).
        if len(v) > limit:
            raise _bad("text attribute too long")
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("text attribute is not UTF-8") from None

    return dec


def _enc_text(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, str):
        raise LocalProtocolError("text attribute needs a str")
    return value.encode("utf-8")


def _dec_raw(v: bytes, tid: bytes) -> AttrValue:
    return v


def _enc_raw(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, bytes):
        raise LocalProtocolError("raw attribute needs bytes")
    return value


def _dec_integrity(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != INTEGRITY_LENGTH:
        raise _bad("MESSAGE-INTEGRITY must be 20 bytes")
    return v


def _dec_integrity_sha256(v: bytes, tid: bytes) -> AttrValue:
    # §14.6: "at least 16 bytes ... a multiple of 4 ... at most 32".
    if not SHA256_INTEGRITY_MIN <= len(v) <= SHA256_INTEGRITY_LENGTH or len(v) % 4:
        raise _bad("MESSAGE-INTEGRITY-SHA256 must be 16-32 bytes in steps of 4")
    return v


def _dec_u32(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != 4:
        raise _bad("32-bit attribute of wrong length")
    return int(_U32.unpack(v)[0])


def _enc_u32(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise LocalProtocolError("32-bit attribute out of range")
    return _U32.pack(value)


def _dec_u64(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != 8:
        raise _bad("64-bit attribute of wrong length")
    return int(_U64.unpack(v)[0])


def _enc_u64(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise LocalProtocolError("64-bit attribute out of range")
    return _U64.pack(value)


#   0                   1                   2                   3
#   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |        Channel Number         |         RFFU = 0              |   CHANNEL-NUMBER
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+   (RFC 8656 §18.1)
#  |   Protocol    |                    RFFU                       |   REQUESTED-TRANSPORT,
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+   (§18.8; and the family
#                                                                       byte of §18.6, §18.11)
#  The RFFU bits are ignored on receipt (RFC 8656 §18: "reserved for future use").


def _dec_first_of_four(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != 4:
        raise _bad("attribute must be 4 bytes")
    return v[0]


def _enc_first_of_four(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFF:
        raise LocalProtocolError("one-byte field out of range")
    return bytes((value, 0, 0, 0))


def _dec_channel(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != 4:
        raise _bad("CHANNEL-NUMBER must be 4 bytes")
    return (v[0] << 8) | v[1]


def _enc_channel(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFF:
        raise LocalProtocolError("channel number out of range")
    return bytes((value >> 8, value & 0xFF, 0, 0))


def _dec_even_port(v: bytes, tid: bytes) -> AttrValue:
    # §18.7: one byte, R (reserve the next port) in the top bit, the rest RFFU.
    if len(v) != 1:
        raise _bad("EVEN-PORT must be 1 byte")
    return v[0] >> 7


def _enc_even_port(value: AttrValue, tid: bytes) -> bytes:
    return b"\x80" if value else b"\x00"


def _dec_token(v: bytes, tid: bytes) -> AttrValue:
    if len(v) != 8:
        raise _bad("RESERVATION-TOKEN must be 8 bytes")
    return v


def _dec_flag(v: bytes, tid: bytes) -> AttrValue:
    if v:
        raise _bad("flag attribute must be empty")
    return None


def _enc_flag(value: AttrValue, tid: bytes) -> bytes:
    return b""


#   0                   1                   2                   3
#   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |0 0 0 0 0 0 0 0|    Family     |         (X-)Port              |
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |                (X-)Address (32 bits or 128 bits)              |
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  (§14.1, §14.2: X-Port = port ^ cookie>>16, X-Address = address ^ (cookie || tid))


def _xor_key(tid: bytes) -> bytes:
    return COOKIE_BYTES + tid


def _dec_address(xor: bool) -> Callable[[bytes, bytes], AttrValue]:
    def dec(v: bytes, tid: bytes) -> AttrValue:
        if len(v) < 4:
            raise _bad("address attribute too short")
        family = v[1]
        port = (v[2] << 8) | v[3]
        raw = v[4:]
        if family == 0x01:
            if len(raw) != 4:
                raise _bad("IPv4 address attribute of wrong length")
        elif family == 0x02:
            if len(raw) != 16:
                raise _bad("IPv6 address attribute of wrong length")
        else:
            raise _bad("unknown address family")
        if xor:
            port ^= COOKIE >> 16
            key = _xor_key(tid)
            raw = bytes(a ^ b for a, b in zip(raw, key, strict=False))
        ip = ipaddress.IPv4Address(raw) if family == 0x01 else ipaddress.IPv6Address(raw)
        return (str(ip), port)

    return dec


def pack_address(addr: Addr, tid: bytes, *, xor: bool) -> bytes:
    """Encode an (ip, port) pair as the value of a (XOR-)MAPPED-ADDRESS attribute."""
    ip_text, port = addr
    try:
        ip = ipaddress.ip_address(ip_text)
    except ValueError:
        raise LocalProtocolError(f"not an IP address: {ip_text!r}") from None
    if not 0 <= port <= 0xFFFF:
        raise LocalProtocolError(f"port out of range: {port}")
    raw = ip.packed
    family = 0x01 if ip.version == 4 else 0x02
    if xor:
        port ^= COOKIE >> 16
        key = _xor_key(tid)
        raw = bytes(a ^ b for a, b in zip(raw, key, strict=False))
    return bytes((0, family, port >> 8, port & 0xFF)) + raw


def _enc_address(xor: bool) -> Callable[[AttrValue, bytes], bytes]:
    def enc(value: AttrValue, tid: bytes) -> bytes:
        if (
            not isinstance(value, tuple)
            or len(value) != 2
            or not isinstance(value[0], str)
            or not isinstance(value[1], int)
        ):
            raise LocalProtocolError("address attribute needs (ip, port)")
        return pack_address((value[0], value[1]), tid, xor=xor)

    return enc


#   0                   1                   2                   3
#   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |           Reserved, should be 0         |Class|     Number    |
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |      Reason Phrase (variable)                                ..
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+   (§14.8)


def _dec_error_code(v: bytes, tid: bytes) -> AttrValue:
    if len(v) < 4 or len(v) > 4 + 763:
        raise _bad("ERROR-CODE of wrong length")
    cls = v[2] & 0x07
    number = v[3]
    if not 3 <= cls <= 6 or number > 99:
        raise _bad("ERROR-CODE out of range")
    try:
        reason = v[4:].decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("ERROR-CODE reason is not UTF-8") from None
    return (cls * 100 + number, reason)


def _enc_error_code(value: AttrValue, tid: bytes) -> bytes:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not isinstance(value[0], int)
        or not isinstance(value[1], str)
        or not 300 <= value[0] <= 699
    ):
        raise LocalProtocolError("ERROR-CODE needs (300..699, reason)")
    code, reason = value
    return bytes((0, 0, code // 100, code % 100)) + reason.encode("utf-8")


def _dec_unknown(v: bytes, tid: bytes) -> AttrValue:
    if len(v) % 2:
        raise _bad("UNKNOWN-ATTRIBUTES of odd length")
    return tuple((v[i] << 8) | v[i + 1] for i in range(0, len(v), 2))


def _enc_unknown(value: AttrValue, tid: bytes) -> bytes:
    if not isinstance(value, tuple) or not all(
        isinstance(t, int) and 0 <= t <= 0xFFFF for t in value
    ):
        raise LocalProtocolError("UNKNOWN-ATTRIBUTES needs a tuple of 16-bit types")
    return b"".join(int(t).to_bytes(2, "big") for t in value)


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    decode: Callable[[bytes, bytes], AttrValue]
    encode: Callable[[AttrValue, bytes], bytes]


#: The attribute registry (STYLE.md rule 6, after aioice's ATTRIBUTES table).
ATTRIBUTES: dict[int, _Spec] = {
    AttrType.MAPPED_ADDRESS: _Spec("MAPPED-ADDRESS", _dec_address(False), _enc_address(False)),
    AttrType.USERNAME: _Spec("USERNAME", _dec_text(513), _enc_text),
    AttrType.MESSAGE_INTEGRITY: _Spec("MESSAGE-INTEGRITY", _dec_integrity, _enc_raw),
    AttrType.ERROR_CODE: _Spec("ERROR-CODE", _dec_error_code, _enc_error_code),
    AttrType.UNKNOWN_ATTRIBUTES: _Spec("UNKNOWN-ATTRIBUTES", _dec_unknown, _enc_unknown),
    AttrType.REALM: _Spec("REALM", _dec_text(763), _enc_text),
    AttrType.NONCE: _Spec("NONCE", _dec_text(763), _enc_text),
    AttrType.MESSAGE_INTEGRITY_SHA256: _Spec(
        "MESSAGE-INTEGRITY-SHA256", _dec_integrity_sha256, _enc_raw
    ),
    AttrType.PASSWORD_ALGORITHM: _Spec("PASSWORD-ALGORITHM", _dec_raw, _enc_raw),
    AttrType.USERHASH: _Spec("USERHASH", _dec_raw, _enc_raw),
    AttrType.XOR_MAPPED_ADDRESS: _Spec(
        "XOR-MAPPED-ADDRESS", _dec_address(True), _enc_address(True)
    ),
    AttrType.PRIORITY: _Spec("PRIORITY", _dec_u32, _enc_u32),
    AttrType.USE_CANDIDATE: _Spec("USE-CANDIDATE", _dec_flag, _enc_flag),
    AttrType.PASSWORD_ALGORITHMS: _Spec("PASSWORD-ALGORITHMS", _dec_raw, _enc_raw),
    AttrType.ALTERNATE_DOMAIN: _Spec("ALTERNATE-DOMAIN", _dec_raw, _enc_raw),
    AttrType.SOFTWARE: _Spec("SOFTWARE", _dec_text(763), _enc_text),
    AttrType.FINGERPRINT: _Spec("FINGERPRINT", _dec_u32, _enc_u32),
    AttrType.ICE_CONTROLLED: _Spec("ICE-CONTROLLED", _dec_u64, _enc_u64),
    AttrType.ICE_CONTROLLING: _Spec("ICE-CONTROLLING", _dec_u64, _enc_u64),
    # TURN (RFC 8656 §18)
    AttrType.CHANNEL_NUMBER: _Spec("CHANNEL-NUMBER", _dec_channel, _enc_channel),
    AttrType.LIFETIME: _Spec("LIFETIME", _dec_u32, _enc_u32),
    AttrType.XOR_PEER_ADDRESS: _Spec("XOR-PEER-ADDRESS", _dec_address(True), _enc_address(True)),
    AttrType.DATA: _Spec("DATA", _dec_raw, _enc_raw),
    AttrType.XOR_RELAYED_ADDRESS: _Spec(
        "XOR-RELAYED-ADDRESS", _dec_address(True), _enc_address(True)
    ),
    AttrType.REQUESTED_ADDRESS_FAMILY: _Spec(
        "REQUESTED-ADDRESS-FAMILY", _dec_first_of_four, _enc_first_of_four
    ),
    AttrType.EVEN_PORT: _Spec("EVEN-PORT", _dec_even_port, _enc_even_port),
    AttrType.REQUESTED_TRANSPORT: _Spec(
        "REQUESTED-TRANSPORT", _dec_first_of_four, _enc_first_of_four
    ),
    AttrType.DONT_FRAGMENT: _Spec("DONT-FRAGMENT", _dec_flag, _enc_flag),
    AttrType.RESERVATION_TOKEN: _Spec("RESERVATION-TOKEN", _dec_token, _enc_raw),
    AttrType.ADDITIONAL_ADDRESS_FAMILY: _Spec(
        "ADDITIONAL-ADDRESS-FAMILY", _dec_first_of_four, _enc_first_of_four
    ),
    # ADDRESS-ERROR-CODE (family + ERROR-CODE layout) and ICMP are only ever sent by a
    # server; kept raw (address_error_code() builds the former).
    AttrType.ADDRESS_ERROR_CODE: _Spec("ADDRESS-ERROR-CODE", _dec_raw, _enc_raw),
    AttrType.ICMP: _Spec("ICMP", _dec_raw, _enc_raw),
}

# The integrity attributes and FINGERPRINT are computed by ``encode``, never copied.
_COMPUTED = frozenset(
    (AttrType.MESSAGE_INTEGRITY, AttrType.MESSAGE_INTEGRITY_SHA256, AttrType.FINGERPRINT)
)


def _pad(n: int) -> int:
    return -n & 3


# --- integrity and fingerprint ----------------------------------------------------------


def _with_length(header: bytes | bytearray | memoryview, body_length: int) -> bytes:
    # §14.5/§14.7: the hash covers the header with its length field rewritten to end just
    # after the attribute being computed, so later attributes can be appended afterwards.
    return bytes(header[0:2]) + body_length.to_bytes(2, "big") + bytes(header[4:HEADER_LENGTH])


def message_integrity(prefix: bytes | bytearray | memoryview, key: bytes) -> bytes:
    """HMAC-SHA1 over ``prefix`` (the message up to, not including, MESSAGE-INTEGRITY),
    with the header length adjusted to cover the MESSAGE-INTEGRITY attribute itself."""
    body = len(prefix) - HEADER_LENGTH + 4 + INTEGRITY_LENGTH
    mac = hmac.new(key, _with_length(prefix, body), hashlib.sha1)
    mac.update(prefix[HEADER_LENGTH:])
    return mac.digest()


def message_integrity_sha256(prefix: bytes | bytearray | memoryview, key: bytes) -> bytes:
    """HMAC-SHA256 over ``prefix`` (the message up to MESSAGE-INTEGRITY-SHA256), with the
    header length adjusted to cover a 32-byte MESSAGE-INTEGRITY-SHA256 (§14.6)."""
    return _hmac_sha256(prefix, key, SHA256_INTEGRITY_LENGTH)


def _hmac_sha256(prefix: bytes | bytearray | memoryview, key: bytes, length: int) -> bytes:
    body = len(prefix) - HEADER_LENGTH + 4 + length
    mac = hmac.new(key, _with_length(prefix, body), hashlib.sha256)
    mac.update(prefix[HEADER_LENGTH:])
    return mac.digest()


def fingerprint_value(prefix: bytes | bytearray | memoryview) -> int:
    """CRC-32 of ``prefix`` xor 0x5354554e, length adjusted to cover FINGERPRINT (§14.7)."""
    body = len(prefix) - HEADER_LENGTH + 8
    crc = zlib.crc32(_with_length(prefix, body))
    crc = zlib.crc32(prefix[HEADER_LENGTH:], crc)
    return crc ^ FINGERPRINT_XOR


def _walk(buf: bytes | bytearray | memoryview) -> list[tuple[int, int, int]] | None:
    """(type, value offset, value length) of every attribute, or None if the framing is bad.
    Never raises: used by the bool-returning verifiers."""
    n = len(buf)
    if n < HEADER_LENGTH or buf[0] & 0xC0 or bytes(buf[4:8]) != COOKIE_BYTES:
        return None
    if ((buf[2] << 8) | buf[3]) != n - HEADER_LENGTH or n & 3:
        return None
    out = []
    pos = HEADER_LENGTH
    while pos < n:
        if pos + 4 > n:
            return None
        atype, alen = _TLV.unpack_from(buf, pos)
        end = pos + 4 + alen
        if end > n:
            return None
        out.append((atype, pos + 4, alen))
        pos = end + _pad(alen)
    if pos != n:
        return None
    return out


def find_attribute(raw: bytes | bytearray | memoryview, attr: int) -> tuple[int, int] | None:
    """``(offset, length)`` of the value of the first ``attr`` in a well-framed message, or
    None (absent, or the framing is bad). Never raises: for callers that want a value's
    place in the datagram rather than a copy (TURN's DATA, relayed without copying)."""
    attrs = _walk(raw)
    if attrs is None:
        return None
    for atype, off, alen in attrs:
        if atype == attr:
            return off, alen
    return None


def verify_integrity(raw: bytes | bytearray | memoryview, key: bytes) -> bool:
    """True iff ``raw`` is well framed and its first MESSAGE-INTEGRITY is HMAC-SHA1 of the
    preceding bytes under ``key`` (§14.5), compared in constant time."""
    attrs = _walk(raw)
    if attrs is None:
        return False
    for atype, off, alen in attrs:
        if atype == AttrType.MESSAGE_INTEGRITY:
            if alen != INTEGRITY_LENGTH:
                return False
            expected = message_integrity(raw[: off - 4], key)
            return hmac.compare_digest(expected, bytes(raw[off : off + alen]))
    return False


def verify_integrity_sha256(raw: bytes | bytearray | memoryview, key: bytes) -> bool:
    """True iff ``raw`` is well framed and its first MESSAGE-INTEGRITY-SHA256 (16-32 bytes
    in steps of 4) is the leading bytes of HMAC-SHA256 of the preceding bytes under ``key``
    (§14.6), compared in constant time."""
    attrs = _walk(raw)
    if attrs is None:
        return False
    for atype, off, alen in attrs:
        if atype == AttrType.MESSAGE_INTEGRITY_SHA256:
            if not SHA256_INTEGRITY_MIN <= alen <= SHA256_INTEGRITY_LENGTH or alen % 4:
                return False
            # The length field covers the attribute as sent (its own, possibly truncated,
            # length), and the comparison is of that many leading bytes.
            expected = _hmac_sha256(raw[: off - 4], key, alen)[:alen]
            return hmac.compare_digest(expected, bytes(raw[off : off + alen]))
    return False


def verify_fingerprint(raw: bytes | bytearray | memoryview) -> bool:
    """True iff ``raw`` is well framed and ends with a correct FINGERPRINT (§14.7)."""
    attrs = _walk(raw)
    if not attrs:
        return False
    atype, off, alen = attrs[-1]
    if atype != AttrType.FINGERPRINT or alen != 4:
        return False
    return int(_U32.unpack_from(raw, off)[0]) == fingerprint_value(raw[: off - 4])


# --- long-term credentials (§9.2) -------------------------------------------------------


def saslprep(text: str) -> str:
    """RFC 4013 SASLprep ("stored strings" profile), as RFC 5389 §15.3 prescribed."""
    # §2.1 mapping: non-ASCII spaces -> SPACE; "commonly mapped to nothing" -> removed.
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c)
    )
    # §2.2 normalisation: NFKC.
    out = unicodedata.normalize("NFKC", mapped)
    # §2.3 prohibited output and §2.5 unassigned code points (stored strings).
    for c in out:
        if (
            stringprep.in_table_c12(c)
            or stringprep.in_table_c21_c22(c)
            or stringprep.in_table_c3(c)
            or stringprep.in_table_c4(c)
            or stringprep.in_table_c5(c)
            or stringprep.in_table_c6(c)
            or stringprep.in_table_c7(c)
            or stringprep.in_table_c8(c)
            or stringprep.in_table_c9(c)
            or stringprep.in_table_a1(c)
        ):
            raise LocalProtocolError("string prohibited by SASLprep")
    # §2.4 bidi (RFC 3454 §6): RandALCat strings must not contain LCat and must start and
    # end with RandALCat.
    if any(stringprep.in_table_d1(c) for c in out):
        if any(stringprep.in_table_d2(c) for c in out) or not (
            stringprep.in_table_d1(out[0]) and stringprep.in_table_d1(out[-1])
        ):
            raise LocalProtocolError("string violates SASLprep bidi rules")
    return out


class PasswordAlgorithm(enum.IntEnum):
    """§18.5 STUN Password Algorithms registry."""

    MD5 = 0x0001
    SHA256 = 0x0002


def long_term_key(
    username: str, realm: str, password: str, algorithm: int = PasswordAlgorithm.MD5
) -> bytes:
    """§9.2.2 key = MD5(username ":" realm ":" SASLprep(password)) for the MD5 algorithm (the
    default, and the only one before RFC 8489), SHA-256 of the same for SHA-256 (§18.5.1.2)."""
    data = f"{username}:{realm}:{saslprep(password)}".encode()
    if algorithm == PasswordAlgorithm.SHA256:
        return hashlib.sha256(data).digest()
    if algorithm != PasswordAlgorithm.MD5:
        raise LocalProtocolError(f"unknown password algorithm {algorithm}")
    return hashlib.md5(data, usedforsecurity=False).digest()


#   0                   1                   2                   3
#   0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |          Algorithm           |  Algorithm Parameters Length   |
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
#  |                    Algorithm Parameters (variable)           ...   (§14.11, §14.12:
#  +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+   one, or a list of them)


def encode_password_algorithms(algorithms: tuple[int, ...]) -> bytes:
    """The value of PASSWORD-ALGORITHMS listing ``algorithms`` (no parameters: neither MD5
    nor SHA-256 has any)."""
    return b"".join(a.to_bytes(2, "big") + b"\x00\x00" for a in algorithms)


def parse_password_algorithm_untrusted(value: bytes) -> int:
    """The algorithm of a PASSWORD-ALGORITHM value (§14.12); StunError (400) if it is not
    one well-formed entry without parameters."""
    if len(value) != 4 or value[2:4] != b"\x00\x00":
        raise _bad("PASSWORD-ALGORITHM must be one algorithm without parameters")
    return (value[0] << 8) | value[1]


# --- the message ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Message:
    """One STUN message. ``attributes`` keeps wire order and repeats (only the first of a
    type is meaningful, §14); MESSAGE-INTEGRITY and FINGERPRINT appear in parsed messages
    but are recomputed, not copied, by ``encode``."""

    method: Method
    msg_class: Class
    transaction_id: bytes
    attributes: tuple[tuple[AttrType, AttrValue], ...] = ()
    #: Unknown comprehension-required attribute types, in order (answer 420, §6.3.1).
    unknown_required: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.transaction_id) != 12:
            raise LocalProtocolError("transaction id must be 12 bytes")

    # -- access --

    def get(self, attr: AttrType) -> AttrValue:
        """Value of the first ``attr``, or None (USE-CANDIDATE: use ``has``)."""
        for t, v in self.attributes:
            if t == attr:
                return v
        return None

    def get_all(self, attr: AttrType) -> list[AttrValue]:
        """Every value of ``attr``, in wire order (XOR-PEER-ADDRESS repeats, RFC 8656 §10)."""
        return [v for t, v in self.attributes if t == attr]

    def has(self, attr: AttrType) -> bool:
        return any(t == attr for t, _ in self.attributes)

    @property
    def username(self) -> str | None:
        v = self.get(AttrType.USERNAME)
        return v if isinstance(v, str) else None

    @property
    def priority(self) -> int | None:
        v = self.get(AttrType.PRIORITY)
        return v if isinstance(v, int) else None

    @property
    def ice_controlling(self) -> int | None:
        v = self.get(AttrType.ICE_CONTROLLING)
        return v if isinstance(v, int) else None

    @property
    def ice_controlled(self) -> int | None:
        v = self.get(AttrType.ICE_CONTROLLED)
        return v if isinstance(v, int) else None

    @property
    def use_candidate(self) -> bool:
        return self.has(AttrType.USE_CANDIDATE)

    @property
    def xor_mapped_address(self) -> Addr | None:
        v = self.get(AttrType.XOR_MAPPED_ADDRESS)
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            return (v[0], int(v[1]))
        return None

    @property
    def error_code(self) -> tuple[int, str] | None:
        v = self.get(AttrType.ERROR_CODE)
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int):
            return (v[0], str(v[1]))
        return None

    # -- codec --

    @classmethod
    def parse_untrusted(cls, buf: bytes | bytearray | memoryview) -> Message:
        """Parse one datagram. Raises only ``StunError`` (hint 400 unless noted). Integrity
        and fingerprint are *not* checked here: use ``verify_integrity``/``verify_fingerprint``
        on the same bytes (they need the key, which depends on USERNAME)."""
        n = len(buf)
        if n < HEADER_LENGTH:
            raise _bad("shorter than a STUN header")
        if n > MAX_MESSAGE:
            raise _bad("larger than a datagram")
        mtype, length, cookie, tid = _HEADER.unpack_from(buf, 0)
        if mtype & 0xC000:
            raise _bad("top two bits of a STUN message are zero (§5)")
        if cookie != COOKIE:
            # RFC 3489 messages have no cookie; we do not speak it.
            raise _bad("bad magic cookie")
        if length != n - HEADER_LENGTH or length & 3:
            raise _bad("length field does not match the datagram")
        method, klass = _split_type(mtype)
        if method not in _METHODS:
            raise _bad(f"unknown method 0x{method:03x}")
        attrs: list[tuple[AttrType, AttrValue]] = []
        unknown: list[int] = []
        seen_integrity = False
        seen_sha256 = False
        seen_fingerprint = False
        pos = HEADER_LENGTH
        while pos < n:
            if pos + 4 > n:
                raise _bad("truncated attribute header")
            atype, alen = _TLV.unpack_from(buf, pos)
            vstart = pos + 4
            vend = vstart + alen
            if vend > n:
                raise _bad("attribute runs past the end")
            pos = vend + _pad(alen)
            if seen_fingerprint:
                # §14.7: FINGERPRINT is always the last attribute.
                raise _bad("attribute after FINGERPRINT")
            if seen_sha256 and atype != AttrType.FINGERPRINT:
                # §14.6: after MESSAGE-INTEGRITY-SHA256 only FINGERPRINT counts.
                continue
            if seen_integrity and atype not in (
                AttrType.FINGERPRINT,
                AttrType.MESSAGE_INTEGRITY_SHA256,
            ):
                # §14.5: everything after MESSAGE-INTEGRITY except these two is ignored
                # (it is not authenticated).
                continue
            spec = ATTRIBUTES.get(atype)
            if spec is None:
                if atype < 0x8000:
                    unknown.append(atype)
                continue
            value = spec.decode(bytes(buf[vstart:vend]), tid)
            attrs.append((AttrType(atype), value))
            if atype == AttrType.MESSAGE_INTEGRITY:
                seen_integrity = True
            elif atype == AttrType.MESSAGE_INTEGRITY_SHA256:
                seen_sha256 = True
            elif atype == AttrType.FINGERPRINT:
                seen_fingerprint = True
        if pos != n:
            raise _bad("padding runs past the end")
        return cls(Method(method), Class(klass), tid, tuple(attrs), tuple(unknown))

    def encode(
        self,
        integrity_key: bytes | None = None,
        fingerprint: bool = True,
        *,
        padding: int = 0,
        integrity: str = "sha1",
    ) -> bytes:
        """Serialise, appending MESSAGE-INTEGRITY (when ``integrity_key`` is given) and
        FINGERPRINT (when ``fingerprint``) after the other attributes, in that order (§14.5,
        §14.7). ``integrity`` picks the integrity attribute(s): ``"sha1"``
        (MESSAGE-INTEGRITY), ``"sha256"`` (MESSAGE-INTEGRITY-SHA256, 32 bytes, §14.6) or
        ``"both"`` (MESSAGE-INTEGRITY then MESSAGE-INTEGRITY-SHA256). ``padding`` is the
        padding byte value: 0 per RFC 8489 §14; other values only exist to reproduce the
        RFC 5769 vectors (which pad with spaces)."""
        if integrity not in ("sha1", "sha256", "both"):
            raise LocalProtocolError(f"unknown integrity {integrity!r}")
        tid = self.transaction_id
        pad_byte = bytes((padding,))
        parts: list[bytes] = []
        for atype, value in self.attributes:
            if atype in _COMPUTED:
                continue
            v = ATTRIBUTES[atype].encode(value, tid)
            if len(v) > 0xFFFF:
                raise LocalProtocolError("attribute too long")
            parts.append(_TLV.pack(atype, len(v)) + v + pad_byte * _pad(len(v)))
        body = b"".join(parts)
        mtype = _message_type(self.method, self.msg_class)
        out = _HEADER.pack(mtype, len(body), COOKIE, tid) + body
        if integrity_key is not None and integrity != "sha256":
            mac = message_integrity(out, integrity_key)
            out = _HEADER.pack(mtype, len(out) - HEADER_LENGTH + 24, COOKIE, tid) + out[20:]
            out += _TLV.pack(AttrType.MESSAGE_INTEGRITY, INTEGRITY_LENGTH) + mac
        if integrity_key is not None and integrity != "sha1":
            mac = message_integrity_sha256(out, integrity_key)
            out = _HEADER.pack(mtype, len(out) - HEADER_LENGTH + 36, COOKIE, tid) + out[20:]
            out += _TLV.pack(AttrType.MESSAGE_INTEGRITY_SHA256, SHA256_INTEGRITY_LENGTH) + mac
        if fingerprint:
            crc = fingerprint_value(out)
            out = _HEADER.pack(mtype, len(out) - HEADER_LENGTH + 8, COOKIE, tid) + out[20:]
            out += _TLV.pack(AttrType.FINGERPRINT, 4) + _U32.pack(crc)
        if len(out) > MAX_MESSAGE:
            raise LocalProtocolError("message too long")
        return out

    def __bytes__(self) -> bytes:
        return self.encode()
