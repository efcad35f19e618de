"""``RtpError``: an RTP or RTCP packet that does not parse.

``hint`` names the drop reason for counters (e.g. ``"truncated"``, ``"version"``,
``"padding"``, ``"length"``), so the shell can count drops by reason without parsing text.
"""

from __future__ import annotations

from appliance.proto.errors import RemoteProtocolError


class RtpError(RemoteProtocolError):
    """The peer sent an RTP/RTCP packet that breaks RFC 3550; drop and count it."""

    def __init__(self, msg: str, *, hint: object = "malformed") -> None:
        super().__init__(msg, hint=hint)
