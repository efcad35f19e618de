"""Events an :class:`~appliance.proto.sctp.association.SctpAssociation` reports through
``poll_event()``, and the :class:`Transmit` that ``poll_output()`` wraps a packet in
(STYLE.md rule 3: frozen, slotted)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CloseCause(enum.Enum):
    SHUTDOWN = "shutdown"  # graceful SHUTDOWN sequence completed (RFC 9260 §9.2)
    LOCAL_ABORT = "local-abort"  # abort() was called
    PEER_ABORT = "peer-abort"  # the peer sent ABORT
    TIMEOUT = "timeout"  # too many retransmissions: the peer stopped answering (§8.3)
    PROTOCOL_ERROR = "protocol-error"  # we aborted: the peer broke a limit or the protocol


@dataclass(frozen=True, slots=True)
class Connected:
    """The association is ESTABLISHED (COOKIE-ECHO/COOKIE-ACK done, RFC 9260 §5.1)."""

    max_outbound_streams: int
    max_inbound_streams: int
    partial_reliability: bool  # the peer supports FORWARD TSN (RFC 3758)
    stream_reset: bool  # the peer supports RE-CONFIG (RFC 6525)


@dataclass(frozen=True, slots=True)
class MessageReceived:
    stream_id: int
    ppid: int
    data: bytes
    unordered: bool = False


@dataclass(frozen=True, slots=True)
class StreamsReset:
    """Streams whose SSNs were reset (RFC 6525): ``incoming`` by the peer's request,
    ``outgoing`` by our ``reset_streams()`` once the peer performed it."""

    incoming: tuple[int, ...] = ()
    outgoing: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class StreamResetFailed:
    """The peer refused our Outgoing SSN Reset Request (RFC 6525 §4.4 result)."""

    stream_ids: tuple[int, ...]
    result: int


@dataclass(frozen=True, slots=True)
class BufferedAmountLow:
    """Unsent bytes queued on ``stream_id`` fell to its low-water threshold (or below)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class Closed:
    cause: CloseCause
    reason: str


@dataclass(frozen=True, slots=True)
class Transmit:
    """``poll_output()``: one SCTP packet to send as DTLS application data."""

    data: bytes


Event = Connected | MessageReceived | StreamsReset | StreamResetFailed | BufferedAmountLow | \
    Closed
Output = Transmit | Event
"""What ``SctpAssociation.poll_output()`` returns (besides None)."""
