"""The relay's trio shell: :func:`serve_relay` runs one relay worker.

One worker has one public UDP socket per listen address (``SO_REUSEPORT``, so M worker
processes share the port and the kernel spreads clients over them by 4-tuple hash) and one
internal UDP socket (loopback, ephemeral port by default) that talks PROXY v2 framed
datagrams with transceivers and with other relays (DESIGN.md "Relay <-> transceiver
datagram format"). Only configured transceivers and next hops may send return traffic;
any other source on the internal socket is treated as an upstream relay, whose datagrams
are routed exactly like a client's (first packet must be a verified STUN request).

Where things are::

    serve_relay (here)      sockets, the nursery, start-up resolution, the ready report
     ├─ fastpath.hot_loop   every socket's drain in one task (fastpath.make_drain: the one
     │                      routing loop; io.PythonIO / io.MmsgIO: the syscalls)
     ├─ housekeeping        RelayCore.sweep every tick (idle flows, refilled budgets)
     ├─ Resolver.run        transceiver names, off the hot path (resolver.py)
     ├─ RelaySockets        TURN relayed sockets' readers, with --turn-peer (turn.py)
     ├─ reseed.Lookups      unknown clients' media: ask the transceivers (flow vouching,
     │                      reseed.py) and Redis (RedisFlowCache, with --redis)
     ├─ RedisFlowCache      writer task, with --redis (redis_cache.py)
     ├─ serve_turn_store    TURN allocations to Redis or the state file (turn_store.py)
     ├─ serve_turn_lookups  allocations of clients moved here, from any worker's records
     ├─ KeeperLink.run      TCP connections handed to the keeper in the fork template, and
     │                      a dead predecessor's taken over (keeper.py)
     ├─ Handover.run        a rolling restart: the predecessor's TCP connections taken
     │                      over, and ours handed to a successor when we stop (handover.py)
     └─ serve_control       {"op": "stats"} (control.py)

    core.RelayCore          every decision, no I/O; transport.py: the Transport/ReturnSink
                            seam a TCP listener plugs into; filter.py: the kernel filter;
                            turn.TurnGate: TURN (issue 40), when ``turn`` is configured

Junk is dropped as early as possible (issue 9, floods): in the kernel by the public
sockets' BPF filter (:mod:`.filter`), then in the loop by the core's tables. Socket
buffers: we ask for ``SOCKET_BUFFER``; the kernel caps the request at
``net.core.rmem_max``/``wmem_max`` (and doubles it); the granted sizes are logged at start
and reported by ``stats``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from ..control import serve_control
from ..netio.sockets import SOCKET_BUFFER, format_addr, socket_buffers, sockname, udp_socket
from ..proto.proxy import TLV_RELAY_ID, encode_tlv
from .board import Board
from .control import worker_handler
from .core import Address, CoreConfig, RelayCore, Transport
from .fastpath import (
    COALESCE_BELOW,
    DENSE,
    HEADROOM,
    INTERNAL_BATCH,
    INTERNAL_SLOT,
    MMSG_BATCH,
    PUBLIC_SLOT,
    Drain,
    Outbox,
    coalesce_wait,
    hot_loop,
    make_drain,
)
from .filter import MAX_DATAGRAM, attach_public_filter
from .handover import HANDOVER_WAIT, Handover, handover_name
from .io import IO_ENV, IO_MODES, IoAdapter, adapter, mmsg_available, select_io
from .keeper import KeeperLink, Kept, keeper_name
from .redis_cache import RedisFlowCache, open_client
from .reseed import FlowVouching, Lookups
from .resolver import Resolver, pattern_address, resolve_at_start
from .tcp import TcpLimits, TcpListener, close_socket, tcp_listener
from .tls import TurnTls
from .transport import ReturnSink, UdpSink
from .turn import RelaySockets, TurnGate, TurnSettings, own_media_map, raise_fd_limit
from .turn_store import (
    FileTurnStore,
    RedisTurnStore,
    TurnStore,
    restore,
    serve_turn_lookups,
    serve_turn_store,
)

__all__ = [
    "COALESCE_BELOW", "DENSE", "IO_ENV", "IO_MODES", "MAX_DATAGRAM", "SOCKET_BUFFER",
    "RelayConfig", "RelayHandle", "attach_public_filter", "build_drains", "coalesce_wait",
    "format_addr",
    "mmsg_available", "pattern_address", "select_io", "serve_relay", "socket_buffers",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """One relay worker's configuration (the CLI builds it from flags and the TOML file).

    Host names in ``next_hops`` are resolved once at start; transceiver names (given in
    ``transceivers`` or by ``transceiver_pattern``) are also re-resolved every
    ``resolve_interval`` seconds (:mod:`.resolver`).
    """

    secrets: tuple[bytes, ...]
    listen: tuple[Address, ...] = (("0.0.0.0", 3478),)
    internal: Address = ("127.0.0.1", 0)
    transceivers: Mapping[int, Address] = field(default_factory=dict)
    cluster: int = 0
    next_hops: Mapping[int, Address] = field(default_factory=dict)
    flow_timeout: float = 30.0
    max_flows: int = 100_000
    new_flow_rate: float = 20.0
    new_flow_burst: float = 40.0
    redis_url: str | None = None
    control: str | None = None
    relay_id: str = "relay"
    worker: int = 0
    transceiver_pattern: str | None = None  # "host-{id}.domain:port"
    transceiver_count: int | None = None  # ids 0..N-1 resolved at start (pattern only)
    resolve_interval: float = 5.0
    resolve_timeout: float = 2.0
    io: str = "auto"  # "python", "mmsg" or "auto" (see select_io)
    coalesce: float = 20e-6  # s; 0 = off (see coalesce_wait)
    #: ICE-TCP listen addresses (tcp.py; ``--tcp``) and their bounds
    tcp: tuple[Address, ...] = ()
    tcp_limits: TcpLimits = field(default_factory=TcpLimits)
    #: shared-port mode: TLS connections on the ICE-TCP listeners go to this HTTPS address
    tcp_https: Address | None = None
    #: ask the transceivers about media from unknown clients (reseed.py, issue 20)
    vouch: bool = True
    #: TURN on the UDP listen addresses (turn.py, issue 40), or None
    turn: TurnSettings | None = None
    #: TURN over TLS on the ICE-TCP listeners and the TLS split's names (tls.py), or None
    turn_tls: TurnTls | None = None
    #: a private directory the supervisor gives every life of this worker index, or None:
    #: the embedded cache of TURN allocations (turn_store.py) when there is no Redis, and
    #: the name of the keeper of its TCP connections in its fork template (keeper.py)
    turn_state_dir: str | None = None


@dataclass(frozen=True, slots=True)
class RelayHandle:
    """What :func:`serve_relay` reports through ``task_status.started``."""

    public: tuple[Address, ...]
    internal: Address
    core: RelayCore
    worker: int = 0
    sockets: Mapping[str, Any] = field(default_factory=dict)
    io: str = "python"
    tcp: tuple[Address, ...] = ()  # the ICE-TCP listeners' bound addresses
    #: the roll's hand-over (handover.py), with a keeper link, else None
    handover: Handover | None = None

    def leave(self) -> bool:
        """A graceful stop begins (call it before cancelling :func:`serve_relay`): True when
        it is a roll's — a successor said hello — and the established TCP connections go
        to that successor instead of closing (handover.py); False, they close as before."""
        return self.handover is not None and self.handover.leave()

    def stats(self) -> dict[str, Any]:
        return {
            "ok": True,
            "counters": self.core.counters.as_dict(),
            "flows": len(self.core.flows),
            "worker": self.worker,
            "sockets": dict(self.sockets),
            "io": self.io,
        }


def _public_socket(addr: Address, turn: bool = False) -> socket.socket:
    # The filter goes on before bind, so no datagram is ever queued unfiltered.
    if turn:
        return udp_socket(addr, reuseport=True,
                          prepare=lambda s: attach_public_filter(s, turn=True))
    return udp_socket(addr, reuseport=True, prepare=lambda s: attach_public_filter(s))


def relay_ips(settings: TurnSettings, public: Sequence[Address]) -> tuple[str, ...]:
    """The IPs relayed addresses are advertised with: configured, else the media addresses'
    and the specific listen IPs (one per family). ValueError when there is none."""
    ips = list(settings.relay_ips) + [a[0] for a in settings.media] + [
        a[0] for a in public if a[0] not in ("0.0.0.0", "::")]
    if not ips:
        raise ValueError("TURN on a wildcard listen address needs --turn-relay-ip or "
                         "--media-address: the IP clients and peers know this host by")
    return tuple(ips)


async def _housekeeping_turn(gate: TurnGate) -> None:
    while True:
        await trio.sleep(1.0)  # allocation lifetimes are minutes: a second is exact enough
        gate.sweep(trio.current_time())


def _core(config: RelayConfig, transceivers: Mapping[int, Address],
          next_hops: Mapping[int, Address]) -> RelayCore:
    return RelayCore(
        CoreConfig(
            secrets=tuple(config.secrets),
            cluster=config.cluster,
            transceivers=transceivers,
            next_hops=next_hops,
            relay_id=config.relay_id,
            flow_timeout=config.flow_timeout,
            max_flows=config.max_flows,
            new_flow_rate=config.new_flow_rate,
            new_flow_burst=config.new_flow_burst,
            max_sources=max(65_536, config.max_flows),
            redis=config.redis_url is not None,
            vouch=config.vouch,
            resolve_transceivers=config.transceiver_pattern is not None,
            resolve_limit=0x10000 if config.transceiver_count is None else config.transceiver_count,
        )
    )


def build_drains(
    core: RelayCore,
    public: Sequence[tuple[Address, socket.socket]],
    isock: socket.socket,
    syscalls: IoAdapter,
    returners: set[Address],
    relay_id: str = "relay",
    tcp: Sequence[socket.socket] = (),
    tcp_limits: TcpLimits | None = None,
    listeners: list[TcpListener] | None = None,
    tcp_https: Address | None = None,
    turn_tls: TurnTls | None = None,
    local: Callable[[float, memoryview, Address], object] | None = None,
) -> dict[int, Drain]:
    """Every socket's drain, by fd: the return sinks and the internal outbox the drains
    queue on (transport.py), registered with the core, then one :func:`make_drain` per
    socket over ``syscalls`` (io.py). Each ICE-TCP listening socket in ``tcp`` becomes a
    :class:`~.tcp.TcpListener` appended to ``listeners`` (its drain is its own: it runs
    from the listener's connection tasks, not from the hot loop)."""
    internal_out = Outbox(syscalls.flusher(isock))
    sinks: dict[Address, ReturnSink] = {}
    for addr, sock in public:
        sinks[addr] = core.sinks[(Transport.UDP, addr)] = UdpSink(addr, syscalls.flusher(sock))
    drains: dict[int, Drain] = {}
    for addr, sock in public:
        buf = bytearray(PUBLIC_SLOT * MMSG_BATCH)
        drains[sock.fileno()] = make_drain(
            core, recv=syscalls.receiver(sock, buf, PUBLIC_SLOT, HEADROOM, MAX_DATAGRAM,
                                         MMSG_BATCH),
            buf=buf, slot=PUBLIC_SLOT, count=MMSG_BATCH, internal=internal_out,
            public=addr, reply=sinks[addr])
    tcps = [TcpListener(core, sock, internal_out, tcp_limits or TcpLimits(), tcp_https,
                        turn_tls) for sock in tcp]
    if listeners is not None:
        listeners.extend(tcps)
    ibuf = bytearray(INTERNAL_SLOT * INTERNAL_BATCH)
    drains[isock.fileno()] = make_drain(
        core, recv=syscalls.receiver(isock, ibuf, INTERNAL_SLOT, HEADROOM,
                                     INTERNAL_SLOT - HEADROOM - 64, INTERNAL_BATCH),
        buf=ibuf, slot=INTERNAL_SLOT, count=INTERNAL_BATCH, internal=internal_out,
        sinks=sinks, returners=returners,
        tlv=encode_tlv(TLV_RELAY_ID, relay_id.encode()[:64]),
        stream_sinks={t.public: t.sink for t in tcps}, local=local)
    return drains


def _canonical(addr: Address) -> Address:
    return (str(ipaddress.ip_address(addr[0].split("%", 1)[0])), addr[1])


def _keeper_link(config: RelayConfig, core: RelayCore, listeners: Sequence[TcpListener],
                 gate: TurnGate | None) -> KeeperLink | None:
    """The worker's link to the keeper of its TCP connections (keeper.py): with a private
    directory (a supervisor's worker, which has a fork template) and TCP listeners."""
    if config.turn_state_dir is None or not listeners:
        return None
    by_public = {_canonical(t.public): t for t in listeners}

    def adopt(sock: socket.socket, kept: Kept, ident: int, board: Board | None
              ) -> bool | None:
        listener = by_public.get(kept.listener)
        return False if listener is None else listener.adopt(sock, kept, ident, board)

    def poll() -> None:
        if gate is None:
            return
        for client, local, record in gate.poll_kept():
            listener = by_public.get(_canonical(local))
            if listener is not None:
                listener.kept_changed(client, record)

    link = KeeperLink(keeper_name(config.turn_state_dir, config.cluster, config.worker),
                      core.counters, adopt, poll)
    # What a successor needs exactly of each kept connection (board.py): a slot per
    # connection the listeners may hold, sparse (a slot's pages exist once it is used).
    link.board = Board.create(sum(t.limits.max_connections for t in listeners))
    for listener in listeners:
        listener.keeper = link
    return link


async def _serve_keeper_link(link: KeeperLink, listeners: Sequence[TcpListener]) -> None:
    """The keeper link, once every listener runs: adopted connections join their tasks."""
    for listener in listeners:
        await listener.started.wait()
    await link.run()


async def _serve_handover(handover: Handover, listeners: Sequence[TcpListener]) -> None:
    """The roll's hand-over, once every listener runs: handed connections join their tasks."""
    for listener in listeners:
        await listener.started.wait()
    await handover.run()


async def _housekeeping(core: RelayCore, flow_timeout: float) -> None:
    tick = min(1.0, flow_timeout / 4)
    while True:
        await trio.sleep(tick)
        core.sweep(trio.current_time())


async def serve_relay(
    config: RelayConfig,
    *,
    task_status: trio.TaskStatus[RelayHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one relay worker until cancelled; reports a :class:`RelayHandle` when ready."""
    io = select_io(config.io)  # a bad mode fails before any socket is bound
    syscalls = adapter(io)
    family = socket.AF_INET6 if ":" in config.internal[0] else socket.AF_INET
    transceivers, next_hops, names = await resolve_at_start(
        config.transceivers, config.next_hops, family, config.transceiver_pattern,
        config.transceiver_count, config.resolve_timeout)
    core = _core(config, transceivers, next_hops)
    resolver = Resolver(core, family, pattern=config.transceiver_pattern,
                        count=config.transceiver_count, configured=config.transceivers,
                        interval=config.resolve_interval, timeout=config.resolve_timeout,
                        names=names, next_hops=next_hops)
    cache = (None if config.redis_url is None else
             RedisFlowCache(core, open_client(config.redis_url), config.cluster,
                            config.flow_timeout))
    socks: list[socket.socket] = []
    relayed: RelaySockets | None = None
    gate: TurnGate | None = None
    handover: Handover | None = None
    try:
        for addr in config.listen:
            socks.append(_public_socket(addr, turn=config.turn is not None))
        # A fixed internal port is shared by the workers (SO_REUSEPORT) so that one next-hop
        # address reaches all of them; the default ephemeral port is per worker.
        isock = udp_socket(config.internal, reuseport=config.internal[1] != 0)
        socks.append(isock)
        pubs = socks[:-1]
        tcp_socks = []
        for addr in config.tcp:
            tcp_socks.append(tcp_listener(addr))
            socks.append(tcp_socks[-1])
        listeners: list[TcpListener] = []
        public = tuple(sockname(s) for s in pubs)
        resolver.update_return_sources()
        if config.turn is not None:
            # Before build_drains: attaching the gate changes what the drains drop unread.
            raise_fd_limit(config.turn.max_allocations)
            relayed = RelaySockets(relay_ips(config.turn, public), core.counters,
                                   read=bool(config.turn.peers))
            gate = TurnGate(core, config.turn, own_media_map(config.turn.media, public),
                            relayed, unix_offset=time.time() - trio.current_time())

        vouching = FlowVouching(core, config.secrets) if config.vouch else None
        lookups = Lookups(core, vouching, isock, cache)
        drains = build_drains(core, list(zip(public, pubs, strict=True)), isock, syscalls,
                              resolver.return_sources, config.relay_id, tcp_socks,
                              config.tcp_limits, listeners, config.tcp_https,
                              config.turn_tls if config.turn is not None else None,
                              None if vouching is None else lookups.handle_local)
        if cache is not None:
            cache.on_recovered = lookups.flush_released  # held datagrams go out at once

        def wake() -> None:
            if core.lookups_pending and not lookups.wanted.is_set():
                lookups.wanted.set()
            if core.resolutions_pending and not resolver.wanted.is_set():
                resolver.wanted.set()

        buffers: dict[str, Any] = {format_addr(a): socket_buffers(s)
                                   for a, s in zip(public, pubs, strict=True)}
        buffers["internal"] = socket_buffers(isock)
        for listener in listeners:
            listener.wake = wake
        link = _keeper_link(config, core, listeners, gate)
        if link is not None:
            assert config.turn_state_dir is not None  # a keeper link has a private directory
            handover = Handover(handover_name(config.turn_state_dir, config.cluster,
                                              config.worker), core.counters, link, close_socket)
            for listener in listeners:
                listener.handover = handover
        handle = RelayHandle(public, sockname(isock), core, config.worker, buffers, io,
                             tuple(t.public for t in listeners), handover)
        store: TurnStore | None = None
        if gate is not None:
            if cache is not None:
                store = RedisTurnStore(cache.client, config.cluster, config.worker)
            elif config.turn_state_dir is not None:
                store = FileTurnStore(config.turn_state_dir, config.cluster, config.worker)
        async with trio.open_nursery() as nursery:
            if gate is not None and relayed is not None:
                relayed.nursery = nursery
            if gate is not None and store is not None:
                # Before the ready line: the allocations of the worker this one replaces
                # are back before its clients' next datagrams are read (turn_store.py).
                await restore(gate, store)
                nursery.start_soon(serve_turn_store, gate, store)
                nursery.start_soon(serve_turn_lookups, gate, store)  # moved clients
            nursery.start_soon(partial(hot_loop, drains, core.counters, wake=wake,
                                       coalesce=config.coalesce))
            nursery.start_soon(_housekeeping, core, config.flow_timeout)
            if gate is not None:
                nursery.start_soon(_housekeeping_turn, gate)
            for listener in listeners:
                nursery.start_soon(listener.serve)
            if link is not None:
                nursery.start_soon(_serve_keeper_link, link, listeners)
            if handover is not None:
                # Before the ready line: a live predecessor (a roll) learns of us now, before
                # the supervisor stops it.
                handover.open()
                nursery.start_soon(_serve_handover, handover, listeners)
            if resolver.needed:
                nursery.start_soon(resolver.run)
            if cache is not None or vouching is not None:
                nursery.start_soon(lookups.run)
            if cache is not None:
                nursery.start_soon(cache.writer)
            if config.control is not None:
                await nursery.start(serve_control, config.control,
                                    worker_handler(core, config.worker, io, buffers))
            log.info(
                "relay worker %d ready: public %s%s internal %s, %d transceivers, %d next hops, "
                "io %s%s",
                config.worker, ", ".join(format_addr(a) for a in public),
                "".join(f", tcp {format_addr(a)}" for a in handle.tcp),
                format_addr(handle.internal), len(transceivers), len(next_hops), io,
                "" if gate is None else f", TURN (relayed on {', '.join(relayed.ips.values())})"
                if relayed is not None else "",
            )
            log.info("relay worker %d socket buffers (kernel-granted): %s", config.worker,
                     buffers)
            task_status.started(handle)
    finally:
        for sock in socks:
            sock.close()
        if relayed is not None:
            relayed.close_all()  # first: a successor binds the TURN/TCP relayed ports again
        if handover is not None:
            with trio.move_on_after(HANDOVER_WAIT, shield=True):
                await handover.send_released()  # a roll's stop: our TCP connections go on
            handover.close()  # the rest close (their clients see the end)
        if cache is not None:
            await cache.close()

