"""``SipError``: why a SIP message was refused, with the status code to answer it with.

``hint`` (and ``status``) is the SIP status a UAS answers a broken *request* with (RFC 3261
§21.4): 400 with a reason phrase naming the problem (§21.4.1: "the reason phrase SHOULD
identify the syntax problem in more detail"), 413 for a body over our limit, 414 for a
Request-URI over it, 505 for a version other than SIP/2.0, 513 for a message over our size
or header-count limit. ``reason`` is that reason phrase (short, printable ASCII, safe to put
on a status line). ``partial`` is the request as far as it parsed — the start line and the
raw header list — so the endpoint can still copy Via/From/To/Call-ID/CSeq into its 400
(§8.2.6); it is None when even the start line failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.proto.errors import LocalProtocolError, RemoteProtocolError

if TYPE_CHECKING:
    from appliance.proto.sip.message import RawMessage


class SipError(RemoteProtocolError):
    """The peer's bytes are not a SIP message we accept."""

    def __init__(self, reason: str, *, status: int = 400, partial: RawMessage | None = None) -> None:
        super().__init__(f"{status} {reason}", hint=status)
        self.status = status
        self.reason = reason
        self.partial = partial


class SipUsageError(LocalProtocolError):
    """The caller asked the endpoint for something its state does not allow (answering a
    call twice, hanging up an unknown call)."""
