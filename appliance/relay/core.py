"""The relay's decisions, without sockets: flow table, first-packet routing, rate limits.

This is the sans-IO half of the relay (STYLE.md rule 1 in spirit: no trio, no sockets, no
clock — ``now`` is always passed in). The trio shell (:mod:`appliance.relay.server`) owns the
sockets; its one hot loop (:mod:`appliance.relay.fastpath`) decides nothing of its own: it
applies two tables defined here — :data:`FAST_FIRST` (a known flow's datagram with this
first byte, from the flow's own hop, is forwarded without a call into the core) and
:attr:`RelayCore.no_flow_first` (an unknown flow's datagram with this first byte is dropped
``no-flow`` without one) — and hands every other datagram to
:meth:`RelayCore.handle_datagram`, which returns what to do with it:

* a :class:`Flow` — forward the datagram to ``flow.dest``, framed with ``flow.header``
  (whose PROXY v2 transport is the flow's :class:`~.transport.Transport`);
* ``bytes`` — answer the sender with these bytes (a server-reflexive STUN response only);
* ``None`` — drop it (already counted under a reason in ``counters.drops``).

Routing of a first packet (DESIGN.md "Relay behaviour", "Server ufrag")::

    datagram from an unknown client ip:port
      ├─ first byte not STUN (RFC 7983) ─────────────── drop "no-flow" (or look it up:
      │                                                  the transceivers vouch, reseed.py;
      │                                                  Redis)
      ├─ not a well-formed Binding request ──────────── drop "stun-malformed"
      ├─ no USERNAME ─────────────────────────────────── answer: reflexive response
      ├─ server ufrag (before ':') does not verify ──── drop "ufrag-<malformed|version|bad-mac>"
      ├─ cluster == own, transceiver K configured ───── new flow -> transceiver K
      ├─ cluster == own, K not resolved yet (pattern) ─ drop "transceiver-resolving", ask the
      │                                                  shell to resolve K (the client's
      │                                                  next check finds it)
      ├─ cluster == other, next hop configured ──────── new flow -> next-hop relay
      └─ otherwise ───────────────────────────────────── drop "unknown-cluster|transceiver"

Transceiver addresses can change under a running relay (``resolve_transceivers``: a pod
restarted with a new IP behind ``transceiver-{id}.…`` DNS names). The shell resolves names
off the hot path and calls :meth:`RelayCore.set_transceiver`, which also re-points the flows
already going to that transceiver. Only MAC-verified server ufrags can ask for a resolution,
and pending resolutions are capped, so junk cannot make the relay query DNS.

A STUN Binding request on a *known* flow whose server ufrag differs from the flow's re-routes
the flow if it verifies (ICE restart, or a NAT that reused the port for a new session).

STUN budget per server ufrag (issue 9, the ICE password-guessing storm). A flow is
*established* once its transceiver has answered it with a Binding success response or with
any non-STUN datagram (the shell reports return traffic of unanswered flows through
:meth:`RelayCore.note_answer`) — i.e. once the client has proved it knows the session's ICE
password. STUN from an established flow with its own ufrag is never budgeted (consent
checks, media keep-alives). Every other Binding request carrying a verified server ufrag —
a new flow, a flow the transceiver has not answered yet, an ICE restart on a flow — spends
one unit of a GCRA budget kept *per server ufrag* (``stun_budget_rate``/s, burst
``stun_budget_burst``); over budget it is dropped and counted ``stun-budget``, so a storm of
wrong passwords against one session, from any number of source addresses, reaches the
transceiver at that rate whatever the storm's. A ufrag only enters the table after its MAC
verified, so an over-budget guess is dropped with a dict look-up, before the MAC check; the
table is bounded (cleared when full: only ever more lenient) and swept of entries that have
refilled. Ahead of it, STUN from *unknown* client addresses (any ufrag) spends a
worker-wide GCRA budget (``unknown_stun_rate``) before it is parsed: past it, a spoofed
flood of first packets is dropped as ``stun-overload`` for the price of a comparison
instead of a USERNAME parse and a MAC check (3-6 µs), so it cannot outrun the worker and
overflow its socket with live calls' packets in it. Trade-offs: a *new* address of the
attacked session (a client changing IP during the storm) competes with the storm for the
per-ufrag budget, as it does for the ICE agent's own 20/s, and a new call competes with a
spoofed flood for the worker-wide one (docs/reliability.md); established flows never do.

DTLS handshake records (content type 22) of a known flow leave the shell's fast path
(``SLOW_FIRST``) and spend a per-flow GCRA budget (``dtls_budget_rate``, burst
``dtls_budget_burst``; a handshake is ~5-10 records): over it they are dropped as
``dtls-budget``. That bounds a ClientHello flood from addresses an attacker authenticated
for sessions of its own (the transceiver's cookie exchange, ``transceiver/admission.py``,
handles the rest).

TURN (issue 40, :mod:`.turn`): with a :class:`~.turn.TurnGate` attached
(:meth:`RelayCore.attach_turn`), a datagram from a client's own address that is ChannelData
(first byte 0x40-0x7F) or a TURN client's STUN message (Allocate, Refresh, CreatePermission,
ChannelBind, Send: the first two bytes, :mod:`appliance.proto.turn.demux`) goes to the gate
before anything else — also from an address that has an ICE flow of its own (browsers share
one socket between their host candidate and their TURN allocation). What the gate relays to
the appliance's own media address comes back here as a datagram from the allocation's
*relayed address* through the hop :data:`TURN_HOP` — routed exactly like a direct client's
(first packet a verified Binding request, then the flow table, every budget) and forwarded
without leaving the host; the answer is a :class:`Relayed` (the payload's place inside the
TURN datagram). Return traffic of such a flow goes back through the gate (fastpath.py), which
wraps it for the TURN client. Flows through ``TURN_HOP`` skip the per-source new-flow bucket
(their source IP is the relay's own; the TURN server's quotas bound them) and are never
written to Redis; after a worker restart the allocation is re-created from the flow cache
(turn.py) and its flow is re-learnt by asking the transceivers (reseed.py), like a direct
client's.

Every rate limit here is one of :mod:`appliance.proto.ratelimit` (GCRA budgets, token buckets).

Bounded memory under any input: the flow table has a hard cap (``max_flows``); creating a flow
at the cap evicts the least recently used one (the table is an ``OrderedDict`` kept in LRU
order, so the stalest flow is always first and idle expiry pops from the front in O(expired)).
New flows, reflexive answers and Redis look-ups each cost a token from a per-source-IP token
bucket; the bucket table is itself LRU-capped. Pending Redis look-ups and the negative cache
are capped too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..proto.mux import Kind, first_byte_kind
from ..proto.proxy import TLV_RELAY_ID, StreamAddr, encode_tlv
from ..proto.ratelimit import NEVER, Gcra, GcraRule, GcraTable, TokenBuckets
from ..proto.stun import MAX_AMPLIFICATION, StunError, peek_username_untrusted, reflexive_response
from ..proto.turn.demux import TURN_FIRST, TURN_TYPE
from ..proto.ufrag import UfragCodec, UfragError
from .counters import COUNTER_NAMES, Counters
from .transport import Address, ReturnSink, Transport, encode_flow_header

__all__ = [
    "COUNTER_NAMES", "FAST_FIRST", "IS_STUN", "SLOW_FIRST", "TURN_HOP", "Address", "CoreConfig",
    "Counters", "Flow", "RelayCore", "Relayed", "Route", "TokenBuckets", "Transport",
]

#: ``IS_STUN[b]`` is true when a datagram starting with byte ``b`` is STUN (RFC 7983 §7),
#: derived from the pure first-byte demultiplexer so the hot path can index a ``bytes``.
IS_STUN = bytes(1 if first_byte_kind(b) is Kind.STUN else 0 for b in range(256))

#: ``SLOW_FIRST[b]``: a datagram of a known flow starting with byte ``b`` goes through
#: :meth:`RelayCore.handle_datagram` rather than the shell's fast path: STUN, and DTLS
#: handshake records (content type 22, RFC 6347 §4.1), which spend the flow's handshake
#: budget (``dtls-budget``). A call sends a handful of those; a ClientHello flood from a flow
#: the attacker authenticated for a session of its own is thousands a second.
#: ChannelData (0x40-0x7F, TURN) is slow too: it is the TURN gate's, even from an address
#: with an ICE flow (without TURN the core drops it).
SLOW_FIRST = bytes(1 if IS_STUN[b] or b == 22 or TURN_FIRST[b] else 0 for b in range(256))
#: ``FAST_FIRST[b]``: the complement — a known flow's datagram from the flow's own hop
#: starting with ``b`` is forwarded to ``flow.dest`` by the shell without a call into the
#: core (exactly what :meth:`RelayCore.handle_datagram` would decide, minus the call: it
#: returns the flow and touches it). tests/relay/test_fastpath.py checks the agreement.
FAST_FIRST = bytes(1 - x for x in SLOW_FIRST)

#: The hop of flows whose client is a TURN allocation's relayed address (module docstring):
#: their datagrams come from the TURN gate, their return traffic goes back through it.
TURN_HOP: Address = ("turn", 0)


class Relayed:
    """:meth:`RelayCore.handle_datagram`'s answer for TURN data to our own media address:
    forward ``length`` bytes at ``offset`` of the datagram (the ChannelData payload, the
    Send indication's DATA) to ``flow.dest`` with ``flow.header``."""

    __slots__ = ("flow", "length", "offset")

    def __init__(self, flow: Flow, offset: int, length: int) -> None:
        self.flow = flow
        self.offset = offset
        self.length = length


class TurnHandler(Protocol):
    """What the core needs of the TURN gate (relay/turn.py)."""

    def handle(self, now: float, client: Address, data: bytes | bytearray | memoryview,
               public: Address, transport: Transport) -> Flow | bytes | Relayed | None: ...

    def back(self, now: float, flow: Flow, buf: memoryview, q: int, size: int) -> None: ...

    def has_allocation(self, client: Address, public: Address) -> bool: ...

    def closed(self, now: float, client: Address, public: Address) -> None: ...

    def keep(self, client: Address, public: Address) -> bytes | None: ...

    def adopt_stream(self, now: float, record: bytes, client: Address) -> bool: ...


@dataclass(frozen=True, slots=True)
class Route:
    """Where a flow goes: a transceiver of this cluster or the relay of another cluster."""

    kind: str  # "t" (transceiver) or "c" (next-hop cluster)
    ident: int

    def __str__(self) -> str:
        return f"{self.kind}{self.ident}"

    @classmethod
    def parse(cls, text: str) -> Route | None:
        """Inverse of ``str()`` (for values read back from Redis); None if not a route."""
        if len(text) < 2 or text[0] not in "tc" or not text[1:].isdigit():
            return None
        return cls(text[0], int(text[1:]))


class Flow:
    """One client ip:port: where its datagrams go and how they are framed.

    Mutable on purpose (``last_seen`` changes per packet); slotted so the hot path's
    attribute store is cheap. There are no per-flow packet/byte counters: nothing reads them,
    and two attribute updates per datagram and direction are measurable on the hot path
    (docs/performance.md "Relay"); the relay-wide counters are in :class:`Counters`.
    """

    __slots__ = (
        "answered",
        "client",
        "hs_tat",
        "created",
        "dest",
        "header",
        "last_seen",
        "public",
        "route",
        "sink",
        "transport",
        "ufrag",
        "upstream",
        "written",
    )

    def __init__(
        self,
        client: Address,
        route: Route,
        dest: Address,
        header: bytes,
        public: Address,
        upstream: Address | None,
        ufrag: bytes,
        now: float,
        transport: Transport = Transport.UDP,
        sink: ReturnSink | None = None,
    ) -> None:
        self.client = client
        self.route = route
        #: next hop: a transceiver's or a relay's internal address
        self.dest = dest
        #: PROXY v2 header (source = client, destination = public, relay-id TLV; its
        #: transport nibble is ``transport``'s)
        self.header = header
        self.public = public
        #: how the client reaches us (UDP now; TCP for ICE-TCP, transport.py)
        self.transport = transport
        #: where its return traffic goes when it does not go back to an upstream relay:
        #: the public socket (or, for TCP, the connection) it arrived on; None when the
        #: shell registered no sink for (transport, public) — a core driven by tests
        self.sink = sink
        #: the upstream relay's internal address when the flow reached us through a relay:
        #: return traffic goes back there (framed) instead of out of our public socket
        self.upstream = upstream
        #: server ufrag of the last verified STUN request (b"" for a flow recovered from Redis)
        self.ufrag = ufrag
        self.created = now
        self.last_seen = now
        self.written = -1e300  # when the flow was last written to Redis
        #: the transceiver has answered this flow (a Binding success or non-STUN return
        #: traffic): its STUN with its own ufrag is no longer budgeted (stun-budget)
        self.answered = False
        #: GCRA theoretical arrival time of the flow's DTLS handshake records (dtls-budget;
        #: a slot on the flow, with the rule in RelayCore, rather than a budget object each)
        self.hs_tat = NEVER


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """What the routing core needs to know (addresses already resolved to IP literals)."""

    secrets: tuple[bytes, ...]
    cluster: int = 0
    transceivers: Mapping[int, Address] = field(default_factory=dict)
    next_hops: Mapping[int, Address] = field(default_factory=dict)
    relay_id: str = "relay"
    flow_timeout: float = 30.0
    max_flows: int = 100_000
    new_flow_rate: float = 20.0
    new_flow_burst: float = 40.0
    max_sources: int = 65_536
    redis: bool = False
    #: ask the transceivers about unknown clients' media (relay/reseed.py, issue 20)
    vouch: bool = False
    max_pending_lookups: int = 4096
    negative_ttl: float = 1.0
    #: media of a client whose look-up is pending is held (issue 32: the first packet of a
    #: moved flow was dropped) for this long, at most this many datagrams per client
    held_ttl: float = 0.5
    max_held_per_client: int = 4
    #: transceiver ids missing from ``transceivers`` may be resolved on demand (a pattern)
    resolve_transceivers: bool = False
    #: ids from this one up are never resolved (``--transceivers N``)
    resolve_limit: int = 0x10000
    max_pending_resolutions: int = 64
    #: a transceiver id that did not resolve is not asked for again before this many seconds
    unresolved_ttl: float = 2.0
    #: STUN from flows their transceiver has not answered, per server ufrag (GCRA)
    stun_budget_rate: float = 20.0
    stun_budget_burst: float = 40.0
    max_budget_ufrags: int = 65_536
    #: STUN from unknown client addresses (any ufrag), per worker (GCRA): above this rate a
    #: flood of spoofed first packets is dropped before it is parsed (stun-overload)
    unknown_stun_rate: float = 20_000.0
    unknown_stun_burst: float = 5_000.0
    #: DTLS handshake records (content type 22) per flow (GCRA): a handshake is ~5-10
    dtls_budget_rate: float = 5.0
    dtls_budget_burst: float = 20.0


class RelayCore:
    """Flow table + first-packet routing. See the module docstring for the decisions."""

    def __init__(self, config: CoreConfig) -> None:
        if config.max_flows < 1:
            raise ValueError("max_flows must be >= 1")
        if config.flow_timeout <= 0:
            raise ValueError("flow_timeout must be > 0")
        if min(config.stun_budget_rate, config.dtls_budget_rate, config.unknown_stun_rate) <= 0 or min(
            config.stun_budget_burst, config.dtls_budget_burst, config.unknown_stun_burst
        ) < 1:
            raise ValueError("budget rates must be > 0 and bursts >= 1")
        self.config = config
        self.codec = UfragCodec(list(config.secrets))
        self.counters = Counters()
        #: transceiver id -> internal address (grows and changes with resolve_transceivers)
        self.transceivers: dict[int, Address] = dict(config.transceivers)
        #: transceiver ids to resolve, and ids recently asked: id -> time before which we
        #: do not ask again
        self._resolve: set[int] = set()
        self._resolve_asked: dict[int, float] = {}
        #: flows recovered from Redis that wait for their transceiver's address:
        #: id -> client -> (public, upstream); installed by set_transceiver
        self._parked: dict[int, dict[Address, tuple[Address, Address | None]]] = {}
        self._parked_count = 0
        #: client ip:port -> Flow, least recently used first
        self.flows: OrderedDict[Address, Flow] = OrderedDict()
        self.buckets: TokenBuckets[str] = TokenBuckets(
            config.new_flow_rate, config.new_flow_burst, max(config.max_sources, 1)
        )
        self._tlv = encode_tlv(TLV_RELAY_ID, config.relay_id.encode()[:64])
        #: flows to write to Redis (created, re-routed or due for a TTL refresh)
        self._dirty: dict[Address, Flow] = {}
        #: Redis look-ups wanted: client -> (public, upstream)
        self._lookups: dict[Address, tuple[Address, Address | None]] = {}
        #: look-ups in flight or recently missed: client -> time before which we do not ask
        self._asked: OrderedDict[Address, float] = OrderedDict()
        #: datagrams of clients being looked up: client -> (expiry, datagrams), oldest first;
        #: forwarded when the look-up installs the flow (:meth:`poll_released`)
        self._held: OrderedDict[Address, tuple[float, list[bytes]]] = OrderedDict()
        self._released: list[tuple[Flow, bytes]] = []
        #: STUN budget per verified server ufrag (GCRA; see the module docstring)
        self.stun_budget: GcraTable[bytes] = GcraTable(
            config.stun_budget_rate, config.stun_budget_burst, config.max_budget_ufrags
        )
        #: STUN from unknown client addresses, worker-wide (stun-overload)
        self._unknown_stun = Gcra(config.unknown_stun_rate, config.unknown_stun_burst)
        #: DTLS handshake records per flow; each flow keeps its TAT in ``Flow.hs_tat``
        self._handshake = GcraRule.of(config.dtls_budget_rate, config.dtls_budget_burst)
        #: ``no_flow_first[b]``: a datagram from an unknown client address starting with
        #: ``b`` can only be dropped ``no-flow`` (not STUN, and no Redis to ask), so the
        #: shell's fast path drops it without a call; all zeros with look-ups (Redis or
        #: transceiver vouching, reseed.py) configured.
        self.no_flow_first = bytes(
            0 if config.redis or config.vouch else 1 - IS_STUN[b] for b in range(256)
        )
        #: return sinks the shell registered, by (transport, public address): a new flow
        #: gets the one it arrived through (transport.py)
        self.sinks: dict[tuple[Transport, Address], ReturnSink] = {}
        #: the TURN gate (relay/turn.py), when TURN is on: attach_turn
        self.turn: TurnHandler | None = None

    def attach_turn(self, turn: TurnHandler) -> None:
        """Turn TURN on (before the shell builds its drains: they read ``no_flow_first``):
        ChannelData from unknown addresses now reaches the core instead of being dropped."""
        self.turn = turn
        self.no_flow_first = bytes(0 if TURN_FIRST[b] else x
                                   for b, x in enumerate(self.no_flow_first))

    @property
    def stun_tat(self) -> dict[bytes, float]:
        """The STUN budget's table: verified server ufrag -> GCRA theoretical arrival time."""
        return self.stun_budget.tat

    # -- the slow path -------------------------------------------------------------------

    def handle_datagram(
        self,
        now: float,
        client: Address,
        data: bytes | bytearray | memoryview,
        public: Address,
        upstream: Address | None = None,
        transport: Transport = Transport.UDP,
    ) -> Flow | bytes | Relayed | None:
        """Decide about one datagram from ``client`` (received on ``public`` over
        ``transport``, or framed by the relay at ``upstream``). The caller has counted it in
        ``packets_in``."""
        if self.turn is not None and upstream is None and data and (TURN_FIRST[data[0]] or (
                len(data) > 1 and TURN_TYPE[(data[0] << 8) | data[1]])):
            # TURN's (demux.py). Without TURN such datagrams take the paths below, as any
            # other junk does (no flow: dropped or looked up; a flow's: forwarded opaque).
            return self.turn.handle(now, client, data, public, transport)
        flow = self.flows.get(client)
        if not data or not IS_STUN[data[0]]:
            if flow is not None and flow.upstream == upstream:
                if data and data[0] == 22:
                    # A DTLS handshake record: the flow's handshake budget (GCRA).
                    hs = self._handshake.step(flow.hs_tat, now)
                    if hs is None:
                        self.counters.drop("dtls-budget")
                        return None
                    flow.hs_tat = hs
                self._touch(flow, now, len(data))
                return flow
            # Vouching is for our own public sockets' clients only: an upstream relay is
            # any host on the internal network, and must not get a client's return traffic
            # pointed at it by a transceiver's answer (its clients re-learn by STUN/Redis).
            # A TURN allocation's relayed address is ours too: its datagrams come from an
            # authenticated allocation (re-created after a worker restart, turn.py), and
            # the flow's replies go back through the gate, so the transceivers are asked.
            if data and ((upstream is TURN_HOP and self.config.vouch) or (
                    upstream is not TURN_HOP and (
                        self.config.redis or (self.config.vouch and upstream is None)))):
                if self._want_lookup(now, client, public, upstream):
                    self._hold(now, client, data)
            else:
                self.counters.drop("no-flow")
            return None
        if flow is None:
            # STUN from an unknown address: parsing it (USERNAME, then the ufrag's MAC) costs
            # 3-6 µs, so a spoofed flood would outrun the worker and overflow its socket,
            # established calls' packets included. Past a worker-wide rate they are dropped
            # unparsed; new calls then compete with the flood (their checks are retried).
            if not self._unknown_stun.allow(now):
                self.counters.drop("stun-overload")
                return None
        # STUN: only a well-formed Binding request is interesting before a flow exists.
        try:
            username = peek_username_untrusted(data)
        except StunError:
            if flow is not None and flow.upstream == upstream:
                # Some other STUN message on a live flow (an indication, a response): it is
                # the transceiver's business, forward it like any other datagram.
                self._touch(flow, now, len(data))
                return flow
            self.counters.drop("stun-malformed")
            return None
        if username is None:
            return self._reflexive(now, client, data)
        server_ufrag = username.split(b":", 1)[0]
        same = flow is not None and flow.upstream == upstream
        if same and flow is not None and flow.answered and (
            server_ufrag == flow.ufrag or not flow.ufrag
        ):
            # Established (its transceiver answered it): never budgeted. A flow recovered
            # from Redis (no ufrag yet) was established on the worker that had it.
            if server_ufrag == flow.ufrag:
                self._touch(flow, now, len(data))  # consent check of a known session
                return flow
        else:
            # Not established: spend the ufrag's budget. A ufrag over budget is in the
            # table, which only holds ufrags that verified: drop before the MAC check.
            if self.stun_budget.over(server_ufrag, now):
                self.counters.drop("stun-budget")
                return None
            if same and flow is not None and server_ufrag == flow.ufrag:
                self.stun_budget.spend(server_ufrag, now)  # verified when the flow was made
                self._touch(flow, now, len(data))
                return flow
        route = self._route(server_ufrag, now)
        if route is None:
            return None
        if not (same and flow is not None and flow.answered and not flow.ufrag):
            self.stun_budget.spend(server_ufrag, now)
        if flow is not None and flow.upstream == upstream:
            if route != flow.route:
                dest = self._dest(route)
                assert dest is not None
                flow.route, flow.dest = route, dest
                self.counters.reroutes += 1
                self._mark_dirty(flow)
            if flow.ufrag:
                # Another session's ufrag (ICE restart, or someone guessing from an
                # established flow of their own): not established for this one yet.
                flow.answered = False
            flow.ufrag = server_ufrag
            self._touch(flow, now, len(data))
            return flow
        if upstream is not TURN_HOP and not self.buckets.allow(client[0], now):
            self.counters.drop("rate-limited")
            return None
        if flow is not None:
            # Same client address arriving through another hop: the newest path wins.
            del self.flows[client]
            self.counters.reroutes += 1
        new = self._install(now, client, route, public, upstream, server_ufrag, transport)
        self._held.pop(client, None)  # the client's check made the flow: nothing to release
        self._touch(new, now, len(data))
        return new

    def note_answer(self, flow: Flow, data: bytes | bytearray | memoryview) -> None:
        """The transceiver sent ``data`` to the client of ``flow``, which is not established
        yet (the shell calls this for return traffic of unanswered flows only). A Binding
        success response (type 0x0101, RFC 8489 §5) or any non-STUN datagram (DTLS, SRTP:
        only ever sent after a successful check) establishes the flow; an error response
        (a 401 to a wrong password) does not."""
        if len(data) >= 2 and IS_STUN[data[0]] and (data[0] != 0x01 or data[1] != 0x01):
            return
        if data:
            flow.answered = True
            self.counters.flows_answered += 1

    def _reflexive(self, now: float, client: Address, data: bytes | bytearray | memoryview) -> bytes | None:
        if not self.buckets.allow(client[0], now):
            self.counters.drop("rate-limited")
            return None
        try:
            resp = reflexive_response(data, client)
        except StunError:  # pragma: no cover - peek accepted it; the two share one walker
            self.counters.drop("stun-malformed")
            return None
        # Never amplify (DESIGN.md): the answer is bounded by the request + a fixed size.
        if len(resp) > len(data) + MAX_AMPLIFICATION:  # pragma: no cover - defence in depth
            self.counters.drop("amplification")
            return None
        self.counters.stun_answered += 1
        return resp

    def _route(self, server_ufrag: bytes, now: float) -> Route | None:
        try:
            hint = self.codec.decode_untrusted(server_ufrag)
        except UfragError as exc:
            self.counters.drop(f"ufrag-{exc.hint}")
            return None
        if hint.cluster == self.config.cluster:
            if hint.transceiver not in self.transceivers:
                self._want_resolve(now, hint.transceiver)
                return None
            return Route("t", hint.transceiver)
        if hint.cluster not in self.config.next_hops:
            self.counters.drop("unknown-cluster")
            return None
        return Route("c", hint.cluster)

    def _dest(self, route: Route) -> Address | None:
        table = self.transceivers if route.kind == "t" else self.config.next_hops
        return table.get(route.ident)

    # -- transceiver addresses (the shell resolves names) ----------------------------------

    def _want_resolve(self, now: float, ident: int) -> None:
        """Transceiver ``ident`` has no address: drop, and ask the shell to resolve it."""
        if not self.config.resolve_transceivers or ident >= self.config.resolve_limit:
            self.counters.drop("unknown-transceiver")
            return
        if self._resolve_asked.get(ident, -1e300) > now:
            self.counters.drop("unknown-transceiver")  # asked recently, without success
            return
        self.counters.drop("transceiver-resolving")
        if ident not in self._resolve and len(self._resolve) < self.config.max_pending_resolutions:
            self._resolve.add(ident)

    @property
    def resolutions_pending(self) -> bool:
        return bool(self._resolve)

    def poll_resolutions(self, now: float) -> list[int]:
        """Transceiver ids the shell should resolve now (each then rests for
        ``unresolved_ttl`` unless :meth:`set_transceiver` gives it an address)."""
        out = sorted(self._resolve)
        self._resolve.clear()
        for ident in out:
            self._resolve_asked[ident] = now + self.config.unresolved_ttl
        if len(self._resolve_asked) > 4 * self.config.max_pending_resolutions:
            for ident in [i for i, t in self._resolve_asked.items() if t <= now]:
                del self._resolve_asked[ident]
        return out

    def set_transceiver(self, ident: int, addr: Address, now: float = 0.0) -> int:
        """Transceiver ``ident`` is (now) at ``addr``; re-point its flows and install the
        Redis-recovered flows that were waiting for it. Returns how many flows moved."""
        self._resolve_asked.pop(ident, None)
        parked = self._parked.pop(ident, {})
        self._parked_count -= len(parked)
        moved = 0
        if self.transceivers.get(ident) != addr:
            self.transceivers[ident] = addr
            for flow in self.flows.values():
                if flow.route.kind == "t" and flow.route.ident == ident and flow.dest != addr:
                    flow.dest = addr
                    moved += 1
        for client, (public, upstream) in parked.items():
            if client not in self.flows:
                self._recovered(now, client, Route("t", ident), public, upstream)
        return moved

    def _park(self, ident: int, client: Address, public: Address, upstream: Address | None) -> None:
        waiting = self._parked.setdefault(ident, {})
        if client not in waiting and self._parked_count < self.config.max_pending_lookups:
            waiting[client] = (public, upstream)
            self._parked_count += 1

    def _touch(self, flow: Flow, now: float, n: int) -> None:
        flow.last_seen = now
        self.flows.move_to_end(flow.client)

    def _install(
        self,
        now: float,
        client: Address,
        route: Route,
        public: Address,
        upstream: Address | None,
        ufrag: bytes,
        transport: Transport = Transport.UDP,
    ) -> Flow:
        dest = self._dest(route)
        assert dest is not None
        while len(self.flows) >= self.config.max_flows:
            _, old = self.flows.popitem(last=False)  # LRU: the stalest flow
            self._dirty.pop(old.client, None)
            self.counters.flows_evicted += 1
        header = encode_flow_header(transport, client, public, self._tlv)
        sink = self.sinks.get((transport, public))
        flow = Flow(client, route, dest, header, public, upstream, ufrag, now, transport, sink)
        self.flows[client] = flow
        self.counters.flows_created += 1
        self._mark_dirty(flow)
        return flow

    # -- time ----------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Expire idle flows (no datagram from the client for ``flow_timeout``), forget
        refilled buckets and stale negative-cache entries, queue Redis TTL refreshes."""
        cutoff = now - self.config.flow_timeout
        flows = self.flows
        while flows:
            client, flow = next(iter(flows.items()))
            if flow.last_seen > cutoff:
                break  # LRU order: all later flows were seen more recently
            del flows[client]
            self._dirty.pop(client, None)
            self.counters.flows_expired += 1
        self.buckets.sweep(now)
        self.stun_budget.sweep(now)  # refilled budgets behave like absent ones
        if self._parked:
            # Parked flows whose transceiver did not resolve are forgotten.
            for ident in [i for i in self._parked if self._resolve_asked.get(i, now + 1) <= now]:
                self._parked_count -= len(self._parked.pop(ident))
        held = self._held
        while held and next(iter(held.values()))[0] <= now:
            held.popitem(last=False)
        asked = self._asked
        while asked:
            client, until = next(iter(asked.items()))
            if until > now:
                break
            del asked[client]
        if self.config.redis:
            # Refresh the Redis TTL of flows still in use, a third of a timeout ahead.
            refresh = now - self.config.flow_timeout / 3
            for flow in reversed(flows.values()):
                if flow.last_seen <= refresh:
                    break  # the rest are older: they will expire rather than refresh
                if flow.written <= refresh:
                    self._mark_dirty(flow)

    def next_deadline(self) -> float | None:
        """When the stalest flow expires (None with an empty table)."""
        if not self.flows:
            return None
        return next(iter(self.flows.values())).last_seen + self.config.flow_timeout

    # -- Redis (the shell does the I/O) --------------------------------------------------

    def _mark_dirty(self, flow: Flow) -> None:
        if self.config.redis and flow.upstream is not TURN_HOP:
            self._dirty[flow.client] = flow

    def poll_writes(self, now: float) -> list[tuple[Address, str]]:
        """Flows to write to Redis now, as (client, route) pairs."""
        if not self._dirty:
            return []
        out = []
        for client, flow in self._dirty.items():
            flow.written = now
            out.append((client, str(flow.route)))
        self._dirty.clear()
        self.counters.redis_writes += len(out)
        return out

    def resync_writes(self) -> int:
        """Queue every flow for a Redis write (Redis is back after an outage, possibly
        empty: redis_cache.py); returns how many."""
        for flow in self.flows.values():
            self._mark_dirty(flow)
        return len(self._dirty)

    def _want_lookup(
        self, now: float, client: Address, public: Address, upstream: Address | None
    ) -> bool:
        """Queue a look-up of ``client`` (unless one is pending or recently missed); True
        when one is queued or in flight, so that the datagram is worth holding."""
        # Counted under the look-up's kind: Redis (and vouching with it), or vouching alone.
        # A datagram counted "-pending" may still be forwarded: it is held (_hold) and goes
        # out if the look-up installs its flow (counted again as held_released).
        kind = "redis" if self.config.redis else "vouch"
        if client in self._lookups or self._asked.get(client, now) > now:
            self.counters.drop(f"{kind}-pending")
            return True
        if len(self._lookups) >= self.config.max_pending_lookups:
            self.counters.drop(f"{kind}-busy")
            return False
        if upstream is not TURN_HOP and not self.buckets.allow(client[0], now):
            # (A relayed address's IP is the relay's own: the TURN quotas bound those.)
            self.counters.drop("rate-limited")
            return False
        self.counters.drop(f"{kind}-pending")
        self._lookups[client] = (public, upstream)
        return True

    def _hold(self, now: float, client: Address, data: bytes | bytearray | memoryview) -> None:
        """Keep a datagram of a client being looked up (issue 32). Before, it was dropped,
        so every flow a worker restart moved lost its first packet(s) — one 20 ms frame per
        call and event at best, several when the answer took longer than a frame. Bounded:
        ``max_held_per_client`` datagrams for ``held_ttl`` per client, as many clients as
        look-ups may be pending; forwarded only once an authentic answer (a transceiver's
        vouch, a Redis entry) installs the flow — exactly the trust later datagrams get."""
        held = self._held
        entry = held.get(client)
        if entry is not None and entry[0] <= now:
            del held[client]  # a stale hold (a look-up that missed): start afresh
            entry = None
        if entry is None:
            while held and (len(held) >= self.config.max_pending_lookups
                            or next(iter(held.values()))[0] <= now):
                held.popitem(last=False)
            held[client] = (now + self.config.held_ttl, [bytes(data)])
        elif len(entry[1]) < self.config.max_held_per_client:
            entry[1].append(bytes(data))
        else:
            return
        self.counters.packets_held += 1

    def poll_released(self) -> list[tuple[Flow, bytes]]:
        """Held datagrams whose flow a look-up just installed, oldest first: the shell sends
        each to ``flow.dest`` framed with ``flow.header`` (reseed.Lookups.flush_released)."""
        out, self._released = self._released, []
        return out

    @property
    def released_pending(self) -> bool:
        return bool(self._released)

    @property
    def lookups_pending(self) -> bool:
        return bool(self._lookups)

    def poll_lookups(self, now: float) -> list[tuple[Address, Address, Address | None]]:
        """Clients to look up in Redis, as (client, public, upstream). Each is remembered for
        ``negative_ttl`` so a miss is not asked again at packet rate."""
        if not self._lookups:
            return []
        out = [(c, p, u) for c, (p, u) in self._lookups.items()]
        self._lookups.clear()
        for client, _, _ in out:
            self._asked[client] = now + self.config.negative_ttl
            self._asked.move_to_end(client)
        while len(self._asked) > self.config.max_pending_lookups * 4:
            self._asked.popitem(last=False)
        self.counters.redis_lookups += len(out)
        return out

    def handle_lookup(
        self,
        now: float,
        client: Address,
        public: Address,
        upstream: Address | None,
        value: str | None,
    ) -> Flow | None:
        """Install a flow recovered from Redis (``value`` is what :meth:`poll_writes`
        produced, or None on a miss). A value naming a route this relay does not have is
        ignored: Redis can only pick among configured next hops, never add one."""
        if value is None:
            self.counters.drop("redis-miss")
            return None
        route = Route.parse(value)
        if (
            route is not None
            and route.kind == "t"
            and route.ident not in self.transceivers
            and self.config.resolve_transceivers
            and route.ident < self.config.resolve_limit
        ):
            # A restarted relay that has not resolved this transceiver yet: park the flow
            # until the name resolves (set_transceiver installs it).
            self._want_resolve(now, route.ident)
            self._park(route.ident, client, public, upstream)
            return None
        if route is None or self._dest(route) is None:
            self.counters.drop("redis-bad-route")
            return None
        if client in self.flows:
            self._asked.pop(client, None)
            return self.flows[client]  # a STUN request won the race
        return self._recovered(now, client, route, public, upstream)

    def _recovered(
        self, now: float, client: Address, route: Route, public: Address, upstream: Address | None
    ) -> Flow:
        self._asked.pop(client, None)
        # _install marks the flow dirty: it is written back at once. The entry's TTL was set
        # by the worker that had the flow before (possibly itself recovered it a moment
        # earlier, so never refreshed it); rewriting gives it a full flow_timeout from now
        # and makes this worker its keeper, so the next restart still finds it.
        # A TCP client (a connection adopted after a worker kill, relay/keeper.py) keeps
        # its transport: STREAM headers, and its return traffic framed onto the connection.
        transport = Transport.TCP if type(client) is StreamAddr else Transport.UDP
        flow = self._install(now, client, route, public, upstream, b"", transport)
        flow.answered = True  # established on the worker that wrote it
        self.counters.flows_recovered += 1
        held = self._held.pop(client, None)
        if held is not None and held[0] > now:
            self._released.extend((flow, d) for d in held[1])
            self.counters.held_released += len(held[1])
        return flow

    def stats(self) -> dict[str, object]:
        out = self.counters.as_dict()
        out["flows"] = len(self.flows)
        out["budget_ufrags"] = len(self.stun_budget)
        return out
