"""PROXY protocol version 2 headers for datagrams (HAProxy PROXY protocol spec, §2.2).

Every datagram on the relay ↔ transceiver leg (and relay ↔ relay hops) starts with one of
these, naming the flow *as the client sees it*: source = client ip:port, destination = the
public relay address the client sent to — in both directions (DESIGN.md).

::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |       signature \\r\\n\\r\\n\\0\\r\\nQUIT\\n  (12 bytes)              |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | ver=2 |cmd=1  | fam   | proto |         length (addr+TLVs)    |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | IPv4: src addr (4) dst addr (4) src port (2) dst port (2)       |
    | IPv6: src addr (16) dst addr (16) src port (2) dst port (2)     |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | TLVs: type (1) length (2) value … — skipped unless asked for    |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    | the untouched client datagram                                   |

Family/transport byte (§2.2, ``address family << 4 | transport``): ``0x12`` UDP over IPv4,
``0x22`` UDP over IPv6, and for ICE-TCP flows (RFC 6544; the relay strips the RFC 4571
framing, each frame still travels as one datagram) ``0x11`` TCP over IPv4, ``0x21`` TCP over
IPv6 (DESIGN.md "Relay <-> transceiver datagram format"). Implemented: the PROXY command
with DGRAM or STREAM over INET/INET6, TLV walking. Deliberately omitted: the LOCAL command,
the UNSPEC and UNIX families (dropped with ``ProxyError``), and the v1 text format.

Hot path: the relay builds a flow's header once (:func:`encode_header`) and prepends it to
every payload; receivers parse with :func:`parse_transport_untrusted` (source, destination,
payload offset and the transport nibble) or :func:`parse_untrusted` (the same without the
transport, for readers that only care about the addresses), which return plain tuples.
"""

from __future__ import annotations

import ipaddress
import struct

from ..errors import RemoteProtocolError

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
VER_CMD_PROXY = 0x21
FAM_UDP4 = 0x12
FAM_UDP6 = 0x22
FAM_TCP4 = 0x11
FAM_TCP6 = 0x21
#: The transport nibble (low 4 bits of the family byte, §2.2).
DGRAM = 0x2
STREAM = 0x1
HEADER_V4_LEN = 16 + 12
HEADER_V6_LEN = 16 + 36
#: Conventional TLV for a relay id (PP2_TYPE_MIN_CUSTOM is 0xE0).
TLV_RELAY_ID = 0xE0

_FIXED = struct.Struct("!12sBBH")
_V4 = struct.Struct("!4s4sHH")
_V6 = struct.Struct("!16s16sHH")
_TLV = struct.Struct("!BH")

Address = tuple[str, int]


class StreamAddr(tuple[str, int]):
    """A client ``(host, port)`` that reached the relay over TCP (ICE-TCP, a STREAM header).

    It is an ordinary address everywhere one is used (indexing, ``sendto``, STUN's
    XOR-MAPPED-ADDRESS, :func:`encode_header`) but never *equal* to the plain tuple of the
    same host and port, and hashes apart from it: a UDP flow and a TCP flow from one
    ``ip:port`` (NATs keep separate port spaces per protocol) are two keys in every flow
    table that is keyed by client address (the relay's and the transceiver's), which is
    what "flows keyed by transport and address" means without changing those tables' type.
    """

    __slots__ = ()

    def __new__(cls, addr: tuple[str, int]) -> StreamAddr:
        return super().__new__(cls, (addr[0], addr[1]))

    def __eq__(self, other: object) -> bool:
        return type(other) is StreamAddr and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(("tcp", self[0], self[1]))

    def __repr__(self) -> str:
        return f"StreamAddr({tuple(self)!r})"


def transport_of(addr: Address) -> int:
    """:data:`STREAM` for a :class:`StreamAddr`, else :data:`DGRAM`."""
    return STREAM if type(addr) is StreamAddr else DGRAM


class ProxyError(RemoteProtocolError):
    """A datagram whose PROXY v2 header does not parse; ``hint`` is the drop reason."""


def _pack_ip(ip: str) -> tuple[int, bytes]:
    """(family byte, packed address) for a textual IPv4/IPv6 address."""
    if ":" in ip:
        return FAM_UDP6, ipaddress.IPv6Address(ip.split("%", 1)[0]).packed
    return FAM_UDP4, ipaddress.IPv4Address(ip).packed


def encode_header(
    src: Address, dst: Address, tlvs: bytes = b"", transport: int = DGRAM
) -> bytes:
    """The PROXY v2 header for a datagram from ``src`` (client) to ``dst`` (public address).

    Both addresses must be of the same family (a client reaching an IPv6 public address is
    IPv6). ``tlvs`` is appended as-is (use :func:`encode_tlv`). ``transport`` is
    :data:`DGRAM` (a UDP client) or :data:`STREAM` (an ICE-TCP client's frame).
    """
    if transport not in (DGRAM, STREAM):
        raise ValueError(f"transport must be DGRAM or STREAM, not {transport!r}")
    fam_s, src_b = _pack_ip(src[0])
    fam_d, dst_b = _pack_ip(dst[0])
    if fam_s != fam_d:
        raise ValueError("source and destination must be the same address family")
    if fam_s == FAM_UDP4:
        addrs = _V4.pack(src_b, dst_b, src[1], dst[1])
    else:
        addrs = _V6.pack(src_b, dst_b, src[1], dst[1])
    fam = (fam_s & 0xF0) | transport
    return _FIXED.pack(SIGNATURE, VER_CMD_PROXY, fam, len(addrs) + len(tlvs)) + addrs + tlvs


def encode_tlv(kind: int, value: bytes) -> bytes:
    return _TLV.pack(kind, len(value)) + value


def _ip4(b: bytes) -> str:
    return f"{b[0]}.{b[1]}.{b[2]}.{b[3]}"


def parse_transport_untrusted(
    buf: bytes | bytearray | memoryview,
) -> tuple[Address, Address, int, int]:
    """Parse a header: ``(source, destination, payload_offset, transport)``, ``transport``
    being :data:`DGRAM` or :data:`STREAM`.

    Raises only :class:`ProxyError`. TLVs are skipped (their bytes are bounds-checked as a
    block by the length field; use :func:`tlvs_untrusted` to read them).
    """
    n = len(buf)
    if n < 16:
        raise ProxyError("datagram shorter than a PROXY v2 header", hint="short")
    sig, ver_cmd, fam, length = _FIXED.unpack_from(buf, 0)
    if sig != SIGNATURE:
        raise ProxyError("no PROXY v2 signature", hint="signature")
    if ver_cmd != VER_CMD_PROXY:
        raise ProxyError(f"unsupported version/command 0x{ver_cmd:02x}", hint="command")
    end = 16 + length
    if end > n:
        raise ProxyError("PROXY header length exceeds datagram", hint="length")
    if fam == FAM_UDP4 or fam == FAM_TCP4:
        if length < 12:
            raise ProxyError("IPv4 address block too short", hint="length")
        s, d, sp, dp = _V4.unpack_from(buf, 16)
        return (_ip4(s), sp), (_ip4(d), dp), end, fam & 0x0F
    if fam == FAM_UDP6 or fam == FAM_TCP6:
        if length < 36:
            raise ProxyError("IPv6 address block too short", hint="length")
        s, d, sp, dp = _V6.unpack_from(buf, 16)
        return (
            (str(ipaddress.IPv6Address(s)), sp),
            (str(ipaddress.IPv6Address(d)), dp),
            end,
            fam & 0x0F,
        )
    raise ProxyError(f"unsupported family/transport 0x{fam:02x}", hint="family")


def parse_untrusted(buf: bytes | bytearray | memoryview) -> tuple[Address, Address, int]:
    """Parse a header: ``(source, destination, payload_offset)`` — DGRAM or STREAM alike
    (:func:`parse_transport_untrusted` says which). Raises only :class:`ProxyError`."""
    src, dst, end, _ = parse_transport_untrusted(buf)
    return src, dst, end


def tlvs_untrusted(buf: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
    """The TLVs of a header (after the addresses), in order. Raises only ProxyError."""
    _, _, end = parse_untrusted(buf)
    fam = buf[13]
    pos = 16 + (12 if fam >> 4 == FAM_UDP4 >> 4 else 36)
    out = []
    while pos < end:
        if pos + 3 > end:
            raise ProxyError("truncated TLV header", hint="tlv")
        kind, length = _TLV.unpack_from(buf, pos)
        pos += 3
        if pos + length > end:
            raise ProxyError("TLV value exceeds header", hint="tlv")
        out.append((kind, bytes(buf[pos : pos + length])))
        pos += length
    return out
