"""The error tree shared by every protocol core.

::

    ProtocolError
    ├── LocalProtocolError          the caller misused the API (a bug on our side)
    │   ├── sctp.SctpUsageError     (MessageTooLargeError, SendBufferFullError, ...)
    │   └── sip.SipUsageError       (answering a call twice, hanging up an unknown one)
    └── RemoteProtocolError         the peer sent bytes that break the protocol
        ├── stun.StunError          (hint: STUN error code, e.g. 400, 401, 487)
        ├── turn.TurnError          (hint: drop reason: ChannelData, TURN stream framing,
        │                            REST usernames; TURN's STUN messages raise StunError)
        ├── sctp.SctpError          (hint: drop reason for counters)
        ├── dtls.DtlsError          (hint: DTLS alert description)
        ├── proxy.ProxyError
        ├── framing.FramingError   (hint: drop reason, RFC 4571 over ICE-TCP)
        ├── rtp.RtpError
        ├── sdp.SdpError            (hint: HTTP status to answer with)
        ├── sip.SipError            (hint: SIP status to answer with, 400/413/414/505/513)
        ├── sse.SseError            (an LLM's event stream)
        └── ufrag.UfragError        (hint: drop reason for counters)

Every ``*_untrusted`` parser raises only its module's subclass of ``RemoteProtocolError``;
callers convert once, at the receive boundary (h11 ``_util.py`` style).
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every protocol error. ``hint`` carries a protocol-specific code."""

    def __init__(self, msg: str, *, hint: object = None) -> None:
        super().__init__(msg)
        self.hint = hint


class LocalProtocolError(ProtocolError):
    """The caller asked for something the protocol does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer's bytes broke the protocol; drop (and count) or alert."""
