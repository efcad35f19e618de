"""The receiving half of an association: TSN tracking, SACK contents, reassembly.

RFC 9260 §6.2 (acknowledgement on reception: cumulative TSN, gap blocks, duplicates,
a_rwnd), §6.5-6.6 (ordered and unordered delivery, stream sequence numbers), §6.9
(reassembly); RFC 3758 §3.6 (FORWARD TSN on the receiver: skip TSNs and SSNs, drop
fragments of abandoned messages); RFC 6525 §5.2.2 (an incoming stream reset is performed
only once every TSN up to the sender's last assigned TSN has arrived; data that overtakes
the reset is held back until it is performed).

TSNs and SSNs are *unwrapped* to unbounded ints relative to what we have already seen
(dcSCTP's ``UnwrappedSequenceNumber``), so no serial-number arithmetic leaks out of here.

Bounds: bytes held (reassembly + out-of-order) are capped by ``max_buffer`` (advertised
as a_rwnd); the TSN window above the cumulative TSN is capped; a message that grows past
``max_message_size`` is a violation the association turns into an ABORT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from appliance.proto.sctp.chunks import DataChunk, SackChunk

M32 = 0xFFFFFFFF
#: TSNs accepted above the cumulative TSN (gap offsets are 16-bit, RFC 9260 §3.3.4).
TSN_WINDOW = 16384
MAX_GAPS = 128
MAX_DUPS = 32


def unwrap(value: int, ref: int, bits: int = 32) -> int:
    """The unbounded int nearest to ``ref`` whose low ``bits`` are ``value``."""
    mod = 1 << bits
    d = (value - ref) % mod
    if d >= mod >> 1:
        d -= mod
    return ref + d


@dataclass(slots=True, eq=False)
class _Partial:
    """The fragments of one ordered message (one SSN) received so far."""

    chunks: dict[int, DataChunk] = field(default_factory=dict)  # unwrapped TSN -> chunk
    size: int = 0
    first: int | None = None  # TSN of the B fragment
    last: int | None = None  # TSN of the E fragment

    def add(self, t: int, chunk: DataChunk) -> None:
        self.chunks[t] = chunk
        self.size += len(chunk.payload)
        if chunk.begin:
            self.first = t
        if chunk.end:
            self.last = t

    def complete(self) -> list[DataChunk] | None:
        first, last = self.first, self.last
        if first is None or last is None or last - first + 1 != len(self.chunks):
            return None
        chunks = self.chunks
        if not all(t in chunks for t in range(first, last + 1)):
            return None
        return [chunks[t] for t in range(first, last + 1)]


@dataclass(slots=True)
class _InStream:
    next_ssn: int = 0  # unwrapped SSN of the next ordered message to deliver
    # unwrapped SSN -> fragments of ordered messages not yet delivered
    pending: dict[int, _Partial] = field(default_factory=dict)


class Delivered(NamedTuple):
    stream_id: int
    ppid: int
    data: bytes
    unordered: bool


@dataclass(slots=True)
class _DeferredReset:
    last_tsn: int  # unwrapped
    streams: tuple[int, ...]
    held: list[DataChunk] = field(default_factory=list)


class Receiver:
    """Accepts DATA chunks, produces deliveries and SACKs. No timers: the association
    decides when to send the SACK (§6.2 delayed acknowledgement)."""

    def __init__(self, peer_initial_tsn: int, *, max_buffer: int, max_message_size: int) -> None:
        self.cum = peer_initial_tsn - 1  # unwrapped cumulative TSN (may be -1)
        self.above: set[int] = set()
        self.duplicates: list[int] = []
        self.buffered = 0
        self.max_buffer = max_buffer
        self.max_message_size = max_message_size
        self.streams: dict[int, _InStream] = {}
        self.unordered: dict[int, DataChunk] = {}
        self.delivered: list[Delivered] = []
        self.violation: str | None = None
        self.deferred: _DeferredReset | None = None
        self.dropped_no_space = 0

    # --- TSN bookkeeping ----------------------------------------------------------------

    def _unwrap(self, tsn: int) -> int:
        return unwrap(tsn, self.cum)

    def _advance(self) -> None:
        above = self.above
        cum = self.cum
        while cum + 1 in above:
            cum += 1
            above.discard(cum)
        self.cum = cum

    @property
    def a_rwnd(self) -> int:
        return max(0, self.max_buffer - self.buffered)

    @property
    def has_gaps(self) -> bool:
        return bool(self.above)

    def sack(self) -> SackChunk:
        """RFC 9260 §3.3.4: gap blocks as offsets from the cumulative TSN ACK."""
        gaps: list[tuple[int, int]] = []
        if self.above:
            start = prev = -1
            for t in sorted(self.above):
                off = t - self.cum
                if off != prev + 1 or start < 0:
                    if start >= 0:
                        gaps.append((start, prev))
                        if len(gaps) >= MAX_GAPS:
                            break
                    start = off
                prev = off
            else:
                gaps.append((start, prev))
        dups = tuple(d & M32 for d in self.duplicates[:MAX_DUPS])
        self.duplicates.clear()
        return SackChunk(self.cum & M32, self.a_rwnd, tuple(gaps), dups)

    # --- DATA -----------------------------------------------------------------------------

    def add(self, chunk: DataChunk) -> bool:
        """Take one DATA chunk; False if it was a duplicate or dropped (no space)."""
        t = self._unwrap(chunk.tsn)
        if t <= self.cum or t in self.above:
            # §6.2: report duplicates in the next SACK (sent at once, §6.7).
            if len(self.duplicates) < MAX_DUPS:
                self.duplicates.append(t)
            return False
        if t - self.cum > TSN_WINDOW:
            self.dropped_no_space += 1
            return False
        size = len(chunk.payload)
        # §6.2: with no buffer space left, drop (and do not ack) new data, but always take the
        # chunk that advances the cumulative TSN so a full buffer cannot deadlock.
        if self.buffered + size > self.max_buffer and t != self.cum + 1:
            self.dropped_no_space += 1
            return False
        if self.buffered + size > 2 * self.max_buffer:
            self.violation = "peer overran the receive window"
            return False
        self.above.add(t)
        self._advance()
        d = self.deferred
        if d is not None and t > d.last_tsn and chunk.stream_id in d.streams:
            # RFC 6525 §5.2.2: new data for a stream whose reset is not yet performed.
            d.held.append(chunk)
            self.buffered += size
            return True
        self._place(t, chunk)
        return True

    def _place(self, t: int, chunk: DataChunk) -> None:
        size = len(chunk.payload)
        if chunk.unordered:
            if chunk.begin and chunk.end:
                self._deliver(chunk.stream_id, chunk.ppid, chunk.payload, True)
                return
            self.unordered[t] = chunk
            self.buffered += size
            self._try_unordered(t)
            return
        st = self.streams.get(chunk.stream_id)
        if st is None:
            st = self.streams[chunk.stream_id] = _InStream()
        ssn = unwrap(chunk.ssn, st.next_ssn, 16)
        if ssn < st.next_ssn:
            return  # a fragment of a message already delivered or skipped by FORWARD TSN
        if chunk.begin and chunk.end and ssn == st.next_ssn and not st.pending:
            st.next_ssn += 1  # the common case: a whole message, in order
            self._deliver(chunk.stream_id, chunk.ppid, chunk.payload, False)
            return
        group = st.pending.get(ssn)
        if group is None:
            group = st.pending[ssn] = _Partial()
        group.add(t, chunk)
        self.buffered += size
        if group.size > self.max_message_size:
            self.violation = (f"peer message on stream {chunk.stream_id} exceeds "
                              f"max_message_size {self.max_message_size}")
            return
        if ssn == st.next_ssn and group.last is not None:
            self._drain_stream(chunk.stream_id, st)

    def _drain_stream(self, sid: int, st: _InStream) -> None:
        while (group := st.pending.get(st.next_ssn)) is not None:
            parts = group.complete()
            if parts is None:
                return
            del st.pending[st.next_ssn]
            st.next_ssn += 1
            data = b"".join(c.payload for c in parts)
            self.buffered -= len(data)
            self._deliver(sid, parts[0].ppid, data, False)

    def _try_unordered(self, t: int) -> None:
        frags = self.unordered
        sid = frags[t].stream_id
        s = t
        while not frags[s].begin:
            s -= 1
            c = frags.get(s)
            if c is None or c.stream_id != sid or c.end:
                return
        e = t
        while not frags[e].end:
            e += 1
            c = frags.get(e)
            if c is None or c.stream_id != sid or c.begin:
                return
        parts = [frags.pop(i) for i in range(s, e + 1)]
        data = b"".join(c.payload for c in parts)
        self.buffered -= len(data)
        self._deliver(sid, parts[0].ppid, data, True)

    def _deliver(self, sid: int, ppid: int, data: bytes, unordered: bool) -> None:
        if len(data) > self.max_message_size:
            self.violation = (f"peer message on stream {sid} of {len(data)} bytes exceeds "
                              f"max_message_size {self.max_message_size}")
            return
        self.delivered.append(Delivered(sid, ppid, data, unordered))

    # --- FORWARD TSN (RFC 3758 §3.6) --------------------------------------------------------

    def forward(self, new_cum_tsn: int, streams: tuple[tuple[int, int], ...]) -> None:
        t = self._unwrap(new_cum_tsn)
        if t <= self.cum:
            return  # old or duplicate FORWARD TSN: only a SACK is owed
        if t - self.cum > TSN_WINDOW:
            # Far beyond anything the peer could have sent within our window: refuse it.
            self.violation = "FORWARD TSN beyond the receive window"
            return
        self.above = {x for x in self.above if x > t}
        self.cum = t
        self._advance()
        for tsn in [x for x in self.unordered if x <= t]:
            self.buffered -= len(self.unordered.pop(tsn).payload)
        for sid, ssn16 in streams:
            st = self.streams.get(sid)
            if st is None:
                st = self.streams[sid] = _InStream()
            ssn = unwrap(ssn16, st.next_ssn, 16)
            if ssn < st.next_ssn:
                continue
            for k in [k for k in st.pending if k <= ssn]:
                self.buffered -= st.pending.pop(k).size
            st.next_ssn = ssn + 1
            self._drain_stream(sid, st)

    # --- stream reset (RFC 6525 §5.2.2) -------------------------------------------------

    def request_reset(self, last_tsn: int, streams: tuple[int, ...]) -> bool:
        """The peer reset its outgoing ``streams`` after ``last_tsn``. True if performed
        now; False if deferred until the missing TSNs arrive (answer "in progress")."""
        lt = self._unwrap(last_tsn)
        if not streams:
            streams = tuple(self.streams)
        if lt <= self.cum:
            self._reset(streams)
            return True
        if self.deferred is None:
            self.deferred = _DeferredReset(lt, streams)
        return False

    def _reset(self, streams: tuple[int, ...]) -> None:
        for sid in streams:
            st = self.streams.pop(sid, None)
            if st is not None:
                for group in st.pending.values():
                    self.buffered -= group.size

    def _maybe_perform_deferred(self) -> tuple[int, ...] | None:
        d = self.deferred
        if d is None or d.last_tsn > self.cum:
            return None
        self.deferred = None
        self._reset(d.streams)
        for chunk in d.held:
            self.buffered -= len(chunk.payload)
            self._place(self._unwrap(chunk.tsn), chunk)
        return d.streams

    def poll_performed_reset(self) -> tuple[int, ...] | None:
        """Streams of a deferred reset that became performable (after new data)."""
        return self._maybe_perform_deferred()
