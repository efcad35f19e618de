"""A call's dialog (RFC 3261 §12): its state as an enum with a transition table that raises
on an illegal move (h11's style), the dialog's identifiers and sequence numbers, and the
small in-dialog body formats (INFO's dtmf-relay, NOTIFY's sipfrag)."""

from __future__ import annotations

import enum
import secrets

from appliance.proto.sip import auth
from appliance.proto.sip.errors import SipUsageError
from appliance.proto.sip.message import Request, parse_uri_untrusted
from appliance.proto.sip.transaction import ServerTransaction

Addr = tuple[str, int]


class CallState(enum.Enum):
    INCOMING = "incoming"  # INVITE received, 100 sent
    EARLY = "early"  # 180 sent
    ANSWERED = "answered"  # 200 sent, waiting for ACK
    OUTGOING = "outgoing"  # INVITE sent
    OUT_EARLY = "out-early"  # 1xx received
    CONFIRMED = "confirmed"
    ENDED = "ended"


#: Every move a call's dialog may make (RFC 3261 §12-§15, §9 CANCEL): the UAS side
#: rings, answers and waits for the ACK; the UAC side hears 1xx and a 2xx; either ends from
#: anywhere but the end. A second 180 or 183 leaves an early call early.
TRANSITIONS: dict[CallState, frozenset[CallState]] = {
    CallState.INCOMING: frozenset({CallState.EARLY, CallState.ANSWERED, CallState.ENDED}),
    CallState.EARLY: frozenset({CallState.EARLY, CallState.ANSWERED, CallState.ENDED}),
    CallState.ANSWERED: frozenset({CallState.CONFIRMED, CallState.ENDED}),
    CallState.OUTGOING: frozenset({CallState.OUT_EARLY, CallState.CONFIRMED, CallState.ENDED}),
    CallState.OUT_EARLY: frozenset({CallState.CONFIRMED, CallState.ENDED}),
    CallState.CONFIRMED: frozenset({CallState.ENDED}),
    CallState.ENDED: frozenset(),
}


class IllegalTransition(SipUsageError):
    """A move :data:`TRANSITIONS` does not have: a bug in the endpoint, never the peer's
    doing (the peer's messages are judged before any move)."""


class Dialog:
    """One call's dialog state (§12): mutable, internal to the endpoint. ``state`` changes
    only through :meth:`move`, which checks :data:`TRANSITIONS`."""

    __slots__ = ("ack_wire", "addr", "auth_tried", "bye_after_ack", "call_id", "cancel_pending",
                 "credentials", "invite", "invite_txn", "local_hdr", "local_seq", "local_tag",
                 "outbound", "remote_hdr", "remote_seq", "remote_tag", "remote_target",
                 "reinvite_txn", "ring_deadline", "route_set", "sip_call_id", "_state",
                 "transport")

    def __init__(self, call_id: str, sip_call_id: str, addr: Addr, transport: str,
                 outbound: bool) -> None:
        self.call_id = call_id
        self.sip_call_id = sip_call_id
        self.addr = addr
        self.transport = transport
        self.outbound = outbound
        self._state = CallState.OUTGOING if outbound else CallState.INCOMING
        self.local_tag = secrets.token_hex(6)
        self.remote_tag: str | None = None
        self.local_hdr = ""  # our From/To value (with our tag)
        self.remote_hdr = ""
        self.remote_target = parse_uri_untrusted("sip:invalid")
        self.route_set: tuple[str, ...] = ()
        self.local_seq = secrets.randbelow(2**16) + 1
        self.remote_seq: int | None = None
        self.invite: Request | None = None
        self.invite_txn: ServerTransaction | None = None
        self.reinvite_txn: ServerTransaction | None = None
        self.ack_wire: bytes | None = None
        self.credentials: auth.Credentials | None = None
        self.auth_tried = False
        self.cancel_pending = False
        self.bye_after_ack = False
        self.ring_deadline: float | None = None

    @property
    def state(self) -> CallState:
        return self._state

    def move(self, to: CallState) -> None:
        """The one way ``state`` changes; :class:`IllegalTransition` for a move the table
        does not have."""
        if to not in TRANSITIONS[self._state]:
            raise IllegalTransition(f"call {self.call_id}: {self._state.value} -> {to.value}")
        self._state = to


def dtmf_relay(body: bytes) -> tuple[str, int] | None:
    """``application/dtmf-relay`` (``Signal=5\\r\\nDuration=160``), the de facto INFO
    format (no RFC; Cisco's, which every trunk copies)."""
    digit, duration = None, 250
    for line in body.decode("ascii", "replace").splitlines():
        k, _, v = line.partition("=")
        k, v = k.strip().lower(), v.strip()
        if k == "signal" and len(v) == 1 and v in "0123456789*#ABCDabcd":
            digit = v.upper()
        elif k == "duration" and v.isdigit() and len(v) < 6:
            duration = int(v)
    return (digit, duration) if digit else None


def sipfrag_status(body: bytes) -> tuple[int, str] | None:
    """RFC 3420 message/sipfrag in a REFER NOTIFY (RFC 3515 §2.4.5): its status line."""
    first = body.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    parts = first.split(" ", 2)
    if len(parts) >= 2 and parts[0].upper() == "SIP/2.0" and parts[1].isdigit() and len(parts[1]) == 3:
        return int(parts[1]), parts[2] if len(parts) > 2 else ""
    return None
