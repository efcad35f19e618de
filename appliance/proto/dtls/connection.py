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
  before the server's Finished arrives; the caller may send SRTP half a round trip earlier.
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

import hashlib
import hmac
import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls._wire import (
    CLIENT_CERT_TYPE_ECDSA_SIGN,
    DTLS_1_0,
    DTLS_1_2,
    EC_POINT_FORMAT_UNCOMPRESSED,
    TLS_EMPTY_RENEGOTIATION_INFO_SCSV,
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    DtlsError,
    ExtensionType,
    HandshakeType,
    NamedGroup,
    SignatureScheme,
    u16,
)
from appliance.proto.dtls._wire13 import DOWNGRADE_SENTINELS
from appliance.proto.dtls.certificate import (
    Certificate,
    check_peer_certificate,
    normalize_fingerprint,
)
from appliance.proto.dtls.crypto import (
    SUITES,
    SUPPORTED_SIGNATURE_SCHEMES,
    KeyShare,
    RecordCipher,
    derive_epoch_keys,
    extended_master_secret,
    finished_verify_data,
    prf,
    sign,
    transcript_hash,
    verify_untrusted,
)
from appliance.proto.dtls.events import (
    DUP_RETRANSMIT_INTERVAL,
    ApplicationData,
    ConnectionClosed,
    Counters,
    Event,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)
from appliance.proto.dtls.messages import (
    CertificateMessage,
    CertificateRequest,
    CertificateVerify,
    ClientHello,
    ClientKeyExchange,
    Extension,
    Finished,
    HandshakeBody,
    HelloVerifyRequest,
    ServerHello,
    ServerHelloDone,
    ServerKeyExchange,
    encode_use_srtp,
    find_extension,
    parse_ec_point_formats_untrusted,
    parse_handshake_body_untrusted,
    parse_renegotiation_info_untrusted,
    parse_signature_algorithms_untrusted,
    parse_supported_groups_untrusted,
    parse_use_srtp_untrusted,
)
from appliance.proto.dtls.record import (
    HANDSHAKE_HEADER_LEN,
    MAX_PLAINTEXT_LEN,
    RECORD_HEADER_LEN,
    HandshakeFragment,
    HandshakeMessage,
    Reassembler,
    Record,
    ReplayWindow,
    handshake_header,
    parse_handshake_fragments_untrusted,
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
# Cookie lifetime granularity: a cookie minted in this or the previous bucket is valid.
_COOKIE_BUCKET_SECONDS = 60.0
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


# The transition table: which handshake messages each state accepts (RFC 5246 §7.3
# message order). Anything else is an unexpected_message.
_ACCEPTS: dict[State, frozenset[HandshakeType]] = {
    State.CLIENT_WAIT_SERVER_HELLO: frozenset(
        {HandshakeType.HELLO_VERIFY_REQUEST, HandshakeType.SERVER_HELLO}
    ),
    State.CLIENT_WAIT_CERTIFICATE: frozenset({HandshakeType.CERTIFICATE}),
    State.CLIENT_WAIT_KEY_EXCHANGE: frozenset({HandshakeType.SERVER_KEY_EXCHANGE}),
    State.CLIENT_WAIT_HELLO_DONE: frozenset(
        {HandshakeType.CERTIFICATE_REQUEST, HandshakeType.SERVER_HELLO_DONE}
    ),
    State.CLIENT_WAIT_FINISHED: frozenset({HandshakeType.FINISHED}),
    State.SERVER_WAIT_CLIENT_HELLO: frozenset({HandshakeType.CLIENT_HELLO}),
    State.SERVER_WAIT_CERTIFICATE: frozenset(
        {HandshakeType.CERTIFICATE, HandshakeType.CLIENT_KEY_EXCHANGE}
    ),
    State.SERVER_WAIT_KEY_EXCHANGE: frozenset({HandshakeType.CLIENT_KEY_EXCHANGE}),
    State.SERVER_WAIT_CERTIFICATE_VERIFY: frozenset({HandshakeType.CERTIFICATE_VERIFY}),
    State.SERVER_WAIT_FINISHED: frozenset({HandshakeType.FINISHED}),
}


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """One element of a flight, kept in plaintext so retransmissions get fresh record
    sequence numbers (RFC 6347 §4.2.4: "each retransmission is a new record")."""

    content_type: ContentType
    epoch: int
    msg_type: int  # handshake only
    message_seq: int  # handshake only
    body: bytes


Flight = list[_Outgoing]
HandlerResult = tuple[Flight | None, AlertDescription | None]


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
        self._send_new_flight(now, [self._client_hello_out(b"")])

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
                self._handle_record(now, record)
            self._drain_early_records(now)
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
            self._emit_flight(self._flight)

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
        self._emit_flight(self._flight)

    def poll_timeout(self) -> float | None:
        return self._retransmit_at

    def poll_transmit(self) -> bytes | None:
        if self._pending_records:
            self._pack_pending()
        return self._tx.popleft() if self._tx else None

    def poll_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def send_application_data(self, data: bytes) -> None:
        if self.state is not State.ESTABLISHED:
            raise LocalProtocolError(f"cannot send application data in state {self.state.value}")
        if len(data) > self.max_application_data:
            raise LocalProtocolError(
                f"{len(data)} bytes exceed one record at mtu {self.mtu} "
                f"(max {self.max_application_data})"
            )
        self._pending_records.append(self._encode_record(ContentType.APPLICATION_DATA, 1, data))

    def close(self) -> None:
        """Send close_notify (RFC 5246 §7.2.1) and end the connection."""
        if self.state is State.CLOSED:
            return
        if self.state is not State.CLIENT_IDLE:
            self._queue_alert(AlertLevel.WARNING, AlertDescription.close_notify)
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

    # --- record layer: receive --------------------------------------------------------

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
                    record.content_type, record.version, 1, record.sequence_number, record.fragment
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

    def _drain_early_records(self, now: float) -> None:
        while (
            self._early_records and self._read_cipher is not None and self.state is not State.CLOSED
        ):
            early, self._early_records = self._early_records, []
            for record in early:
                self._handle_record(now, record)

    def _handle_plaintext(self, now: float, content_type: int, epoch: int, payload: bytes) -> None:
        if content_type == ContentType.HANDSHAKE:
            try:
                fragments = parse_handshake_fragments_untrusted(payload)
            except DtlsError:
                self.counters.records_dropped += 1
                return
            for frag in fragments:
                self._handle_fragment(now, frag, epoch)
                if self.state is State.CLOSED:
                    return
        elif content_type == ContentType.CHANGE_CIPHER_SPEC:
            # The epoch is explicit in every DTLS record, so CCS carries no information we
            # need; we only check that it is well-formed (RFC 5246 §7.1).
            if payload != b"\x01":
                self.counters.records_dropped += 1
        elif content_type == ContentType.ALERT:
            self._handle_alert(payload)
        elif content_type == ContentType.APPLICATION_DATA:
            if epoch == 0:
                # RFC 5246 §6.2: application data is never sent unprotected.
                self.counters.records_dropped += 1
            elif self.state is State.ESTABLISHED:
                self._events.append(ApplicationData(payload))
            elif len(self._early_app_data) < _MAX_EARLY_RECORDS:
                # The peer's Finished was reordered behind its first data: hold it.
                self._early_app_data.append(payload)

    def _handle_alert(self, payload: bytes) -> None:
        if len(payload) != 2:
            self.counters.records_dropped += 1
            return
        level, description = payload
        try:
            desc = AlertDescription(description)
        except ValueError:
            desc = AlertDescription.internal_error if level == AlertLevel.FATAL else None  # type: ignore[assignment]
            if desc is None:
                return
        if desc is AlertDescription.close_notify:
            # RFC 5246 §7.2.1: answer close_notify with our own and stop.
            if self._write_cipher is not None:
                self._queue_alert(AlertLevel.WARNING, AlertDescription.close_notify)
            self._close_locally(desc, "peer sent close_notify", by_peer=True)
        elif level == AlertLevel.FATAL:
            self._close_locally(desc, f"peer sent fatal {desc.name}", by_peer=True)
        # Warnings (no_renegotiation, …) need no action.

    def _handle_fragment(self, now: float, frag: HandshakeFragment, epoch: int) -> None:
        if self.state is State.SERVER_WAIT_CLIENT_HELLO:
            if frag.msg_type != HandshakeType.CLIENT_HELLO or epoch != 0:
                return
            # Before a ClientHello is accepted nothing is committed (stateless cookies,
            # RFC 6347 §4.2.1): a client may restart at message_seq 0 or continue at 1
            # after a HelloVerifyRequest, so follow whatever sequence it uses.
            if (
                frag.message_seq != self._reassembler.next_seq
                and frag.message_seq < Reassembler.WINDOW
            ):
                self._reassembler.clear()
                self._reassembler.next_seq = frag.message_seq
        if (
            self.state is State.ESTABLISHED
            and epoch == 0
            and frag.message_seq >= self._reassembler.next_seq
        ):
            return  # unauthenticated new handshake after the fact: ignore
        if not self._reassembler.add(frag, epoch):
            # An old message: the peer is retransmitting (RFC 6347 §4.2.4). Trigger once per
            # datagram and only on first fragments, so a fragmented flight does not make us
            # answer once per fragment.
            if frag.fragment_offset == 0:
                self._dup_seen = True
            return
        while (msg := self._reassembler.pop()) is not None:
            self._handle_message(now, msg)
            if self.state is State.CLOSED:
                return

    # --- handshake dispatch -----------------------------------------------------------

    def _handle_message(self, now: float, msg: HandshakeMessage) -> None:
        if self.state is State.ESTABLISHED:
            # A new handshake on an established association is a renegotiation attempt
            # (HelloRequest or ClientHello); RFC 5746 §4.4/§4.2: refuse with a warning.
            self._queue_alert(AlertLevel.WARNING, AlertDescription.no_renegotiation)
            return
        allowed = _ACCEPTS.get(self.state, frozenset())
        if msg.msg_type not in allowed:
            raise DtlsError(
                f"{self._type_name(msg.msg_type)} in state {self.state.value}",
                hint=AlertDescription.unexpected_message,
            )
        # Finished is the only message protected by epoch 1 (RFC 5246 §7.4.9); anything
        # else in epoch 1, or a plaintext Finished, is an attack or a broken peer.
        if (msg.msg_type == HandshakeType.FINISHED) != (msg.epoch == 1):
            raise DtlsError(
                "handshake message in the wrong epoch", hint=AlertDescription.unexpected_message
            )
        raw = handshake_header(msg.msg_type, len(msg.body), msg.message_seq) + msg.body
        try:
            body = parse_handshake_body_untrusted(msg.msg_type, msg.body)
        except DtlsError:
            if self.state is State.SERVER_WAIT_CLIENT_HELLO and self._cookie_secret is not None:
                return  # stateless phase: drop rather than answer unverified senders
            raise
        handler = self._HANDLERS[msg.msg_type]
        flight, alert = handler(self, now, body, raw, msg)
        if alert is not None:
            raise DtlsError(f"{self._type_name(msg.msg_type)} refused", hint=alert)
        if flight is not None:
            self._send_new_flight(now, flight)
            if self._false_start and self.state is State.CLIENT_WAIT_FINISHED:
                # Flight 5 is queued (only it moves a client here with a flight): RFC 7918
                # §3, our keys are final and the server is authenticated (certificate
                # against the SDP fingerprint, ServerKeyExchange signature), so the caller
                # may send from now on; anything it sends goes out behind our Finished.
                assert self._suite is not None
                self._events.append(FalseStart(self._srtp_profile, self._suite,
                                               self._peer_fingerprint))

    @staticmethod
    def _type_name(msg_type: int) -> str:
        try:
            return HandshakeType(msg_type).name
        except ValueError:
            return f"type {msg_type}"

    # --- server flights ---------------------------------------------------------------

    def _on_client_hello(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, ClientHello)
        # RFC 6347 §4.2.1: versions count down; {254,253} is 1.2. A client that cannot do
        # 1.2 is refused; supported_versions (a 1.3 offer) is ignored by a 1.2 server.
        if body.client_version > DTLS_1_2:
            return None, AlertDescription.protocol_version
        if self._cookie_secret is not None and not self._cookie_valid(now, body):
            # Stateless: answer with a HelloVerifyRequest that reuses the ClientHello's
            # record sequence number and message_seq (RFC 6347 §4.2.1, §4.2.2), commit
            # nothing, and do not arm a timer (the client retransmits).
            hvr = HelloVerifyRequest(DTLS_1_0, self._make_cookie(now, body, 0))
            self.counters.hello_verify_requests += 1
            self._write_seq[0] = max(self._write_seq[0], self._last_epoch0_seq)
            out = _Outgoing(ContentType.HANDSHAKE, 0, hvr.msg_type, msg.message_seq, bytes(hvr))
            self._emit_flight([out])
            return None, None
        alert = self._negotiate(body)
        if alert is not None:
            return None, alert
        self._client_hello = body
        self._client_random = body.random
        self._server_random = self._rng(32 - len(self.downgrade_sentinel)) + self.downgrade_sentinel
        # Our message_seq continues from the client's (0, or 1 after a HelloVerifyRequest),
        # and our epoch-0 record numbers from its ClientHello, as OpenSSL does after
        # DTLSv1_listen; clients may run replay detection on epoch 0.
        self._send_message_seq = msg.message_seq
        self._write_seq[0] = max(self._write_seq[0], self._last_epoch0_seq)
        self._transcript = bytearray(raw)

        assert self._suite is not None and self._group is not None
        extensions: list[Extension] = []
        if self._signal_reneg:
            extensions.append((ExtensionType.renegotiation_info, b"\x00"))
        extensions.append((ExtensionType.extended_master_secret, b""))
        if find_extension(body.extensions, ExtensionType.ec_point_formats) is not None:
            extensions.append((ExtensionType.ec_point_formats, b"\x01\x00"))
        if self._srtp_profile is not None:
            extensions.append((ExtensionType.use_srtp, encode_use_srtp([self._srtp_profile])))
        server_hello = ServerHello(
            DTLS_1_2, self._server_random, b"", self._suite, 0, tuple(extensions)
        )

        self._key_share = KeyShare(self._group)
        params = ServerKeyExchange(self._group, self._key_share.public, 0, b"").params()
        scheme, signature = sign(
            self.certificate.private_key, self._client_random + self._server_random + params
        )
        ske = ServerKeyExchange(self._group, self._key_share.public, scheme, signature)
        # RFC 5246 §7.4.4: ask for the browser's certificate; WebRTC authenticates both ends.
        request = CertificateRequest(
            bytes((CLIENT_CERT_TYPE_ECDSA_SIGN,)), SUPPORTED_SIGNATURE_SCHEMES, b""
        )
        flight = [
            self._append_transcript(self._handshake_out(m))
            for m in (
                server_hello,
                CertificateMessage((self.certificate.der,)),
                ske,
                request,
                ServerHelloDone(),
            )
        ]
        self.state = State.SERVER_WAIT_CERTIFICATE
        return flight, None

    def _negotiate(self, hello: ClientHello) -> AlertDescription | None:
        """Pick suite, group, SRTP profile; enforce the extensions we require."""
        exts = hello.extensions
        # RFC 5246 §7.4.1.2: null compression must be offered.
        if 0 not in hello.compression_methods:
            return AlertDescription.illegal_parameter
        # RFC 7627 §5.3: a server that requires EMS aborts a handshake without it.
        if find_extension(exts, ExtensionType.extended_master_secret) is None:
            return AlertDescription.handshake_failure
        reneg = find_extension(exts, ExtensionType.renegotiation_info)
        if reneg is not None:
            # RFC 5746 §3.6: in an initial handshake the value must be empty.
            if parse_renegotiation_info_untrusted(reneg) != b"":
                return AlertDescription.handshake_failure
            self._signal_reneg = True
        if TLS_EMPTY_RENEGOTIATION_INFO_SCSV in hello.cipher_suites:
            self._signal_reneg = True
        # Server preference (ours), restricted to what the client offers. A client that
        # offers no ECDHE_ECDSA AEAD suite (RSA, PSK, CBC, …) gets handshake_failure.
        suite = next((s for s in self._suites if s in hello.cipher_suites), None)
        if suite is None:
            return AlertDescription.handshake_failure
        groups_raw = find_extension(exts, ExtensionType.supported_groups)
        # RFC 8422 §4: without supported_groups the client accepts any curve; P-256 then.
        client_groups = (
            parse_supported_groups_untrusted(groups_raw)
            if groups_raw is not None
            else (NamedGroup.secp256r1,)
        )
        group = next((g for g in self._groups if g in client_groups), None)
        if group is None:
            return AlertDescription.handshake_failure
        formats = find_extension(exts, ExtensionType.ec_point_formats)
        if (
            formats is not None
            and EC_POINT_FORMAT_UNCOMPRESSED not in parse_ec_point_formats_untrusted(formats)
        ):
            return AlertDescription.illegal_parameter
        sigalgs = find_extension(exts, ExtensionType.signature_algorithms)
        # RFC 5246 §7.4.1.4.1: absent means SHA-1, which we will not sign with.
        if (
            sigalgs is None
            or SignatureScheme.ecdsa_secp256r1_sha256
            not in parse_signature_algorithms_untrusted(sigalgs)
        ):
            return AlertDescription.handshake_failure
        if self._srtp_profiles:
            srtp = find_extension(exts, ExtensionType.use_srtp)
            if srtp is None:
                return AlertDescription.handshake_failure
            offered, _mki = parse_use_srtp_untrusted(srtp)
            # RFC 5764 §4.1.1: the server picks; we use our preference order. We ignore
            # any MKI (WebRTC never uses one) and answer with an empty one.
            profile = next((p for p in self._srtp_profiles if p in offered), None)
            if profile is None:
                return AlertDescription.handshake_failure
            self._srtp_profile = profile
        self._suite = suite
        self._group = group
        return None

    def _on_client_certificate(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, CertificateMessage)
        alert = self._accept_peer_certificate(body)
        if alert is not None:
            return None, alert
        self._transcript += raw
        # RFC 5246 §7.4.8: CertificateVerify follows only a non-empty certificate.
        self.state = State.SERVER_WAIT_KEY_EXCHANGE
        return None, None

    def _on_client_key_exchange(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, ClientKeyExchange) and self._key_share is not None
        if self.state is State.SERVER_WAIT_CERTIFICATE and self._remote_fingerprints is not None:
            # The client skipped its Certificate although we asked and SDP promised one.
            return None, AlertDescription.handshake_failure
        pre_master = self._key_share.exchange_untrusted(body.public)
        self._transcript += raw
        self._derive_keys(pre_master)
        self.state = (
            State.SERVER_WAIT_CERTIFICATE_VERIFY
            if self._peer_public_key is not None
            else State.SERVER_WAIT_FINISHED
        )
        return None, None

    def _on_certificate_verify(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, CertificateVerify) and self._peer_public_key is not None
        # RFC 5246 §7.4.8: the signature covers every handshake message so far.
        verify_untrusted(
            self._peer_public_key, body.signature_scheme, body.signature, bytes(self._transcript)
        )
        self._transcript += raw
        self.state = State.SERVER_WAIT_FINISHED
        return None, None

    def _on_finished(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert (
            isinstance(body, Finished)
            and self._suite is not None
            and self._master_secret is not None
        )
        hash_name = SUITES[self._suite].hash_name
        label = b"server finished" if self.role is Role.CLIENT else b"client finished"
        expected = finished_verify_data(
            hash_name, self._master_secret, label, bytes(self._transcript)
        )
        # RFC 5246 §7.4.9: a wrong verify_data is fatal decrypt_error.
        if not hmac.compare_digest(expected, body.verify_data):
            return None, AlertDescription.decrypt_error
        self._transcript += raw
        flight: Flight | None = None
        if self.role is Role.SERVER:
            # Flight 6: ChangeCipherSpec + Finished. No timer: we resend it only when the
            # client retransmits flight 5 (RFC 6347 §4.2.4, the final flight case).
            flight = [
                _Outgoing(ContentType.CHANGE_CIPHER_SPEC, 0, 0, 0, b"\x01"),
                self._handshake_out(
                    Finished(
                        finished_verify_data(
                            hash_name,
                            self._master_secret,
                            b"server finished",
                            bytes(self._transcript),
                        )
                    ),
                    epoch=1,
                ),
            ]
        self._complete(now)
        if flight is not None:
            self._send_new_flight(now, flight, arm_timer=False)
        else:
            # Client: nothing left to retransmit; the server is done too.
            self._flight = None
        return None, None

    # --- client flights ---------------------------------------------------------------

    def _client_hello_out(self, cookie: bytes) -> _Outgoing:
        extensions: list[Extension] = [
            (ExtensionType.supported_groups, _u16_vector(self._groups)),
            (ExtensionType.ec_point_formats, b"\x01\x00"),
            (ExtensionType.signature_algorithms, _u16_vector(SUPPORTED_SIGNATURE_SCHEMES)),
            (ExtensionType.extended_master_secret, b""),
            (ExtensionType.renegotiation_info, b"\x00"),
        ]
        if self._srtp_profiles:
            extensions.append((ExtensionType.use_srtp, encode_use_srtp(self._srtp_profiles)))
        hello = ClientHello(
            DTLS_1_2, self._client_random, b"", cookie, self._suites, b"\x00", tuple(extensions)
        ) if self._hello_template is None else replace(self._hello_template, cookie=cookie)
        self._client_hello = hello
        out = self._handshake_out(hello)
        # RFC 6347 §4.2.6: the first ClientHello and the HelloVerifyRequest are not part
        # of the transcript, so the transcript restarts with each ClientHello we send.
        self._transcript = bytearray(
            handshake_header(out.msg_type, len(out.body), out.message_seq) + out.body
        )
        return out

    def adopt_client_hello(self, now: float, hello: ClientHello, next_record_seq: int) -> None:
        """Continue as 1.2 after a 1.3-capable ClientHello (versioned.py) got a 1.2 answer:
        that ClientHello is flight 1 and the start of the transcript (RFC 8446 §4.1.3)."""
        self._hello_template, self._client_random = hello, hello.random
        self._write_seq[0] = next_record_seq
        self.state = State.CLIENT_WAIT_SERVER_HELLO
        self._send_new_flight(now, [self._client_hello_out(hello.cookie)], emit=False)

    def _on_hello_verify_request(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, HelloVerifyRequest)
        self._hvr_count += 1
        # A server that keeps asking is broken or hostile; RFC 6347 expects one round.
        if self._hvr_count > 3 or not body.cookie:
            return None, AlertDescription.illegal_parameter
        return [self._client_hello_out(body.cookie)], None

    def _on_server_hello(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, ServerHello) and self._client_hello is not None
        if body.server_version != DTLS_1_2:
            return None, AlertDescription.protocol_version
        if self._hello_template is not None and body.random[-8:] in DOWNGRADE_SENTINELS:
            return None, AlertDescription.illegal_parameter  # RFC 8446 §4.1.3 downgrade
        if body.cipher_suite not in self._suites or body.compression_method != 0:
            return None, AlertDescription.illegal_parameter
        offered = {t for t, _ in self._client_hello.extensions}
        for ext_type, _ in body.extensions:
            # RFC 5246 §7.4.1.4: the server may only answer extensions we sent.
            if ext_type not in offered:
                return None, AlertDescription.unsupported_extension
        # RFC 7627 §5.2: a client that requires EMS aborts if the server does not echo it.
        if find_extension(body.extensions, ExtensionType.extended_master_secret) is None:
            return None, AlertDescription.handshake_failure
        reneg = find_extension(body.extensions, ExtensionType.renegotiation_info)
        if reneg is not None and parse_renegotiation_info_untrusted(reneg) != b"":
            return None, AlertDescription.handshake_failure
        srtp = find_extension(body.extensions, ExtensionType.use_srtp)
        if self._srtp_profiles:
            if srtp is None:
                return None, AlertDescription.handshake_failure
            chosen, mki = parse_use_srtp_untrusted(srtp)
            # RFC 5764 §4.1.1: exactly one profile, one we offered, and our (empty) MKI.
            if len(chosen) != 1 or chosen[0] not in self._srtp_profiles or mki:
                return None, AlertDescription.illegal_parameter
            self._srtp_profile = SrtpProfile(chosen[0])
        self._suite = CipherSuite(body.cipher_suite)
        self._server_random = body.random
        self._transcript += raw
        self.state = State.CLIENT_WAIT_CERTIFICATE
        return None, None

    def _on_server_certificate(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, CertificateMessage)
        if not body.certificates:
            return None, AlertDescription.handshake_failure
        alert = self._accept_peer_certificate(body)
        if alert is not None:
            return None, alert
        self._transcript += raw
        self.state = State.CLIENT_WAIT_KEY_EXCHANGE
        return None, None

    def _on_server_key_exchange(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, ServerKeyExchange) and self._peer_public_key is not None
        if body.named_group not in self._groups:
            return None, AlertDescription.illegal_parameter
        # RFC 8422 §5.4: the signature binds both randoms to the server's ECDH share.
        verify_untrusted(
            self._peer_public_key,
            body.signature_scheme,
            body.signature,
            self._client_random + self._server_random + body.params(),
        )
        self._group = NamedGroup(body.named_group)
        self._key_share = KeyShare(self._group)
        self._peer_ecdh_public = body.public
        self._transcript += raw
        self.state = State.CLIENT_WAIT_HELLO_DONE
        return None, None

    def _on_certificate_request(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert isinstance(body, CertificateRequest)
        # We can only answer with an ECDSA certificate signed with SHA-256.
        if CLIENT_CERT_TYPE_ECDSA_SIGN not in body.certificate_types or (
            SignatureScheme.ecdsa_secp256r1_sha256 not in body.signature_schemes
        ):
            return None, AlertDescription.handshake_failure
        self._certificate_requested = True
        self._transcript += raw
        return None, None  # stay in CLIENT_WAIT_HELLO_DONE

    def _on_server_hello_done(
        self, now: float, body: HandshakeBody, raw: bytes, msg: HandshakeMessage
    ) -> HandlerResult:
        assert self._key_share is not None and self._suite is not None
        self._transcript += raw
        # Flight 5 (RFC 6347 §4.2.4): [Certificate] ClientKeyExchange [CertificateVerify]
        # ChangeCipherSpec Finished.
        flight: Flight = []
        if self._certificate_requested:
            flight.append(
                self._append_transcript(
                    self._handshake_out(CertificateMessage((self.certificate.der,)))
                )
            )
        pre_master = self._key_share.exchange_untrusted(self._peer_ecdh_public)
        flight.append(
            self._append_transcript(self._handshake_out(ClientKeyExchange(self._key_share.public)))
        )
        # RFC 7627 §4: the session hash runs through ClientKeyExchange.
        self._derive_keys(pre_master)
        if self._certificate_requested:
            scheme, signature = sign(self.certificate.private_key, bytes(self._transcript))
            flight.append(
                self._append_transcript(self._handshake_out(CertificateVerify(scheme, signature)))
            )
        flight.append(_Outgoing(ContentType.CHANGE_CIPHER_SPEC, 0, 0, 0, b"\x01"))
        assert self._master_secret is not None
        verify = finished_verify_data(
            SUITES[self._suite].hash_name,
            self._master_secret,
            b"client finished",
            bytes(self._transcript),
        )
        flight.append(self._append_transcript(self._handshake_out(Finished(verify), epoch=1)))
        self.state = State.CLIENT_WAIT_FINISHED
        return flight, None

    _HANDLERS: dict[
        int,
        Callable[[Dtls12Connection, float, HandshakeBody, bytes, HandshakeMessage], HandlerResult],
    ] = {}

    # --- shared helpers ---------------------------------------------------------------

    def _accept_peer_certificate(self, body: CertificateMessage) -> AlertDescription | None:
        if not body.certificates:
            # RFC 5246 §7.4.6: the client may send none; we then require that SDP did not
            # promise a fingerprint.
            return (
                AlertDescription.handshake_failure
                if self._remote_fingerprints is not None
                else None
            )
        alert, self._peer_fingerprint, self._peer_public_key = check_peer_certificate(
            body.certificates[0], self._remote_fingerprints
        )
        return alert

    def _derive_keys(self, pre_master: bytes) -> None:
        assert self._suite is not None
        hash_name = SUITES[self._suite].hash_name
        session_hash = transcript_hash(hash_name, bytes(self._transcript))
        self._master_secret = extended_master_secret(hash_name, pre_master, session_hash)
        keys = derive_epoch_keys(
            self._suite, self._master_secret, self._client_random, self._server_random
        )
        if self.role is Role.CLIENT:
            self._write_cipher, self._read_cipher = keys.client, keys.server
        else:
            self._write_cipher, self._read_cipher = keys.server, keys.client

    def _complete(self, now: float) -> None:
        assert self._suite is not None
        self.state = State.ESTABLISHED
        self._retransmit_at = None
        self._reassembler.clear()
        self._key_share = None  # forward secrecy: the ephemeral key is no longer needed
        self._events.append(
            HandshakeComplete(self._srtp_profile, self._suite, self._peer_fingerprint)
        )
        for data in self._early_app_data:
            self._events.append(ApplicationData(data))
        self._early_app_data.clear()

    def _append_transcript(self, out: _Outgoing) -> _Outgoing:
        self._transcript += (
            handshake_header(out.msg_type, len(out.body), out.message_seq) + out.body
        )
        return out

    def _handshake_out(self, body: HandshakeBody, epoch: int = 0) -> _Outgoing:
        seq = self._send_message_seq
        self._send_message_seq += 1
        return _Outgoing(ContentType.HANDSHAKE, epoch, body.msg_type, seq, bytes(body))

    def _cookie_valid(self, now: float, hello: ClientHello) -> bool:
        if not hello.cookie:
            return False
        # Accept cookies from this and the previous bucket so one minted just before a
        # bucket boundary still works; older ones are stale (bounded replay of cookies).
        return any(
            hmac.compare_digest(hello.cookie, self._make_cookie(now, hello, back))
            for back in (0, 1)
        )

    def _make_cookie(self, now: float, hello: ClientHello, back: int) -> bytes:
        assert self._cookie_secret is not None
        bucket = int(now // _COOKIE_BUCKET_SECONDS) - back
        mac = hmac.new(self._cookie_secret, digestmod=hashlib.sha256)
        mac.update(len(self._cookie_context).to_bytes(2, "big") + self._cookie_context)
        mac.update(bucket.to_bytes(8, "big", signed=True))
        # RFC 6347 §4.2.1: bind the cookie to the ClientHello parameters that must not
        # change between the two ClientHellos (everything but the cookie itself).
        mac.update(
            u16(hello.client_version)
            + hello.random
            + bytes((len(hello.session_id),))
            + hello.session_id
        )
        mac.update(b"".join(u16(s) for s in hello.cipher_suites) + hello.compression_methods)
        return mac.digest()

    # --- record layer: send -----------------------------------------------------------

    def _encode_record(self, content_type: int, epoch: int, payload: bytes) -> bytes:
        seq = self._write_seq[epoch]
        self._write_seq[epoch] = seq + 1
        if epoch:
            assert self._write_cipher is not None
            payload = self._write_cipher.encrypt(content_type, DTLS_1_2, epoch, seq, payload)
        return Record(content_type, DTLS_1_2, epoch, seq, payload).__bytes__()

    def _send_new_flight(
        self, now: float, flight: Flight, *, arm_timer: bool = True, emit: bool = True
    ) -> None:
        self._flight = flight
        # A new flight means the previous one got through: start again from the initial
        # timer (RFC 6347 §4.2.4.1 backs off only on loss).
        self._rto = self._initial_rto
        self._retransmit_count = 0
        self._retransmit_at = now + self._rto if arm_timer else None
        if emit:
            self._emit_flight(flight)

    def _emit_flight(self, flight: Flight) -> None:
        """Fragment and pack a flight into datagrams of at most ``mtu`` bytes."""
        datagram = bytearray()
        for out in flight:
            cipher_overhead = self._write_cipher.overhead if out.epoch and self._write_cipher else 0
            overhead = RECORD_HEADER_LEN + cipher_overhead
            if out.content_type != ContentType.HANDSHAKE:
                if len(datagram) + overhead + len(out.body) > self.mtu:
                    self._tx.append(bytes(datagram))
                    datagram = bytearray()
                datagram += self._encode_record(out.content_type, out.epoch, out.body)
                continue
            offset = 0
            total = len(out.body)
            while True:
                room = self.mtu - len(datagram) - overhead - HANDSHAKE_HEADER_LEN
                # Start a new datagram rather than send a sliver of a fragment.
                if room < min(total - offset, 64) or room <= 0:
                    self._tx.append(bytes(datagram))
                    datagram = bytearray()
                    continue
                chunk = out.body[offset : offset + room]
                frag = HandshakeFragment(out.msg_type, total, out.message_seq, offset, chunk)
                datagram += self._encode_record(ContentType.HANDSHAKE, out.epoch, bytes(frag))
                offset += len(chunk)
                if offset >= total:
                    break
        if datagram:
            self._tx.append(bytes(datagram))

    def _queue_alert(self, level: AlertLevel, description: AlertDescription) -> None:
        epoch = 1 if self._write_cipher is not None else 0
        self._pending_records.append(
            self._encode_record(ContentType.ALERT, epoch, bytes((level, description)))
        )

    def _pack_pending(self) -> None:
        datagram = bytearray()
        for record in self._pending_records:
            if datagram and len(datagram) + len(record) > self.mtu:
                self._tx.append(bytes(datagram))
                datagram = bytearray()
            datagram += record
        if datagram:
            self._tx.append(bytes(datagram))
        self._pending_records.clear()

    def _fail(self, alert: AlertDescription, reason: str) -> None:
        """Fatal error detected locally: send the alert and end (RFC 5246 §7.2.2)."""
        self._queue_alert(AlertLevel.FATAL, alert)
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


def _u16_vector(values: Sequence[int]) -> bytes:
    data = b"".join(u16(v) for v in values)
    return u16(len(data)) + data


Dtls12Connection._HANDLERS = {
    HandshakeType.CLIENT_HELLO: Dtls12Connection._on_client_hello,
    HandshakeType.CERTIFICATE: lambda self, now, body, raw, msg: (
        self._on_server_certificate(now, body, raw, msg)
        if self.role is Role.CLIENT
        else self._on_client_certificate(now, body, raw, msg)
    ),
    HandshakeType.CLIENT_KEY_EXCHANGE: Dtls12Connection._on_client_key_exchange,
    HandshakeType.CERTIFICATE_VERIFY: Dtls12Connection._on_certificate_verify,
    HandshakeType.FINISHED: Dtls12Connection._on_finished,
    HandshakeType.HELLO_VERIFY_REQUEST: Dtls12Connection._on_hello_verify_request,
    HandshakeType.SERVER_HELLO: Dtls12Connection._on_server_hello,
    HandshakeType.SERVER_KEY_EXCHANGE: Dtls12Connection._on_server_key_exchange,
    HandshakeType.CERTIFICATE_REQUEST: Dtls12Connection._on_certificate_request,
    HandshakeType.SERVER_HELLO_DONE: Dtls12Connection._on_server_hello_done,
}
