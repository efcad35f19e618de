"""A sans-IO DTLS 1.2 connection (RFC 6347) for WebRTC, in either role.

What is implemented, and where the rules come from:

* Flights and timers: RFC 6347 §4.2.4 — 1 s initial timer (configurable, WebRTC peers use
  less), doubled on each expiry up to 60 s (§4.2.4.1); retransmission of our last flight
  when the peer retransmits its previous one.
* Stateless cookies: RFC 6347 §4.2.1 — HelloVerifyRequest with an HMAC over the caller's
  client-address bytes and the ClientHello parameters; nothing is committed until the
  ClientHello comes back with a valid cookie. Fixed at construction (``cookie_secret``) or
  switched on or off by the owner while the server still waits for a ClientHello
  (:meth:`Dtls12Connection.require_cookies`: a transceiver turns them on under load).
* A peer's repeated flight triggers a retransmission of ours (§4.2.4) at most once per
  ``DUP_RETRANSMIT_INTERVAL``: a flood of copies of a ClientHello is not answered with a
  full server flight each.
* Handshake: RFC 5246 §7.3 full handshake with ECDHE_ECDSA (RFC 8422), mutual
  authentication (CertificateRequest/CertificateVerify, RFC 5246 §7.4.4, §7.4.8) and
  WebRTC fingerprint checks of the peer certificate (RFC 8122 §5, RFC 8827 §6.5).
* Extensions: extended_master_secret required (RFC 7627 §5.2-5.3), renegotiation_info
  (RFC 5746, always empty: renegotiation is refused, §4.4), use_srtp (RFC 5764 §4.1).
* Records: epochs 0 and 1 only, 64-entry anti-replay window (§4.1.2.6), invalid records
  silently dropped (§4.1.2.7), next-epoch records buffered until keys exist (§4.1).
* Exporter: RFC 5705 for DTLS-SRTP keying (RFC 5764 §4.2).
* False Start (RFC 7918), client role, opt-in (``false_start=True``): once flight 5 is out
  the client's keys are final, so :class:`FalseStart` is emitted and the exporter answers
  before the server's Finished arrives; the caller may send SRTP (and application data)
  half a round trip earlier.
  §3's conditions hold by construction: every suite here is ECDHE with an AEAD cipher, and
  the server's certificate (fingerprint) and ServerKeyExchange signature are verified
  before flight 5 is sent. A bad or missing server Finished still fails the handshake.

Deliberately omitted: session resumption and tickets (WebRTC never resumes),
renegotiation (refused with a no_renegotiation warning), compression, non-AEAD suites,
RSA certificates, connection IDs. DTLS 1.3 is ``connection13`` (RFC 9147); ``versioned``
picks the engine and hands over between them (RFC 8446 §4.2.1, §4.1.3 downgrade sentinel).

Usage (STYLE.md rule 2): after any ``handle_*``/``start``/``send_*``/``close``, drain
``poll_transmit()`` and ``poll_event()`` until ``None``, then wake at ``poll_timeout()``.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls import handshake12 as hs
from appliance.proto.dtls import handshake12_client as client
from appliance.proto.dtls import handshake12_server as server
from appliance.proto.dtls import recordlayer12 as rl
from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    DtlsError,
    HandshakeType,
    NamedGroup,
)
from appliance.proto.dtls.certificate import Certificate, normalize_fingerprint
from appliance.proto.dtls.conn12_protocol import Flight, Handler
from appliance.proto.dtls.crypto import SUITES, KeyShare, RecordCipher, prf
from appliance.proto.dtls.events import (
    DUP_RETRANSMIT_INTERVAL,
    ConnectionClosed,
    Counters,
    Event,
    Role,
    State,
)
from appliance.proto.dtls.messages import ClientHello
from appliance.proto.dtls.record import (
    MAX_PLAINTEXT_LEN,
    RECORD_HEADER_LEN,
    HandshakeMessage,
    Reassembler,
    Record,
    ReplayWindow,
    parse_record_untrusted,
)
from appliance.proto.errors import LocalProtocolError
from appliance.proto.srtp.profile import DEFAULT_SRTP_PROFILES, SrtpProfile

DEFAULT_CIPHER_SUITES: tuple[CipherSuite, ...] = (
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
)
DEFAULT_GROUPS: tuple[NamedGroup, ...] = (NamedGroup.x25519, NamedGroup.secp256r1)

# RFC 6347 §4.2.4.1: 1 s initial timer, doubling, "at least 60 seconds" as the ceiling.
DEFAULT_INITIAL_RTO = 1.0
MAX_RTO = 60.0
# Labels RFC 5705 §4 forbids exporters to use (they belong to the handshake itself).
_RESERVED_LABELS = {
    b"client finished",
    b"server finished",
    b"master secret",
    b"key expansion",
    b"extended master secret",
}

# Layout (issue 15, item 6): this module keeps the state and the verbs; the record layer
# (records, replay windows, reassembly, flights on the wire) is recordlayer12.py, the
# handshake dispatch and Finished handshake12.py, the flight handlers
# handshake12_server.py and handshake12_client.py. They see the connection only as a
# conn12_protocol.Conn12, so none of them imports this module.


class Dtls12Connection:
    """One DTLS 1.2 association with one peer. See the module docstring for usage."""

    def __init__(
        self,
        role: Role,
        certificate: Certificate,
        *,
        remote_fingerprints: Sequence[str] | None,
        srtp_profiles: Sequence[SrtpProfile] = DEFAULT_SRTP_PROFILES,
        cipher_suites: Sequence[CipherSuite] = DEFAULT_CIPHER_SUITES,
        groups: Sequence[NamedGroup] = DEFAULT_GROUPS,
        cookie_secret: bytes | None = None,
        cookie_context: bytes = b"",
        mtu: int = 1200,
        max_handshake_buffer: int = 32 * 1024,
        initial_retransmit: float = DEFAULT_INITIAL_RTO,
        max_retransmissions: int = 10,
        rng: Callable[[int], bytes] = os.urandom,
        false_start: bool = False,
    ) -> None:
        if remote_fingerprints is not None:
            if not remote_fingerprints:
                raise LocalProtocolError("remote_fingerprints is empty; pass None to opt out")
            for fp in remote_fingerprints:
                normalize_fingerprint(fp)  # raises LocalProtocolError on garbage
        if not cipher_suites or any(CipherSuite(s) not in SUITES for s in cipher_suites):
            raise LocalProtocolError("cipher_suites must be a non-empty subset of CipherSuite")
        if not groups:
            raise LocalProtocolError("groups must not be empty")
        if mtu < 256:
            raise LocalProtocolError("mtu below 256 cannot carry the handshake")
        if cookie_secret is not None and role is not Role.SERVER:
            raise LocalProtocolError("cookies are a server feature")
        if false_start and role is not Role.CLIENT:
            raise LocalProtocolError("False Start is a client feature (RFC 7918)")
        self.role = role
        self.certificate = certificate
        self.mtu = mtu
        self.counters = Counters()
        self._remote_fingerprints = tuple(remote_fingerprints) if remote_fingerprints else None
        self._srtp_profiles = tuple(SrtpProfile(p) for p in srtp_profiles)
        self._suites = tuple(CipherSuite(s) for s in cipher_suites)
        self._groups = tuple(NamedGroup(g) for g in groups)
        self._cookie_secret = cookie_secret
        self._cookie_context = cookie_context
        self._initial_rto = initial_retransmit
        self._max_retransmissions = max_retransmissions
        self._rng = rng
        self._false_start = false_start

        self.state = State.CLIENT_IDLE if role is Role.CLIENT else State.SERVER_WAIT_CLIENT_HELLO
        self._reassembler = Reassembler(max_handshake_buffer)
        self._transcript = bytearray()
        self._send_message_seq = 0
        # Per-epoch record state. Epoch 0 is plaintext; epoch 1 is the negotiated AEAD.
        self._write_seq = [0, 0]
        self._write_cipher: RecordCipher | None = None
        self._read_cipher: RecordCipher | None = None
        self._replay = [ReplayWindow(), ReplayWindow()]
        self._peer_epoch1_seen = False
        self._early_records: list[Record] = []
        self._early_app_data: list[bytes] = []
        self._last_epoch0_seq = 0

        # Negotiated parameters and secrets.
        self._client_random = b""
        self._server_random = b""
        self._suite: CipherSuite | None = None
        self._group: NamedGroup | None = None
        self._srtp_profile: SrtpProfile | None = None
        self._key_share: KeyShare | None = None
        self._peer_ecdh_public = b""
        self._master_secret: bytes | None = None
        self._peer_public_key: ec.EllipticCurvePublicKey | None = None
        self._peer_fingerprint: str | None = None
        self._client_hello: ClientHello | None = None
        self._certificate_requested = False
        self._signal_reneg = False
        self._hvr_count = 0
        # Set by the version-negotiating wrapper (versioned.py): a 1.3-capable server marks
        # a 1.2 ServerHello.random (RFC 8446 §4.1.3); a 1.3-capable client resends the
        # combined ClientHello it first sent (after a HelloVerifyRequest) and checks it.
        self.downgrade_sentinel = b""
        self._hello_template: ClientHello | None = None

        # Output queues and the retransmission timer.
        self._flight: Flight | None = None
        self._tx: deque[bytes] = deque()
        self._pending_records: list[bytes] = []
        self._events: deque[Event] = deque()
        self._rto = initial_retransmit
        self._retransmit_at: float | None = None
        self._retransmit_count = 0
        self._dup_seen = False
        self._dup_retransmit_at = -math.inf

    # --- public verbs -----------------------------------------------------------------

    @property
    def awaiting_client_hello(self) -> bool:
        """A server that has not accepted a ClientHello yet (cookies can still change)."""
        return self.state is State.SERVER_WAIT_CLIENT_HELLO

    @property
    def cookies_required(self) -> bool:
        return self._cookie_secret is not None

    def require_cookies(self, secret: bytes | None, context: bytes = b"") -> None:
        """Server, before a ClientHello is accepted: demand a HelloVerifyRequest cookie
        exchange (RFC 6347 §4.2.1) from the next ClientHello on (``secret``), or stop
        (None). ``context`` binds cookies to the caller's view of the peer (its address
        bytes), so a cookie is only good from where it was sent. Switching between
        ClientHellos is safe: the stateless phase commits nothing."""
        if self.role is not Role.SERVER or self.state is not State.SERVER_WAIT_CLIENT_HELLO:
            raise LocalProtocolError("cookies can only change before a ClientHello is accepted")
        if secret is not None and len(secret) < 16:
            raise LocalProtocolError("a cookie secret needs at least 16 bytes")
        self._cookie_secret = secret
        self._cookie_context = context

    @property
    def _closed(self) -> bool:
        # A property, so mypy does not narrow ``state`` across calls that change it.
        return self.state is State.CLOSED

    @property
    def is_established(self) -> bool:
        return self.state is State.ESTABLISHED

    @property
    def cipher_suite(self) -> CipherSuite | None:
        return self._suite

    @property
    def srtp_profile(self) -> SrtpProfile | None:
        return self._srtp_profile

    @property
    def max_application_data(self) -> int:
        """The largest payload ``send_application_data`` accepts at this MTU."""
        overhead = self._write_cipher.overhead if self._write_cipher else 24
        return min(MAX_PLAINTEXT_LEN, self.mtu - RECORD_HEADER_LEN - overhead)

    def start(self, now: float) -> None:
        """Client only: send the first ClientHello (flight 1)."""
        if self.role is not Role.CLIENT or self.state is not State.CLIENT_IDLE:
            raise LocalProtocolError("start() is for a fresh client connection")
        self._client_random = self._rng(32)
        self.state = State.CLIENT_WAIT_SERVER_HELLO
        rl.send_new_flight(self, now, [client.client_hello_out(self, b"")])

    def handle_datagram(self, now: float, data: bytes) -> None:
        """Feed one UDP payload. Never raises for bad peer bytes: they are dropped or end
        the connection with an alert (reported as a ``ConnectionClosed`` event)."""
        if self.state in (State.CLOSED, State.CLIENT_IDLE):
            return
        self._dup_seen = False
        offset = 0
        try:
            while offset < len(data) and not self._closed:
                try:
                    record, offset = parse_record_untrusted(data, offset)
                except DtlsError:
                    # RFC 6347 §4.1.2.7: invalid records are silently discarded; without a
                    # valid length we cannot find the next record, so the rest goes too.
                    self.counters.records_dropped += 1
                    break
                rl.handle_record(self, now, record)
            rl.drain_early_records(self, now)
        except DtlsError as exc:
            self._fail(exc.hint, str(exc))
            return
        # RFC 6347 §4.2.4: the peer retransmitted its previous flight, so ours was lost.
        if self._dup_seen and self._flight is not None and not self._closed:
            if now < self._dup_retransmit_at:
                self.counters.retransmissions_suppressed += 1
                return
            self._dup_retransmit_at = now + DUP_RETRANSMIT_INTERVAL
            self.counters.retransmissions += 1
            rl.emit_flight(self, self._flight)

    def handle_timeout(self, now: float) -> None:
        if self._retransmit_at is None or now < self._retransmit_at or self._flight is None:
            return
        self._retransmit_count += 1
        if self._retransmit_count > self._max_retransmissions:
            self._close_locally(None, "handshake timed out")
            return
        # RFC 6347 §4.2.4.1: double the timer on each expiry, up to the ceiling.
        self._rto = min(self._rto * 2, MAX_RTO)
        self._retransmit_at = now + self._rto
        self.counters.retransmissions += 1
        rl.emit_flight(self, self._flight)

    def poll_timeout(self) -> float | None:
        return self._retransmit_at

    def poll_transmit(self) -> bytes | None:
        if self._pending_records:
            rl.pack_pending(self)
        return self._tx.popleft() if self._tx else None

    def poll_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def send_application_data(self, data: bytes) -> None:
        # RFC 7918 §3: a False Start client may send application data once its Finished
        # is out; the record goes in its own datagram right behind flight 5.
        if self.state is not State.ESTABLISHED and not (
                self._false_start and self.state is State.CLIENT_WAIT_FINISHED):
            raise LocalProtocolError(f"cannot send application data in state {self.state.value}")
        if len(data) > self.max_application_data:
            raise LocalProtocolError(
                f"{len(data)} bytes exceed one record at mtu {self.mtu} "
                f"(max {self.max_application_data})"
            )
        self._pending_records.append(rl.encode_record(self, ContentType.APPLICATION_DATA, 1, data))

    def close(self) -> None:
        """Send close_notify (RFC 5246 §7.2.1) and end the connection."""
        if self.state is State.CLOSED:
            return
        if self.state is not State.CLIENT_IDLE:
            rl.queue_alert(self, AlertLevel.WARNING, AlertDescription.close_notify)
        self._close_locally(None, "closed locally", event=True)

    def export_keying_material(self, label: bytes, length: int) -> bytes:
        """RFC 5705 §4 exporter without context, e.g. ``b"EXTRACTOR-dtls_srtp"``."""
        ready = self.state is State.ESTABLISHED or (
            self._false_start and self.state is State.CLIENT_WAIT_FINISHED)
        if self._master_secret is None or self._suite is None or not ready:
            raise LocalProtocolError("keying material is available once the handshake completes")
        if label in _RESERVED_LABELS:
            raise LocalProtocolError(f"label {label!r} is reserved (RFC 5705 §4)")
        return prf(
            SUITES[self._suite].hash_name,
            self._master_secret,
            label,
            self._client_random + self._server_random,
            length,
        )


    def adopt_client_hello(self, now: float, hello: ClientHello, next_record_seq: int) -> None:
        """Continue as 1.2 after a 1.3-capable ClientHello (versioned.py) got a 1.2 answer:
        that ClientHello is flight 1 and the start of the transcript (RFC 8446 §4.1.3)."""
        self._hello_template, self._client_random = hello, hello.random
        self._write_seq[0] = next_record_seq
        self.state = State.CLIENT_WAIT_SERVER_HELLO
        rl.send_new_flight(self, now, [client.client_hello_out(self, hello.cookie)], emit=False)

    # --- the handshake (handshake12*.py) and endings ----------------------------------

    # Handler per message type; the CERTIFICATE handler depends on the role. A class
    # attribute (an instance may replace it: test_security does).
    _HANDLERS: dict[int, Handler] = {
        HandshakeType.CLIENT_HELLO: server.on_client_hello,
        HandshakeType.CERTIFICATE: lambda c, now, body, raw, msg: (
            client.on_server_certificate(c, now, body, raw, msg)
            if c.role is Role.CLIENT
            else server.on_client_certificate(c, now, body, raw, msg)
        ),
        HandshakeType.CLIENT_KEY_EXCHANGE: server.on_client_key_exchange,
        HandshakeType.CERTIFICATE_VERIFY: server.on_certificate_verify,
        HandshakeType.FINISHED: hs.on_finished,
        HandshakeType.HELLO_VERIFY_REQUEST: client.on_hello_verify_request,
        HandshakeType.SERVER_HELLO: client.on_server_hello,
        HandshakeType.SERVER_KEY_EXCHANGE: client.on_server_key_exchange,
        HandshakeType.CERTIFICATE_REQUEST: client.on_certificate_request,
        HandshakeType.SERVER_HELLO_DONE: client.on_server_hello_done,
    }

    def _handle_message(self, now: float, msg: HandshakeMessage) -> None:
        """One reassembled handshake message, from the record layer."""
        hs.handle_message(self, now, msg)

    def _fail(self, alert: AlertDescription, reason: str) -> None:
        """Fatal error detected locally: send the alert and end (RFC 5246 §7.2.2)."""
        rl.queue_alert(self, AlertLevel.FATAL, alert)
        self._close_locally(alert, reason)

    def _close_locally(
        self,
        alert: AlertDescription | None,
        reason: str,
        *,
        by_peer: bool = False,
        event: bool = True,
    ) -> None:
        self.state = State.CLOSED
        self._flight = None
        self._retransmit_at = None
        self._key_share = None
        self._reassembler.clear()
        self._early_records.clear()
        if event:
            self._events.append(ConnectionClosed(alert, by_peer, reason))
