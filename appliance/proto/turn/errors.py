"""``TurnError``: bytes that break TURN framing outside STUN itself (RFC 8656 §12).

STUN messages, TURN's included, are parsed by :mod:`appliance.proto.stun` and raise
``StunError``; this error is for what is TURN's alone: ChannelData messages, the stream
framing of TURN over TCP/TLS, and TURN REST API usernames. ``hint`` names the drop reason
for counters (``"channel-short"``, ``"channel-range"``, ``"frame-too-long"``, ...).
"""

from __future__ import annotations

from appliance.proto.errors import RemoteProtocolError


class TurnError(RemoteProtocolError):
    """The peer sent TURN framing we do not accept; drop (and count by ``hint``)."""

    def __init__(self, msg: str, *, hint: object = "malformed") -> None:
        super().__init__(msg, hint=hint)
