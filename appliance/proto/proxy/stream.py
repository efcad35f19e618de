"""The PROXY header a front proxy writes at the start of a TCP connection (HAProxy PROXY
protocol spec: §2.1, version 1 text; §2.2, version 2 binary).

A reverse proxy that owns port 443 and passes TLS through by SNI (HAProxy ``send-proxy`` /
``send-proxy-v2``, nginx ``proxy_protocol on``, cloud load balancers) hides the client
behind its own address; the relay's TCP listener believes this header from the addresses
an operator names (``--tcp-proxy-from``), and only from them, so the API's trust, the TURN
quotas and the ICE-TCP flows follow the real client (docs/turn.md "A proxy in front").

:func:`parse_stream_header_untrusted` is incremental: given the bytes read so far it
returns ``None`` while the header is incomplete, or ``(source, destination, length)``.
Accepted: v1 ``PROXY TCP4|TCP6 …`` (at most 107 bytes, §2.1) and v2 ``PROXY`` over
TCP/IPv4 or TCP/IPv6 (TLVs skipped, at most :data:`MAX_V2`). Refused with
:class:`~appliance.proto.proxy.ProxyError`: v1 ``UNKNOWN`` and v2 ``LOCAL`` (a connection
with no client behind it, e.g. the proxy's health check), UDP or UNIX families, anything
that is not a header — the caller closes the connection.
"""

from __future__ import annotations

import ipaddress
import struct

from . import SIGNATURE, ProxyError

Address = tuple[str, int]

V1_PREFIX = b"PROXY "
#: §2.1: "the maximum line length is 107 bytes including the CRLF".
MAX_V1 = 107
#: A v2 header we accept: the fixed 16 bytes, an IPv6 block and up to 200 bytes of TLVs.
MAX_V2 = 16 + 36 + 200
_FIXED = struct.Struct("!12sBBH")
_V4 = struct.Struct("!4s4sHH")
_V6 = struct.Struct("!16s16sHH")
_V2_PROXY = 0x21
_V2_LOCAL = 0x20
_TCP4, _TCP6 = 0x11, 0x21


def parse_stream_header_untrusted(buf: bytes | bytearray | memoryview
                                  ) -> tuple[Address, Address, int] | None:
    """``(source, destination, header_length)``, or None while more bytes are needed.
    Raises only :class:`ProxyError`."""
    data = bytes(buf[:MAX_V2])
    if not data:
        return None
    if data[0] == SIGNATURE[0]:
        return _v2(data)
    if data[0] == V1_PREFIX[0]:
        return _v1(data)
    raise ProxyError("the connection does not start with a PROXY header", hint="signature")


def _v1(data: bytes) -> tuple[Address, Address, int] | None:
    if not data.startswith(V1_PREFIX[: len(data)]):
        raise ProxyError("not a PROXY v1 line", hint="signature")
    end = data.find(b"\r\n", 0, MAX_V1)
    if end < 0:
        if len(data) >= MAX_V1:
            raise ProxyError("PROXY v1 line longer than 107 bytes", hint="length")
        return None
    try:
        words = data[:end].decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ProxyError("PROXY v1 line is not ASCII", hint="syntax") from None
    if words[1:2] == ["UNKNOWN"]:
        raise ProxyError("PROXY UNKNOWN: no client behind the connection", hint="local")
    if len(words) != 6 or words[1] not in ("TCP4", "TCP6"):
        raise ProxyError("PROXY v1 line is not 'PROXY TCP4|TCP6 src dst sport dport'",
                         hint="syntax")
    src, dst = _ip(words[2], words[1]), _ip(words[3], words[1])
    return (src, _port(words[4])), (dst, _port(words[5])), end + 2


def _ip(text: str, family: str) -> str:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ProxyError("PROXY v1 address does not parse", hint="syntax") from None
    if (addr.version == 4) != (family == "TCP4"):
        raise ProxyError("PROXY v1 address is not of its family", hint="syntax")
    return str(addr)


def _port(text: str) -> int:
    # §2.1: decimal, no leading zero, 0..65535.
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[0] == "0"):
        raise ProxyError("PROXY v1 port does not parse", hint="syntax")
    port = int(text)
    if port > 65535:
        raise ProxyError("PROXY v1 port out of range", hint="syntax")
    return port


def _v2(data: bytes) -> tuple[Address, Address, int] | None:
    if not data.startswith(SIGNATURE[: len(data)]):
        raise ProxyError("not a PROXY v2 signature", hint="signature")
    if len(data) < 16:
        return None
    _, ver_cmd, fam, length = _FIXED.unpack_from(data, 0)
    if ver_cmd == _V2_LOCAL:
        raise ProxyError("PROXY v2 LOCAL: no client behind the connection", hint="local")
    if ver_cmd != _V2_PROXY:
        raise ProxyError(f"unsupported PROXY v2 version/command 0x{ver_cmd:02x}", hint="command")
    end = 16 + length
    if end > MAX_V2:
        raise ProxyError("PROXY v2 header longer than we accept", hint="length")
    if fam == _TCP4:
        if length < 12:
            raise ProxyError("PROXY v2 IPv4 block too short", hint="length")
        if len(data) < end:
            return None
        s, d, sp, dp = _V4.unpack_from(data, 16)
        return (str(ipaddress.IPv4Address(s)), sp), (str(ipaddress.IPv4Address(d)), dp), end
    if fam == _TCP6:
        if length < 36:
            raise ProxyError("PROXY v2 IPv6 block too short", hint="length")
        if len(data) < end:
            return None
        s, d, sp, dp = _V6.unpack_from(data, 16)
        return (str(ipaddress.IPv6Address(s)), sp), (str(ipaddress.IPv6Address(d)), dp), end
    raise ProxyError(f"PROXY v2 family/transport 0x{fam:02x} is not TCP", hint="family")
