"""What :class:`~appliance.proto.sip.ua.SipEndpoint` hands its shell from ``poll_output()``:
datagrams to send (:class:`Transmit`) and the call events, frozen."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.proto.sip.message import Headers, Request

Addr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Transmit:
    data: bytes
    addr: Addr
    transport: str  # "udp" | "tcp" | "tls"


@dataclass(frozen=True, slots=True)
class IncomingCall:
    call_id: str
    invite: Request
    offer_sdp: bytes  # b"" for an offerless INVITE (the answer then comes in the ACK)
    sip_headers: Headers
    source: Addr
    transport: str


@dataclass(frozen=True, slots=True)
class CallProgress:
    call_id: str
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class CallAnswered:
    call_id: str
    answer_sdp: bytes


@dataclass(frozen=True, slots=True)
class CallAcked:
    call_id: str
    sdp: bytes  # the answer, for an offerless INVITE; else usually b""


@dataclass(frozen=True, slots=True)
class CallEnded:
    call_id: str
    reason: str
    by: str  # "local" | "remote"


@dataclass(frozen=True, slots=True)
class CallCancelled:
    call_id: str


@dataclass(frozen=True, slots=True)
class CallFailed:
    call_id: str
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class Dtmf:
    call_id: str
    digit: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class ReInvite:
    call_id: str
    offer_sdp: bytes


@dataclass(frozen=True, slots=True)
class ReInviteAnswered:
    """The peer's final answer to *our* re-INVITE (:meth:`SipEndpoint.reinvite`): status
    2xx with its SDP answer, or the refusal (491 glare, 488, ...): the old session stands."""

    call_id: str
    status: int
    answer_sdp: bytes


@dataclass(frozen=True, slots=True)
class ReferProgress:
    call_id: str
    status: int
    reason: str
    final: bool


Event = (IncomingCall | CallProgress | CallAnswered | CallAcked | CallEnded | CallCancelled
         | CallFailed | Dtmf | ReInvite | ReInviteAnswered | ReferProgress)
Output = Transmit | Event
