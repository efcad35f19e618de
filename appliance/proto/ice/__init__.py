"""ICE for the appliance (RFC 8445, RFC 7675): sans-IO state machines.

* ``IceLiteAgent`` — the transceiver's side: ICE-lite, always controlled, answers checks,
  tracks nomination and consent (``lite``).
* ``IceClient`` — a one-pair controlling agent for the load generator and tests
  (``client``).
* outputs (``events``) — what ``poll_output()`` returns: ``Transmit`` and the events.
"""

from __future__ import annotations

from appliance.proto.ice.client import HOST_PRIORITY, ClientState, IceClient
from appliance.proto.ice.events import (
    AuthFailure,
    CheckFailed,
    CheckReceived,
    CheckSucceeded,
    ConnectFailed,
    ConsentExpired,
    IceEvent,
    IceOutput,
    Nominated,
    Transmit,
)
from appliance.proto.ice.lite import IceLiteAgent, IceState

__all__ = [
    "HOST_PRIORITY",
    "AuthFailure",
    "CheckFailed",
    "CheckReceived",
    "CheckSucceeded",
    "ClientState",
    "ConnectFailed",
    "ConsentExpired",
    "IceClient",
    "IceEvent",
    "IceLiteAgent",
    "IceOutput",
    "IceState",
    "Nominated",
    "Transmit",
]
