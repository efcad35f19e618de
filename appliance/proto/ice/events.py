"""Outputs of the ICE machines (``poll_output()``): :class:`Transmit` and the events
(``poll_event()``); frozen, slotted, hashable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from appliance.proto.stun import Addr

__all__ = [
    "AuthFailure",
    "CheckFailed",
    "CheckReceived",
    "CheckSucceeded",
    "ConnectFailed",
    "ConsentExpired",
    "IceEvent",
    "IceOutput",
    "Nominated",
    "Transmit",
]


@dataclass(frozen=True, slots=True)
class Transmit:
    """``poll_output()``: one STUN datagram to send to ``addr``."""

    data: bytes
    addr: Addr


@dataclass(frozen=True, slots=True)
class CheckReceived:
    """Lite agent: a valid check arrived from ``addr`` (reported once per address and
    USE-CANDIDATE flag, not per packet; the counters count packets)."""

    addr: Addr
    nominated: bool


@dataclass(frozen=True, slots=True)
class Nominated:
    """The selected pair is now ``addr``: first nomination, NAT rebinding, the first
    nomination after an ICE restart, or — before that nomination — the first address to
    pass a check with the restart's new credentials. Media goes to ``addr`` from now on."""

    addr: Addr


@dataclass(frozen=True, slots=True)
class ConsentExpired:
    """RFC 7675 §5.1: no proof of consent for the consent timeout; the session is over."""


@dataclass(frozen=True, slots=True)
class AuthFailure:
    """Lite agent: a check for our ufrag failed authentication (bad or missing
    MESSAGE-INTEGRITY, or the wrong remote ufrag). ``reason`` is for logs and counters."""

    addr: Addr
    reason: str


@dataclass(frozen=True, slots=True)
class CheckSucceeded:
    """Client: an authenticated success response; ``mapped`` is its XOR-MAPPED-ADDRESS and
    ``rtt`` is measured from the first transmission of the request (seconds)."""

    addr: Addr
    mapped: Addr | None
    rtt: float


@dataclass(frozen=True, slots=True)
class CheckFailed:
    """Client: an authenticated error response (e.g. 487 Role Conflict)."""

    addr: Addr
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    """Client: the nominating check was never answered (its STUN transaction timed out)."""


IceEvent: TypeAlias = (
    CheckReceived
    | Nominated
    | ConsentExpired
    | AuthFailure
    | CheckSucceeded
    | CheckFailed
    | ConnectFailed
)

IceOutput: TypeAlias = Transmit | IceEvent
"""What ``poll_output()`` returns (besides None)."""
