"""Re-seeding a worker's flow table from the transceivers (issue 20, relay failover).

When a relay worker dies, the flows it had learnt die with it. The kernel moves its clients
to the surviving workers at once (the ``SO_REUSEPORT`` group hashes over the sockets still
bound), and a replacement joins the group a moment later and takes some clients back — so
after any restart, workers receive media from client addresses they have no flow for. The
seed design waited for the client's next ICE consent check (RFC 7675: every ~5 s) or asked
Redis; this module asks the transceivers, which know every client they serve, over the
trusted internal leg:

1. the core turns a non-STUN datagram from an unknown client into a *look-up*
   (:meth:`RelayCore._want_lookup`: per-source token bucket, pending cap, negative cache —
   the same path Redis look-ups take; the datagram itself is dropped, counted
   ``redis-pending``);
2. :class:`Lookups` (one task per worker, woken by the hot loop) sends each look-up as a
   QUERY (:mod:`appliance.proto.proxy.vouch`: a PROXY v2 LOCAL header, MAC'd with the
   routing secret, a fresh nonce) to every transceiver of the cluster, and hands the same
   batch to Redis when one is configured and up;
3. the transceiver that serves the client answers VOUCH (same nonce) to the worker's
   internal address; the internal drain hands the LOCAL datagram to
   :meth:`FlowVouching.handle_datagram`, which checks the MAC, that it comes from that
   transceiver's configured address, and that it answers a pending query, then installs
   the flow (:meth:`RelayCore.handle_lookup`, route ``t<id>``).

The datagrams that made the worker ask (and any that arrive while it waits) are held, a
few per client for half a second (:meth:`RelayCore._hold`), and forwarded the moment the
answer installs the flow (:meth:`Lookups.flush_released`), so a moved flow loses nothing;
before issue 32 they were dropped and the client's *next* packet was the first forwarded.
The transceiver learns the new worker's internal address from it and its return traffic
follows. Measured: well under
100 ms from a worker's death to media in both directions (docs/reliability.md).

Trust: a client datagram can only make the relay *ask*; a flow is installed only on an
authentic answer from a configured transceiver that has itself authenticated the client
(an ICE check with the session's password, RFC 8445 §7.3) — never from anything a client
sends. Queries cost at most ``query_rate`` per second per worker (GCRA), on top of the
core's per-source bucket, so a flood of junk from spoofed addresses costs a few small
datagrams per second per transceiver, not one per junk datagram.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import trio

from ..logs import redact
from ..netio.sockets import format_addr
from ..proto.proxy.vouch import Kind, Vouch, VouchError, derive_key, encode, parse_untrusted
from ..proto.ratelimit import Gcra
from .core import Address, Flow, RelayCore

log = logging.getLogger("appliance.relay.server")

#: A query not answered within this long is forgotten (the core's negative cache keeps the
#: client from being asked again for ``negative_ttl``).
QUERY_TTL = 0.5
#: Queries per second per worker (GCRA) and burst: a restart of a worker with 5 000 flows
#: re-learns them within a second; a junk flood is bounded by the same figure.
QUERY_RATE = 5000.0
QUERY_BURST = 5000.0
MAX_PENDING = 8192


class Batch(Protocol):
    """Where else a batch of look-ups goes (the Redis cache)."""

    @property
    def available(self) -> bool: ...

    async def lookup(self, wanted: list[tuple[Address, Address, Address | None]]) -> None: ...


class FlowVouching:
    """Queries out, answers in (no sockets: the shell sends what :meth:`queries` returns)."""

    def __init__(self, core: RelayCore, secret_list: Sequence[bytes], *,
                 query_rate: float = QUERY_RATE, query_burst: float = QUERY_BURST,
                 ttl: float = QUERY_TTL, max_pending: int = MAX_PENDING) -> None:
        self.core = core
        self.keys = [derive_key(s) for s in secret_list]
        self.ttl = ttl
        self.max_pending = max_pending
        self._budget = Gcra(query_rate, query_burst)
        #: client -> (nonce, public, upstream, expires), oldest first
        self.pending: OrderedDict[Address, tuple[bytes, Address, Address | None, float]] = (
            OrderedDict())

    def queries(self, now: float,
                wanted: list[tuple[Address, Address, Address | None]]) -> list[tuple[bytes, Address]]:
        """The QUERY datagrams for these look-ups, one per (client, transceiver)."""
        c = self.core.counters
        out: list[tuple[bytes, Address]] = []
        targets = sorted(self.core.transceivers.items())
        if not targets:
            return out
        self._expire(now)
        key = self.keys[0]
        for client, public, upstream in wanted:
            if not self._budget.allow(now):
                c.drop("vouch-budget")
                continue
            nonce = secrets.token_bytes(8)
            while len(self.pending) >= self.max_pending:
                self.pending.popitem(last=False)
            self.pending[client] = (nonce, public, upstream, now + self.ttl)
            self.pending.move_to_end(client)
            try:
                for ident, addr in targets:
                    out.append((encode(Vouch(Kind.QUERY, client, public, ident, nonce), key),
                                addr))
            except ValueError:  # pragma: no cover - client and public of two families
                continue
        c.vouch_queries += len(out)
        return out

    def _expire(self, now: float) -> None:
        pending = self.pending
        while pending:
            client, entry = next(iter(pending.items()))
            if entry[3] > now:
                break
            del pending[client]

    def handle_datagram(self, now: float, data: bytes | bytearray | memoryview,
                        src: Address) -> Flow | None:
        """A LOCAL datagram from a transceiver's address: install the flow it vouches for."""
        c = self.core.counters
        try:
            msg = parse_untrusted(data, self.keys)
        except VouchError as exc:
            c.drop(f"vouch-{exc.hint}")
            return None
        if msg.kind is not Kind.VOUCH or self.core.transceivers.get(msg.transceiver) != src:
            c.drop("vouch-source")
            return None
        entry = self.pending.get(msg.client)
        if entry is None or entry[0] != msg.nonce or entry[1] != msg.public or entry[3] <= now:
            c.drop("vouch-unexpected")  # late, replayed, or never asked
            return None
        del self.pending[msg.client]
        flow = self.core.handle_lookup(now, msg.client, msg.public, entry[2], f"t{msg.transceiver}")
        if flow is not None:
            c.flows_vouched += 1
            # Per flow, how long its route took to come back (issue 41 item 2: a takeover's
            # timeline is the first datagram's arrival, this, and the echo's return).
            log.debug("flow %s re-seeded by transceiver %d, %.1f ms after it was asked",
                      redact(format_addr(msg.client)), msg.transceiver,
                      1000 * (now - entry[3] + self.ttl))
        return flow


class Lookups:
    """The task that serves the core's look-ups: vouch queries to the transceivers and, when
    configured and reachable, the Redis cache (both at once; the first answer wins, the
    other finds the flow already there)."""

    def __init__(self, core: RelayCore, vouching: FlowVouching | None, isock: socket.socket,
                 cache: Batch | None) -> None:
        self.core = core
        self.vouching = vouching
        self.isock = isock
        self.cache = cache
        #: set by the hot loop when the core has look-ups queued
        self.wanted = trio.Event()

    def flush_released(self) -> None:
        """Send the held datagrams whose flow an answer just installed (core.poll_released),
        framed like any forwarded datagram, before anything else of theirs goes out."""
        if not self.core.released_pending:
            return
        c = self.core.counters
        for flow, data in self.core.poll_released():
            try:
                self.isock.sendto(flow.header + data, flow.dest)
            except OSError:
                c.drop("send-failed")
                continue
            c.packets_out += 1
            c.bytes_out += len(data)

    def handle_local(self, now: float, data: memoryview, src: Address) -> None:
        """The internal drain's LOCAL datagrams: a vouch answer, then what it released."""
        if self.vouching is not None:
            self.vouching.handle_datagram(now, data, src)
        self.flush_released()

    def send(self, out: list[tuple[bytes, Address]]) -> None:
        for data, addr in out:
            try:
                self.isock.sendto(data, addr)
            except OSError:  # a full buffer or an unreachable transceiver: it may retry
                self.core.counters.drop("vouch-send-failed")

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                await self.wanted.wait()
                self.wanted = trio.Event()
                now = trio.current_time()
                wanted = self.core.poll_lookups(now)
                if not wanted:
                    continue
                if self.vouching is not None:
                    self.send(self.vouching.queries(now, wanted))
                if self.cache is not None and self.cache.available:
                    nursery.start_soon(self.cache.lookup, wanted)

