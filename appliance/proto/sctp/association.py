"""One SCTP association over DTLS (RFC 8261), sans-IO, in the shape of Google's dcSCTP.

Verbs (docs/style.md rule 18): ``handle_input(now, data)`` takes one DTLS
application-data payload (= one SCTP packet, no IP/UDP header); ``poll_output()`` returns
the next output until None: packets to send as DTLS application data (each an
:class:`~.events.Transmit`) first, then :mod:`events`; ``poll_timeout()`` /
``handle_timeout(now)`` drive the timers. Time is always passed in. After any call the
shell drains ``poll_output()``, then sleeps until ``poll_timeout()``. ``poll_transmit()``
(bare packets) and ``poll_event()`` split the same stream in two; the call's data-channel
path uses them, so a packet costs no wrapper object.

What happens where (RFC 9260 unless noted):

* setup §5.1-5.2: ``connect()`` sends INIT (T1-init); the passive side answers INIT with
  INIT ACK carrying a signed state cookie (:mod:`cookie`) and keeps **no state** until a
  valid COOKIE ECHO arrives. Both sides may ``connect()`` at once (WebRTC does, RFC 8841
  §9.3): an INIT in COOKIE-WAIT/COOKIE-ECHOED is answered with our own tag and TSN (§5.2.1),
  so either COOKIE ECHO establishes. Restart (§5.2.2-5.2.4 tag mismatch cases) is omitted:
  such INITs/COOKIE ECHOs are dropped and counted.
* verification tags §8.5; out-of-the-blue packets §8.4 (only SHUTDOWN ACK is answered);
  CRC32c §6.8 checked on every packet.
* data: :mod:`sender` and :mod:`receiver`; SACK timing §6.2 (every second packet with DATA,
  at once on gaps, duplicates, FORWARD TSN or the I bit, otherwise after ``sack_delay``).
* HEARTBEAT is answered (§8.3); we send none (ICE consent freshness, RFC 7675, already
  proves liveness on a WebRTC transport; T3-rtx catches a dead peer while data flows).
* shutdown §9.2 (T2-shutdown), abort §9.1; failure §8.1 (``max_retransmissions``).
* RFC 6525 stream reset: one Outgoing SSN Reset Request in flight at a time (§5.1.1),
  sent once the streams' queued data has left; incoming requests performed in order
  (§5.2.2), "in progress" while TSNs are missing; other requests answered "denied".

Untrusted input never raises out of ``handle_input``: a packet that fails to parse or
verify is dropped and counted in ``stats.drops`` by reason.
"""

from __future__ import annotations

import enum
import random
import secrets
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from appliance.proto.sctp import chunks as c
from appliance.proto.sctp.cookie import CookieState
from appliance.proto.sctp.errors import (
    MessageTooLargeError,
    SctpError,
    SctpUsageError,
    SendBufferFullError,
    StreamClosedError,
)
from appliance.proto.sctp.events import (
    BufferedAmountLow,
    CloseCause,
    Closed,
    Connected,
    Event,
    MessageReceived,
    Output,
    Transmit,
)
from appliance.proto.sctp.receiver import M32, Receiver
from appliance.proto.sctp.reconfig import ReconfigMixin
from appliance.proto.sctp.sender import OutMessage, RtoEstimator, Sender

MAX_STREAMS = 65535  # RFC 8831 §6.2: offer the maximum in both directions
_SUPPORTED = bytes([c.ChunkType.RECONFIG, c.ChunkType.FORWARD_TSN])


class State(enum.Enum):
    CLOSED = "closed"
    COOKIE_WAIT = "cookie-wait"
    COOKIE_ECHOED = "cookie-echoed"
    ESTABLISHED = "established"
    SHUTDOWN_PENDING = "shutdown-pending"
    SHUTDOWN_SENT = "shutdown-sent"
    SHUTDOWN_RECEIVED = "shutdown-received"
    SHUTDOWN_ACK_SENT = "shutdown-ack-sent"


#: States in which DATA may be received and SACKs/data sent (§9.2 allows data to drain).
_DATA_STATES = frozenset({State.ESTABLISHED, State.SHUTDOWN_PENDING, State.SHUTDOWN_SENT,
                          State.SHUTDOWN_RECEIVED})
_SENDABLE = frozenset({State.CLOSED, State.COOKIE_WAIT, State.COOKIE_ECHOED, State.ESTABLISHED})

#: (state, trigger) -> next state: RFC 9260 §4 (Figure 3) for what we implement. Every
#: state change except "ended" (ABORT / failure / shutdown complete -> CLOSED, from any
#: state) goes through this table.
TRANSITIONS: dict[tuple[State, str], State] = {
    (State.CLOSED, "connect"): State.COOKIE_WAIT,
    (State.COOKIE_WAIT, "init-ack"): State.COOKIE_ECHOED,
    (State.CLOSED, "cookie-echo"): State.ESTABLISHED,
    (State.COOKIE_WAIT, "cookie-echo"): State.ESTABLISHED,
    (State.COOKIE_ECHOED, "cookie-echo"): State.ESTABLISHED,
    (State.COOKIE_ECHOED, "cookie-ack"): State.ESTABLISHED,
    (State.ESTABLISHED, "shutdown"): State.SHUTDOWN_PENDING,
    (State.SHUTDOWN_PENDING, "idle"): State.SHUTDOWN_SENT,
    (State.ESTABLISHED, "peer-shutdown"): State.SHUTDOWN_RECEIVED,
    (State.SHUTDOWN_PENDING, "peer-shutdown"): State.SHUTDOWN_RECEIVED,
    (State.SHUTDOWN_RECEIVED, "idle"): State.SHUTDOWN_ACK_SENT,
    (State.SHUTDOWN_SENT, "peer-shutdown"): State.SHUTDOWN_ACK_SENT,
}


@dataclass(slots=True)
class SctpStats:
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    messages_in: int = 0
    messages_out: int = 0
    retransmissions: int = 0
    fast_retransmits: int = 0
    t3_expiries: int = 0
    abandoned_messages: int = 0
    drops: Counter[str] = field(default_factory=Counter)


class SctpAssociation(ReconfigMixin):
    """An SCTP endpoint with one association. See the module docstring for the RFC map."""

    def __init__(
        self,
        *,
        local_port: int = 5000,
        remote_port: int = 5000,
        secret: bytes | None = None,
        rng: random.Random | None = None,
        max_message_size: int = 262144,
        mtu: int = 1200,
        max_receive_buffer: int = 1024 * 1024,
        max_send_buffer: int = 16 * 1024 * 1024,
        rto_initial: float = 1.0,
        rto_min: float = 0.2,
        rto_max: float = 10.0,
        max_retransmissions: int = 10,
        max_init_retransmissions: int = 8,
        cwnd_initial_mtus: int = 10,
        sack_delay: float = 0.2,
        cookie_lifetime: float = 60.0,
    ) -> None:
        self.local_port = local_port
        self.remote_port = remote_port
        self._rng = rng or random.SystemRandom()
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self.max_message_size = max_message_size
        self.mtu = mtu
        self.max_receive_buffer = max_receive_buffer
        self.max_send_buffer = max_send_buffer
        self.max_init_retransmissions = max_init_retransmissions
        self.sack_delay = sack_delay
        self.cookie_lifetime = cookie_lifetime
        self.state = State.CLOSED
        self._stats = SctpStats()
        self._ended = False
        self._out: deque[bytes] = deque()
        self._ctrl: list[bytes] = []
        self._events: deque[Event] = deque()
        self._now = 0.0
        self.my_tag = 0
        self.peer_tag = 0
        self._my_tsn = 0
        self.peer_forward_tsn = False
        self.peer_reconfig = False
        self.outbound_streams = MAX_STREAMS
        self.inbound_streams = MAX_STREAMS
        self._rto = RtoEstimator(rto_initial, rto_min, rto_max)
        self.sender = Sender(mtu=mtu, rto=self._rto, cwnd_initial_mtus=cwnd_initial_mtus,
                             max_retransmissions=max_retransmissions)
        self.receiver: Receiver | None = None
        self._sack_now = False
        self._sack_due: float | None = None
        self._data_packets = 0
        # T1 (init/cookie) and T2 (shutdown): the chunk to resend, deadline, tries
        self._t1: tuple[bytes, float, int] | None = None
        self._t2: tuple[bytes, float, int] | None = None
        self._init_reconfig()

    # --- the caller's verbs -----------------------------------------------------------------

    @property
    def stats(self) -> SctpStats:
        """Counters, including ``drops`` by reason (a dropped packet never raises)."""
        self._sync_stats()
        return self._stats

    @property
    def is_established(self) -> bool:
        return self.state in _DATA_STATES

    def connect(self, now: float) -> None:
        """Send INIT (§5.1 step A). Safe for both sides to call (§5.2.1 collision)."""
        self._now = now
        if self.state is not State.CLOSED or self._ended:
            return
        self.my_tag = self._new_tag()
        self._my_tsn = self._rng.getrandbits(32)
        self._init_tsn_state(self._my_tsn)
        init = c.InitChunk(self.my_tag, self.max_receive_buffer, MAX_STREAMS, MAX_STREAMS,
                           self._my_tsn, self._init_params())
        wire = bytes(init)
        self._packet(0, wire)
        self._t1 = (wire, now + self._rto.rto_initial, 0)
        self._go("connect")

    def send(self, now: float, stream_id: int, ppid: int, message: bytes, *,
             ordered: bool = True, max_retransmits: int | None = None,
             max_lifetime: float | None = None) -> None:
        """Queue one message (RFC 9260 §6.9 fragments it). ``max_retransmits`` /
        ``max_lifetime`` (seconds) make it partially reliable (RFC 3758) when the peer
        supports FORWARD TSN; otherwise it is sent reliably."""
        self._now = now
        if self._ended or self.state not in _SENDABLE:
            raise SctpUsageError(f"cannot send in state {self.state.value}")
        if not 0 <= stream_id < self.outbound_streams:
            raise SctpUsageError(f"stream {stream_id} outside 0..{self.outbound_streams - 1}")
        if stream_id in self._closing:
            raise StreamClosedError(f"stream {stream_id} is being reset")
        if not message:
            raise SctpUsageError("SCTP cannot carry an empty message (RFC 9260 §6.2)")
        if len(message) > self.max_message_size:
            raise MessageTooLargeError(
                f"message of {len(message)} bytes exceeds max_message_size "
                f"{self.max_message_size}")
        if self.sender.total_queued + len(message) > self.max_send_buffer:
            raise SendBufferFullError(
                f"{self.sender.total_queued} bytes already queued; cap {self.max_send_buffer}")
        expires = None if max_lifetime is None else now + max_lifetime
        self.sender.enqueue(OutMessage(stream_id, ppid, bytes(message), not ordered,
                                       max_retransmits, expires))
        self._stats.messages_out += 1
        self._flush(now)

    def reset_streams(self, now: float, stream_ids: Iterable[int]) -> None:
        """Reset our outgoing side of ``stream_ids`` (RFC 6525 §5.1.2); no more sends on
        them until ``StreamsReset(outgoing=...)`` (after which their SSNs restart at 0)."""
        self._now = now
        ids = set(stream_ids)
        if self._ended or self.state not in _SENDABLE:
            raise SctpUsageError(f"cannot reset streams in state {self.state.value}")
        if self.is_established and not self.peer_reconfig:
            raise SctpUsageError("the peer does not support RE-CONFIG (RFC 6525)")
        if any(not 0 <= s < self.outbound_streams for s in ids):
            raise SctpUsageError("stream id out of range")
        ids -= self._closing
        self._closing |= ids
        self._reset_wanted |= ids
        self._flush(now)

    def buffered_amount(self, stream_id: int) -> int:
        """Bytes queued on ``stream_id`` that have not been sent yet."""
        return self.sender.queued.get(stream_id, 0)

    def set_buffered_amount_low_threshold(self, stream_id: int, threshold: int) -> None:
        self.sender.low_threshold[stream_id] = threshold

    def shutdown(self, now: float) -> None:
        """Graceful close (§9.2): SHUTDOWN once every queued message is acknowledged."""
        self._now = now
        if self._ended:
            return
        if self.state in (State.CLOSED, State.COOKIE_WAIT, State.COOKIE_ECHOED):
            self._finish(CloseCause.SHUTDOWN, "shut down before the association was up",
                         abort=self.state is State.COOKIE_ECHOED)
            return
        if self.state is State.ESTABLISHED:
            self._go("shutdown")
        self._flush(now)

    def abort(self, now: float, reason: str = "") -> None:
        """ABORT with a User-Initiated Abort cause (§9.1, §3.3.10.12); Closed at once."""
        self._now = now
        if self._ended:
            return
        cause = ((c.ErrorCause.USER_INITIATED_ABORT, reason.encode()[:256]),) if reason else ()
        self._finish(CloseCause.LOCAL_ABORT, reason or "aborted", abort=True, causes=cause)

    def poll_output(self) -> Output | None:
        """The next packet to send (a :class:`~.events.Transmit`), else the next event;
        None when there is neither (drain until None after every call)."""
        pkt = self.poll_transmit()
        if pkt is not None:
            return Transmit(pkt)
        return self._events.popleft() if self._events else None

    def poll_transmit(self) -> bytes | None:
        """Only the next packet, bare (callers that keep packets and events apart)."""
        if self._out:
            pkt = self._out.popleft()
            st = self._stats
            st.packets_out += 1
            st.bytes_out += len(pkt)
            return pkt
        return None

    def poll_event(self) -> Event | None:
        """Only the next event (callers that keep packets and events apart)."""
        return self._events.popleft() if self._events else None

    def poll_timeout(self) -> float | None:
        if self._ended:
            return None
        times = [t for t in (self._t1 and self._t1[1], self._t2 and self._t2[1],
                             self._sack_due, self._reconfig_deadline()) if t]
        if self.state in _DATA_STATES and self.sender.t3 is not None:
            times.append(self.sender.t3)
        return min(times) if times else None

    def handle_timeout(self, now: float) -> None:
        self._now = now
        if self._ended:
            return
        if self._t1 is not None and now >= self._t1[1]:
            wire, _, tries = self._t1
            if tries + 1 > self.max_init_retransmissions:
                self._finish(CloseCause.TIMEOUT, "no answer to INIT / COOKIE ECHO (T1)")
                return
            # §6.3.3 E2 applies to T1 too: double the timeout on every retransmission.
            self._t1 = (wire, now + min(self._rto.rto_initial * 2 ** (tries + 1),
                                        self._rto.rto_max), tries + 1)
            self._packet(0 if self.state is State.COOKIE_WAIT else self.peer_tag, wire)
        if self._t2 is not None and now >= self._t2[1]:
            wire, _, tries = self._t2
            if tries + 1 > self.sender.max_retransmissions:
                self._finish(CloseCause.TIMEOUT, "no answer to SHUTDOWN (T2)", abort=True)
                return
            self._rto.back_off()
            self._t2 = (wire, now + self._rto.rto, tries + 1)
            self._packet(self.peer_tag, wire)
        if self.state in _DATA_STATES:
            if self.sender.on_t3(now):
                self._finish(CloseCause.TIMEOUT,
                             "peer stopped acknowledging data (T3-rtx retransmission limit)",
                             abort=True)
                return
        if self._sack_due is not None and now >= self._sack_due:
            self._sack_now = True
        if self._reconfig_timeout(now):
            self._finish(CloseCause.TIMEOUT, "no answer to RE-CONFIG request", abort=True)
            return
        if not self._ended:
            self._flush(now)

    # --- input --------------------------------------------------------------------------

    def handle_input(self, now: float, data: bytes) -> None:
        self._now = now
        st = self._stats
        st.packets_in += 1
        st.bytes_in += len(data)
        if self._ended:
            st.drops["closed"] += 1
            return
        if not isinstance(data, bytes):
            data = bytes(data)
        if len(data) < c.MIN_PACKET:
            st.drops["truncated"] += 1
            return
        if not c.verify_checksum(data):
            st.drops["checksum"] += 1
            return
        try:
            header, chunks = c.parse_packet_untrusted(data)
        except SctpError as exc:
            st.drops[str(exc.hint)] += 1
            return
        if header.dst_port != self.local_port or header.src_port != self.remote_port:
            st.drops["port"] += 1
            return
        if not chunks:
            st.drops["empty"] += 1
            return
        try:
            self._dispatch(now, header, chunks)
        except SctpError as exc:
            st.drops[str(exc.hint)] += 1
        if not self._ended:
            self._after_input(now)

    def _dispatch(self, now: float, header: c.CommonHeader, chunks: list[c.Chunk]) -> None:
        first = chunks[0]
        vtag = header.vtag
        if isinstance(first, c.InitChunk) and not isinstance(first, c.InitAckChunk):
            # §8.5.1 A: INIT must be alone and carry tag 0.
            if len(chunks) != 1 or vtag != 0:
                raise SctpError("INIT bundled or with a non-zero tag", hint="bad-init")
            self._on_init(now, first)
            return
        if isinstance(first, c.AbortChunk | c.ShutdownCompleteChunk):
            # §8.5.1 B/C: the T bit means "the tag is yours, reflected".
            expect = self.peer_tag if first.reflected else self.my_tag
            if self.state is State.CLOSED or vtag != expect:
                raise SctpError("ABORT/SHUTDOWN COMPLETE with the wrong tag", hint="vtag")
        elif isinstance(first, c.CookieEchoChunk):
            pass  # checked against the cookie's own tag
        elif self.state is State.CLOSED:
            if isinstance(first, c.ShutdownAckChunk):
                # §8.4 item 5: answer an out-of-the-blue SHUTDOWN ACK (our lost SHUTDOWN
                # COMPLETE) so the peer can close.
                self._packet(vtag, bytes(c.ShutdownCompleteChunk(reflected=True)))
                return
            raise SctpError("out-of-the-blue packet", hint="out-of-the-blue")
        elif vtag != self.my_tag:
            raise SctpError("verification tag mismatch", hint="vtag")
        data_seen = False
        for chunk in chunks:
            if self._ended:
                return
            if isinstance(chunk, c.DataChunk):
                data_seen = True
                self._on_data(chunk)
            elif isinstance(chunk, c.SackChunk):
                if self.state in _DATA_STATES and not self.sender.on_sack(now, chunk):
                    self._stats.drops["stale-sack"] += 1
            elif isinstance(chunk, c.CookieEchoChunk):
                self._on_cookie_echo(now, vtag, chunk)
            elif isinstance(chunk, c.InitAckChunk):
                self._on_init_ack(now, chunk)
            elif isinstance(chunk, c.CookieAckChunk):
                if self.state is State.COOKIE_ECHOED:
                    self._t1 = None
                    self._establish("cookie-ack")
            elif isinstance(chunk, c.HeartbeatAckChunk):
                pass  # we send no HEARTBEATs; an unsolicited ACK is harmless
            elif isinstance(chunk, c.HeartbeatChunk):
                self._ctrl.append(bytes(c.HeartbeatAckChunk(chunk.info)))  # §8.3
            elif isinstance(chunk, c.ForwardTsnChunk):
                if self.receiver is not None and self.state in _DATA_STATES:
                    self.receiver.forward(chunk.new_cum_tsn, chunk.streams)
                    self._sack_now = True  # RFC 3758 §3.6: SACK every FORWARD TSN at once
            elif isinstance(chunk, c.ReconfigChunk):
                if self.state in _DATA_STATES:
                    self._on_reconfig(now, chunk)
            elif isinstance(chunk, c.ShutdownChunk):
                self._on_shutdown(now, chunk)
            elif isinstance(chunk, c.ShutdownAckChunk):
                if self.state in (State.SHUTDOWN_SENT, State.SHUTDOWN_ACK_SENT):
                    self._packet(self.peer_tag, bytes(c.ShutdownCompleteChunk()))
                    self._finish(CloseCause.SHUTDOWN, "shutdown complete")
            elif isinstance(chunk, c.ShutdownCompleteChunk):
                if self.state is State.SHUTDOWN_ACK_SENT:
                    self._finish(CloseCause.SHUTDOWN, "shutdown complete")
            elif isinstance(chunk, c.AbortChunk):
                self._finish(CloseCause.PEER_ABORT, chunk.describe())
            elif isinstance(chunk, c.ErrorChunk):
                self._stats.drops["error-chunk-received"] += 1
            elif isinstance(chunk, c.UnknownChunk):
                self._stats.drops["unknown-chunk"] += 1
                if chunk.report:  # §3.2: report types with bit 0x40 set
                    # The cause echoes the chunk, cut so the ERROR always fits a packet.
                    self._ctrl.append(bytes(c.ErrorChunk(
                        ((c.ErrorCause.UNRECOGNIZED_CHUNK, bytes(chunk)[:256]),))))
                if not chunk.skip:
                    break  # §3.2: "00"/"01": stop processing this packet
            else:  # an INIT bundled after another chunk
                self._stats.drops["misplaced-chunk"] += 1
        # DATA before we are ESTABLISHED (a COOKIE-ACK lost while the peer, established,
        # already sends) was dropped by _on_data: nothing to acknowledge, and a SACK timer
        # armed for it could never be served by _flush (no receiver state to SACK from), so
        # poll_timeout would stay in the past for ever.
        if data_seen and self.state in _DATA_STATES:
            self._data_packets += 1
            if self._data_packets >= 2:
                self._sack_now = True  # §6.2: acknowledge at least every second packet
            elif self._sack_due is None:
                self._sack_due = now + self.sack_delay

    # --- setup (§5) ---------------------------------------------------------------------

    def _new_tag(self) -> int:
        return self._rng.randrange(1, 1 << 32)

    def _init_params(self) -> tuple[tuple[int, bytes], ...]:
        return ((c.ParamType.FORWARD_TSN_SUPPORTED, b""),
                (c.ParamType.SUPPORTED_EXTENSIONS, _SUPPORTED))

    def _on_init(self, now: float, init: c.InitChunk) -> None:
        if self.state in (State.CLOSED, State.COOKIE_WAIT, State.COOKIE_ECHOED):
            if self.state is State.CLOSED:
                # Stateless (§5.1.3): fresh tag and TSN, remembered only in the cookie.
                tag, tsn = self._new_tag(), self._rng.getrandbits(32)
            else:
                tag, tsn = self.my_tag, self._my_tsn  # §5.2.1: collision, reuse ours
            cookie = CookieState(now, tag, tsn, init.initiate_tag, init.initial_tsn,
                                 init.a_rwnd, init.outbound_streams, init.inbound_streams,
                                 init.forward_tsn, init.reconfig).seal(self._secret)
            ack = c.InitAckChunk(tag, self.max_receive_buffer, MAX_STREAMS, MAX_STREAMS, tsn,
                                 ((c.ParamType.STATE_COOKIE, cookie),) + self._init_params())
            self._packet(init.initiate_tag, bytes(ack))
        else:
            self._stats.drops["init-restart-unsupported"] += 1

    def _on_init_ack(self, now: float, ack: c.InitAckChunk) -> None:
        if self.state is not State.COOKIE_WAIT:
            self._stats.drops["unexpected-init-ack"] += 1
            return
        cookie = ack.cookie
        if cookie is None:
            raise SctpError("INIT ACK without a state cookie", hint="missing-cookie")
        self._learn_peer(ack.initiate_tag, ack.initial_tsn, ack.a_rwnd, ack.outbound_streams,
                         ack.inbound_streams, ack.forward_tsn, ack.reconfig)
        wire = bytes(c.CookieEchoChunk(cookie))
        # §5.1 step D: "The COOKIE ECHO chunk can be bundled with any pending outbound DATA
        # chunks, but it MUST be the first chunk in the packet", and no other packet may
        # follow until the COOKIE ACK. Messages queued since connect() (a pre-negotiated
        # channel's first message) ride along, which saves the peer a round trip; dcSCTP
        # and usrsctp accept it. The sender starts here with the peer's window; T1-cookie
        # resends only the COOKIE ECHO, and T3-rtx (armed now, served once established)
        # resends the DATA if that packet was lost.
        self._start_sender()
        parts = [wire]
        if self.sender.queue:
            parts.extend(self.sender.produce(now, self.mtu - c.COMMON_HEADER.size - len(wire)))
        self._packet(self.peer_tag, b"".join(parts))
        self._t1 = (wire, now + self._rto.rto_initial, 0)
        self._go("init-ack")

    def _on_cookie_echo(self, now: float, vtag: int, echo: c.CookieEchoChunk) -> None:
        cs = CookieState.open_untrusted(echo.cookie, self._secret, now, self.cookie_lifetime)
        if vtag != cs.local_tag:
            raise SctpError("COOKIE ECHO tag differs from the cookie's", hint="vtag")
        if self.state in (State.CLOSED, State.COOKIE_WAIT):
            # CLOSED: the stateless INIT ACK's tag and TSN come back in the cookie. In
            # COOKIE-WAIT the cookie normally carries our own tag (§5.2.1); if it does not,
            # we answered the peer's INIT before calling connect() ourselves. Only our INIT
            # went out with the new tag and we have learned nothing from the peer, so
            # adopting the cookie's tag and TSN is safe (the peer already holds them).
            if cs.local_tag != self.my_tag:
                self.my_tag, self._my_tsn = cs.local_tag, cs.local_initial_tsn
                self._init_tsn_state(self._my_tsn)
        elif self.state is State.COOKIE_ECHOED:
            # We already echoed the peer's cookie, which names our current tag: a cookie
            # with another tag must not win, or the two sides would disagree on tags.
            if cs.local_tag != self.my_tag:
                raise SctpError("COOKIE ECHO for another association", hint="vtag")
        else:
            # §5.2.4 case D: a duplicate echo of the live association gets a COOKIE ACK.
            if cs.local_tag == self.my_tag and cs.peer_tag == self.peer_tag:
                self._ctrl.append(bytes(c.CookieAckChunk()))
                return
            raise SctpError("COOKIE ECHO for a restart (unsupported)", hint="restart")
        self._learn_peer(cs.peer_tag, cs.peer_initial_tsn, cs.peer_rwnd,
                         cs.peer_outbound_streams, cs.peer_inbound_streams, cs.peer_forward_tsn,
                         cs.peer_reconfig)
        self._t1 = None
        self._ctrl.append(bytes(c.CookieAckChunk()))
        self._establish("cookie-echo")

    def _learn_peer(self, tag: int, tsn: int, rwnd: int, os_: int, mis: int, fwd: bool,
                    reconfig: bool) -> None:
        self.peer_tag = tag
        self._peer_tsn = tsn
        self._peer_rwnd = rwnd
        self.outbound_streams = min(MAX_STREAMS, mis)
        self.inbound_streams = min(MAX_STREAMS, os_)
        self.peer_forward_tsn = fwd
        self.peer_reconfig = reconfig

    def _go(self, trigger: str) -> None:
        self.state = TRANSITIONS[(self.state, trigger)]

    def _establish(self, trigger: str) -> None:
        self._go(trigger)
        self.receiver = Receiver(self._peer_tsn, max_buffer=self.max_receive_buffer,
                                 max_message_size=self.max_message_size)
        self._start_sender()
        self._init_peer_reconfig(self._peer_tsn)
        self._events.append(Connected(self.outbound_streams, self.inbound_streams,
                                      self.peer_forward_tsn, self.peer_reconfig))

    def _start_sender(self) -> None:
        """Once per association: at INIT ACK (DATA may go with our COOKIE ECHO) or when
        the peer's COOKIE ECHO establishes us first. A collision's later COOKIE ECHO
        names the same tags and TSNs (§5.2.1), so the running sender stays as it is."""
        if not self.sender.started:
            self.sender.start(self._my_tsn, self._peer_rwnd, self.peer_forward_tsn)

    # --- data / shutdown ----------------------------------------------------------------

    def _on_data(self, chunk: c.DataChunk) -> None:
        rx = self.receiver
        if rx is None or self.state not in _DATA_STATES:
            self._stats.drops["data-before-established"] += 1
            return
        if chunk.stream_id >= self.inbound_streams:
            self._stats.drops["invalid-stream"] += 1
            self._ctrl.append(bytes(c.ErrorChunk(((c.ErrorCause.INVALID_STREAM,
                                                   chunk.stream_id.to_bytes(2, "big") +
                                                   b"\0\0"),))))
            return
        gaps_before = rx.has_gaps
        if not rx.add(chunk):
            self._sack_now = True  # §6.7: duplicates or a full window: tell the peer now
            return
        if rx.has_gaps or gaps_before or chunk.immediate:
            self._sack_now = True  # §6.7: out of order, or a gap just filled

    def _on_shutdown(self, now: float, chunk: c.ShutdownChunk) -> None:
        if self.state not in _DATA_STATES:
            return
        self.sender.on_cum_ack(now, chunk.cum_tsn)
        if self.state is State.SHUTDOWN_SENT:
            # §9.2: both sides sent SHUTDOWN; answer with SHUTDOWN ACK.
            self._send_t2(now, bytes(c.ShutdownAckChunk()), "peer-shutdown")
        elif self.state in (State.ESTABLISHED, State.SHUTDOWN_PENDING):
            self._go("peer-shutdown")

    def _send_t2(self, now: float, wire: bytes, trigger: str) -> None:
        self._packet(self.peer_tag, wire)
        self._t2 = (wire, now + self._rto.rto, 0)
        self._go(trigger)

    def _after_input(self, now: float) -> None:
        rx = self.receiver
        if rx is not None:
            if rx.delivered:
                for d in rx.delivered:
                    self._events.append(MessageReceived(d.stream_id, d.ppid, d.data,
                                                        d.unordered))
                self._stats.messages_in += len(rx.delivered)
                rx.delivered.clear()
            if rx.violation is not None:
                self._finish(CloseCause.PROTOCOL_ERROR, rx.violation, abort=True, causes=(
                    (c.ErrorCause.PROTOCOL_VIOLATION, rx.violation.encode()[:200]),))
                return
            if self._deferred_seq is not None:
                self._after_data_reconfig(now)
        self._flush(now)

    def _sync_stats(self) -> None:
        s, st = self.sender, self._stats
        st.retransmissions, st.fast_retransmits = s.retransmissions, s.fast_retransmits
        st.t3_expiries, st.abandoned_messages = s.t3_expiries, s.abandoned_messages

    # --- output -------------------------------------------------------------------------

    def _packet(self, vtag: int, chunk_bytes: bytes) -> None:
        self._out.append(c.serialize_packet(self.local_port, self.remote_port, vtag,
                                            chunk_bytes))

    def _flush(self, now: float) -> None:
        """Turn everything that may be sent now into packets (bundling, §6.10)."""
        if self._ended:
            return
        data_ok = self.state in _DATA_STATES
        sender = self.sender
        if data_ok and self._reset_wanted:
            self._maybe_send_reconfig(now)
        budget = self.mtu - c.COMMON_HEADER.size
        while True:
            parts: list[bytes] = []
            room = budget
            if self._ctrl:
                while self._ctrl and len(self._ctrl[0]) <= room:
                    room -= len(self._ctrl[0])
                    parts.append(self._ctrl.pop(0))
                if self._ctrl and not parts:
                    # Larger than a packet: none of our chunks can be (an ERROR echoing a
                    # huge unknown chunk is the only candidate); count rather than loop.
                    self._ctrl.pop(0)
                    self._stats.drops["oversized-control-chunk"] += 1
                    continue
            if data_ok:
                if self._sack_now or (self._sack_due is not None and (parts or
                                                                      self.sender.queue)):
                    assert self.receiver is not None
                    sack = bytes(self.receiver.sack())
                    if len(sack) <= room:
                        parts.insert(0, sack)  # SACK first in the bundle (§6.10 ordering)
                        room -= len(sack)
                        self._sack_now, self._sack_due, self._data_packets = False, None, 0
                if sender.fwd_pending and (fwd := sender.forward_tsn()) is not None:
                    raw = bytes(fwd)
                    if len(raw) <= room:
                        parts.append(raw)
                        room -= len(raw)
                    else:
                        sender.fwd_pending = True
                if sender.queue or sender.rtx_pending:
                    parts.extend(sender.produce(now, room))
            if not parts:
                break
            self._packet(self.peer_tag, parts[0] if len(parts) == 1 else b"".join(parts))
        if data_ok:
            if sender.low_events:
                for sid in sender.low_events:
                    self._events.append(BufferedAmountLow(sid))
                sender.low_events.clear()
            if self.state is State.SHUTDOWN_PENDING and self.sender.idle:
                self._send_t2(now, bytes(c.ShutdownChunk(self._cum_tsn())), "idle")
            elif self.state is State.SHUTDOWN_RECEIVED and self.sender.idle:
                self._send_t2(now, bytes(c.ShutdownAckChunk()), "idle")

    def _cum_tsn(self) -> int:
        return (self.receiver.cum & M32) if self.receiver is not None else 0

    def _finish(self, cause: CloseCause, reason: str, *, abort: bool = False,
                causes: tuple[tuple[int, bytes], ...] = ()) -> None:
        if self._ended:
            return
        if abort and self.peer_tag:
            self._packet(self.peer_tag, bytes(c.AbortChunk(False, causes)))
        self._ended = True
        self._sync_stats()
        self.state = State.CLOSED
        self._t1 = self._t2 = None
        self._sack_due = None
        self._events.append(Closed(cause, reason))
