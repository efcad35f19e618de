"""SIP for phone calls: a sans-IO UA core (RFC 3261) in layers.

* :mod:`.message` — ``parse_untrusted`` / ``bytes(msg)``, typed header views, URIs, and
  :class:`StreamFramer` for TCP/TLS (§7, §18.3, §20, §25).
* :mod:`.policy` — the transport policy: which sources are served, refused or ignored.
* :mod:`.transaction` — the four §17 transaction machines and their timers (RFC 6026).
* :mod:`.dialog` — a call's dialog (§12): its state and the transition table every move
  goes through.
* :mod:`.auth` — digest answers to 401/407 (RFC 2617, RFC 8760).
* :mod:`.events` — what the endpoint hands its shell.
* :mod:`.ua` — :class:`SipEndpoint`: the UAS and UAC over the layers above (dispatch,
  CANCEL/BYE/re-INVITE/INFO/REFER, rate limits), with the house verbs.

SDP for phone media lives beside the WebRTC answerer: :mod:`appliance.proto.sdp.phone`.
No I/O, no clock: ``now`` is passed in.
"""

from __future__ import annotations

from appliance.proto.sip.auth import Credentials
from appliance.proto.sip.errors import SipError, SipUsageError
from appliance.proto.sip.message import (
    NameAddr,
    Request,
    Response,
    StreamFramer,
    Uri,
    Via,
    parse_untrusted,
)
from appliance.proto.sip.transaction import Timers
from appliance.proto.sip.ua import (
    CallAcked,
    CallAnswered,
    CallCancelled,
    CallEnded,
    CallFailed,
    CallProgress,
    Decision,
    Dtmf,
    EndpointConfig,
    IncomingCall,
    ReferProgress,
    ReInvite,
    ReInviteAnswered,
    SipEndpoint,
    Transmit,
    cidr_policy,
)

__all__ = [
    "CallAcked", "CallAnswered", "CallCancelled", "CallEnded", "CallFailed", "CallProgress",
    "Credentials", "Decision", "Dtmf", "EndpointConfig", "IncomingCall", "NameAddr",
    "ReInvite", "ReInviteAnswered", "ReferProgress", "Request", "Response", "SipEndpoint", "SipError",
    "SipUsageError", "StreamFramer", "Timers", "Transmit", "Uri", "Via", "cidr_policy", "parse_untrusted",
]
