"""The INIT ACK state cookie (RFC 9260 §5.1.3): everything the passive side needs to create
the association from a COOKIE ECHO, signed, so it holds no state before the echo arrives
(the SYN-flood defence of §5.1). The format is ours (§5.1.3 leaves it to the implementer):

    version u8 | created f64 | local tag | local initial TSN | peer tag | peer initial TSN |
    peer a_rwnd | peer OS u16 | peer MIS u16 | flags u8 (1 FORWARD TSN, 2 RE-CONFIG) |
    HMAC-SHA256 over everything before it (32 bytes)
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from appliance.proto.sctp.errors import SctpError

_BODY = struct.Struct("!BdIIIIIHHB")
_VERSION = 1
_MAC = 32
SIZE = _BODY.size + _MAC


@dataclass(frozen=True, slots=True)
class CookieState:
    created: float
    local_tag: int
    local_initial_tsn: int
    peer_tag: int
    peer_initial_tsn: int
    peer_rwnd: int
    peer_outbound_streams: int
    peer_inbound_streams: int
    peer_forward_tsn: bool
    peer_reconfig: bool

    def seal(self, secret: bytes) -> bytes:
        flags = (1 if self.peer_forward_tsn else 0) | (2 if self.peer_reconfig else 0)
        body = _BODY.pack(_VERSION, self.created, self.local_tag, self.local_initial_tsn,
                          self.peer_tag, self.peer_initial_tsn, self.peer_rwnd,
                          self.peer_outbound_streams, self.peer_inbound_streams, flags)
        return body + hmac.digest(secret, body, hashlib.sha256)

    @classmethod
    def open_untrusted(cls, cookie: bytes, secret: bytes, now: float,
                       lifetime: float) -> CookieState:
        """Verify the MAC (constant time) and age; raise SctpError(hint=...) otherwise."""
        if len(cookie) != SIZE:
            raise SctpError("state cookie has the wrong length", hint="bad-cookie")
        body, mac = cookie[: _BODY.size], cookie[_BODY.size :]
        if not hmac.compare_digest(mac, hmac.digest(secret, body, hashlib.sha256)):
            raise SctpError("state cookie MAC does not verify", hint="bad-cookie")
        ver, created, ltag, ltsn, ptag, ptsn, prwnd, pos, pmis, flags = _BODY.unpack(body)
        if ver != _VERSION:
            raise SctpError("state cookie version", hint="bad-cookie")
        # §5.1.5 step 3: a cookie older than its lifetime is stale (and one from the future
        # is forged or from another clock).
        if not (created - 1.0 <= now <= created + lifetime):
            raise SctpError("stale state cookie", hint="stale-cookie")
        return cls(created, ltag, ltsn, ptag, ptsn, prwnd, pos, pmis, bool(flags & 1),
                   bool(flags & 2))
