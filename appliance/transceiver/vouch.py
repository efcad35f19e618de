"""The transceiver's half of flow vouching (issue 20; the relay's half is relay/reseed.py).

A relay worker that receives media from a client address it has no flow for asks every
transceiver of its cluster "is this client yours?" (a PROXY v2 LOCAL datagram with a vouch
TLV, MAC'd with the routing secret: :mod:`appliance.proto.proxy.vouch`). We answer only
for a client address one of our live sessions has authenticated — an ICE check that proved
the session's password (RFC 8445 §7.3) put it in ``by_client`` — and whose public relay
address is the one the relay names; anyone else (a wrong MAC, an unknown client) gets
silence, which the relay treats as "no".

The query also tells us that this client's datagrams now reach the relay at the query's
source (the worker that had the flow died, or the ``SO_REUSEPORT`` hash moved the client),
so the flow's return traffic is pointed there at once instead of at the client's next
packet (DESIGN.md: "the transceiver replies to the internal address the flow's last packet
came from" — the query is that relay's first word about the flow). And what we sent the
old worker since we last heard from it is sent again through the new one first
(:meth:`~.call.Flow.move`, issue 41 item 2): a worker that had to ask lost the flow, and
may have lost those datagrams with it — the echo of the client's last packets before a
``kill -9``, sent into a dead socket, were the holes that made aiortc callers go silent for
~320 ms. (Also when the query comes from the address we were sending to: a relay restarted
on a fixed internal port asks from the same address and has lost the same way.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from appliance.proto.proxy.vouch import Kind, Vouch, VouchError, derive_key, encode, parse_untrusted

from ..logs import redact
from .call import Addr

log = logging.getLogger(__name__)


class _Flow(Protocol):
    public: Addr
    relay: Addr
    header: bytes

    def move(self, relay: Addr) -> list[bytes]: ...


class _Call(Protocol):
    @property
    def flows(self) -> Mapping[Addr, _Flow]: ...


class _Session(Protocol):
    @property
    def call(self) -> _Call: ...


class VouchResponder:
    """Answers relay queries for the clients of ``by_client``."""

    def __init__(self, transceiver: int, secrets: Sequence[bytes],
                 by_client: Mapping[Addr, _Session], send: Callable[[bytes, Addr], None],
                 counters: dict[str, int],
                 other: Callable[[Addr, Addr, Addr], bool] | None = None) -> None:
        self.transceiver = transceiver
        #: asked for a client ``by_client`` does not hold: a phone call's trunk address
        #: (phone_session.py; the ADR's restricted-latch rule), ``(client, public, relay)``
        self.other = other
        self.keys = [derive_key(s) for s in secrets]
        self.by_client = by_client
        self.send = send
        self.counters = counters
        # queries = answers + refused (a client that is not ours, or not at that public
        # address: a phone call's latch refusing a stray port shows here)
        for name in ("vouch_queries", "vouch_answers", "vouch_refused", "drop_vouch",
                     "vouch_resent"):
            counters.setdefault(name, 0)

    def handle_datagram(self, data: bytes | bytearray | memoryview, relay: Addr) -> None:
        c = self.counters
        try:
            msg = parse_untrusted(data, self.keys)
        except VouchError:
            c["drop_vouch"] += 1
            return
        if msg.kind is not Kind.QUERY or msg.transceiver != self.transceiver:
            c["drop_vouch"] += 1
            return
        c["vouch_queries"] += 1
        session = self.by_client.get(msg.client)
        if session is None:
            if self.other is None or not self.other(msg.client, msg.public, relay):
                c["vouch_refused"] += 1
                return  # not ours: silence
            self._answer(msg, relay)
            return
        flow = session.call.flows.get(msg.client)
        if flow is None or flow.public != msg.public:
            c["vouch_refused"] += 1
            return
        # Its datagrams reach that worker now, and what may have been lost is sent again
        # through it, oldest first (module docstring).
        again = flow.move(relay)
        for payload in again:
            self.send(flow.header + payload, relay)
        self.counters["vouch_resent"] += len(again)
        if again:
            log.debug("flow %s moved to relay %s: %d datagram(s) sent again",
                      redact(msg.client), relay, len(again))
        self._answer(msg, relay)

    def _answer(self, msg: Vouch, relay: Addr) -> None:
        self.counters["vouch_answers"] += 1
        self.send(encode(Vouch(Kind.VOUCH, msg.client, msg.public, self.transceiver,
                               msg.nonce), self.keys[0]), relay)
