"""DTMF digits as RTP telephone-events (RFC 4733): the payload codec, a receiver that
turns the packet stream into one press per digit, and a sender that makes the packets.

Payload (RFC 4733 §2.3)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |     event     |E|R| volume    |          duration             |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+

``event`` 0-9 are the digits, 10 ``*``, 11 ``#``, 12-15 ``A``-``D``, 16 flash (RFC 4733
§3.2); ``E`` marks the end; ``volume`` is -dBm0 (0..63); ``duration`` counts RTP timestamp
units since the event began. Every packet of one event carries the event's *start*
timestamp (§2.5.1.1), so the receiver groups by timestamp: updates lengthen the duration,
the end packet is sent three times (§2.5.1.4), and any of them may be lost or reordered.

Receiver rule (§2.5.2): a press is reported exactly once, when the first end packet of
its timestamp arrives; a later packet with the same timestamp (a retransmitted end, a
late update) is absorbed. A press whose end packets are all lost is reported when a
packet of a newer event arrives, or when no packet of it came for :data:`LOST_END_TIMEOUT`
seconds, with the longest duration seen. The timestamp of the last reported press is
remembered so that its stragglers never make a second press.

Sender (§2.5.1): a first packet with the RTP marker bit, updates every ``interval`` (50 ms
by default, §2.5.1.2's suggestion; 20 ms to follow the audio ptime), then the end packet
three times, one interval apart. Each is a :class:`DtmfPacket`; the leg gives it the next
RTP sequence number of our stream (every packet, retransmissions included, gets its own).

Deliberately omitted: several events in one payload and RFC 2198 redundancy (trunks send
one event per packet; bytes after the first four are ignored), long-event segments
(§2.5.1.3: a press longer than 0xFFFF units — 8 s at 8 kHz, 1.36 s at 48 kHz — is sent
capped at that duration and reported as such). Events other than the 16 DTMF symbols and
flash are reported with ``digit`` None and their event code.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp.errors import RtpError

_EVENT: Final = struct.Struct("!BBH")
PAYLOAD_SIZE: Final = 4
MAX_DURATION: Final = 0xFFFF
#: Seconds without a packet of an un-ended event before it is reported anyway.
LOST_END_TIMEOUT: Final = 1.0
DEFAULT_VOLUME: Final = 10  # -10 dBm0, what most phones send
END_REPEATS: Final = 3  # §2.5.1.4

#: RFC 4733 §3.2 event codes of the DTMF symbols (16: hook flash).
EVENT_DIGITS: Final = "0123456789*#ABCD"
FLASH: Final = 16


def digit_for(event: int) -> str | None:
    """The DTMF symbol of an event code, ``"!"`` for flash, None for other events."""
    if event < len(EVENT_DIGITS):
        return EVENT_DIGITS[event]
    return "!" if event == FLASH else None


def event_for(digit: str) -> int:
    """The event code of a DTMF symbol (``0-9 * # A-D``, ``!`` for flash)."""
    if digit == "!":
        return FLASH
    i = EVENT_DIGITS.find(digit.upper()) if len(digit) == 1 else -1
    if i < 0:
        raise LocalProtocolError(f"not a DTMF digit: {digit!r}")
    return i


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """One RFC 4733 payload. ``bytes(ev)`` serialises it."""

    event: int
    end: bool
    volume: int
    duration: int

    def __post_init__(self) -> None:
        if not (0 <= self.event <= 255 and 0 <= self.volume <= 63
                and 0 <= self.duration <= MAX_DURATION):
            raise LocalProtocolError("telephone-event field out of range")

    @classmethod
    def parse_untrusted(cls, buf: bytes | bytearray | memoryview) -> TelephoneEvent:
        """Parse the first event of a telephone-event payload. Raises only RtpError."""
        if len(buf) < PAYLOAD_SIZE:
            raise RtpError(f"telephone-event payload of {len(buf)} bytes", hint="dtmf")
        event, flags, duration = _EVENT.unpack_from(buf, 0)
        # The R bit is reserved: "MUST be ignored by the receiver" (§2.3).
        return cls(event, bool(flags & 0x80), flags & 0x3F, duration)

    def __bytes__(self) -> bytes:
        return _EVENT.pack(self.event, (0x80 if self.end else 0) | self.volume, self.duration)


@dataclass(frozen=True, slots=True)
class DigitPress:
    """One press, reported once. ``duration`` is in seconds (the RTP units divided by the
    clock rate); ``timestamp`` is the event's RTP start timestamp; ``ended`` is False when
    its end packets were lost (reported by timeout or by the next event)."""

    digit: str | None
    event: int
    duration: float
    timestamp: int
    ended: bool = True


class DtmfReceiver:
    """Telephone-event packets in, one :class:`DigitPress` per press out (module docstring)."""

    __slots__ = ("clock_rate", "_events", "_ts", "_code", "_duration", "_last_seen",
                 "_done_ts", "dropped")

    def __init__(self, clock_rate: int = 8000) -> None:
        self.clock_rate = clock_rate
        self._events: deque[DigitPress] = deque()
        self._ts: int | None = None  # the open (not yet reported) event's start timestamp
        self._code = 0
        self._duration = 0
        self._last_seen = 0.0
        self._done_ts: int | None = None  # the last reported event's timestamp
        self.dropped = 0  # payloads that did not parse

    def handle_input(self, now: float, data: bytes | memoryview, timestamp: int) -> None:
        """One telephone-event RTP payload (already authenticated) with its RTP timestamp."""
        try:
            ev = TelephoneEvent.parse_untrusted(data)
        except RtpError:
            self.dropped += 1
            return
        if timestamp == self._done_ts:
            return  # a retransmitted end or a late update of a press already reported
        if self._ts is not None and timestamp != self._ts:
            if _older(timestamp, self._ts):
                return  # a reordered packet of an event before the open one
            self._report(ended=False)  # a newer event began: the open one lost its ends
        if self._done_ts is not None and _older(timestamp, self._done_ts):
            return  # a straggler of an older, already reported press
        if self._ts is None:
            self._ts, self._code, self._duration = timestamp, ev.event, 0
        self._duration = max(self._duration, ev.duration)
        self._last_seen = now
        if ev.end:
            self._report(ended=True)

    def _report(self, *, ended: bool) -> None:
        assert self._ts is not None
        self._events.append(DigitPress(digit_for(self._code), self._code,
                                       self._duration / self.clock_rate, self._ts, ended))
        self._done_ts, self._ts = self._ts, None

    def poll_output(self) -> DigitPress | None:
        return self._events.popleft() if self._events else None

    def poll_timeout(self) -> float | None:
        return self._last_seen + LOST_END_TIMEOUT if self._ts is not None else None

    def handle_timeout(self, now: float) -> None:
        if self._ts is not None and now >= self._last_seen + LOST_END_TIMEOUT:
            self._report(ended=False)


def _older(a: int, b: int) -> bool:
    """RTP timestamp ``a`` is before ``b`` (32-bit serial arithmetic, RFC 1982 style)."""
    return a != b and ((b - a) & 0xFFFFFFFF) < 1 << 31


@dataclass(frozen=True, slots=True)
class DtmfPacket:
    """One telephone-event packet to send at ``at``: the leg adds the RTP header (our SSRC,
    the telephone-event payload type, the next sequence number, ``timestamp``)."""

    at: float
    timestamp: int
    marker: bool
    payload: bytes


class DtmfSender:
    """Digits in (:meth:`send`), RFC 4733 packets out when due: :meth:`handle_timeout` at
    :meth:`poll_timeout` makes them ready, :meth:`poll_output` hands them out.

    ``interval`` is the update spacing (seconds); ``gap`` the silence between two queued
    digits. A digit queued while another is being sent starts after it.
    """

    __slots__ = ("clock_rate", "interval", "gap", "volume", "_queue", "_ready", "_free_at")

    def __init__(self, clock_rate: int = 8000, *, interval: float = 0.05, gap: float = 0.05,
                 volume: int = DEFAULT_VOLUME) -> None:
        if interval <= 0 or gap < 0:
            raise LocalProtocolError("interval must be > 0 and gap >= 0")
        self.clock_rate = clock_rate
        self.interval = interval
        self.gap = gap
        self.volume = volume
        self._queue: deque[DtmfPacket] = deque()  # scheduled, in time order
        self._ready: deque[DtmfPacket] = deque()  # due: for poll_output
        self._free_at = float("-inf")  # when the last queued digit's packets are done

    def send(self, now: float, digit: str, duration: float, timestamp_at: int) -> float:
        """Queue one digit of ``duration`` seconds. ``timestamp_at`` is our stream's RTP
        timestamp at ``now`` (the leg's sender clock); the event's timestamp is derived for
        its actual start. Returns the start time."""
        code = event_for(digit)
        if not 0 < duration:
            raise LocalProtocolError("a DTMF duration must be positive")
        start = max(now, self._free_at)
        ts = (timestamp_at + round((start - now) * self.clock_rate)) & 0xFFFFFFFF
        total = min(MAX_DURATION, max(1, round(duration * self.clock_rate)))
        step = max(1, round(self.interval * self.clock_rate))
        # First packet at the start, marker set, covering one interval (or the whole press
        # if shorter); then one update per interval; the last is the end, sent three times.
        k = 0
        while True:
            dur = min(total, (k + 1) * step)
            at = start + k * self.interval
            if dur >= total:
                break
            self._queue.append(DtmfPacket(at, ts, k == 0, bytes(
                TelephoneEvent(code, False, self.volume, dur))))
            k += 1
        end = bytes(TelephoneEvent(code, True, self.volume, total))
        for r in range(END_REPEATS):
            self._queue.append(DtmfPacket(at + r * self.interval, ts, k == 0 and r == 0, end))
        self._free_at = at + (END_REPEATS - 1) * self.interval + self.gap
        self.handle_timeout(now)
        return start

    @property
    def busy(self) -> bool:
        return bool(self._queue or self._ready)

    def poll_timeout(self) -> float | None:
        return self._queue[0].at if self._queue else None

    def handle_timeout(self, now: float) -> None:
        while self._queue and self._queue[0].at <= now:
            self._ready.append(self._queue.popleft())

    def poll_output(self) -> DtmfPacket | None:
        """The next packet that is due (after :meth:`send` / :meth:`handle_timeout`)."""
        return self._ready.popleft() if self._ready else None
