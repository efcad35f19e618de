"""SCTP over DTLS for WebRTC data channels, sans-IO: RFC 9260 essentials, RFC 8261,
RFC 3758 (FORWARD TSN), RFC 6525 (stream reset); DCEP (RFC 8832) in :mod:`.datachannel`.

See docs/sctp.md for the design note and :mod:`.association` for the RFC map.
"""

from appliance.proto.sctp.association import SctpAssociation, SctpStats, State
from appliance.proto.sctp.errors import (
    MessageTooLargeError,
    SctpError,
    SctpUsageError,
    SendBufferFullError,
    StreamClosedError,
)
from appliance.proto.sctp.events import (
    BufferedAmountLow,
    CloseCause,
    Closed,
    Connected,
    Event,
    MessageReceived,
    Output,
    StreamResetFailed,
    StreamsReset,
    Transmit,
)

__all__ = [
    "BufferedAmountLow",
    "CloseCause",
    "Closed",
    "Connected",
    "Event",
    "MessageReceived",
    "MessageTooLargeError",
    "Output",
    "SctpAssociation",
    "SctpError",
    "SctpStats",
    "SctpUsageError",
    "SendBufferFullError",
    "State",
    "StreamClosedError",
    "StreamResetFailed",
    "StreamsReset",
    "Transmit",
]
