"""Data channels for agents: typed events in, messages out, with back-pressure.

A browser (or any WebRTC peer) pairs its audio with data channels (RFC 8831): transcripts,
typed messages, tool calls, control. An agent sees them beside its audio::

    async def agent(ctx: AgentContext) -> None:
        async for event in ctx.channel_events():
            if isinstance(event, ChannelMessage):
                await ctx.send_message(event.channel_id, f"you said {event.data!r}")

The transceiver owns the SCTP association; this module only knows the **port** it
provides (:class:`ChannelPort`: send, open, close, buffered amount) and keeps the agent's
side bounded:

* **inbound** events wait in a queue of at most ``max_events`` entries and
  ``max_inbound_bytes`` message bytes; an agent that does not read loses the *oldest*
  messages (counted in ``messages_dropped``) — the network loop never blocks on an agent,
  exactly like audio frames. Opened/closed events are never dropped (they are small and
  tell the agent which channels exist).
* **outbound**, :meth:`ChannelHub.send` hands the message to the port at once (the SCTP
  layer queues and paces it) and then waits while the channel's buffered amount is above
  ``high_water`` — the ``bufferedAmount`` / ``bufferedamountlow`` pattern of the browser
  API, so a fast producer is paced by the peer's acknowledgements, and memory is bounded
  by ``high_water`` plus one message per channel.

Everything here is trio-aware but does no I/O: the transceiver calls :meth:`ChannelHub.push`
and :meth:`ChannelHub.buffered_low` from its network loop; agents call the async methods
through :class:`~appliance.agents.context.AgentContext`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

import trio

#: The largest message either side may send (DESIGN.md: a=max-message-size:262144).
MAX_MESSAGE_BYTES = 262_144


class ChannelError(Exception):
    """A channel operation cannot be done: no such channel, closed, too large, no port."""


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """One data channel, as RFC 8831/8832 describe it."""

    id: int  # the SCTP stream id
    label: str
    protocol: str = ""
    ordered: bool = True
    max_retransmits: int | None = None  # partially reliable by count (RFC 3758)
    max_packet_lifetime_ms: int | None = None  # partially reliable by time
    negotiated: bool = False  # pre-negotiated (same id on both sides, no DCEP)

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "label": self.label,
            "protocol": self.protocol,
            "ordered": self.ordered,
            "max_retransmits": self.max_retransmits,
            "max_packet_lifetime": self.max_packet_lifetime_ms,
            "negotiated": self.negotiated,
        }


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """A channel is open (opened by the peer, by us, or pre-negotiated)."""

    channel: ChannelInfo


@dataclass(frozen=True, slots=True)
class ChannelMessage:
    """One whole message: ``str`` for a text message, ``bytes`` for binary (either may be
    empty: RFC 8831 §6.6's empty-message PPIDs are mapped back to empty values)."""

    channel_id: int
    label: str
    data: str | bytes


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is closed (either side reset its stream, or the call ended)."""

    channel_id: int
    label: str


ChannelEvent = ChannelOpened | ChannelMessage | ChannelClosed


class ChannelPort(Protocol):
    """What the transceiver's data-channel endpoint offers the agent side."""

    def send(self, channel_id: int, data: str | bytes) -> None:
        """Queue one message; raises :class:`ChannelError` if the channel cannot take it."""

    def open(
        self,
        label: str,
        *,
        protocol: str,
        ordered: bool,
        max_retransmits: int | None,
        max_packet_lifetime_ms: int | None,
        negotiated_id: int | None,
    ) -> ChannelInfo:
        """Open a channel (DCEP, or pre-negotiated with ``negotiated_id``)."""

    def close(self, channel_id: int) -> None:
        """Close a channel (an outgoing stream reset, RFC 8831 §6.7)."""

    def buffered_amount(self, channel_id: int) -> int:
        """Bytes queued on the channel and not yet acknowledged by the peer."""


def message_size(data: str | bytes) -> int:
    return len(data.encode()) if isinstance(data, str) else len(data)


class ChannelHub:
    """The agent's view of a call's data channels (one per session, owned by AgentHost)."""

    def __init__(
        self,
        *,
        max_events: int = 1024,
        max_inbound_bytes: int = 4 * MAX_MESSAGE_BYTES,
        high_water: int = 1 << 20,
    ) -> None:
        self.port: ChannelPort | None = None  # set by the transceiver once SCTP is up
        self.channels: dict[int, ChannelInfo] = {}
        self.max_events = max_events
        self.max_inbound_bytes = max_inbound_bytes
        self.high_water = high_water
        self._events: deque[ChannelEvent] = deque()
        self._inbound_bytes = 0
        self._events_lot = trio.lowlevel.ParkingLot()
        self._room_lot = trio.lowlevel.ParkingLot()
        self.closed = False
        # Counters (session detail, /metrics).
        self.messages_in = 0
        self.bytes_in = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.messages_dropped = 0

    # -- transceiver side (never blocks) ---------------------------------------------------

    def note(self, event: ChannelEvent) -> None:
        """Account for an event from the network (open channels, counters) without queueing
        it: for a synchronous channel handler that takes the event at once."""
        if isinstance(event, ChannelOpened):
            self.channels[event.channel.id] = event.channel
        elif isinstance(event, ChannelClosed):
            self.channels.pop(event.channel_id, None)
            self._room_lot.unpark_all()  # a sender waiting on it must learn it is gone
        else:
            self.messages_in += 1
            self.bytes_in += message_size(event.data)

    def push(self, event: ChannelEvent) -> None:
        """An event from the network, queued for the agent. Messages past the bounds push
        out the oldest queued message (opened/closed events are never dropped)."""
        self.note(event)
        if isinstance(event, ChannelMessage):
            self._inbound_bytes += message_size(event.data)
            while (
                self._inbound_bytes > self.max_inbound_bytes or len(self._events) >= self.max_events
            ) and self._drop_oldest_message():
                pass
        self._events.append(event)
        if self._events_lot:
            self._events_lot.unpark_all()

    def _drop_oldest_message(self) -> bool:
        for i, pending in enumerate(self._events):
            if isinstance(pending, ChannelMessage):
                del self._events[i]
                self._inbound_bytes -= message_size(pending.data)
                self.messages_dropped += 1
                return True
        return False

    def buffered_low(self, channel_id: int | None = None) -> None:
        """The port's buffered amount fell (the peer acknowledged data): wake senders."""
        if self._room_lot:
            self._room_lot.unpark_all()

    def close(self) -> None:
        """The call is over: iterators finish after what is queued, sends raise."""
        if self.closed:
            return
        self.closed = True
        self.port = None
        self._events_lot.unpark_all()
        self._room_lot.unpark_all()

    # -- agent side --------------------------------------------------------------------------

    async def events(self) -> AsyncGenerator[ChannelEvent, None]:
        while True:
            if self._events:
                event = self._events.popleft()
                if isinstance(event, ChannelMessage):
                    self._inbound_bytes -= message_size(event.data)
                yield event
                continue
            if self.closed:
                return
            await self._events_lot.park()

    def resolve(self, channel: int | str) -> ChannelInfo:
        """A channel by id or by label (the first open one with that label)."""
        if isinstance(channel, int):
            info = self.channels.get(channel)
        else:
            info = next((c for c in self.channels.values() if c.label == channel), None)
        if info is None:
            raise ChannelError(f"no open data channel {channel!r}")
        return info

    def _port(self) -> ChannelPort:
        if self.closed:
            raise ChannelError("the call has ended")
        if self.port is None:
            raise ChannelError("the call has no data channels (none negotiated, or not yet up)")
        return self.port

    def send_nowait(self, channel: int | str, data: str | bytes) -> None:
        """Queue a message now, whatever the buffered amount (for synchronous handlers)."""
        if not isinstance(data, str | bytes):
            raise TypeError("a channel message is str (text) or bytes (binary)")
        size = message_size(data)
        if size > MAX_MESSAGE_BYTES:
            raise ChannelError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
        port = self._port()
        info = self.resolve(channel)
        port.send(info.id, data)
        self.messages_out += 1
        self.bytes_out += size

    async def send(self, channel: int | str, data: str | bytes) -> None:
        """Queue a message, then wait while the channel holds more than ``high_water``."""
        await trio.lowlevel.checkpoint()
        info = self.resolve(channel)
        self.send_nowait(info.id, data)
        while info.id in self.channels and self._port().buffered_amount(info.id) > self.high_water:
            await self._room_lot.park()

    def open(
        self,
        label: str,
        *,
        protocol: str = "",
        ordered: bool = True,
        max_retransmits: int | None = None,
        max_packet_lifetime_ms: int | None = None,
        negotiated_id: int | None = None,
    ) -> ChannelInfo:
        if max_retransmits is not None and max_packet_lifetime_ms is not None:
            raise ChannelError("max_retransmits and max_packet_lifetime_ms are exclusive")
        info = self._port().open(
            label,
            protocol=protocol,
            ordered=ordered,
            max_retransmits=max_retransmits,
            max_packet_lifetime_ms=max_packet_lifetime_ms,
            negotiated_id=negotiated_id,
        )
        self.channels[info.id] = info
        return info

    def close_channel(self, channel: int | str) -> None:
        info = self.resolve(channel)
        self._port().close(info.id)

    def buffered_amount(self, channel: int | str) -> int:
        info = self.resolve(channel)
        return self.port.buffered_amount(info.id) if self.port is not None else 0

    def stats(self) -> dict[str, object]:
        return {
            "open": [c.to_json() for c in sorted(self.channels.values(), key=lambda c: c.id)],
            "messages_in": self.messages_in,
            "bytes_in": self.bytes_in,
            "messages_out": self.messages_out,
            "bytes_out": self.bytes_out,
            "messages_dropped": self.messages_dropped,
        }
