"""TURN (RFC 8656) for the relay: a sans-IO server on the one STUN codec.

* ``server``      — :class:`TurnServer`: Allocate, Refresh, CreatePermission, ChannelBind,
  Send/Data indications, ChannelData, long-term REST credentials, nonces, quotas, no open
  relay, no amplification (its docstring has the whole decision table).
* ``credentials`` — TURN REST API credentials (``expiry:id`` + base64 HMAC-SHA1), the
  shared secret they are minted with, the shapes clients learn them in (RTCIceServer, WHIP
  ``Link``) and the server's stateless nonces: all signaling needs, without the relay.
* ``channel``     — ChannelData codec and :class:`StreamFramer` (TURN over TCP/TLS, §12.5).
* ``snapshot``    — an allocation as a cache record (no secret, no key), so a TURN/UDP
  allocation (through the cache) or a TURN/TCP one (with its connection, relay/keeper.py)
  outlives the relay worker that made it; its parser is untrusted-input safe.
* ``demux``       — which datagrams on the media port are TURN's (pure tables).
* ``errors``      — :class:`TurnError` (ChannelData, stream framing, REST usernames).

Every ``*_untrusted`` function raises only ``TurnError`` (or, for the STUN codec it builds on,
``StunError``); :meth:`TurnServer.handle_input` never raises for peer bytes.
"""

from __future__ import annotations

from .channel import (
    CHANNEL_MAX,
    CHANNEL_MIN,
    StreamFramer,
    channel_data_header,
    encode_channel_data,
    message_spans_untrusted,
    parse_channel_data_untrusted,
)
from .credentials import (
    NonceCodec,
    RestCredential,
    check_turn_url,
    derive_turn_secret,
    ice_server,
    mint_rest_credential,
    parse_rest_username_untrusted,
    parse_turn_secrets,
    rest_password,
    turn_urls,
    whip_link_headers,
)
from .demux import TURN_FIRST, TURN_TYPE, is_turn
from .errors import TurnError
from .server import (
    AllocationCreated,
    AllocationEnded,
    AllocationMissing,
    PeerData,
    ReclaimPorts,
    RelayPorts,
    Transmit,
    TurnConfig,
    TurnCounters,
    TurnServer,
)
from .snapshot import AllocationRecord, encode_record, parse_record_untrusted

__all__ = [
    "CHANNEL_MAX",
    "CHANNEL_MIN",
    "TURN_FIRST",
    "TURN_TYPE",
    "AllocationCreated",
    "AllocationRecord",
    "AllocationEnded",
    "AllocationMissing",
    "NonceCodec",
    "PeerData",
    "ReclaimPorts",
    "RelayPorts",
    "RestCredential",
    "StreamFramer",
    "Transmit",
    "TurnConfig",
    "TurnCounters",
    "TurnError",
    "TurnServer",
    "channel_data_header",
    "check_turn_url",
    "encode_record",
    "derive_turn_secret",
    "encode_channel_data",
    "ice_server",
    "is_turn",
    "message_spans_untrusted",
    "mint_rest_credential",
    "parse_channel_data_untrusted",
    "parse_record_untrusted",
    "parse_rest_username_untrusted",
    "parse_turn_secrets",
    "rest_password",
    "turn_urls",
    "whip_link_headers",
]
