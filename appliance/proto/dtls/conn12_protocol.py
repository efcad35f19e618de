"""What the DTLS 1.2 handshake and record-layer functions may touch of a connection: :class:`Conn12`.

:mod:`.connection` keeps the state and the verbs; :mod:`.recordlayer12` (records, replay
windows, reassembly, flights on the wire), :mod:`.handshake12` (dispatch and what both
roles share), :mod:`.handshake12_server` and :mod:`.handshake12_client` (one handler per
flight message, pion's ``flight*handler.go``) are functions of a connection. They import
this module and never :mod:`.connection`, so there is no import cycle, not even a
``TYPE_CHECKING`` one (issue 15, item 6; the DTLS 1.3 twin is :mod:`.conn13_protocol`).
:class:`Conn12` is a structural type: mypy checks that
:class:`~.connection.Dtls12Connection` satisfies it wherever the connection passes
``self``.

Members are the connection's own (private) names on purpose: the functions are the other
half of the connection's state machine (RFC 6347, RFC 5246 §7.3), split off only to keep
each file readable, not a separate component with its own API.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls._wire import AlertDescription, CipherSuite, ContentType, NamedGroup
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.crypto import KeyShare, RecordCipher
from appliance.proto.dtls.events import Counters, Event, Role, State
from appliance.proto.dtls.messages import ClientHello, HandshakeBody
from appliance.proto.dtls.record import HandshakeMessage, Reassembler, Record, ReplayWindow
from appliance.proto.srtp.profile import SrtpProfile


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One element of a flight, kept in plaintext so retransmissions get fresh record
    sequence numbers (RFC 6347 §4.2.4: "each retransmission is a new record")."""

    content_type: ContentType
    epoch: int
    msg_type: int  # handshake only
    message_seq: int  # handshake only
    body: bytes


Flight = list[Outgoing]
HandlerResult = tuple[Flight | None, AlertDescription | None]
Handler = Callable[["Conn12", float, HandshakeBody, bytes, HandshakeMessage], HandlerResult]


class Conn12(Protocol):
    """The part of :class:`~.connection.Dtls12Connection` its handlers and record layer use."""

    # Configuration (set at construction).
    role: Role
    certificate: Certificate
    mtu: int
    counters: Counters
    _remote_fingerprints: tuple[str, ...] | None
    _srtp_profiles: tuple[SrtpProfile, ...]
    _suites: tuple[CipherSuite, ...]
    _groups: tuple[NamedGroup, ...]
    _cookie_secret: bytes | None
    _cookie_context: bytes
    _initial_rto: float
    _rng: Callable[[int], bytes]
    _false_start: bool
    downgrade_sentinel: bytes
    _hello_template: ClientHello | None
    _HANDLERS: dict[int, Handler]

    # Handshake progress and record state.
    state: State
    _reassembler: Reassembler
    _transcript: bytearray
    _send_message_seq: int
    _write_seq: list[int]
    _write_cipher: RecordCipher | None
    _read_cipher: RecordCipher | None
    _replay: list[ReplayWindow]
    _peer_epoch1_seen: bool
    _early_records: list[Record]
    _early_app_data: list[bytes]
    _last_epoch0_seq: int

    # Negotiated parameters and secrets.
    _client_random: bytes
    _server_random: bytes
    _suite: CipherSuite | None
    _group: NamedGroup | None
    _srtp_profile: SrtpProfile | None
    _key_share: KeyShare | None
    _peer_ecdh_public: bytes
    _master_secret: bytes | None
    _peer_public_key: ec.EllipticCurvePublicKey | None
    _peer_fingerprint: str | None
    _client_hello: ClientHello | None
    _certificate_requested: bool
    _signal_reneg: bool
    _hvr_count: int

    # Output queues and the retransmission timer.
    _flight: Flight | None
    _tx: deque[bytes]
    _pending_records: list[bytes]
    _events: deque[Event]
    _rto: float
    _retransmit_at: float | None
    _retransmit_count: int
    _dup_seen: bool

    def _handle_message(self, now: float, msg: HandshakeMessage) -> None: ...

    def _close_locally(
        self,
        alert: AlertDescription | None,
        reason: str,
        *,
        by_peer: bool = False,
        event: bool = True,
    ) -> None: ...
