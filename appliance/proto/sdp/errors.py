"""``SdpError``: why an offer or sdpfrag was refused, and the HTTP status to answer with.

Status choices (RFC 9110 §15.5; RFC 9725 leaves the exact 4xx to the server):

==========  ======================================================================
400         the body is not SDP (RFC 8866 syntax) or an attribute value breaks its
            grammar: code ``malformed``.
413         the body exceeds our limits (bytes, lines, m= sections): ``too-large``.
            413 "Content Too Large" is what an HTTP client understands as "send less".
422         well-formed SDP we cannot serve ("Unprocessable Content", the HTTP
            analogue of SIP 488 Not Acceptable Here). 406 is deliberately not used:
            it is about the request's Accept header, not its body.
==========  ======================================================================

``code`` is a short stable token for machines (metrics labels, problem+json ``type``);
``detail`` is for humans and names the offending line when there is one.
"""

from __future__ import annotations

from typing import Final

from appliance.proto.errors import RemoteProtocolError

STATUS_MALFORMED: Final = 400
STATUS_TOO_LARGE: Final = 413
STATUS_UNSERVABLE: Final = 422

#: code -> HTTP status. Every code an SdpError may carry is listed here.
CODES: Final[dict[str, int]] = {
    "malformed": STATUS_MALFORMED,
    "too-large": STATUS_TOO_LARGE,
    "no-audio": STATUS_UNSERVABLE,  # no usable audio m= section
    "no-opus": STATUS_UNSERVABLE,  # audio offered, but not Opus 48000/2
    "unsupported-proto": STATUS_UNSERVABLE,  # audio not over UDP/TLS/RTP/SAVP(F)
    "no-fingerprint": STATUS_UNSERVABLE,  # no a=fingerprint with a hash we verify
    "no-ice-credentials": STATUS_UNSERVABLE,  # a=ice-ufrag / a=ice-pwd missing
    "bad-setup": STATUS_UNSERVABLE,  # a=setup:holdconn: a call needs its DTLS connection
    "no-rtcp-mux": STATUS_UNSERVABLE,  # we have one port: RTCP must be muxed (RFC 5761)
    "unsupported-application": STATUS_UNSERVABLE,  # not UDP/DTLS/SCTP webrtc-datachannel
    "bad-sctp-port": STATUS_UNSERVABLE,  # a=sctp-port:0
    "not-bundled": STATUS_UNSERVABLE,  # data channel not on the audio's BUNDLE transport
}


class SdpError(RemoteProtocolError):
    """The peer's SDP cannot be parsed or served.

    ``hint`` (and ``status``) is the HTTP status to answer with; ``code`` is from
    :data:`CODES`; ``line`` is the 1-based line number when one line is to blame.
    """

    def __init__(self, code: str, detail: str, *, line: int | None = None) -> None:
        status = CODES.get(code, STATUS_MALFORMED)
        msg = f"{code}: {detail}" if line is None else f"{code}: line {line}: {detail}"
        super().__init__(msg, hint=status)
        self.code = code
        self.status = status
        self.detail = detail
        self.line = line
