"""Flow vouching on the internal leg: "is this client yours?" / "yes, it is mine" (issue 20).

A relay worker that receives media from a client address it has no flow for (it was just
started, or the ``SO_REUSEPORT`` hash moved the client to it when another worker died)
asks its transceivers; the transceiver that serves the client — it learnt the address from
an ICE check that proved the session's password (RFC 8445 §7.3) — vouches for it, and the
relay installs the flow. Nothing a client sends can create a flow this way: the client only
triggers a *question*; the answer comes from a transceiver and is authenticated with the
routing secret the relays and transceivers already share (DESIGN.md "Server ufrag").

Both messages are PROXY protocol v2 headers (HAProxy spec §2.2) with the **LOCAL** command
(``0x20``: "not relayed, the proxy's own traffic"), so every reader of the fixed datagram
format (DESIGN.md "Relay ↔ transceiver datagram format") drops them as ``command`` errors
unless it knows them. The address block names the flow exactly as a relayed datagram's
would (source = client, destination = the public relay address); one TLV carries the rest::

    PROXY v2 signature | 0x20 | fam 0x12/0x22 | length | client, public | TLV 0xE1:
        kind (1: QUERY relay->transceiver, 2: VOUCH transceiver->relay)
        transceiver id (2, big endian: the one asked / the one answering)
        nonce (8: the relay's, echoed in the answer: no replay, no unsolicited answer)
        mac (16: HMAC-SHA256 over every byte before it, key derived from a routing secret)

A client that reaches the relay over TCP (ICE-TCP, a :class:`~appliance.proto.proxy.StreamAddr`:
a connection the relay's keeper handed to the worker that took over after a kill) is named
with the STREAM family byte (``0x11``/``0x21``) as its relayed datagrams are, and parsed
back as a ``StreamAddr``, so the transceiver finds the TCP flow, not a UDP one from the
same ``ip:port``.

No payload follows. Omitted on purpose: negative answers (silence is one: the relay's
look-up simply expires), batching (one client per datagram keeps the parser trivial; a
restart costs one small datagram per flow and transceiver).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import RemoteProtocolError
from . import (
    FAM_TCP4,
    FAM_TCP6,
    FAM_UDP4,
    FAM_UDP6,
    SIGNATURE,
    STREAM,
    Address,
    ProxyError,
    StreamAddr,
    encode_header,
    transport_of,
)
from . import parse_untrusted as _parse_proxy

__all__ = ["TLV_VOUCH", "VER_CMD_LOCAL", "Kind", "Vouch", "VouchError", "derive_key",
           "encode", "parse_untrusted"]

VER_CMD_LOCAL = 0x20
#: The TLV type of the vouch block (PP2_TYPE_MIN_CUSTOM is 0xE0, the relay id).
TLV_VOUCH = 0xE1
MAC_LEN = 16
NONCE_LEN = 8
_BODY = struct.Struct("!BH8s")  # kind, transceiver id, nonce
VALUE_LEN = _BODY.size + MAC_LEN
#: The whole datagram: fixed 16 + addresses + TLV header 3 + value.
LEN_V4 = 16 + 12 + 3 + VALUE_LEN
LEN_V6 = 16 + 36 + 3 + VALUE_LEN
_LABEL = b"appliance flow vouch v1"


class VouchError(RemoteProtocolError):
    """A datagram that is not a well-formed, authentic vouch message (``hint`` says why)."""


class Kind(enum.IntEnum):
    QUERY = 1
    VOUCH = 2


@dataclass(frozen=True, slots=True)
class Vouch:
    kind: Kind
    client: Address
    public: Address
    transceiver: int
    nonce: bytes


def derive_key(secret: bytes) -> bytes:
    """The MAC key of one routing secret (a separate key, so a vouch MAC is never a valid
    ufrag MAC or the other way round)."""
    return hmac.new(secret, _LABEL, hashlib.sha256).digest()


def _mac(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()[:MAC_LEN]


def encode(msg: Vouch, key: bytes) -> bytes:
    """The datagram of ``msg``, authenticated with ``key`` (:func:`derive_key`)."""
    if len(msg.nonce) != NONCE_LEN or not 0 <= msg.transceiver <= 0xFFFF:
        raise ValueError("nonce must be 8 bytes and transceiver 0..65535")
    tlv = struct.pack("!BH", TLV_VOUCH, VALUE_LEN) + _BODY.pack(
        int(msg.kind), msg.transceiver, msg.nonce)
    proxy = bytearray(encode_header(msg.client, msg.public, tlv + bytes(MAC_LEN),
                                    transport_of(msg.client)))
    proxy[12] = VER_CMD_LOCAL
    body = len(proxy) - MAC_LEN
    proxy[body:] = _mac(key, memoryview(proxy)[:body])
    return bytes(proxy)


def is_local(buf: bytes | bytearray | memoryview) -> bool:
    """True if ``buf`` has the PROXY v2 signature and the LOCAL command (a vouch candidate:
    a first-look test for the receive loops, which then call :func:`parse_untrusted`)."""
    return len(buf) >= 16 and buf[12] == VER_CMD_LOCAL and bytes(buf[:12]) == SIGNATURE


def parse_untrusted(buf: bytes | bytearray | memoryview, keys: Sequence[bytes]) -> Vouch:
    """Parse and authenticate a vouch datagram against any of ``keys``. Raises only
    :class:`VouchError`."""
    n = len(buf)
    if n < 16 or bytes(buf[:12]) != SIGNATURE:
        raise VouchError("no PROXY v2 signature", hint="signature")
    if buf[12] != VER_CMD_LOCAL:
        raise VouchError("not a LOCAL header", hint="command")
    fam = buf[13]
    if fam in (FAM_UDP4, FAM_TCP4):
        want, addr_len = LEN_V4, 12
    elif fam in (FAM_UDP6, FAM_TCP6):
        want, addr_len = LEN_V6, 36
    else:
        raise VouchError(f"unsupported family 0x{fam:02x}", hint="family")
    length = (buf[14] << 8) | buf[15]
    if n != want or length != want - 16:
        raise VouchError("wrong vouch length", hint="length")
    t = 16 + addr_len
    if buf[t] != TLV_VOUCH or ((buf[t + 1] << 8) | buf[t + 2]) != VALUE_LEN:
        raise VouchError("no vouch TLV", hint="tlv")
    body = n - MAC_LEN
    mac = bytes(buf[body:])
    signed = memoryview(bytes(buf[:body]))
    if not any(hmac.compare_digest(_mac(k, signed), mac) for k in keys):
        raise VouchError("vouch MAC does not verify", hint="mac")
    kind_b, ident, nonce = _BODY.unpack_from(buf, t + 3)
    try:
        kind = Kind(kind_b)
    except ValueError:
        raise VouchError(f"unknown vouch kind {kind_b}", hint="kind") from None
    # The address block parses like a relayed datagram's (same family byte, same layout).
    head = bytearray(buf[: 16 + addr_len])
    head[12], head[14], head[15] = 0x21, 0, addr_len
    try:
        client, public, _ = _parse_proxy(head)
    except ProxyError as exc:  # pragma: no cover - the length and family were checked
        raise VouchError(str(exc), hint="address") from None
    if fam & 0x0F == STREAM:
        client = StreamAddr(client)
    return Vouch(kind, client, public, ident, nonce)
