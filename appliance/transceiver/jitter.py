"""A small adaptive jitter buffer for inbound audio RTP (sans-IO: time is passed in).

Design goal (issue 6 item 5): **no added delay in steady state**. A packet that arrives in
order is released at once; the buffer only *holds* packets when a sequence gap opens in
front of them, waiting a bounded, adaptive time for the missing packet(s) to show up
(reordering) before declaring them lost (loss concealment). So:

* in-order packets: 0 ms added;
* reordered packets: the ones behind the hole wait until the hole fills, at most
  ``wait`` (initially one frame, 20 ms);
* lost packets: one ``JitterItem`` with ``payload=None`` per missing sequence number is
  released when ``wait`` expires, and the consumer conceals it (Opus PLC/fade);
* duplicates and packets that arrive after their slot was released or concealed are
  dropped and counted;
* depth is bounded (``max_depth`` packets): a packet that would exceed it forces the hole in
  front to be concealed now; a sequence jump larger than ``max_jump`` (a sender restart)
  resynchronises instead of conceal-filling seconds of silence.

Adaptation: a packet that arrives *after* we concealed its slot means we gave up too early,
so ``wait`` grows by 10 ms (up to ``max_wait``); holes that fill quickly let it decay back
toward ``min_wait``. Sequence numbers are unwrapped to 64-bit "extended" numbers (RFC 3550
Appendix A.1) so wrap-around at 65535 is invisible to callers.

The consumer drives it with the house verbs: :meth:`push` (a ``handle_*``), then drain
:meth:`poll` until ``None``, then sleep until :meth:`poll_timeout`.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

SAMPLES_PER_FRAME = 960


class JitterItem(NamedTuple):
    """One released slot: ``payload`` is ``None`` for a lost packet (conceal it)."""

    seq: int  # extended (unwrapped) sequence number
    timestamp: int  # RTP timestamp (estimated for a lost packet)
    payload: bytes | None


class JitterBuffer:
    __slots__ = (
        "_held", "_next", "_last_ts", "_last_seq", "_hole_since", "_ready",
        "_concealed", "wait", "min_wait", "max_wait", "max_depth", "max_jump",
        "received", "duplicates", "late", "lost", "resyncs", "_step",
    )

    def __init__(
        self,
        *,
        min_wait: float = 0.010,
        initial_wait: float = 0.020,
        max_wait: float = 0.080,
        max_depth: int = 8,
        max_jump: int = 100,
        samples_per_frame: int = SAMPLES_PER_FRAME,
    ) -> None:
        self._step = samples_per_frame  # RTP clock units per packet (48 kHz Opus, 8 kHz G.711)
        self._held: dict[int, tuple[int, bytes]] = {}  # ext seq -> (timestamp, payload)
        self._next: int | None = None  # next extended seq to release
        self._last_seq = 0
        self._last_ts = 0
        self._hole_since: float | None = None  # when the current hole started holding packets
        self._ready: deque[JitterItem] = deque()
        # Recently concealed slots: a late packet for one of them means "wait longer".
        self._concealed: deque[int] = deque(maxlen=64)
        self.wait = initial_wait
        self.min_wait = min_wait
        self.max_wait = max_wait
        self.max_depth = max_depth
        self.max_jump = max_jump
        self.received = 0
        self.duplicates = 0
        self.late = 0
        self.lost = 0
        self.resyncs = 0

    # -- input -------------------------------------------------------------------------

    def _unwrap(self, seq: int) -> int:
        assert self._next is not None
        delta = (seq - self._next) & 0xFFFF
        if delta >= 0x8000:
            delta -= 0x10000
        return self._next + delta

    def push(self, now: float, seq: int, timestamp: int, payload: bytes) -> None:
        """Accept one RTP packet (16-bit ``seq``)."""
        self.received += 1
        if self._next is None:
            # First packet: start the extended sequence space well above zero so a
            # slightly older packet after it unwraps to a smaller, still positive number.
            self._next = (1 << 32) + seq
            self._last_seq = self._next - 1
            self._last_ts = timestamp - self._step
        ext = self._unwrap(seq)
        if ext < self._next:
            if ext in self._concealed:
                # We concealed this slot and then the packet came: our wait was too short.
                self.late += 1
                self.wait = min(self.max_wait, self.wait + 0.010)
            else:
                self.duplicates += 1
            return
        if ext in self._held:
            self.duplicates += 1
            return
        if ext - self._next > self.max_jump:
            # The sender jumped (restart, SSRC change, long outage): release what we hold
            # and start over at this packet, without conceal-filling the jump.
            self._flush_held()
            self.resyncs += 1
            self._next = ext
            self._last_seq = ext - 1
            self._last_ts = timestamp - self._step
        if ext == self._next:
            self._emit(ext, timestamp, payload)
            if self._hole_since is not None:
                # A hole just filled: adapt the wait toward how long it actually took.
                waited = now - self._hole_since
                self.wait = max(self.min_wait, min(self.wait, max(waited * 1.5, self.wait * 0.95)))
                self._hole_since = None
            self._release_in_order()
            if self._held and self._hole_since is None:
                self._hole_since = now
            return
        # A hole in front of this packet: hold it.
        self._held[ext] = (timestamp, payload)
        if self._hole_since is None:
            self._hole_since = now
        if len(self._held) > self.max_depth:
            self._conceal_hole()
            self._hole_since = now if self._held else None

    # -- output ------------------------------------------------------------------------

    def poll(self) -> JitterItem | None:
        """The next released slot, in sequence order, or ``None``."""
        return self._ready.popleft() if self._ready else None

    def peek(self) -> JitterItem | None:
        """The slot :meth:`poll` would return next, left in place (FEC looks one ahead)."""
        return self._ready[0] if self._ready else None

    def poll_timeout(self) -> float | None:
        """When :meth:`handle_timeout` must run to give up on the current hole."""
        if self._hole_since is None:
            return None
        return self._hole_since + self.wait

    def handle_timeout(self, now: float) -> None:
        while self._hole_since is not None and now >= self._hole_since + self.wait:
            self._conceal_hole()
            self._hole_since = now if self._held else None

    @property
    def depth(self) -> int:
        return len(self._held)

    # -- internals ---------------------------------------------------------------------

    def _emit(self, ext: int, timestamp: int, payload: bytes | None) -> None:
        self._ready.append(JitterItem(ext, timestamp, payload))
        self._last_seq = ext
        self._last_ts = timestamp
        self._next = ext + 1

    def _release_in_order(self) -> None:
        held = self._held
        assert self._next is not None
        while self._next in held:
            ts, payload = held.pop(self._next)
            self._emit(self._next, ts, payload)

    def _conceal_hole(self) -> None:
        """Declare the slots up to the first held packet lost, then release in order."""
        if not self._held or self._next is None:
            return
        first = min(self._held)
        while self._next < first:
            ext = self._next
            ts = self._last_ts + self._step * (ext - self._last_seq)
            self._concealed.append(ext)
            self.lost += 1
            self._emit(ext, ts & 0xFFFFFFFF, None)
        self._release_in_order()

    def _flush_held(self) -> None:
        for ext in sorted(self._held):
            ts, payload = self._held.pop(ext)
            self._emit(ext, ts, payload)
        self._hole_since = None
