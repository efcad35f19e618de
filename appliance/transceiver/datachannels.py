"""A call's data channels: the SCTP endpoint in the call's ``sctp`` slot, joined to the
agent's :class:`~appliance.agents.channels.ChannelHub` (STYLE.md rule 8: the protocol core
does not know agents, agents do not know SCTP; they meet here).

The endpoint sits in the call's ``sctp`` slot; :class:`CallChannels` holds no reference
to the call (the slot's contract: the call polls the endpoint, the endpoint never calls
back).

* **Network → agent:** the endpoint's events, passed out unwrapped by
  :meth:`~appliance.transceiver.call.ServerCall.poll_output`, become the agent's typed
  channel events (:meth:`CallChannels.on_event`); a synchronous channel handler (the
  built-in ``echo``) is called from the session's drain instead of queueing, like its frame
  handler, and what it sends is taken by that same drain.
* **Agent → network:** :class:`CallChannels` is the hub's
  :class:`~appliance.agents.channels.ChannelPort`: ``send``/``open``/``close`` go to the
  endpoint at the shell's current time; for an agent task, ``flush`` (the session's drain)
  then takes them out through the call.
  Each channel's buffered-amount-low threshold is the hub's high-water mark, so a sender
  waiting for room is woken when the peer's acknowledgements bring it under.

The transceiver's DTLS role picks its stream-id parity (RFC 8832 §6; the client by default,
docs/adr-dtls-active.md: even ids); the call starts the association itself once DTLS is up
(RFC 8261 §5: either side may send the INIT; both doing so is resolved by the association,
RFC 9260 §5.2.1) and marks ``SCTP_STEPS`` in its timeline.
"""

from __future__ import annotations

from collections.abc import Callable

from appliance.agents import AgentContext
from appliance.agents.channels import (
    ChannelClosed,
    ChannelError,
    ChannelEvent,
    ChannelHub,
    ChannelInfo,
    ChannelMessage,
    ChannelOpened,
    message_size,
)
from appliance.agents.registry import ChannelFn
from appliance.proto.sctp import Closed, Connected, SctpUsageError
from appliance.proto.sctp import datachannel as dc
from appliance.proto.sdp import MAX_MESSAGE_SIZE, ApplicationPlan

from .call import SCTP_STEPS

__all__ = ["DTLS_RECORD_OVERHEAD", "SCTP_STEPS", "CallChannels"]

#: The most a DTLS record adds to its payload with our cipher suites: DTLS 1.2 AES-GCM's
#: 13-byte header + 8-byte explicit nonce + 16-byte tag (RFC 6347 §4.1, RFC 5288 §3);
#: ChaCha20-Poly1305 and DTLS 1.3 records add less. An SCTP packet must fit one record
#: (RFC 8261 §5: no fragmentation below SCTP), and the association exists before the
#: handshake picks the suite, so it is sized for the largest overhead.
DTLS_RECORD_OVERHEAD = 37



class CallChannels:
    """The data channels of one call (one SCTP association over its DTLS)."""

    def __init__(
        self,
        plan: ApplicationPlan,
        hub: ChannelHub,
        ctx: AgentContext,
        *,
        dtls_client: bool,
        mtu: int,
        clock: Callable[[], float],
        flush: Callable[[], None] | None,
        on_channel: ChannelFn | None = None,
    ) -> None:
        """``dtls_client``/``mtu``: the call's DTLS role and record MTU. ``flush`` (None
        when every operation comes from inside the session's drain) sends what an
        operation queued."""
        self.endpoint = dc.DataChannelEndpoint(
            dtls_client=dtls_client, remote_port=plan.sctp_port,
            max_message_size=MAX_MESSAGE_SIZE, mtu=mtu - DTLS_RECORD_OVERHEAD)
        self._plan = plan
        self._hub = hub
        self._ctx = ctx
        self._clock = clock
        self._flush = flush
        self._on_channel = on_channel
        self._labels: dict[int, str] = {}
        self.connected = False
        self.closed_reason: str | None = None
        # The agent may open channels at once: the endpoint holds them until our INIT is
        # out (pre-negotiated ones; their messages ride with our COOKIE ECHO) or the
        # association is up (DCEP ones).
        hub.port = self

    # -- lifecycle -------------------------------------------------------------------------

    def _after(self) -> None:
        if self._flush is not None:
            self._flush()

    # -- network → agent ---------------------------------------------------------------------

    def on_event(self, ev: object) -> None:
        """One event of the endpoint (passed out by the call's ``poll_output``)."""
        if isinstance(ev, dc.ChannelOpened):
            self._labels[ev.channel_id] = ev.label
            self.endpoint.set_buffered_amount_low_threshold(ev.channel_id, self._hub.high_water)
            info = ChannelInfo(ev.channel_id, ev.label, ev.protocol, ev.ordered,
                               ev.max_retransmits, ev.max_packet_lifetime, ev.negotiated)
            self._deliver(ChannelOpened(info))
        elif isinstance(ev, dc.ChannelMessage):
            self._deliver(ChannelMessage(ev.channel_id, self._labels.get(ev.channel_id, ""),
                                         ev.data))
        elif isinstance(ev, dc.ChannelClosed):
            self._deliver(ChannelClosed(ev.channel_id, self._labels.pop(ev.channel_id, "")))
        elif isinstance(ev, dc.ChannelBufferedAmountLow):
            self._hub.buffered_low(ev.channel_id)
        elif isinstance(ev, Connected):
            self.connected = True
        elif isinstance(ev, Closed):
            self.connected = False
            self.closed_reason = f"{ev.cause.value}: {ev.reason}" if ev.reason else ev.cause.value
            self._hub.port = None
            self._hub.buffered_low()

    def _deliver(self, event: ChannelEvent) -> None:
        handler = self._on_channel
        if handler is None:
            self._hub.push(event)
            return
        self._hub.note(event)  # state and counters, no queue: the handler takes it now
        handler(self._ctx, event)

    # -- agent → network (ChannelPort) -----------------------------------------------------------

    def send(self, channel_id: int, data: str | bytes) -> None:
        size = message_size(data)
        if not self._plan.can_send(size):
            raise ChannelError(
                f"message of {size} bytes exceeds the caller's a=max-message-size "
                f"({self._plan.max_message_size})")
        try:
            self.endpoint.send(self._clock(), channel_id, data)
        except SctpUsageError as exc:
            raise ChannelError(str(exc)) from None
        self._after()

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
        try:
            cid = self.endpoint.open_channel(
                self._clock(), label, protocol=protocol, ordered=ordered,
                max_retransmits=max_retransmits, max_packet_lifetime=max_packet_lifetime_ms,
                negotiated=negotiated_id is not None, id=negotiated_id)
        except SctpUsageError as exc:
            raise ChannelError(str(exc)) from None
        self._labels[cid] = label
        self.endpoint.set_buffered_amount_low_threshold(cid, self._hub.high_water)
        self._after()
        return ChannelInfo(cid, label, protocol, ordered, max_retransmits,
                           max_packet_lifetime_ms, negotiated_id is not None)

    def close(self, channel_id: int) -> None:
        self.endpoint.close_channel(self._clock(), channel_id)
        self._after()

    def buffered_amount(self, channel_id: int) -> int:
        return self.endpoint.buffered_amount(channel_id)

    # -- session detail ----------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        out = self._hub.stats()
        out["sctp"] = "connected" if self.connected else (self.closed_reason or "connecting")
        return out
