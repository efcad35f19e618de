"""WebRTC data channels (RFC 8831) and DCEP (RFC 8832) on top of :class:`SctpAssociation`.

:class:`DataChannelEndpoint` owns one association and speaks the same verbs
(``handle_input``/``poll_transmit``/``poll_event``/``poll_timeout``/``handle_timeout``),
so a shell drives either object the same way. What it adds:

* DCEP (RFC 8832 §5): DATA_CHANNEL_OPEN / DATA_CHANNEL_ACK, PPID 50, always sent ordered
  and reliable (§6). Channels may be opened by either side. The DTLS role picks the
  stream-id parity (§6: the DTLS client uses even ids, the server odd), so both sides can
  open at once without collisions. Until the ACK (or any data) arrives, the opener sends
  ordered even on an unordered channel (§6).
* Pre-negotiated channels (RFC 8831 §6.5, ``negotiated: true, id``): no DCEP at all.
* Reliability (RFC 8831 §6.1): reliable, ``max_retransmits`` or ``max_packet_lifetime``
  (milliseconds, as in the W3C API), ordered or not; mapped onto RFC 3758 per message.
* Messages (RFC 8831 §6.6): strings PPID 51, binary 53; an empty string is PPID 56 and an
  empty binary PPID 57, each carried as one zero byte (SCTP cannot carry 0 bytes). The
  deprecated partial PPIDs 52/54 are accepted as string/binary.
* Closing (RFC 8831 §6.7): a stream reset of our outgoing stream; when the peer resets its
  outgoing stream we answer *and* reset ours (Chrome leaves a channel in "closing" until
  it sees both). A channel is closed when both directions have been reset.
* Bounded: at most ``max_channels`` channels; a DCEP OPEN beyond that is refused by
  resetting the stream.
"""

from __future__ import annotations

import enum
import struct
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from appliance.proto.sctp.association import SctpAssociation, State
from appliance.proto.sctp.errors import SctpError, SctpUsageError
from appliance.proto.sctp.events import (
    BufferedAmountLow,
    Closed,
    Connected,
    MessageReceived,
    StreamResetFailed,
    StreamsReset,
)

PPID_DCEP = 50
PPID_STRING = 51
PPID_BINARY_PARTIAL = 52  # deprecated (RFC 8831 §8)
PPID_BINARY = 53
PPID_STRING_PARTIAL = 54  # deprecated
PPID_STRING_EMPTY = 56
PPID_BINARY_EMPTY = 57

DATA_CHANNEL_ACK = 0x02
DATA_CHANNEL_OPEN = 0x03
_OPEN = struct.Struct("!BBHIHH")
_CHUNK = struct.Struct("!BBH")


def carries_channel_message(packet: bytes) -> bool:
    """Whether one of *our own* SCTP packets holds a DATA chunk that begins a channel
    message (any PPID but DCEP's). For the transceiver's timeline; it walks the chunk
    headers only and trusts their lengths, so it is not for peer input."""
    i, n = 12, len(packet)  # after the common header (RFC 9260 §3.1)
    while i + 16 <= n:
        ctype, flags, length = _CHUNK.unpack_from(packet, i)
        if (ctype == 0 and flags & 0x02  # DATA with the B bit (§3.3.1)
                and int.from_bytes(packet[i + 12 : i + 16], "big") != PPID_DCEP):
            return True
        if length < 4:
            return False
        i += (length + 3) & ~3
    return False


class ChannelType(enum.IntEnum):
    """RFC 8832 §5.1 Channel Type; 0x80 is the unordered bit."""

    RELIABLE = 0x00
    PARTIAL_RELIABLE_REXMIT = 0x01
    PARTIAL_RELIABLE_TIMED = 0x02
    RELIABLE_UNORDERED = 0x80
    PARTIAL_RELIABLE_REXMIT_UNORDERED = 0x81
    PARTIAL_RELIABLE_TIMED_UNORDERED = 0x82


class ChannelState(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class DataChannelOpen:
    """RFC 8832 §5.1::

        | Message Type=3| Channel Type  |           Priority            |
        |                    Reliability Parameter                      |
        |         Label Length          |       Protocol Length         |
        \\  Label (UTF-8)  \\  Protocol (UTF-8)  \\
    """

    channel_type: int
    priority: int
    reliability: int
    label: str
    protocol: str

    @classmethod
    def parse_untrusted(cls, data: bytes) -> DataChannelOpen:
        if len(data) < _OPEN.size:
            raise SctpError("DATA_CHANNEL_OPEN shorter than 12 bytes", hint="dcep")
        mtype, ctype, prio, rel, llen, plen = _OPEN.unpack_from(data)
        if mtype != DATA_CHANNEL_OPEN:
            raise SctpError("not a DATA_CHANNEL_OPEN", hint="dcep")
        if len(data) != _OPEN.size + llen + plen:
            raise SctpError("DATA_CHANNEL_OPEN label/protocol lengths", hint="dcep")
        if ctype not in ChannelType._value2member_map_:
            raise SctpError(f"unknown channel type {ctype:#x}", hint="dcep")
        try:
            label = data[_OPEN.size : _OPEN.size + llen].decode("utf-8")
            protocol = data[_OPEN.size + llen :].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SctpError("DATA_CHANNEL_OPEN label is not UTF-8", hint="dcep") from exc
        return cls(ctype, prio, rel, label, protocol)

    def __bytes__(self) -> bytes:
        label, protocol = self.label.encode(), self.protocol.encode()
        return _OPEN.pack(DATA_CHANNEL_OPEN, self.channel_type, self.priority,
                          self.reliability, len(label), len(protocol)) + label + protocol


# --- events --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    channel_id: int
    label: str
    protocol: str
    ordered: bool
    max_retransmits: int | None
    max_packet_lifetime: int | None  # milliseconds
    negotiated: bool
    locally_initiated: bool


@dataclass(frozen=True, slots=True)
class ChannelMessage:
    channel_id: int
    data: bytes | str


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    channel_id: int


@dataclass(frozen=True, slots=True)
class ChannelBufferedAmountLow:
    channel_id: int


ChannelEvent = ChannelOpened | ChannelMessage | ChannelClosed | ChannelBufferedAmountLow
EndpointEvent = ChannelEvent | Connected | Closed


@dataclass(slots=True, eq=False)
class _Channel:
    id: int
    label: str
    protocol: str
    ordered: bool
    max_retransmits: int | None
    max_packet_lifetime: int | None
    negotiated: bool
    local: bool
    priority: int = 256
    state: ChannelState = ChannelState.CONNECTING
    acked: bool = False
    in_reset: bool = False
    out_reset: bool = False

    def opened_event(self) -> ChannelOpened:
        return ChannelOpened(self.id, self.label, self.protocol, self.ordered,
                             self.max_retransmits, self.max_packet_lifetime, self.negotiated,
                             self.local)

    def open_message(self) -> DataChannelOpen:
        base = 0x00 if self.ordered else 0x80
        if self.max_retransmits is not None:
            return DataChannelOpen(base | 1, self.priority, self.max_retransmits, self.label,
                                   self.protocol)
        if self.max_packet_lifetime is not None:
            return DataChannelOpen(base | 2, self.priority, self.max_packet_lifetime,
                                   self.label, self.protocol)
        return DataChannelOpen(base, self.priority, 0, self.label, self.protocol)


class DataChannelEndpoint:
    """Data channels over one SCTP association. ``dtls_client`` is the DTLS role (it picks
    the stream-id parity); extra keyword arguments go to :class:`SctpAssociation`."""

    def __init__(self, *, dtls_client: bool, association: SctpAssociation | None = None,
                 max_channels: int = 1024, **association_options: Any) -> None:
        self.association = association or SctpAssociation(**association_options)
        self.dtls_client = dtls_client
        self.max_channels = max_channels
        self._channels: dict[int, _Channel] = {}
        self._events: deque[EndpointEvent] = deque()
        self.stats: Counter[str] = Counter()

    # --- verbs shared with the association ----------------------------------------------

    def connect(self, now: float) -> None:
        self.association.connect(now)
        self._open_negotiated()
        self._pump(now)

    def handle_input(self, now: float, packet: bytes) -> None:
        self.association.handle_input(now, packet)
        self._pump(now)

    def handle_timeout(self, now: float) -> None:
        self.association.handle_timeout(now)
        self._pump(now)

    def poll_transmit(self) -> bytes | None:
        return self.association.poll_transmit()

    def poll_timeout(self) -> float | None:
        return self.association.poll_timeout()

    def poll_event(self) -> EndpointEvent | None:
        return self._events.popleft() if self._events else None

    def shutdown(self, now: float) -> None:
        self.association.shutdown(now)
        self._pump(now)

    def abort(self, now: float, reason: str = "") -> None:
        self.association.abort(now, reason)
        self._pump(now)

    # --- channels -------------------------------------------------------------------------

    def channel_state(self, channel_id: int) -> ChannelState:
        ch = self._channels.get(channel_id)
        return ch.state if ch is not None else ChannelState.CLOSED

    @property
    def channel_ids(self) -> tuple[int, ...]:
        return tuple(self._channels)

    def open_channel(self, now: float, label: str = "", *, protocol: str = "",
                     ordered: bool = True, max_retransmits: int | None = None,
                     max_packet_lifetime: int | None = None, negotiated: bool = False,
                     id: int | None = None, priority: int = 256) -> int:
        """Open a channel; returns its stream id. ``negotiated=True`` needs ``id`` and sends
        no DCEP (both sides must open it). Reliability: at most one of ``max_retransmits``
        and ``max_packet_lifetime`` (ms), as in the W3C API."""
        if max_retransmits is not None and max_packet_lifetime is not None:
            raise SctpUsageError("max_retransmits and max_packet_lifetime are exclusive")
        if len(self._channels) >= self.max_channels:
            raise SctpUsageError(f"already {self.max_channels} channels")
        if negotiated:
            if id is None:
                raise SctpUsageError("a negotiated channel needs an id")
        elif id is None:
            id = self._free_id()
        if not 0 <= id < min(self.association.outbound_streams, 65535):
            raise SctpUsageError(f"channel id {id} out of range")
        if id in self._channels:
            raise SctpUsageError(f"channel id {id} is in use")
        ch = _Channel(id, label, protocol, ordered, max_retransmits, max_packet_lifetime,
                      negotiated, local=True, priority=priority, acked=negotiated)
        self._channels[id] = ch
        if not negotiated:
            self.association.send(now, id, PPID_DCEP, bytes(ch.open_message()))
        if self.association.is_established or (negotiated and self._init_sent()):
            ch.state = ChannelState.OPEN
            self._events.append(ch.opened_event())
        self._pump(now)
        return id

    def _init_sent(self) -> bool:
        return self.association.state in (State.COOKIE_WAIT, State.COOKIE_ECHOED)

    def _open_negotiated(self) -> None:
        """A pre-negotiated channel (RFC 8831 §6.5) opens as soon as our INIT is out, not
        at ESTABLISHED: both sides already agree on it, so what is sent on it now waits in
        the association and leaves bundled with our COOKIE ECHO (RFC 9260 §5.1 step D),
        a round trip before the COOKIE ACK. DCEP channels still wait for ESTABLISHED (their
        OPEN is queued and bundled the same way). See docs/sctp.md "Setup latency"."""
        if not self._init_sent():
            return
        for ch in self._channels.values():
            if ch.negotiated and ch.state is ChannelState.CONNECTING:
                ch.state = ChannelState.OPEN
                self._events.append(ch.opened_event())

    def _free_id(self) -> int:
        limit = min(self.association.outbound_streams, 65535)
        for i in range(0 if self.dtls_client else 1, limit, 2):
            if i not in self._channels:
                return i
        raise SctpUsageError("no free stream id")

    def send(self, now: float, channel_id: int, data: bytes | str) -> None:
        """Send one message; ``str`` goes as UTF-8 text, ``bytes`` as binary."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.state is not ChannelState.OPEN:
            raise SctpUsageError(f"channel {channel_id} is not open")
        if isinstance(data, str):
            payload, ppid = (data.encode(), PPID_STRING) if data else (b"\0", PPID_STRING_EMPTY)
        else:
            payload, ppid = (bytes(data), PPID_BINARY) if data else (b"\0", PPID_BINARY_EMPTY)
        lifetime = None if ch.max_packet_lifetime is None else ch.max_packet_lifetime / 1000
        self.association.send(now, channel_id, ppid, payload,
                              ordered=ch.ordered or not ch.acked,
                              max_retransmits=ch.max_retransmits, max_lifetime=lifetime)
        self.stats["messages_out"] += 1
        self.stats["bytes_out"] += len(data) if isinstance(data, bytes) else len(payload)
        self._pump(now)

    def close_channel(self, now: float, channel_id: int) -> None:
        """RFC 8831 §6.7: reset our outgoing stream; ChannelClosed once both are reset."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.state in (ChannelState.CLOSING, ChannelState.CLOSED):
            return
        ch.state = ChannelState.CLOSING
        self._reset(now, ch)
        self._pump(now)

    def buffered_amount(self, channel_id: int) -> int:
        return self.association.buffered_amount(channel_id)

    def set_buffered_amount_low_threshold(self, channel_id: int, threshold: int) -> None:
        self.association.set_buffered_amount_low_threshold(channel_id, threshold)

    # --- association events -----------------------------------------------------------------

    def _reset(self, now: float, ch: _Channel) -> None:
        if ch.out_reset:
            return
        try:
            self.association.reset_streams(now, [ch.id])
        except SctpUsageError:
            # The association is closing or the peer cannot reset streams: nothing more can
            # travel on this channel either way.
            ch.out_reset = ch.in_reset = True
            self._finish(ch)

    def _finish(self, ch: _Channel) -> None:
        if self._channels.pop(ch.id, None) is not None:
            ch.state = ChannelState.CLOSED
            self._events.append(ChannelClosed(ch.id))

    def _pump(self, now: float) -> None:
        assoc = self.association
        while (ev := assoc.poll_event()) is not None:
            if isinstance(ev, MessageReceived):
                self._on_message(now, ev)
            elif isinstance(ev, StreamsReset):
                self._on_reset(now, ev)
            elif isinstance(ev, StreamResetFailed):
                for sid in ev.stream_ids:
                    if (ch := self._channels.get(sid)) is not None:
                        self._finish(ch)
            elif isinstance(ev, BufferedAmountLow):
                if ev.stream_id in self._channels:
                    self._events.append(ChannelBufferedAmountLow(ev.stream_id))
            elif isinstance(ev, Connected):
                self._events.append(ev)
                for ch in self._channels.values():
                    if ch.state is ChannelState.CONNECTING:
                        ch.state = ChannelState.OPEN
                        self._events.append(ch.opened_event())
            elif isinstance(ev, Closed):
                for ch in list(self._channels.values()):
                    self._finish(ch)
                self._events.append(ev)

    def _on_message(self, now: float, ev: MessageReceived) -> None:
        sid, ppid, data = ev.stream_id, ev.ppid, ev.data
        if ppid == PPID_DCEP:
            self._on_dcep(now, sid, data)
            return
        ch = self._channels.get(sid)
        if ch is None or ch.state is ChannelState.CLOSED or ch.in_reset:
            self.stats["drops_no_channel"] += 1
            return
        ch.acked = True  # RFC 8832 §6: user data implies the ACK
        msg: bytes | str
        if ppid in (PPID_STRING, PPID_STRING_PARTIAL):
            msg = data.decode("utf-8", "replace")
        elif ppid in (PPID_BINARY, PPID_BINARY_PARTIAL):
            msg = data
        elif ppid == PPID_STRING_EMPTY:
            msg = ""
        elif ppid == PPID_BINARY_EMPTY:
            msg = b""
        else:
            self.stats["drops_unknown_ppid"] += 1
            return
        self.stats["messages_in"] += 1
        self.stats["bytes_in"] += len(msg) if isinstance(msg, bytes) else len(data)
        self._events.append(ChannelMessage(sid, msg))

    def _on_dcep(self, now: float, sid: int, data: bytes) -> None:
        if data[:1] == bytes([DATA_CHANNEL_ACK]):
            ch = self._channels.get(sid)
            if ch is not None and ch.local:
                ch.acked = True
            else:
                self.stats["drops_dcep_ack"] += 1
            return
        try:
            req = DataChannelOpen.parse_untrusted(data)
        except SctpError:
            self.stats["drops_dcep_malformed"] += 1
            return
        if sid in self._channels:
            self.stats["drops_dcep_collision"] += 1
            return
        kind = req.channel_type & 0x7F
        ch = _Channel(sid, req.label, req.protocol, not req.channel_type & 0x80,
                      req.reliability if kind == 1 else None,
                      req.reliability if kind == 2 else None, negotiated=False, local=False,
                      priority=req.priority, state=ChannelState.OPEN, acked=True)
        if len(self._channels) >= self.max_channels:
            self.stats["drops_too_many_channels"] += 1
            self._channels[sid] = ch
            ch.state = ChannelState.CLOSING
            self._reset(now, ch)  # refuse: close the stream the peer opened
            return
        self._channels[sid] = ch
        self.association.send(now, sid, PPID_DCEP, bytes([DATA_CHANNEL_ACK]))
        self._events.append(ch.opened_event())

    def _on_reset(self, now: float, ev: StreamsReset) -> None:
        for sid in ev.outgoing:
            ch = self._channels.get(sid)
            if ch is not None:
                ch.out_reset = True
                if ch.in_reset:
                    self._finish(ch)
        for sid in ev.incoming:
            ch = self._channels.get(sid)
            if ch is None:
                continue
            ch.in_reset = True
            if ch.out_reset:
                self._finish(ch)
            elif ch.state is not ChannelState.CLOSING:
                # RFC 8831 §6.7: the peer closed; reset our side too (Chrome waits for it).
                ch.state = ChannelState.CLOSING
                self._reset(now, ch)
