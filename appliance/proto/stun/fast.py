"""Hot-path STUN helpers for the relay (RFC 8489 §5, §6.3.1, §14.2, §14.3, §14.7).

The relay sees every first packet of every flow, including floods of junk, so these are pure
functions over ``bytes``/``memoryview`` that walk the attribute TLVs in place: no ``Message``
object, no decoding of values, one ``bytes`` copy for the USERNAME we return.

* ``peek_username_untrusted`` accepts only a well-formed Binding *request* (type 0x0001, magic
  cookie, length field equal to the datagram and a multiple of 4, every attribute inside the
  datagram, §5 and §14) and returns the raw USERNAME value (first occurrence before
  MESSAGE-INTEGRITY, §14.5). It neither checks MESSAGE-INTEGRITY (the relay has no password)
  nor FINGERPRINT (a plain discovery request need not carry one).
* ``reflexive_response`` answers a plain Binding request (server-reflexive discovery, §6.3.1
  and RFC 8445 §5.1.1.1) with XOR-MAPPED-ADDRESS and FINGERPRINT only.

Amplification bound: the response is a 20-byte header + XOR-MAPPED-ADDRESS (12 bytes for IPv4,
24 for IPv6) + FINGERPRINT (8) = 40 or 52 bytes, and a request is at least a 20-byte header,
so **the response is never larger than the request + 32 bytes** (a factor below 2.6 for the
smallest possible request, and below 1.0 once the request carries 32 bytes of attributes). No
SOFTWARE, no echoing of request attributes: nothing an attacker sends makes the answer grow.

Deliberately omitted: answering 420 for unknown comprehension-required attributes in a plain
request (the relay never answers anything but a bare discovery request) and RFC 5780 NAT
behaviour discovery (OTHER-ADDRESS, CHANGE-REQUEST).
"""

from __future__ import annotations

import functools
import ipaddress

from appliance.proto.errors import LocalProtocolError
from appliance.proto.stun.message import (
    COOKIE,
    COOKIE_BYTES,
    HEADER_LENGTH,
    Addr,
    StunError,
    fingerprint_value,
)

__all__ = ["MAX_AMPLIFICATION", "peek_username_untrusted", "reflexive_response"]

#: ``len(reflexive_response(req, addr)) <= len(req) + MAX_AMPLIFICATION`` for every accepted
#: request (see the module docstring).
MAX_AMPLIFICATION = 32

_USERNAME = 0x0006
_MESSAGE_INTEGRITY = 0x0008
# Binding success response header bytes 0-1 (§5: method 0x001, class 0b10).
_SUCCESS_TYPE = b"\x01\x01"


def _walk_binding_request(buf: bytes | bytearray | memoryview) -> bytes | None:
    n = len(buf)
    # §5: Binding request is type 0x0001 (which also covers "top two bits zero").
    if n < HEADER_LENGTH or buf[0] != 0 or buf[1] != 1:
        raise StunError("not a STUN Binding request", hint=None)
    if buf[4:8] != COOKIE_BYTES:
        raise StunError("bad magic cookie", hint=None)
    length = (buf[2] << 8) | buf[3]
    if length != n - HEADER_LENGTH or length & 3:
        raise StunError("length field does not match the datagram", hint=None)
    username: bytes | None = None
    after_integrity = False
    pos = HEADER_LENGTH
    # Invariant: n - pos is a multiple of 4, so while pos < n a 4-byte TLV header fits.
    while pos < n:
        atype = (buf[pos] << 8) | buf[pos + 1]
        alen = (buf[pos + 2] << 8) | buf[pos + 3]
        end = pos + 4 + alen
        if end > n:
            raise StunError("attribute runs past the end", hint=None)
        if atype == _USERNAME:
            # First USERNAME only, and never one after MESSAGE-INTEGRITY (§14.5: not covered
            # by the MAC, so the transceiver would not use it either).
            if username is None and not after_integrity:
                username = bytes(buf[pos + 4 : end])
        elif atype == _MESSAGE_INTEGRITY:
            after_integrity = True
        pos = end + (-alen & 3)
    if pos != n:
        raise StunError("padding runs past the end", hint=None)
    return username


def peek_username_untrusted(buf: bytes | bytearray | memoryview) -> bytes | None:
    """USERNAME of a well-formed Binding request, or None if it has no USERNAME.

    Raises ``StunError`` (hint None: drop, do not answer) for anything that is not a
    well-formed Binding request."""
    return _walk_binding_request(buf)


@functools.lru_cache(maxsize=4096)
def _packed(ip: str) -> bytes:
    # Parsing the textual address dominates the cost; flows repeat, so cache it.
    try:
        return ipaddress.ip_address(ip).packed
    except ValueError:
        raise LocalProtocolError(f"not an IP address: {ip!r}") from None


def reflexive_response(buf: bytes | bytearray | memoryview, addr: Addr) -> bytes:
    """Binding success response to the Binding request ``buf``: XOR-MAPPED-ADDRESS = ``addr``
    and FINGERPRINT. Raises ``StunError`` if ``buf`` is not a well-formed Binding request.

    The result is at most ``len(buf) + MAX_AMPLIFICATION`` bytes long."""
    _walk_binding_request(buf)
    ip, port = addr
    if not 0 <= port <= 0xFFFF:
        raise LocalProtocolError(f"port out of range: {port}")
    packed = _packed(ip)
    tid = bytes(buf[8:HEADER_LENGTH])
    # §14.2: X-Port = port ^ (cookie >> 16); X-Address = address ^ (cookie || tid).
    xaddr = (
        int.from_bytes(packed, "big") ^ int.from_bytes((COOKIE_BYTES + tid)[: len(packed)], "big")
    ).to_bytes(len(packed), "big")
    xport = (port ^ (COOKIE >> 16)).to_bytes(2, "big")
    if len(packed) == 4:
        xma = b"\x00\x20\x00\x08\x00\x01" + xport + xaddr
        body_len = b"\x00\x14"  # 12 (XOR-MAPPED-ADDRESS) + 8 (FINGERPRINT)
    else:
        xma = b"\x00\x20\x00\x14\x00\x02" + xport + xaddr
        body_len = b"\x00\x20"  # 24 + 8
    msg = _SUCCESS_TYPE + body_len + COOKIE_BYTES + tid + xma
    # fingerprint_value() sets the length field to cover FINGERPRINT itself (§14.7).
    return msg + b"\x80\x28\x00\x04" + fingerprint_value(msg).to_bytes(4, "big")
