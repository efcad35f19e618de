"""A sans-IO DTLS 1.3 connection (RFC 9147) for WebRTC, in either role.

The verbs, timers and closing are :class:`~.engine.Engine`'s; callers use it through
:class:`~appliance.proto.dtls.DtlsConnection` with ``versions`` containing ``"1.3"``.

* Handshake: RFC 8446 §2 full (EC)DHE handshake, certificate authentication in both
  directions (the server always sends CertificateRequest, §4.3.2; WebRTC authenticates
  both ends by the SDP fingerprint, RFC 8827 §6.5); CertificateVerify with
  ecdsa_secp256r1_sha256 (§4.4.3); Finished (§4.4.4). DTLS changes: RFC 9147 §5.2
  handshake header (message_seq, fragments) with a TLS-style transcript (no DTLS fields,
  §5.2), no compatibility mode (§5: empty session id echo, no ChangeCipherSpec).
* Version negotiation: supported_versions (RFC 8446 §4.2.1). A server whose ClientHello
  lacks 1.3 hands the buffered datagrams to the 1.2 engine (``fallback``) when 1.2 is
  enabled; a client whose ServerHello says 1.2 (or that gets a HelloVerifyRequest) does
  the same with the ClientHello it sent. Downgrade sentinels: §4.1.3.
* HelloRetryRequest (RFC 8446 §4.1.4) with a stateless cookie (RFC 9147 §5.1): the
  cookie carries an HMAC-protected hash of ClientHello1 and the choices made, so the
  server keeps nothing for a ClientHello without a valid cookie. HRR is sent when the
  client offered no usable key share, or when cookies are required (the 1.2 code's
  HelloVerifyRequest policy: ``cookie_secret`` / :meth:`require_cookies`).
* Key exchange: X25519, P-256 and X25519MLKEM768 when ML-KEM is available
  (:data:`.keyschedule13.HAVE_MLKEM`); a client that offers only groups we lack gets an
  HRR for one we have, if its supported_groups lists one.
* ACKs (RFC 9147 §7): the final client flight and every post-handshake message are
  ACKed; ACKed fragments are not resent. KeyUpdate (RFC 9147 §8, RFC 8446 §4.6.3) in
  both directions; the new write epoch starts once our KeyUpdate is ACKed.
* SRTP: use_srtp in ClientHello / EncryptedExtensions (RFC 5764 §4.1.1), keys from the
  TLS 1.3 exporter (RFC 8446 §7.5) through :meth:`export_keying_material`.

Deliberately omitted: PSK, resumption and NewSessionTicket (ignored when received),
0-RTT, connection IDs (RFC 9147 §9), post-handshake client authentication, RSA/EdDSA.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric import ec

from appliance.proto.dtls import handshake13 as hs
from appliance.proto.dtls._wire import (
    AlertDescription,
    CipherSuite13,
    ContentType13,
    DtlsError,
    Group13,
    HandshakeType13,
)
from appliance.proto.dtls.certificate import Certificate
from appliance.proto.dtls.conn_protocol import S13
from appliance.proto.dtls.engine import Engine, Options
from appliance.proto.dtls.events import (
    ApplicationData,
    Counters,
    FalseStart,
    HandshakeComplete,
    Role,
    State,
)
from appliance.proto.dtls.keyschedule13 import (
    KeySchedule,
    KeyShare13,
    RecordProtection13,
    supported_groups,
)
from appliance.proto.dtls.messages import ClientHello, KeyUpdate
from appliance.proto.dtls.record import (
    HandshakeMessage,
    parse_handshake_fragments_untrusted,
    parse_record_untrusted,
)
from appliance.proto.dtls.record13 import Ack, is_unified_header, parse_ciphertext_untrusted
from appliance.proto.dtls.recordlayer13 import CIPHERTEXT_OVERHEAD, OutMessage, RecordLayer13
from appliance.proto.errors import LocalProtocolError

DEFAULT_CIPHER_SUITES_13: tuple[CipherSuite13, ...] = (
    CipherSuite13.TLS_AES_128_GCM_SHA256,
    CipherSuite13.TLS_CHACHA20_POLY1305_SHA256,
    CipherSuite13.TLS_AES_256_GCM_SHA384,
)
_MAX_EARLY = 32
# Raw datagrams kept while the version is undecided, replayed into the 1.2 engine.
_MAX_FALLBACK_DATAGRAMS = 16

_PUBLIC_STATE = {
    S13.CLIENT_IDLE: State.CLIENT_IDLE,
    S13.C_WAIT_SH: State.CLIENT_WAIT_SERVER_HELLO,
    S13.C_WAIT_EE: State.CLIENT_WAIT_CERTIFICATE,
    S13.C_WAIT_CERT_CR: State.CLIENT_WAIT_CERTIFICATE,
    S13.C_WAIT_CERT: State.CLIENT_WAIT_CERTIFICATE,
    S13.C_WAIT_CV: State.CLIENT_WAIT_CERTIFICATE,
    S13.C_WAIT_FIN: State.CLIENT_WAIT_FINISHED,
    S13.S_WAIT_CH: State.SERVER_WAIT_CLIENT_HELLO,
    S13.S_WAIT_CERT: State.SERVER_WAIT_CERTIFICATE,
    S13.S_WAIT_CV: State.SERVER_WAIT_CERTIFICATE_VERIFY,
    S13.S_WAIT_FIN: State.SERVER_WAIT_FINISHED,
    S13.ESTABLISHED: State.ESTABLISHED,
    S13.CLOSED: State.CLOSED,
}


#: Server states after our flight and before the client's Finished (``half_rtt``).
_HALF_RTT_STATES = frozenset({S13.S_WAIT_CERT, S13.S_WAIT_CV, S13.S_WAIT_FIN})


class Engine13(Engine):
    """One DTLS 1.3 association with one peer (see the module docstring)."""

    rl: RecordLayer13

    def __init__(
        self,
        role: Role,
        certificate: Certificate,
        options: Options,
        *,
        cipher_suites: Sequence[CipherSuite13] = DEFAULT_CIPHER_SUITES_13,
        groups: Sequence[Group13] | None = None,
        fallback_12: bool = False,
        hello_12: tuple[tuple[int, ...], tuple[tuple[int, bytes], ...]] = ((), ()),
        half_rtt: bool = False,
        counters: Counters | None = None,
    ) -> None:
        if not cipher_suites:
            raise LocalProtocolError("cipher_suites for DTLS 1.3 must not be empty")
        groups = tuple(Group13(g) for g in (supported_groups() if groups is None else groups))
        if not groups:
            raise LocalProtocolError("groups must not be empty")
        super().__init__(role, certificate, options, counters)
        # Server only, opt-in: the exporter (so SRTP) works once our flight is sent, before
        # the client's certificate and Finished arrive: "0.5-RTT data" (RFC 8446 §4.4.4,
        # Appendix E.1 — sent to a peer not yet authenticated). FalseStart says when.
        self._half_rtt = half_rtt and role is Role.SERVER
        self._half_rtt_sent = False
        self._suites = tuple(CipherSuite13(s) for s in cipher_suites)
        self._groups = groups
        # HRR for a key-share mismatch needs a cookie even when cookies are not required.
        self._hrr_secret = options.rng(32)
        self._fallback_12 = fallback_12
        self._hello_12 = hello_12  # (1.2 suites, 1.2-only extensions) for a combined hello
        self.rl = RecordLayer13(options.mtu, self.counters)
        self._state = S13.CLIENT_IDLE if role is Role.CLIENT else S13.S_WAIT_CH
        self._send_msg_seq = 0
        self._early_records: list[tuple[int, bytes, int]] = []  # (bits, raw datagram, offset)
        self._early_app: list[bytes] = []
        self._to_ack: list[tuple[int, int]] = []
        self._raw: list[bytes] | None = [] if (fallback_12 or role is Role.SERVER) else None
        #: set when the peer speaks only 1.2: the caller continues with the 1.2 engine
        self.fallback: list[bytes] | None = None
        self.fallback_hello: ClientHello | None = None
        # Negotiated state.
        self._suite: CipherSuite13 | None = None
        self._ks: KeySchedule | None = None
        self._secrets: dict[str, bytes] = {}
        self._ku_pending = False
        self._last_seq0 = 0
        # Handshake scratch (handshake13.py).
        self._client_random = b""
        self._shares: dict[Group13, KeyShare13] = {}
        self._hello: ClientHello | None = None
        self._hrr_done = False
        self._hrr_suite: CipherSuite13 | None = None
        self._cert_requested = False
        self._cert_request_context = b""
        self._peer_key: ec.EllipticCurvePublicKey | None = None

    # --- state and verbs --------------------------------------------------------------

    @property
    def state(self) -> State:
        return _PUBLIC_STATE[self._state]

    @property
    def is_established(self) -> bool:
        return self._state is S13.ESTABLISHED

    @property
    def _closed(self) -> bool:
        return self._state is S13.CLOSED

    @property
    def _inert(self) -> bool:
        # S13, not the public state: Enum hashing (the state map) is slow per datagram.
        return self._state is S13.CLOSED or self._state is S13.CLIENT_IDLE

    @property
    def _stopped(self) -> bool:
        return self._state is S13.CLOSED or self.fallback is not None

    @property
    def cipher_suite(self) -> CipherSuite13 | None:
        return self._suite

    @property
    def max_application_data(self) -> int:
        return min(2**14, self.rl.mtu - CIPHERTEXT_OVERHEAD)

    def start(self, now: float) -> None:
        if self.role is not Role.CLIENT or self._state is not S13.CLIENT_IDLE:
            raise LocalProtocolError("start() is for a fresh client connection")
        hs.client_start(self, now)

    def key_update(self, now: float, *, request_peer: bool = True) -> None:
        """Send a KeyUpdate (RFC 8446 §4.6.3); our new epoch starts when it is ACKed."""
        if self._state is not S13.ESTABLISHED:
            raise LocalProtocolError("KeyUpdate needs an established connection")
        if self._ku_pending or self.rl.flight is not None:
            raise LocalProtocolError("a previous flight is not acknowledged yet")
        self._send_key_update(now, request_peer)

    def export_keying_material(self, label: bytes, length: int) -> bytes:
        """RFC 8446 §7.5 exporter with an empty context (RFC 5764 §4.2 for SRTP)."""
        early = self._half_rtt_sent and self._state in _HALF_RTT_STATES
        if (self._state is not S13.ESTABLISHED and not early) or self._ks is None:
            raise LocalProtocolError("keying material is available once the handshake completes")
        return self._ks.export(self._secrets["exporter"], label, b"", length)

    def _read_datagram(self, now: float, data: bytes) -> None:
        if self._raw is not None and len(self._raw) < _MAX_FALLBACK_DATAGRAMS:
            self._raw.append(bytes(data))
        self._records(now, data, 0)
        self._drain_early(now)
        if self.fallback is None:
            self._flush_acks()

    def _datagram_done(self, now: float) -> None:
        if (self._half_rtt and not self._half_rtt_sent and self._state in _HALF_RTT_STATES
                and "exporter" in self._secrets):
            # Our flight (…Finished) is out: the traffic and exporter secrets are final.
            self._half_rtt_sent = True
            assert self._suite is not None
            self._events.append(FalseStart(self._srtp_profile, self._suite, None))

    # --- record layer: receive --------------------------------------------------------

    def _records(self, now: float, data: bytes, offset: int) -> None:
        while offset < len(data) and not self._closed and self.fallback is None:
            first = data[offset]
            if is_unified_header(first):
                try:
                    rec, end = parse_ciphertext_untrusted(data, offset)
                except DtlsError:
                    self.counters.records_dropped += 1
                    return
                epoch = self.rl.match_epoch(rec.epoch_bits)
                if epoch is None:
                    # RFC 9147 §4.2.1: keys for this epoch may still come (a reordered
                    # ServerHello); hold a bounded number of such records.
                    if len(self._early_records) < _MAX_EARLY and self._state is not S13.ESTABLISHED:
                        self._early_records.append((rec.epoch_bits, data, offset))
                    else:
                        self.counters.records_dropped += 1
                    offset = end
                    continue
                opened = self.rl.open_untrusted(rec, epoch)
                offset = end
                if opened is not None:
                    seq, content_type, content = opened
                    self._on_record(now, content_type, epoch, seq, content)
            elif first in (ContentType13.HANDSHAKE, ContentType13.ALERT, ContentType13.ACK, 20):
                try:
                    record, offset = parse_record_untrusted(data, offset)
                except DtlsError:
                    self.counters.records_dropped += 1
                    return
                if record.epoch != 0 or not self.rl.window0.check(record.sequence_number):
                    self.counters.records_dropped += 1
                    continue
                self.rl.window0.mark(record.sequence_number)
                self._last_seq0 = max(self._last_seq0, record.sequence_number)
                if record.content_type in (ContentType13.HANDSHAKE, ContentType13.ALERT):
                    self._on_record(now, record.content_type, 0, record.sequence_number,
                                    record.fragment)
            else:
                # RFC 9147 §4.1: neither format: reject the rest of the datagram.
                self.counters.records_dropped += 1
                return

    def _drain_early(self, now: float) -> None:
        while self._early_records and not self._closed and self.fallback is None:
            ready = [e for e in self._early_records if self.rl.match_epoch(e[0]) is not None]
            if not ready:
                return
            self._early_records = [e for e in self._early_records if e not in ready]
            for _bits, data, offset in ready:
                # Re-parse just this one record (the rest of its datagram was handled).
                rec, _end = parse_ciphertext_untrusted(data, offset)
                epoch = self.rl.match_epoch(rec.epoch_bits)
                assert epoch is not None
                opened = self.rl.open_untrusted(rec, epoch)
                if opened is not None:
                    self._on_record(now, opened[1], epoch, opened[0], opened[2])

    def _on_record(self, now: float, content_type: int, epoch: int, seq: int, content: bytes) -> None:
        if content_type == ContentType13.HANDSHAKE:
            try:
                fragments = parse_handshake_fragments_untrusted(content)
            except DtlsError:
                self.counters.records_dropped += 1
                return
            if epoch >= 2:
                # RFC 9147 §7: remember what to ACK (sent for the final flight and for
                # anything after the handshake).
                self._to_ack.append((epoch, seq))
                if self.role is Role.SERVER and self._state in (S13.S_WAIT_CERT, S13.S_WAIT_CV,
                                                                S13.S_WAIT_FIN):
                    # The client's flight has begun: ours arrived (implicit ACK, §7.1).
                    self._retransmit_at = None
            for frag in fragments:
                self._handle_fragment(now, frag, epoch)
                if self._stopped:
                    return
        elif content_type == ContentType13.ACK:
            try:
                ack = Ack.parse_untrusted(content)
            except DtlsError:
                self.counters.records_dropped += 1
                return
            if epoch >= 2 and self.rl.on_ack(ack.record_numbers):
                self._flight_acked()
        elif content_type == ContentType13.ALERT:
            self._handle_alert(content)
        elif content_type == ContentType13.APPLICATION_DATA and epoch >= 3:
            if self._state is S13.ESTABLISHED:
                self._events.append(ApplicationData(content))
            elif len(self._early_app) < _MAX_EARLY:
                self._early_app.append(content)  # the peer's Finished is still on its way
        else:
            self.counters.records_dropped += 1

    def _flush_acks(self) -> None:
        # During the handshake only the server ACKs, once the client's final flight is
        # complete (the other flights are acknowledged by the next flight, §7.1).
        if self._to_ack and self._state is S13.ESTABLISHED and self.rl.write_epoch >= 3:
            numbers = tuple(self._to_ack[-64:])
            self._to_ack.clear()
            self.rl.queue_record(ContentType13.ACK, self.rl.write_epoch, bytes(Ack(numbers)))
        elif self._state is not S13.ESTABLISHED and self.role is Role.CLIENT:
            self._to_ack.clear()

    def _flight_acked(self) -> None:
        self.rl.flight_done()
        self._retransmit_at = None
        if self._ku_pending:
            # RFC 9147 §8: switch to the new keys only once the KeyUpdate is ACKed.
            self._ku_pending = False
            self._advance_write_epoch()

    def _alert_is_fatal(self, level: int, desc: AlertDescription) -> bool:
        # RFC 8446 §6.2: in 1.3 every error alert is fatal, whatever its level says.
        return desc is not AlertDescription.user_canceled

    # --- send helpers -----------------------------------------------------------------

    def _out(self, msg_type: int, body: bytes, epoch: int) -> OutMessage:
        seq = self._send_msg_seq
        self._send_msg_seq += 1
        self._transcript += bytes((msg_type,)) + len(body).to_bytes(3, "big") + body
        return OutMessage(epoch, msg_type, seq, body)

    def _install(self, epoch: int, write_secret: bytes, read_secret: bytes) -> None:
        assert self._suite is not None
        self.rl.install_write(epoch, RecordProtection13(self._suite, write_secret))
        self.rl.install_read(epoch, RecordProtection13(self._suite, read_secret))

    def _advance_write_epoch(self) -> None:
        assert self._ks is not None and self._suite is not None
        self._secrets["write"] = self._ks.next_secret(self._secrets["write"])
        self.rl.write_epoch += 1
        self.rl.install_write(self.rl.write_epoch,
                              RecordProtection13(self._suite, self._secrets["write"]))

    def _send_key_update(self, now: float, request_peer: bool) -> None:
        self._ku_pending = True
        out = self._out(HandshakeType13.KEY_UPDATE, bytes(KeyUpdate(request_peer)),
                        self.rl.write_epoch)
        self._send_flight(now, [out])

    def _handle_message(self, now: float, msg: HandshakeMessage) -> None:
        hs.handle_message(self, now, msg)

    def _enter_closed(self) -> None:
        self._state = S13.CLOSED
        self._early_records.clear()

    def _complete(self) -> None:
        assert self._suite is not None
        self._state = S13.ESTABLISHED
        self._raw = None
        self._events.append(HandshakeComplete(self._srtp_profile, self._suite,
                                              self._peer_fingerprint, "1.3"))
        for data in self._early_app:
            self._events.append(ApplicationData(data))
        self._early_app.clear()

