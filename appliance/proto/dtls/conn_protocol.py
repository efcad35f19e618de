"""What the handshake handlers may touch of an engine: :class:`Conn12`, :class:`Conn13`.

:mod:`.engine12` and :mod:`.engine13` keep the state and read records; the handlers
(:mod:`.handshake12`, :mod:`.handshake12_server`, :mod:`.handshake12_client`: one per
flight message, pion's ``flight*handler.go``; :mod:`.handshake13`) are functions of an
engine. They import this module and never an engine module, so there is no import cycle,
not even a ``TYPE_CHECKING`` one. The protocols are structural types: mypy checks that
:class:`~.engine12.Engine12` and :class:`~.engine13.Engine13` satisfy them wherever an
engine passes ``self``.

Members are the engine's own (private) names on purpose: the handlers are the other half
of the engine's state machine (RFC 5246 §7.3, RFC 8446 §4, RFC 9147 §5), split off only to
keep each file readable, not a separate component with its own API.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls._wire import (
    AlertDescription,
    CipherSuite,
    CipherSuite13,
    Group13,
    NamedGroup,
)
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.crypto import KeyShare, RecordCipher
from appliance.proto.dtls.events import Counters, Event, Role, State
from appliance.proto.dtls.keyschedule13 import KeySchedule, KeyShare13
from appliance.proto.dtls.messages import ClientHello, HandshakeBody
from appliance.proto.dtls.record import HandshakeMessage, Reassembler
from appliance.proto.dtls.recordlayer12 import Flight, RecordLayer12
from appliance.proto.dtls.recordlayer13 import OutMessage, RecordLayer13
from appliance.proto.srtp.profile import SrtpProfile

HandlerResult = tuple[Flight | None, AlertDescription | None]
Handler = Callable[["Conn12", float, HandshakeBody, bytes, HandshakeMessage], HandlerResult]


class S13(enum.Enum):
    """Where a 1.3 handshake is; the public :class:`~.events.State` is derived from it."""

    CLIENT_IDLE = "client-idle"
    C_WAIT_SH = "client-wait-server-hello"
    C_WAIT_EE = "client-wait-encrypted-extensions"
    C_WAIT_CERT_CR = "client-wait-certificate-or-request"
    C_WAIT_CERT = "client-wait-certificate"
    C_WAIT_CV = "client-wait-certificate-verify"
    C_WAIT_FIN = "client-wait-finished"
    S_WAIT_CH = "server-wait-client-hello"
    S_WAIT_CERT = "server-wait-certificate"
    S_WAIT_CV = "server-wait-certificate-verify"
    S_WAIT_FIN = "server-wait-finished"
    ESTABLISHED = "established"
    CLOSED = "closed"


class _Engine(Protocol):
    """What :class:`~.engine.Engine` gives both versions."""

    role: Role
    certificate: Certificate
    counters: Counters
    _remote_fingerprints: tuple[str, ...] | None
    _srtp_profiles: tuple[SrtpProfile, ...]
    _cookie_secret: bytes | None
    _cookie_context: bytes
    _rng: Callable[[int], bytes]
    _reassembler: Reassembler
    _transcript: bytearray
    _events: deque[Event]
    _srtp_profile: SrtpProfile | None
    _peer_fingerprint: str | None
    _retransmit_at: float | None
    _client_random: bytes

    @property
    def state(self) -> State: ...

    def _send_flight(self, now: float, flight: list[Any], *, arm_timer: bool = True,
                     emit: bool = True) -> None: ...

    def _close_locally(self, alert: AlertDescription | None, reason: str, *,
                       by_peer: bool = False, event: bool = True) -> None: ...


class Conn12(_Engine, Protocol):
    """The part of :class:`~.engine12.Engine12` its handlers use."""

    rl: RecordLayer12
    _suites: tuple[CipherSuite, ...]
    _groups: tuple[NamedGroup, ...]
    _false_start: bool
    downgrade_sentinel: bytes
    _hello_template: ClientHello | None
    _HANDLERS: dict[int, Handler]
    _state: State
    _send_message_seq: int
    _read_cipher: RecordCipher | None
    _early_app_data: list[bytes]
    _last_epoch0_seq: int
    _server_random: bytes
    _suite: CipherSuite | None
    _group: NamedGroup | None
    _key_share: KeyShare | None
    _peer_ecdh_public: bytes
    _master_secret: bytes | None
    _peer_public_key: ec.EllipticCurvePublicKey | None
    _client_hello: ClientHello | None
    _certificate_requested: bool
    _signal_reneg: bool
    _hvr_count: int


class Conn13(_Engine, Protocol):
    """The part of :class:`~.engine13.Engine13` the handshake handlers use."""

    rl: RecordLayer13
    _suites: tuple[CipherSuite13, ...]
    _groups: tuple[Group13, ...]
    _hrr_secret: bytes
    _fallback_12: bool
    _hello_12: tuple[tuple[int, ...], tuple[tuple[int, bytes], ...]]
    _state: S13
    _send_msg_seq: int
    _raw: list[bytes] | None
    fallback: list[bytes] | None
    fallback_hello: ClientHello | None
    _suite: CipherSuite13 | None
    _ks: KeySchedule | None
    _secrets: dict[str, bytes]
    _ku_pending: bool
    _last_seq0: int
    _shares: dict[Group13, KeyShare13]
    _hello: ClientHello | None
    _hrr_done: bool
    _hrr_suite: CipherSuite13 | None
    _cert_requested: bool
    _cert_request_context: bytes
    _peer_key: ec.EllipticCurvePublicKey | None

    def _out(self, msg_type: int, body: bytes, epoch: int) -> OutMessage: ...

    def _install(self, epoch: int, write_secret: bytes, read_secret: bytes) -> None: ...

    def _send_key_update(self, now: float, request_peer: bool) -> None: ...

    def _complete(self) -> None: ...
