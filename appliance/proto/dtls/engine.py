"""What the DTLS 1.2 and 1.3 engines share: :class:`Engine`, one handshake engine's verbs.

An engine is one version's state machine behind :class:`~.connection.DtlsConnection`:
:class:`~.engine12.Engine12` (RFC 6347) and :class:`~.engine13.Engine13` (RFC 9147). This
base holds everything that does not depend on the version:

* the shared options and their checks (fingerprints, SRTP profiles, cookies, MTU, timers);
* the retransmission timer (RFC 6347 §4.2.4.1, RFC 9147 §5.8.2: initial timer, doubled on
  each expiry up to 60 s, a bounded number of tries) and the answer to a repeated peer
  flight (RFC 6347 §4.2.4, RFC 9147 §5.8.1), at most once per ``DUP_RETRANSMIT_INTERVAL``;
* handshake fragments into the reassembler, following the client's message_seq while
  nothing is committed (RFC 6347 §4.2.1 stateless cookies);
* alerts out, closing, the event queue, and the record layer's interface
  (:class:`~.recordlayer.RecordLayer`: ``queue_record``, ``new_flight``, ``emit_flight``,
  ``poll_transmit``).

A subclass reads records (:meth:`_read_datagram`), handles reassembled messages
(:meth:`_handle_message`) and exports keys.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from appliance.proto.dtls._wire import AlertDescription, AlertLevel, ContentType, DtlsError
from appliance.proto.dtls.certificate import Certificate, normalize_fingerprint
from appliance.proto.dtls.events import (
    DUP_RETRANSMIT_INTERVAL,
    ConnectionClosed,
    Counters,
    Event,
    Role,
    State,
)
from appliance.proto.dtls.record import HandshakeFragment, HandshakeMessage, Reassembler
from appliance.proto.dtls.recordlayer import RecordLayer
from appliance.proto.errors import LocalProtocolError
from appliance.proto.srtp.profile import DEFAULT_SRTP_PROFILES, SrtpProfile

# RFC 6347 §4.2.4.1 / RFC 9147 §5.8.2: 1 s initial timer, doubling, at most 60 s.
DEFAULT_INITIAL_RTO = 1.0
MAX_RTO = 60.0
_CLIENT_HELLO = 1  # the same handshake type in both versions


@dataclass(frozen=True, slots=True)
class Options:
    """The options both versions take (see :class:`~.connection.DtlsConnection`)."""

    remote_fingerprints: Sequence[str] | None
    srtp_profiles: Sequence[SrtpProfile] = DEFAULT_SRTP_PROFILES
    cookie_secret: bytes | None = None
    cookie_context: bytes = b""
    mtu: int = 1200
    max_handshake_buffer: int = 32 * 1024
    initial_retransmit: float = DEFAULT_INITIAL_RTO
    max_retransmissions: int = 10
    rng: Callable[[int], bytes] = os.urandom


class Engine:
    """One version's DTLS state machine; see the module docstring."""

    rl: RecordLayer[Any]
    #: 1.2: a retransmitted epoch-0 message after the handshake still means our last
    #: flight was lost (the server's final flight, RFC 6347 §4.2.4); 1.3 has ACKs.
    _EPOCH0_DUPLICATES_AFTER_HANDSHAKE = False

    def __init__(self, role: Role, certificate: Certificate, options: Options,
                 counters: Counters | None) -> None:
        remote_fingerprints, mtu, cookie_secret = (
            options.remote_fingerprints, options.mtu, options.cookie_secret)
        if remote_fingerprints is not None:
            if not remote_fingerprints:
                raise LocalProtocolError("remote_fingerprints is empty; pass None to opt out")
            for fp in remote_fingerprints:
                normalize_fingerprint(fp)  # raises LocalProtocolError on garbage
        if mtu < 256:
            raise LocalProtocolError("mtu below 256 cannot carry the handshake")
        if cookie_secret is not None and role is not Role.SERVER:
            raise LocalProtocolError("cookies are a server feature")
        self.role = role
        self.certificate = certificate
        self.counters = counters if counters is not None else Counters()
        self._remote_fingerprints = tuple(remote_fingerprints) if remote_fingerprints else None
        self._srtp_profiles = tuple(SrtpProfile(p) for p in options.srtp_profiles)
        self._cookie_secret = cookie_secret
        self._cookie_context = options.cookie_context
        self._initial_rto = options.initial_retransmit
        self._max_retransmissions = options.max_retransmissions
        self._rng = options.rng
        self._reassembler = Reassembler(options.max_handshake_buffer)
        self._transcript = bytearray()
        self._events: deque[Event] = deque()
        self._srtp_profile: SrtpProfile | None = None
        self._peer_fingerprint: str | None = None
        self._rto = options.initial_retransmit
        self._retransmit_at: float | None = None
        self._retransmit_count = 0
        self._dup_seen = False
        self._dup_retransmit_at = -math.inf

    # --- state, as each version keeps it ----------------------------------------------

    @property
    def state(self) -> State:
        raise NotImplementedError

    def _enter_closed(self) -> None:
        """Set the version's state to closed and drop what only the handshake needed."""
        raise NotImplementedError

    def _read_datagram(self, now: float, data: bytes) -> None:
        """Every record of one datagram; raises DtlsError to end with its alert."""
        raise NotImplementedError

    def _handle_message(self, now: float, msg: HandshakeMessage) -> None:
        raise NotImplementedError

    def _datagram_done(self, now: float) -> None:
        """Hook after a datagram was read without a fatal error."""

    @property
    def _closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def _inert(self) -> bool:
        """Closed, or a client not started: input is ignored (a per-datagram check)."""
        raise NotImplementedError

    @property
    def _stopped(self) -> bool:
        """Nothing more of this datagram is for this engine."""
        return self._closed

    @property
    def is_established(self) -> bool:
        return self.state is State.ESTABLISHED

    @property
    def awaiting_client_hello(self) -> bool:
        """A server that has not accepted a ClientHello yet (cookies can still change)."""
        return self.state is State.SERVER_WAIT_CLIENT_HELLO

    @property
    def _may_send(self) -> bool:
        return self.is_established

    @property
    def mtu(self) -> int:
        return self.rl.mtu

    @property
    def srtp_profile(self) -> SrtpProfile | None:
        return self._srtp_profile

    @property
    def max_application_data(self) -> int:
        """The largest payload ``send_application_data`` accepts at this MTU."""
        raise NotImplementedError

    # --- verbs ------------------------------------------------------------------------

    @property
    def cookies_required(self) -> bool:
        return self._cookie_secret is not None

    def require_cookies(self, secret: bytes | None, context: bytes = b"") -> None:
        """Server, before a ClientHello is accepted: demand a cookie exchange
        (HelloVerifyRequest, RFC 6347 §4.2.1; HelloRetryRequest, RFC 9147 §5.1) from the
        next ClientHello on (``secret``), or stop (None). ``context`` binds cookies to the
        caller's view of the peer (its address bytes), so a cookie is only good from where
        it was sent. Switching between ClientHellos is safe: the stateless phase commits
        nothing."""
        if self.role is not Role.SERVER or not self.awaiting_client_hello:
            raise LocalProtocolError("cookies can only change before a ClientHello is accepted")
        if secret is not None and len(secret) < 16:
            raise LocalProtocolError("a cookie secret needs at least 16 bytes")
        self._cookie_secret = secret
        self._cookie_context = context

    def handle_input(self, now: float, data: bytes) -> None:
        """Feed one UDP payload. Never raises for bad peer bytes: they are dropped or end
        the connection with an alert (reported as a ``ConnectionClosed`` event)."""
        if self._inert:
            return
        self._dup_seen = False
        try:
            self._read_datagram(now, data)
        except DtlsError as exc:
            self._fail(exc.hint, str(exc))
            return
        self._datagram_done(now)
        # The peer retransmitted its previous flight, so ours (or part of it) was lost.
        if self._dup_seen and self.rl.flight is not None and not self._closed:
            if now < self._dup_retransmit_at:
                self.counters.retransmissions_suppressed += 1
                return
            self._dup_retransmit_at = now + DUP_RETRANSMIT_INTERVAL
            self.counters.retransmissions += 1
            self.rl.emit_flight()

    def handle_timeout(self, now: float) -> None:
        if self._retransmit_at is None or now < self._retransmit_at or self.rl.flight is None:
            return
        self._retransmit_count += 1
        if self._retransmit_count > self._max_retransmissions:
            self._close_locally(None, "handshake timed out")
            return
        self._rto = min(self._rto * 2, MAX_RTO)
        self._retransmit_at = now + self._rto
        self.counters.retransmissions += 1
        self.rl.emit_flight()

    def poll_timeout(self) -> float | None:
        return self._retransmit_at

    def poll_transmit(self) -> bytes | None:
        return self.rl.poll_transmit()

    def poll_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def send_application_data(self, data: bytes) -> None:
        if not self._may_send:
            raise LocalProtocolError(f"cannot send application data in state {self.state.value}")
        if len(data) > self.max_application_data:
            raise LocalProtocolError(
                f"{len(data)} bytes exceed one record at mtu {self.mtu} "
                f"(max {self.max_application_data})"
            )
        self.rl.queue_record(ContentType.APPLICATION_DATA, self.rl.write_epoch, data)

    def close(self) -> None:
        """Send close_notify (RFC 5246 §7.2.1, RFC 8446 §6.1) and end the connection."""
        if self._closed:
            return
        if self.state is not State.CLIENT_IDLE:
            self.rl.queue_alert(AlertLevel.WARNING, AlertDescription.close_notify)
        self._close_locally(None, "closed locally")

    # --- shared machinery -------------------------------------------------------------

    def _send_flight(self, now: float, flight: list[Any], *, arm_timer: bool = True,
                     emit: bool = True) -> None:
        """Make ``flight`` the one retransmitted. A new flight means the previous one got
        through: the timer starts again from its initial value (it backs off only on loss)."""
        self._rto = self._initial_rto
        self._retransmit_count = 0
        self._retransmit_at = now + self._rto if arm_timer else None
        self.rl.new_flight(flight, emit=emit)

    def _handle_fragment(self, now: float, frag: HandshakeFragment, epoch: int) -> None:
        if self.awaiting_client_hello:
            if frag.msg_type != _CLIENT_HELLO or epoch != 0:
                return
            # Before a ClientHello is accepted nothing is committed: a client may restart
            # at message_seq 0 or continue at 1 after a HelloVerifyRequest or
            # HelloRetryRequest, so follow whatever sequence it uses.
            if frag.message_seq != self._reassembler.next_seq and frag.message_seq < Reassembler.WINDOW:
                self._reassembler.clear()
                self._reassembler.next_seq = frag.message_seq
        if epoch == 0 and self.is_established and (
                not self._EPOCH0_DUPLICATES_AFTER_HANDSHAKE
                or frag.message_seq >= self._reassembler.next_seq):
            return  # unauthenticated new handshake after the fact: ignore
        if not self._reassembler.add(frag, epoch):
            # An old message: the peer is retransmitting. Trigger once per datagram and
            # only on first fragments, so a fragmented flight is not answered per fragment.
            if frag.fragment_offset == 0:
                self._dup_seen = True
            return
        while (msg := self._reassembler.pop()) is not None:
            self._handle_message(now, msg)
            if self._stopped:
                return

    @property
    def _answers_close_notify(self) -> bool:
        """Whether a peer's close_notify is answered with ours (1.2: only once encrypted)."""
        return True

    def _alert_is_fatal(self, level: int, desc: AlertDescription) -> bool:
        raise NotImplementedError

    def _handle_alert(self, payload: bytes) -> None:
        if len(payload) != 2:
            self.counters.records_dropped += 1
            return
        level, description = payload
        try:
            desc = AlertDescription(description)
        except ValueError:
            desc = AlertDescription.internal_error
            if not self._alert_is_fatal(level, desc):
                return
        if desc is AlertDescription.close_notify:
            # RFC 5246 §7.2.1, RFC 8446 §6.1: answer close_notify with our own and stop.
            if self._answers_close_notify:
                self.rl.queue_alert(AlertLevel.WARNING, AlertDescription.close_notify)
            self._close_locally(desc, "peer sent close_notify", by_peer=True)
        elif self._alert_is_fatal(level, desc):
            self._close_locally(desc, f"peer sent {desc.name}", by_peer=True)

    def _fail(self, alert: AlertDescription, reason: str) -> None:
        """Fatal error detected locally: send the alert and end (RFC 5246 §7.2.2)."""
        self.rl.queue_alert(AlertLevel.FATAL, alert)
        self._close_locally(alert, reason)

    def _close_locally(
        self,
        alert: AlertDescription | None,
        reason: str,
        *,
        by_peer: bool = False,
        event: bool = True,
    ) -> None:
        self._enter_closed()
        self.rl.flight = None
        self._retransmit_at = None
        self._reassembler.clear()
        if event:
            self._events.append(ConnectionClosed(alert, by_peer, reason))
