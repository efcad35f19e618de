"""TURN for clients (issue 40 item 3): what signaling hands a client so it can reach the
relays' TURN server, in the shapes its ecosystem expects.

The relays run TURN by default (docs/turn.md) and accept TURN REST API credentials minted
from a secret they share with signaling (``proto/turn/credentials.py``: derived from the
routing secret, or ``--turn-secret-file``). Signaling mints one per hand-out, stateless,
and never logs it:

* WHIP (RFC 9725 §4.6): ``POST /v1/sessions`` (and ``POST /v1/realtime/calls``) answer 201
  with one ``Link: <turn:…>; rel="ice-server"; username="…"; credential="…";
  credential-type="password"`` header per URL. They arrive with the answer, after the offer
  was made: a WHIP client that wants them for its first offer asks first (below), or uses
  them on an ICE restart.
* RTCIceServer (W3C webrtc-pc §4.2.1): ``ice_servers`` — ``[{"urls": [...], "username",
  "credential"}]``, ready for ``new RTCPeerConnection({iceServers})`` — beside the ephemeral
  key of ``POST /v1/realtime/client_secrets``, the client token of ``POST /v1/client_tokens``,
  and alone from ``GET /v1/ice_servers`` (what the demo page asks before its offer: the
  server is ICE-lite and the page does not trickle, so its relay candidates must be in the
  offer it sends).

Each credential's id is random (nothing in it names a session: the username crosses the
network in clear in every TURN request) and it expires ``ttl`` after the moment it can
first be used — now, or when the token it comes with expires — so a call through TURN may
last ``ttl`` before a refresh is refused (``--turn-credential-ttl``).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from ..proto.turn.credentials import (
    RestCredential,
    ice_server,
    mint_rest_credential,
    whip_link_headers,
)

#: How long a call through TURN may last on one credential, from when it could start.
DEFAULT_TTL = 7200.0
MIN_TTL, MAX_TTL = 60.0, 7 * 86400.0


def check_ttl(value: object) -> float:
    """``--turn-credential-ttl``, checked (ValueError says the bounds)."""
    ttl = float(str(value))
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise ValueError(f"--turn-credential-ttl must be {MIN_TTL:g}..{MAX_TTL:g} seconds")
    return ttl


@dataclass(frozen=True, slots=True)
class TurnAdvert:
    """The TURN servers signaling advertises and the secret it mints their credentials
    with (the first of the relays' secrets)."""

    secret: bytes = field(repr=False)
    urls: tuple[str, ...]
    ttl: float = DEFAULT_TTL

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("TURN advertised with no URL")
        check_ttl(self.ttl)

    def mint(self, now: float, *, valid_for: float = 0.0) -> RestCredential:
        """A fresh credential usable from now until ``valid_for + ttl`` seconds from now."""
        return mint_rest_credential(self.secret, secrets.token_urlsafe(9),
                                    math.ceil(now + valid_for + self.ttl))


def link_headers(turn: TurnAdvert | None, now: float) -> list[str]:
    """The WHIP ``Link`` header values for one session (none without TURN)."""
    if turn is None:
        return []
    return whip_link_headers(turn.mint(now), list(turn.urls))


def ice_servers(turn: TurnAdvert | None, now: float, *,
                valid_for: float = 0.0) -> list[dict[str, Any]]:
    """``iceServers`` for a client that may start its call up to ``valid_for`` seconds from
    now: one RTCIceServer with every URL and one credential (``[]`` without TURN)."""
    if turn is None:
        return []
    return [ice_server(turn.mint(now, valid_for=valid_for), list(turn.urls))]
