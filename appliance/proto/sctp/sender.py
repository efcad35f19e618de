"""The sending half of an association: queue, fragmentation, retransmission, congestion.

RFC 9260 §6.1 (transmission rules: cwnd, peer rwnd, zero-window probe), §6.2.1 (processing
a SACK), §6.3 (RTO estimation with Karn's rule, T3-rtx rules R1-R3, expiry: back off, mark
everything for retransmission), §6.9 (fragmentation), §7.2 (slow start, congestion
avoidance with partial_bytes_acked, fast retransmit on three miss indications and fast
recovery), §8.3 (the error counter: too many consecutive T3 expiries fail the association);
RFC 3758 §3.5 (abandoning PR-SCTP messages by retransmission count or lifetime, the
Advanced.Peer.Ack.Point, when to send FORWARD TSN).

Design (after dcSCTP's SendQueue + RetransmissionQueue): messages wait whole in one FIFO
queue; TSNs and SSNs are assigned only when a fragment first leaves, so a message abandoned
before it was ever sent costs the peer nothing. In-flight fragments live in an insertion-
ordered dict keyed by *unwrapped* TSN; each keeps its serialised bytes so a retransmission
is a dict lookup. Omitted: max.burst, reneging of gap-acked data (WebRTC peers never
renege; a reneged chunk would only be resent on T3), and per-stream round-robin (FIFO).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from appliance.proto.sctp.chunks import (
    DATA_HEADER_SIZE,
    ForwardTsnChunk,
    SackChunk,
    encode_data,
)
from appliance.proto.sctp.receiver import M32, unwrap

# Smallest fragment worth starting in a packet that already carries other chunks; a
# smaller leftover room is left for the next packet instead of splitting a message finely.
MIN_FRAGMENT = 256


@dataclass(slots=True, eq=False)
class OutMessage:
    stream_id: int
    ppid: int
    data: bytes
    unordered: bool
    max_retransmits: int | None
    expires: float | None
    offset: int = 0
    ssn: int = 0
    abandoned: bool = False
    tsns: list[int] = field(default_factory=list)

    @property
    def partially_reliable(self) -> bool:
        return self.max_retransmits is not None or self.expires is not None


@dataclass(slots=True, eq=False)
class _Inflight:
    tsn: int
    wire: bytes
    size: int
    msg: OutMessage
    sent_at: float
    nsent: int = 1
    acked: bool = False
    abandoned: bool = False
    rtx: bool = False  # marked for retransmission
    fast: bool = False  # marked by fast retransmit (may ignore cwnd once, §7.2.4)
    in_flight: bool = True
    misses: int = 0


@dataclass(slots=True)
class RtoEstimator:
    """RFC 9260 §6.3.1 (alpha 1/8, beta 1/4), clamped to [rto_min, rto_max]."""

    rto_initial: float
    rto_min: float
    rto_max: float
    srtt: float | None = None
    rttvar: float = 0.0
    rto: float = 0.0

    def __post_init__(self) -> None:
        self.rto = self.rto_initial

    def sample(self, r: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = r, r / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - r)
            self.srtt = 0.875 * self.srtt + 0.125 * r
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.rto_min), self.rto_max)

    def back_off(self) -> None:
        self.rto = min(self.rto * 2, self.rto_max)  # §6.3.3 E2


class Sender:
    def __init__(self, *, mtu: int, rto: RtoEstimator, cwnd_initial_mtus: int,
                 max_retransmissions: int) -> None:
        self.mtu = mtu
        # Chunks are padded to 4 bytes on the wire (RFC 9260 §3.2): a payload size that is
        # a multiple of 4 is what keeps a full DATA chunk within an MTU that is not.
        self.max_payload = (mtu - 12 - DATA_HEADER_SIZE) & ~3
        self.rto = rto
        self.max_retransmissions = max_retransmissions
        self.queue: deque[OutMessage] = deque()
        self.queued: dict[int, int] = {}  # stream -> unsent bytes (bufferedAmount)
        self.total_queued = 0
        self.low_threshold: dict[int, int] = {}
        self.low_events: list[int] = []
        self.ssn: dict[int, int] = {}
        self.inflight: dict[int, _Inflight] = {}
        self.started = False
        self.pr_enabled = False
        self.next_tsn = self.cum_ack = self.adv_point = 0
        self.cwnd = cwnd_initial_mtus * mtu
        self.ssthresh = 1 << 30
        self.pba = 0
        self.flight = 0
        self.peer_rwnd = 0
        self.fast_exit: int | None = None
        self.rtx_pending = 0
        self.t3: float | None = None
        self.error_count = 0
        self.fwd_pending = False
        # counters (copied into the association's stats)
        self.retransmissions = 0
        self.fast_retransmits = 0
        self.t3_expiries = 0
        self.abandoned_messages = 0

    def start(self, initial_tsn: int, peer_rwnd: int, forward_tsn: bool) -> None:
        self.started = True
        self.next_tsn = initial_tsn
        self.cum_ack = self.adv_point = initial_tsn - 1
        self.peer_rwnd = peer_rwnd
        self.pr_enabled = forward_tsn

    # --- queue ------------------------------------------------------------------------------

    def enqueue(self, msg: OutMessage) -> None:
        self.queue.append(msg)
        n = len(msg.data)
        self.queued[msg.stream_id] = self.queued.get(msg.stream_id, 0) + n
        self.total_queued += n

    def _unqueue(self, sid: int, n: int) -> None:
        before = self.queued.get(sid, 0)
        after = before - n
        if after:
            self.queued[sid] = after
        else:
            self.queued.pop(sid, None)
        self.total_queued -= n
        thr = self.low_threshold.get(sid, 0)
        if before > thr >= after:
            self.low_events.append(sid)

    def has_queued(self, sid: int) -> bool:
        return self.queued.get(sid, 0) > 0

    def reset_ssns(self, streams: tuple[int, ...]) -> None:
        for sid in streams:
            self.ssn.pop(sid, None)

    @property
    def last_assigned_tsn(self) -> int:
        return (self.next_tsn - 1) & M32

    @property
    def idle(self) -> bool:
        return not self.queue and not self.inflight

    @property
    def outstanding(self) -> bool:
        return bool(self.inflight)

    # --- transmission (§6.1) --------------------------------------------------------------

    def produce(self, now: float, room: int) -> list[bytes]:
        """DATA chunks for one packet with ``room`` bytes left, retransmissions first."""
        out: list[bytes] = []
        if not self.started:
            return out
        if self.rtx_pending:
            for item in list(self.inflight.values()):
                if not item.rtx:
                    continue
                if self._expired(item, now):
                    self._abandon(item.msg)
                    continue
                if not item.fast and self.flight >= self.cwnd:
                    break
                if len(item.wire) > room:
                    break
                item.rtx = item.fast = False
                self.rtx_pending -= 1
                item.nsent += 1
                item.sent_at = now
                item.in_flight = True
                item.misses = 0
                self.flight += item.size
                room -= len(item.wire)
                out.append(item.wire)
                self.retransmissions += 1
            if self.rtx_pending and not out:
                return out  # retransmissions go before any new data (§6.1 rule C)
        queue = self.queue
        while queue and room > DATA_HEADER_SIZE:
            if self.flight >= self.cwnd:
                break
            # §6.1 A: respect the peer's window, but probe a zero window with one chunk.
            if self.peer_rwnd <= 0 and self.flight > 0:
                break
            msg = queue[0]
            if msg.offset == 0 and msg.expires is not None and now >= msg.expires:
                queue.popleft()  # §3.5 A3 of RFC 3758: expired before it ever left
                self._unqueue(msg.stream_id, len(msg.data))
                self.abandoned_messages += 1
                continue
            remaining = len(msg.data) - msg.offset
            take = min((room - DATA_HEADER_SIZE) & ~3, self.max_payload, remaining)
            if take < remaining and take < MIN_FRAGMENT and out:
                break
            if msg.offset == 0 and not msg.unordered:
                ssn = self.ssn.get(msg.stream_id, 0)
                msg.ssn = ssn
                self.ssn[msg.stream_id] = (ssn + 1) & 0xFFFF
            tsn = self.next_tsn
            self.next_tsn += 1
            payload = msg.data[msg.offset : msg.offset + take]
            flags = (2 if msg.offset == 0 else 0) | (1 if take == remaining else 0) | (
                4 if msg.unordered else 0)
            wire = encode_data(tsn & M32, msg.stream_id, msg.ssn, msg.ppid, payload, flags)
            size = DATA_HEADER_SIZE + take
            self.inflight[tsn] = _Inflight(tsn, wire, size, msg, now)
            msg.tsns.append(tsn)
            msg.offset += take
            if take == remaining:
                queue.popleft()
            self._unqueue(msg.stream_id, take)
            self.flight += size
            self.peer_rwnd -= size
            room -= len(wire)
            out.append(wire)
        if out and self.t3 is None:
            self.t3 = now + self.rto.rto  # §6.3.2 R1
        return out

    # --- SACK (§6.2.1) ----------------------------------------------------------------------

    def on_sack(self, now: float, sack: SackChunk) -> bool:
        """Process a SACK; False if it was stale or acknowledged TSNs never sent."""
        if not self.started:
            return False
        cum = unwrap(sack.cum_tsn, self.cum_ack)
        if cum < self.cum_ack or cum >= self.next_tsn:
            return False
        inflight = self.inflight
        flight_before = self.flight
        acked = 0
        rtt_from: float | None = None
        advanced = cum > self.cum_ack
        if advanced:
            # In-flight TSNs are consecutive from cum_ack + 1, so pop by number: iterating a
            # dict from its front after many front deletions is O(deleted) in CPython.
            for t in range(self.cum_ack + 1, cum + 1):
                item = inflight.pop(t, None)
                if item is None or item.acked or item.abandoned:
                    continue
                acked += item.size
                if item.in_flight:
                    self.flight -= item.size
                if item.rtx:
                    self.rtx_pending -= 1
                if item.nsent == 1:
                    rtt_from = item.sent_at
            self.cum_ack = cum
            self.error_count = 0  # §8.3: an acknowledged TSN clears the error counter
        highest: int | None = None
        top = self.next_tsn - 1
        for start, end in sack.gaps:
            lo, hi = cum + start, min(cum + end, top)
            for t in range(max(lo, cum + 1), hi + 1):
                gap_item = inflight.get(t)
                if gap_item is None or gap_item.acked:
                    continue
                gap_item.acked = True
                if gap_item.abandoned:
                    continue
                acked += gap_item.size
                if gap_item.in_flight:
                    self.flight -= gap_item.size
                    gap_item.in_flight = False
                if gap_item.rtx:
                    gap_item.rtx = gap_item.fast = False
                    self.rtx_pending -= 1
                if gap_item.nsent == 1:
                    rtt_from = gap_item.sent_at
                highest = t
        if rtt_from is not None:
            self.rto.sample(now - rtt_from)
        if highest is not None:
            self._miss_indications(highest)
        if self.fast_exit is not None and cum >= self.fast_exit:
            self.fast_exit = None  # §7.2.4: leave fast recovery
        if advanced and self.fast_exit is None:
            mtu = self.mtu
            utilised = flight_before + mtu >= self.cwnd
            if self.cwnd <= self.ssthresh:
                if utilised:
                    self.cwnd += min(acked, mtu)  # §7.2.1 slow start
            else:
                self.pba += acked  # §7.2.2 congestion avoidance
                if self.pba >= self.cwnd and utilised:
                    self.pba -= self.cwnd
                    self.cwnd += mtu
        self.peer_rwnd = max(0, sack.a_rwnd - self.flight)
        self._advance_ack_point()
        if not inflight:
            self.t3 = None  # §6.3.2 R2
            self.pba = 0
        elif advanced or self.t3 is None:
            self.t3 = now + self.rto.rto  # §6.3.2 R3
        return True

    def on_cum_ack(self, now: float, cum_tsn: int) -> None:
        """SHUTDOWN carries a cumulative TSN ACK (§9.2): treat it as a SACK without gaps."""
        self.on_sack(now, SackChunk(cum_tsn, self.peer_rwnd + self.flight))

    def _miss_indications(self, highest: int) -> None:
        marked = False
        for t, item in self.inflight.items():
            if t >= highest:
                break
            if item.acked or item.abandoned or item.rtx:
                continue
            item.misses += 1
            if item.misses >= 3:
                # §7.2.4: three miss indications mark a chunk for fast retransmission.
                if self._abandon_instead(item):
                    continue
                item.rtx = item.fast = True
                self.rtx_pending += 1
                if item.in_flight:
                    item.in_flight = False
                    self.flight -= item.size
                self.fast_retransmits += 1
                marked = True
        if marked and self.fast_exit is None:
            self.ssthresh = max(self.cwnd // 2, 4 * self.mtu)
            self.cwnd = self.ssthresh
            self.pba = 0
            self.fast_exit = self.next_tsn - 1

    # --- T3-rtx (§6.3.3) ------------------------------------------------------------------

    def on_t3(self, now: float) -> bool:
        """Handle an expired T3-rtx; True if the association has now failed (§8.3)."""
        if self.t3 is None or now < self.t3:
            return False
        self.t3 = None
        self.t3_expiries += 1
        self.error_count += 1
        if self.error_count > self.max_retransmissions:
            return True
        self.rto.back_off()  # E2
        self.ssthresh = max(self.cwnd // 2, 4 * self.mtu)  # §7.2.3
        self.cwnd = self.mtu
        self.pba = 0
        self.fast_exit = None
        for item in list(self.inflight.values()):
            if item.acked or item.abandoned:
                continue
            if self._abandon_instead(item):
                continue
            if item.in_flight:
                item.in_flight = False
                self.flight -= item.size
            if not item.rtx:
                item.rtx = True
                self.rtx_pending += 1
            item.fast = False
        self._advance_ack_point()
        if self.adv_point > self.cum_ack:
            self.fwd_pending = True  # RFC 3758 §3.5 C3: FORWARD TSN goes out on T3 too
        if self.inflight:
            self.t3 = now + self.rto.rto
        return False

    # --- partial reliability (RFC 3758 §3.5) ------------------------------------------------

    def _expired(self, item: _Inflight, now: float | None = None) -> bool:
        msg = item.msg
        if not self.pr_enabled or not msg.partially_reliable:
            return False
        if msg.max_retransmits is not None and item.nsent > msg.max_retransmits:
            return True
        return msg.expires is not None and now is not None and now >= msg.expires

    def _abandon_instead(self, item: _Inflight, now: float | None = None) -> bool:
        if self._expired(item, now):
            self._abandon(item.msg)
            return True
        return False

    def expire(self, now: float) -> None:
        """Abandon in-flight messages whose lifetime ended (A3), e.g. on T3 or SACK."""
        if not self.pr_enabled:
            return
        for item in list(self.inflight.values()):
            if not item.abandoned and not item.acked and item.msg.expires is not None \
                    and now >= item.msg.expires:
                self._abandon(item.msg)
        self._advance_ack_point()

    def _abandon(self, msg: OutMessage) -> None:
        if msg.abandoned:
            return
        msg.abandoned = True
        self.abandoned_messages += 1
        for t in msg.tsns:
            item = self.inflight.get(t)
            if item is None or item.abandoned:
                continue
            item.abandoned = True
            if item.in_flight:
                item.in_flight = False
                if not item.acked:
                    self.flight -= item.size
            if item.rtx:
                item.rtx = item.fast = False
                self.rtx_pending -= 1
        if msg.offset < len(msg.data):
            # Fragments never sent: drop them; the FORWARD TSN's (stream, SSN) entry tells the
            # peer to skip the message's SSN.
            try:
                self.queue.remove(msg)
            except ValueError:
                pass
            else:
                self._unqueue(msg.stream_id, len(msg.data) - msg.offset)
                msg.offset = len(msg.data)
        self._advance_ack_point()

    def _advance_ack_point(self) -> None:
        """§3.5 C1: move the Advanced.Peer.Ack.Point over abandoned TSNs."""
        adv = max(self.adv_point, self.cum_ack)
        while (item := self.inflight.get(adv + 1)) is not None and item.abandoned:
            adv += 1
        self.adv_point = adv
        if adv > self.cum_ack:
            self.fwd_pending = True

    def forward_tsn(self) -> ForwardTsnChunk | None:
        """§3.5 C3-C4: the FORWARD TSN to send now (and mark it sent)."""
        if not self.fwd_pending:
            return None
        self.fwd_pending = False
        if self.adv_point <= self.cum_ack:
            return None
        last_ssn: dict[int, int] = {}
        for t in range(self.cum_ack + 1, self.adv_point + 1):
            item = self.inflight.get(t)
            if item is not None and not item.msg.unordered:
                last_ssn[item.msg.stream_id] = item.msg.ssn
        return ForwardTsnChunk(self.adv_point & M32, tuple(sorted(last_ssn.items())))
