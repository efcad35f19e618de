"""A sans-IO DTLS 1.2 connection (RFC 6347) for WebRTC, in either role.

What is implemented, and where the rules come from:

* Flights and timers: RFC 6347 §4.2.4 — 1 s initial timer (configurable, WebRTC peers use
  less), doubled on each expiry up to 60 s (§4.2.4.1); retransmission of our last flight
  when the peer retransmits its previous one.
* Stateless cookies: RFC 6347 §4.2.1 — HelloVerifyRequest with an HMAC over the caller's
  client-address bytes and the ClientHello parameters; nothing is committed until the
  ClientHello comes back with a valid cookie. Fixed at construction (``cookie_secret``) or
  switched on or off by the owner while the server still waits for a ClientHello
  (:meth:`.engine.Engine.require_cookies`: a transceiver turns them on under load).
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
RSA certificates, connection IDs. DTLS 1.3 is :mod:`.engine13` (RFC 9147);
:class:`~.connection.DtlsConnection` picks the engine and hands over between them
(RFC 8446 §4.2.1, §4.1.3 downgrade sentinel). The verbs, timers and closing are
:class:`~.engine.Engine`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls import handshake12 as hs
from appliance.proto.dtls import handshake12_client as client
from appliance.proto.dtls import handshake12_server as server
from appliance.proto.dtls._wire import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    DtlsError,
    HandshakeType,
    NamedGroup,
)
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.conn_protocol import Handler
from appliance.proto.dtls.crypto import SUITES, KeyShare, RecordCipher, prf
from appliance.proto.dtls.engine import DEFAULT_INITIAL_RTO, Engine, Options
from appliance.proto.dtls.events import ApplicationData, Counters, Role, State
from appliance.proto.dtls.messages import ClientHello
from appliance.proto.dtls.record import (
    MAX_PLAINTEXT_LEN,
    RECORD_HEADER_LEN,
    HandshakeMessage,
    Record,
    ReplayWindow,
    parse_handshake_fragments_untrusted,
    parse_record_untrusted,
)
from appliance.proto.dtls.recordlayer12 import RecordLayer12
from appliance.proto.errors import LocalProtocolError

__all__ = ["DEFAULT_CIPHER_SUITES", "DEFAULT_GROUPS", "DEFAULT_INITIAL_RTO", "Engine12"]

DEFAULT_CIPHER_SUITES: tuple[CipherSuite, ...] = (
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    CipherSuite.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
)
DEFAULT_GROUPS: tuple[NamedGroup, ...] = (NamedGroup.x25519, NamedGroup.secp256r1)

# Labels RFC 5705 §4 forbids exporters to use (they belong to the handshake itself).
_RESERVED_LABELS = {
    b"client finished",
    b"server finished",
    b"master secret",
    b"key expansion",
    b"extended master secret",
}
# How many records of the next epoch we hold while the keys for it are not yet derived
# (RFC 6347 §4.1 allows buffering them; a reordered Finished would otherwise be lost).
_MAX_EARLY_RECORDS = 32

# Layout: this module keeps the 1.2 state and reads records; the verbs and timers are
# engine.py's, records out recordlayer12.py, the handshake dispatch and Finished
# handshake12.py, the flight handlers handshake12_server.py and handshake12_client.py.
# They see the engine only as a conn_protocol.Conn12, so none of them imports this one.


class Engine12(Engine):
    """One DTLS 1.2 association with one peer (see the module docstring)."""

    rl: RecordLayer12
    _EPOCH0_DUPLICATES_AFTER_HANDSHAKE = True

    def __init__(
        self,
        role: Role,
        certificate: Certificate,
        options: Options,
        *,
        cipher_suites: Sequence[CipherSuite] = DEFAULT_CIPHER_SUITES,
        groups: Sequence[NamedGroup] = DEFAULT_GROUPS,
        false_start: bool = False,
        counters: Counters | None = None,
    ) -> None:
        super().__init__(role, certificate, options, counters)
        if not cipher_suites or any(CipherSuite(s) not in SUITES for s in cipher_suites):
            raise LocalProtocolError("cipher_suites must be a non-empty subset of CipherSuite")
        if not groups:
            raise LocalProtocolError("groups must not be empty")
        if false_start and role is not Role.CLIENT:
            raise LocalProtocolError("False Start is a client feature (RFC 7918)")
        self._suites = tuple(CipherSuite(s) for s in cipher_suites)
        self._groups = tuple(NamedGroup(g) for g in groups)
        self._false_start = false_start
        self.rl = RecordLayer12(options.mtu, self.counters)

        self._state = State.CLIENT_IDLE if role is Role.CLIENT else State.SERVER_WAIT_CLIENT_HELLO
        self._send_message_seq = 0
        # Receive state per epoch. Epoch 0 is plaintext; epoch 1 is the negotiated AEAD.
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
        self._key_share: KeyShare | None = None
        self._peer_ecdh_public = b""
        self._master_secret: bytes | None = None
        self._peer_public_key: ec.EllipticCurvePublicKey | None = None
        self._client_hello: ClientHello | None = None
        self._certificate_requested = False
        self._signal_reneg = False
        self._hvr_count = 0
        # Set by the version-negotiating connection: a 1.3-capable server marks a 1.2
        # ServerHello.random (RFC 8446 §4.1.3); a 1.3-capable client resends the combined
        # ClientHello it first sent (after a HelloVerifyRequest) and checks it.
        self.downgrade_sentinel = b""
        self._hello_template: ClientHello | None = None

    # --- state and verbs --------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def _inert(self) -> bool:
        return self._state is State.CLOSED or self._state is State.CLIENT_IDLE

    @property
    def cipher_suite(self) -> CipherSuite | None:
        return self._suite

    @property
    def _may_send(self) -> bool:
        # RFC 7918 §3: a False Start client may send application data once its Finished
        # is out; the record goes in its own datagram right behind flight 5.
        return self._state is State.ESTABLISHED or (
            self._false_start and self._state is State.CLIENT_WAIT_FINISHED)

    @property
    def max_application_data(self) -> int:
        overhead = self.rl.write_cipher.overhead if self.rl.write_cipher else 24
        return min(MAX_PLAINTEXT_LEN, self.rl.mtu - RECORD_HEADER_LEN - overhead)

    def start(self, now: float) -> None:
        """Client only: send the first ClientHello (flight 1)."""
        if self.role is not Role.CLIENT or self._state is not State.CLIENT_IDLE:
            raise LocalProtocolError("start() is for a fresh client connection")
        self._client_random = self._rng(32)
        self._state = State.CLIENT_WAIT_SERVER_HELLO
        self._send_flight(now, [client.client_hello_out(self, b"")])

    def export_keying_material(self, label: bytes, length: int) -> bytes:
        """RFC 5705 §4 exporter without context, e.g. ``b"EXTRACTOR-dtls_srtp"``."""
        if self._master_secret is None or self._suite is None or not self._may_send:
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
        """Continue as 1.2 after a 1.3-capable ClientHello got a 1.2 answer: that
        ClientHello is flight 1 and the start of the transcript (RFC 8446 §4.1.3)."""
        self._hello_template, self._client_random = hello, hello.random
        self.rl.write_seq[0] = next_record_seq
        self._state = State.CLIENT_WAIT_SERVER_HELLO
        self._send_flight(now, [client.client_hello_out(self, hello.cookie)], emit=False)

    # --- records in (RFC 6347 §4.1) ---------------------------------------------------

    def _read_datagram(self, now: float, data: bytes) -> None:
        offset = 0
        while offset < len(data) and not self._closed:
            try:
                record, offset = parse_record_untrusted(data, offset)
            except DtlsError:
                # RFC 6347 §4.1.2.7: invalid records are silently discarded; without a
                # valid length we cannot find the next record, so the rest goes too.
                self.counters.records_dropped += 1
                break
            self._handle_record(now, record)
        # Next-epoch records held until the keys for them existed.
        while self._early_records and self._read_cipher is not None and not self._closed:
            early, self._early_records = self._early_records, []
            for record in early:
                self._handle_record(now, record)

    def _handle_record(self, now: float, record: Record) -> None:
        if record.epoch == 0:
            if not self._replay[0].check(record.sequence_number):
                self.counters.replays_dropped += 1
                return
            # Epoch 0 is unauthenticated; once the peer talks in epoch 1 only its
            # retransmitted handshake records are still meaningful in epoch 0.
            if self._peer_epoch1_seen and record.content_type != ContentType.HANDSHAKE:
                self.counters.records_dropped += 1
                return
            self._replay[0].mark(record.sequence_number)
            self._last_epoch0_seq = max(self._last_epoch0_seq, record.sequence_number)
            self._handle_plaintext(now, record.content_type, 0, record.fragment)
        elif record.epoch == 1:
            if self._read_cipher is None:
                if len(self._early_records) < _MAX_EARLY_RECORDS:
                    self._early_records.append(record)
                else:
                    self.counters.records_dropped += 1
                return
            if not self._replay[1].check(record.sequence_number):
                self.counters.replays_dropped += 1
                return
            try:
                plaintext = self._read_cipher.decrypt(
                    record.content_type, record.version, 1, record.sequence_number,
                    record.fragment,
                )
            except DtlsError:
                # RFC 6347 §4.1.2.7: forged or corrupted records are dropped, not fatal.
                self.counters.auth_failures += 1
                return
            if len(plaintext) > MAX_PLAINTEXT_LEN:
                self.counters.records_dropped += 1
                return
            # Mark only after authentication so forgeries cannot move the window.
            self._replay[1].mark(record.sequence_number)
            self._peer_epoch1_seen = True
            self._handle_plaintext(now, record.content_type, 1, plaintext)
        else:
            # Later epochs would need renegotiation, which we refuse.
            self.counters.records_dropped += 1

    def _handle_plaintext(self, now: float, content_type: int, epoch: int, payload: bytes) -> None:
        if content_type == ContentType.APPLICATION_DATA:
            if epoch == 0:
                # RFC 5246 §6.2: application data is never sent unprotected.
                self.counters.records_dropped += 1
            elif self._state is State.ESTABLISHED:
                self._events.append(ApplicationData(payload))
            elif len(self._early_app_data) < _MAX_EARLY_RECORDS:
                # The peer's Finished was reordered behind its first data: hold it.
                self._early_app_data.append(payload)
        elif content_type == ContentType.HANDSHAKE:
            try:
                fragments = parse_handshake_fragments_untrusted(payload)
            except DtlsError:
                self.counters.records_dropped += 1
                return
            for frag in fragments:
                self._handle_fragment(now, frag, epoch)
                if self._closed:
                    return
        elif content_type == ContentType.CHANGE_CIPHER_SPEC:
            # The epoch is explicit in every DTLS record, so CCS carries no information we
            # need; we only check that it is well-formed (RFC 5246 §7.1).
            if payload != b"\x01":
                self.counters.records_dropped += 1
        elif content_type == ContentType.ALERT:
            self._handle_alert(payload)

    @property
    def _answers_close_notify(self) -> bool:
        return self.rl.write_cipher is not None

    def _alert_is_fatal(self, level: int, desc: AlertDescription) -> bool:
        return level == AlertLevel.FATAL  # warnings (no_renegotiation, …) need no action

    # --- the handshake (handshake12*.py) and endings ----------------------------------

    # Handler per message type. A class attribute (an instance may replace it:
    # test_security does).
    _HANDLERS: dict[int, Handler] = {
        HandshakeType.CLIENT_HELLO: server.on_client_hello,
        HandshakeType.CERTIFICATE: hs.on_certificate,
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
        """One reassembled handshake message, from the reassembler."""
        hs.handle_message(self, now, msg)

    def _enter_closed(self) -> None:
        self._state = State.CLOSED
        self._key_share = None
        self._early_records.clear()
