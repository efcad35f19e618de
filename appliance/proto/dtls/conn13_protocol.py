"""What the DTLS 1.3 handshake handlers may touch of a connection: :class:`S13` and :class:`Conn13`.

:mod:`.connection13` drives :mod:`.handshake13` (it calls its handlers with itself), and the
handlers read and write the connection's negotiated state. Both import this module and
neither imports the other's, so there is no import cycle, not even a ``TYPE_CHECKING`` one
(issue 15, item 5). :class:`Conn13` is a structural type: mypy checks that
:class:`~.connection13.Dtls13Connection` satisfies it where the connection passes ``self``
to :func:`.handshake13.handle_message` and :func:`.handshake13.client_start`.

Members are the connection's own (private) names on purpose: the handlers are the other
half of the connection's state machine (RFC 8446 §2 / §4, RFC 9147 §5), split off only to
keep each file readable, not a separate component with its own API.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls._wire13 import CipherSuite13, Group13
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.events import Counters
from appliance.proto.dtls.keyschedule13 import KeySchedule, KeyShare13
from appliance.proto.dtls.messages import ClientHello
from appliance.proto.dtls.recordlayer13 import OutMessage, RecordLayer13
from appliance.proto.srtp.profile import SrtpProfile


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


class Conn13(Protocol):
    """The part of :class:`~.connection13.Dtls13Connection` the handshake handlers use."""

    # Configuration (set at construction).
    certificate: Certificate
    counters: Counters
    rl: RecordLayer13
    _remote_fingerprints: tuple[str, ...] | None
    _srtp_profiles: tuple[SrtpProfile, ...]
    _suites: tuple[CipherSuite13, ...]
    _groups: tuple[Group13, ...]
    _cookie_secret: bytes | None
    _cookie_context: bytes
    _hrr_secret: bytes
    _rng: Callable[[int], bytes]
    _fallback_12: bool
    _hello_12: tuple[tuple[int, ...], tuple[tuple[int, bytes], ...]]

    # Handshake progress and negotiated state.
    _state: S13
    _send_msg_seq: int
    _transcript: bytearray
    _raw: list[bytes] | None
    fallback: list[bytes] | None
    fallback_hello: ClientHello | None
    _suite: CipherSuite13 | None
    _ks: KeySchedule | None
    _srtp_profile: SrtpProfile | None
    _peer_fingerprint: str | None
    _secrets: dict[str, bytes]
    _ku_pending: bool
    _retransmit_at: float | None
    _last_seq0: int

    # Handshake scratch.
    _client_random: bytes
    _shares: dict[Group13, KeyShare13]
    _hello: ClientHello | None
    _hrr_done: bool
    _hrr_suite: CipherSuite13 | None
    _cert_requested: bool
    _cert_request_context: bytes
    _peer_key: ec.EllipticCurvePublicKey | None

    def _out(self, msg_type: int, body: bytes, epoch: int) -> OutMessage: ...

    def _send_flight(self, now: float, flight: list[OutMessage], *,
                     arm_timer: bool = True) -> None: ...

    def _install(self, epoch: int, write_secret: bytes, read_secret: bytes) -> None: ...

    def _send_key_update(self, now: float, request_peer: bool) -> None: ...

    def _complete(self) -> None: ...
