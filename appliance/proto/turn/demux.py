"""Which datagrams on the media port are TURN's: pure tables, no parsing (docs/style.md
rule 7: demultiplex by the first bytes, never by a parser failing).

The relay's public port carries ICE STUN, DTLS, RTP/RTCP (RFC 7983) and, with TURN on, TURN:

* **ChannelData** — first byte 0x40-0x7F (channels 0x4000-0x7FFF, RFC 5766 §11; RFC 8656
  §12 and RFC 7983 §7 keep 0x40-0x4F and give the rest to QUIC, which this port does not
  carry): a range no other protocol on the port uses, so the first byte alone decides.
* **TURN's STUN messages** — first byte 0x00-0x03 like every STUN message, so the first *two*
  bytes decide: the message type (RFC 8489 §5) of an Allocate, Refresh, CreatePermission or
  ChannelBind request or a Send indication (RFC 8656 §18). ICE's Binding requests, the only
  other STUN a client sends us, have method 0x001.

``TURN_FIRST[b]`` (ChannelData) and ``TURN_TYPE[(b0 << 8) | b1]`` (STUN) are tables the hot
path indexes; :func:`is_turn` is the same decision as a function.
"""

from __future__ import annotations

from appliance.proto.stun.message import Class, Method, message_type

__all__ = ["CLIENT_TYPES", "TURN_FIRST", "TURN_TYPE", "is_turn"]

#: Message types a TURN client sends (RFC 8656 §18): its requests and the Send indication.
CLIENT_TYPES = frozenset(
    [message_type(m, Class.REQUEST) for m in (
        Method.ALLOCATE, Method.REFRESH, Method.CREATE_PERMISSION, Method.CHANNEL_BIND)]
    + [message_type(Method.SEND, Class.INDICATION)]
)
#: ``TURN_FIRST[b]``: a datagram starting with ``b`` is ChannelData (0x40-0x7F).
TURN_FIRST = bytes(1 if 0x40 <= b <= 0x7F else 0 for b in range(256))
#: ``TURN_TYPE[t]``: a STUN message of type ``t`` (its first two bytes) is a TURN client's.
TURN_TYPE = bytes(1 if t in CLIENT_TYPES else 0 for t in range(0x10000))


def is_turn(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is for the TURN server: ChannelData, or a TURN client's STUN
    message (the first two bytes; the message itself is parsed by the server)."""
    if not data:
        return False
    if TURN_FIRST[data[0]]:
        return True
    return len(data) >= 2 and bool(TURN_TYPE[(data[0] << 8) | data[1]])
