"""TURN in the relay (issue 40): the gate between the routing core and the sans-IO
:class:`~appliance.proto.turn.TurnServer`, and the relayed sockets.

::

    TURN client ──UDP──► public socket ─► drain ─► RelayCore.handle_datagram
                                                     │ ChannelData / TURN STUN (demux.py)
                                                     ▼
                                                  TurnGate.handle ─► TurnServer
                                                     │
       answers (401, Allocate success, …) ◄──────────┤ Transmit
                                                     │ PeerData
              peer = our own media address ──────────┼──► RelayCore.handle_datagram(
              (item 2: never leaves the host)        │      client = relayed address,
                                                     │      hop = TURN_HOP) ─► transceiver
              peer inside --turn-peer ───────────────┴──► relayed socket ─► peer

    transceiver ─► internal drain: flow.upstream is TURN_HOP ─► TurnGate.back ─► ChannelData
                   (or a Data indication) ─► public socket ─► TURN client
    peer ─► relayed socket reader ─► TurnGate.from_peer ─► TurnServer ─► public socket

**Our own media address is delivered in-process.** A browser with
``iceTransportPolicy: "relay"`` pairs its relay candidate (the allocation's relayed address)
with the answer's host candidate (our media address) and sends its checks, DTLS and SRTP
through the allocation to it. The gate hands that payload straight back to the routing core
as if it had arrived on the public socket from the relayed address: the ICE ufrag of the
first check routes it to the owning transceiver, the flow table does the rest, and the
transceiver sees a client at the relayed address (its XOR-MAPPED-ADDRESS, consent checks and
media all name it) — no datagram to ourselves, no hairpin through a NAT, no port below 1024
to send to. Its replies come back to the gate (fastpath's internal drain, by the flow's hop)
and go to the TURN client as ChannelData (4-byte header + the payload in place: no copy) or,
before a channel is bound, as a Data indication.

**Relayed addresses are real sockets** (one UDP socket per allocation, bound on the relay IP
with an ephemeral port): the kernel guarantees two workers never hand out the same address,
and a peer inside an operator's ``--turn-peer`` networks is reached through it. Without such
networks nothing can legitimately arrive on a relayed socket, so it is not read and its
receive buffer is shrunk to the minimum: junk sent to it costs a few kB per allocation.

Counters (in the relay's ``stats``): ``turn_*`` (allocations created/expired/deleted/closed,
requests, challenges, auth failures, packets to/from peers, ``turn_relayed_in`` /
``turn_relayed_out`` for our own media address, ``turn_peer_sends`` through sockets) and
drops ``turn-*`` by reason.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import logging
import resource
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from ..netio.sockets import family_of
from ..proto.proxy import StreamAddr
from ..proto.ratelimit import Gcra
from ..proto.turn import (
    AllocationCreated,
    AllocationEnded,
    AllocationMissing,
    PeerData,
    RelayPorts,
    Transmit,
    TurnConfig,
    TurnCounters,
    TurnError,
    TurnServer,
    parse_record_untrusted,
)
from ..proto.turn.server import Network
from .core import TURN_HOP, Address, Flow, RelayCore, Relayed
from .counters import Counters
from .transport import ReturnSink, Transport

log = logging.getLogger("appliance.relay.server")

__all__ = [
    "RelaySockets", "TurnGate", "TurnSettings", "own_media_map",
]

#: Datagrams read from one relayed socket per wake-up (peers under --turn-peer only).
PEER_BATCH = 32


def nonce_key(secret: bytes) -> bytes:
    """The nonce key of :class:`~appliance.proto.turn.NonceCodec`: from the first shared
    secret, so every worker accepts every worker's nonces (a restart costs no round trip)."""
    return hmac.new(secret, b"appliance turn nonce v1", hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """TURN in one relay worker (the CLI builds it: ``--turn`` and its flags)."""

    secrets: tuple[bytes, ...]
    realm: str = "appliance"
    #: the appliance's own media addresses as clients reach them (the answer's candidates)
    media: tuple[Address, ...] = ()
    #: the IPs relayed addresses are advertised with, per family (4, 6)
    relay_ips: tuple[str, ...] = ()
    peers: tuple[Network, ...] = ()
    max_allocations: int = 2000
    max_per_source: int = 16
    max_per_username: int = 8
    max_lifetime: int = 3600

    def server_config(self, own: frozenset[Address]) -> TurnConfig:
        return TurnConfig(secrets=self.secrets, nonce_key=nonce_key(self.secrets[0]),
                          realm=self.realm, own=own, peers=self.peers,
                          max_allocations=self.max_allocations,
                          max_per_source=self.max_per_source,
                          max_per_username=self.max_per_username,
                          max_lifetime=self.max_lifetime)


def _canonical(addr: Address) -> Address:
    return (str(ipaddress.ip_address(addr[0])), addr[1])


def own_media_map(media: Sequence[Address], listen: Sequence[Address]) -> dict[Address, Address]:
    """Our own media address (as a peer names it) -> the listen address it arrives on: each
    media address maps to the listen address of its family and port (a wildcard bind takes
    every address of its family). A listen address bound to a specific IP is a media address
    of itself. ValueError for a media address no listen address serves."""
    out: dict[Address, Address] = {}
    for addr in listen:
        if addr[0] not in ("0.0.0.0", "::"):
            out[_canonical(addr)] = addr
    for addr in media:
        ip = ipaddress.ip_address(addr[0])
        match = [a for a in listen if a[1] == addr[1]
                 and ipaddress.ip_address(a[0]).version == ip.version
                 and (a[0] in ("0.0.0.0", "::") or ipaddress.ip_address(a[0]) == ip)]
        if not match:
            raise ValueError(f"media address {addr[0]}:{addr[1]} is not served by any "
                             "listen address (same family and port)")
        out[_canonical(addr)] = match[0]
    return out


class RelaySockets:
    """The relayed addresses as real UDP sockets (:class:`~appliance.proto.turn.RelayPorts`).

    ``relay_ips`` are the advertised IPs, one per family; a socket binds to that IP when it
    is local, else to the family's wildcard (a cloud VM's public IP is its NAT's). With
    ``read`` (peers beyond our own media address are allowed) each socket gets a reader task
    in ``nursery`` (set by the shell before traffic flows); without, its receive buffer is
    shrunk to the minimum and it is never read.
    """

    def __init__(self, relay_ips: Sequence[str], counters: Counters, *, read: bool) -> None:
        self.ips: dict[int, str] = {}
        for ip in relay_ips:
            self.ips.setdefault(4 if ipaddress.ip_address(ip).version == 4 else 6, ip)
        self.counters = counters
        self.read = read
        self.socks: dict[Address, socket.socket] = {}
        #: relayed addresses held without a socket (adopt)
        self.adopted: set[Address] = set()
        self.scopes: dict[Address, trio.CancelScope] = {}
        self.nursery: trio.Nursery | None = None
        #: the gate's peer-data entry, set by TurnGate
        self.deliver: Callable[[float, Address, Address, bytes], None] | None = None

    def bind(self, family: int, client: Address, even: bool = False) -> Address | None:
        ip = self.ips.get(4 if family == 1 else 6)
        if ip is None:
            return None
        held: list[socket.socket] = []
        try:
            # EVEN-PORT: the kernel's ports are random; one more try if it gave an adopted one
            for _ in range(16 if even else 2):
                sock = self._bind(ip)
                if sock is None:
                    return None
                port = int(sock.getsockname()[1])
                relayed = (str(ipaddress.ip_address(ip)), port)
                if relayed in self.adopted:
                    # An identity of ours whose old socket just closed: ours from now on,
                    # never another allocation's (and the port is not a candidate).
                    self._install(relayed, sock)
                    self.adopted.discard(relayed)
                    continue
                if not even or port % 2 == 0:
                    break
                held.append(sock)
            else:
                self.counters.drop("turn-no-even-port")
                return None
        finally:
            for other in held:
                other.close()
        self._install(relayed, sock)
        return relayed

    def _install(self, relayed: Address, sock: socket.socket) -> None:
        self.socks[relayed] = sock
        if self.read and self.nursery is not None:
            scope = trio.CancelScope()
            self.scopes[relayed] = scope
            self.nursery.start_soon(self._reader, relayed, sock, scope)

    def claim(self, relayed: Address) -> bool:
        """Bind exactly ``relayed`` again (an allocation re-created after a worker restart:
        the dead worker's socket was closed by the kernel); False if it is taken."""
        if relayed in self.socks or relayed in self.adopted:
            return False
        return self._claim(relayed)

    def adopt(self, relayed: Address) -> bool:
        """Hold ``relayed`` without its socket: a client the ``SO_REUSEPORT`` hash moved
        here whose allocation's socket is still held by the worker it left (alive). Our own
        media address is reached in-process, so the address is only an identity; a peer
        beyond it is not reached (``turn-peer-no-socket``) until :meth:`reclaim` gets the
        socket. No allocation of this worker is given the address meanwhile."""
        if relayed in self.socks or relayed in self.adopted:
            return False
        ip = self.ips.get(4 if ":" not in relayed[0] else 6)
        if ip is None or str(ipaddress.ip_address(ip)) != relayed[0]:
            return False  # not an address this worker hands out
        self.adopted.add(relayed)
        return True

    def reclaim(self) -> int:
        """Try to bind every adopted address (its old holder let go of it, at its stale
        copy's expiry): each one bound is a full relayed socket again. How many were.
        Called now and then (turn_store.py), so the address cannot be handed to another
        allocation by another worker for long after its old socket closed."""
        n = 0
        for relayed in list(self.adopted):
            self.adopted.discard(relayed)
            if self._claim(relayed):
                n += 1
            else:
                self.adopted.add(relayed)
        return n

    def _claim(self, relayed: Address) -> bool:
        ip = self.ips.get(4 if ":" not in relayed[0] else 6)
        if ip is None or str(ipaddress.ip_address(ip)) != relayed[0]:
            return False  # not an address this worker hands out
        sock = self._bind(ip, relayed[1], count=False)
        if sock is None:
            return False
        self._install(relayed, sock)
        return True

    def _bind(self, ip: str, port: int = 0, *, count: bool = True) -> socket.socket | None:
        af = family_of(ip)
        sock = socket.socket(af, socket.SOCK_DGRAM)
        try:
            if af == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if not self.read:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's minimum
            sock.setblocking(False)
            try:
                sock.bind((ip, port))
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                sock.bind(("::" if af == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            sock.close()
            if count:
                self.counters.drop("turn-bind-failed")  # out of ports or descriptors: 508
            return None
        return sock

    def close(self, relayed: Address) -> None:
        self.adopted.discard(relayed)
        scope = self.scopes.pop(relayed, None)
        if scope is not None:
            scope.cancel()
        sock = self.socks.pop(relayed, None)
        if sock is not None:
            sock.close()

    def send(self, relayed: Address, peer: Address, data: memoryview) -> None:
        sock = self.socks.get(relayed)
        if sock is None:
            self.counters.drop("turn-peer-no-socket")  # adopted: only an identity here
            return
        try:
            sock.sendto(data, peer)
        except OSError:
            self.counters.drop("turn-peer-send-failed")
            return
        self.counters.add("turn_peer_sends")

    async def _reader(self, relayed: Address, sock: socket.socket,
                      scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await trio.lowlevel.wait_readable(sock)
                now = trio.current_time()
                for _ in range(PEER_BATCH):
                    try:
                        data, src = sock.recvfrom(65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        continue  # an ICMP error queued on the socket
                    if self.deliver is not None:
                        self.deliver(now, relayed, (src[0], src[1]), data)

    def close_all(self) -> None:
        for relayed in list(self.socks):
            self.close(relayed)


def raise_fd_limit(wanted: int) -> None:
    """One descriptor per allocation: ask for ``wanted`` more than in use (up to the hard
    limit) so the allocation cap, not EMFILE, is what refuses a client."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    goal = wanted + 1024
    if soft < goal and (hard == resource.RLIM_INFINITY or soft < hard):
        new = goal if hard == resource.RLIM_INFINITY else min(goal, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):  # pragma: no cover - a container that forbids it
            log.warning("relay: cannot raise the descriptor limit to %d for TURN", new)


class TurnGate:
    """The relay's TURN: :meth:`handle` for the core, :meth:`back` for the internal drain,
    :meth:`from_peer` for relayed sockets, :meth:`sweep` for housekeeping."""

    def __init__(self, core: RelayCore, settings: TurnSettings, own: Mapping[Address, Address],
                 ports: RelayPorts | RelaySockets, *, unix_offset: float = 0.0) -> None:
        self.core = core
        self.own = dict(own)
        self.ports = ports
        counters = core.counters
        self.server = TurnServer(settings.server_config(frozenset(own)), ports,
                                 unix_offset=unix_offset,
                                 counters=_RelayTally(counters))
        #: relayed address -> the own media address its client last sent to (the peer the
        #: transceiver's replies are wrapped as coming from)
        self.peer_of: dict[Address, Address] = {}
        self.sinks: Mapping[tuple[Transport, Address], ReturnSink] = core.sinks
        #: TURN STUN from clients without an allocation spends the worker-wide budget of
        #: STUN from unknown addresses before it is parsed (stun-overload), like ICE's
        self._unknown: Gcra = core._unknown_stun
        #: 5-tuples whose allocation this worker lacks (AllocationMissing): looked up in
        #: the cache by turn_store.serve_turn_lookups, woken by ``wanted``
        self.missing: dict[tuple[Address, Address], None] = {}
        self.wanted = trio.Event()
        #: write-ahead (turn_store.serve_turn_store sets it when it runs): the answer to a
        #: request that changed a UDP allocation is held until the change is written, so
        #: a kill never loses what a client was told it has (a channel bound a moment
        #: before would otherwise be gone, its audio dropped until the binding's refresh)
        self.saving = False
        #: answers held for the store: (answer, client, the public address it came to)
        self.held: list[tuple[bytes, Address, Address]] = []
        #: set when an answer is held: the store writes now, not at its next tick
        self.save_now = trio.Event()
        if isinstance(ports, RelaySockets):
            ports.deliver = self.from_peer
        core.attach_turn(self)

    # -- client -> server (RelayCore.handle_datagram) ------------------------------------

    def handle(self, now: float, client: Address, data: bytes | bytearray | memoryview,
               public: Address, transport: Transport) -> Flow | bytes | Relayed | None:
        c = self.core.counters
        srv = self.server
        if data[0] < 0x40 and (client, public) not in srv.allocations and \
                not self._unknown.allow(now):
            c.drop("stun-overload")
            return None
        srv.handle_input(now, data, client, public, stream=transport is Transport.TCP)
        result: Flow | bytes | Relayed | None = None
        while (out := srv.poll_output()) is not None:
            if type(out) is PeerData:
                result = self._to_peer(now, out)
            elif type(out) is Transmit:
                if out.dest == client and out.local == public and result is None:
                    result = out.data  # the answer: out of the socket it came in on
                else:
                    self._send(out)
            else:
                self._event(out)
        if isinstance(result, bytes) and self.saving and transport is Transport.UDP and \
                srv.unsaved(client, public):
            self.held.append((result, client, public))
            self.save_now.set()
            return None
        return result

    def release(self, n: int) -> None:
        """The store wrote (or failed to write: service comes first) what the first ``n``
        held answers' requests changed: they go to their clients now."""
        held, self.held = self.held[:n], self.held[n:]
        touched: list[ReturnSink] = []
        for data, client, public in held:
            sink = self.sinks.get((Transport.UDP, public))
            if sink is None:
                self.core.counters.drop("turn-no-sink")
                continue
            sink.pending.append((data, 0, 0, client))
            touched.append(sink)
        self._flush(touched)

    def _flush(self, touched: list[ReturnSink]) -> None:
        c = self.core.counters
        for sink in touched:
            if sink.pending:
                sent, nbytes, failed = sink.flush(_EMPTY, sink.pending)
                sink.pending.clear()
                c.packets_out += sent
                c.bytes_out += nbytes
                if failed:
                    c.drop("send-failed", failed)

    def _to_peer(self, now: float, out: PeerData) -> Relayed | bytes | None:
        public = self.own.get(out.peer)
        if public is None:
            # A peer inside --turn-peer (the server checked it): out of the relayed socket.
            send = getattr(self.ports, "send", None)
            if send is not None:
                send(out.relayed, out.peer, out.data)
            return None
        # Our own media address: route the payload as a datagram from the relayed address.
        self.peer_of[out.relayed] = out.peer
        self.core.counters.add("turn_relayed_in")
        res = self.core.handle_datagram(now, out.relayed, out.data, public, TURN_HOP)
        if isinstance(res, Flow):
            return Relayed(res, out.offset, len(out.data))
        if isinstance(res, bytes):
            # A reflexive STUN answer to the relayed address: wrapped for the TURN client.
            self.server.from_peer(now, out.relayed, out.peer, res)
            tx = self.server.poll_output()
            return tx.data if isinstance(tx, Transmit) else None
        return None

    def _sink(self, out: Transmit) -> ReturnSink | None:
        # A TCP client's address is a StreamAddr (relay/tcp.py): its sink is its listener's.
        tp = Transport.TCP if isinstance(out.dest, StreamAddr) else Transport.UDP
        return self.sinks.get((tp, out.local))

    def _send(self, out: Transmit) -> None:
        sink = self._sink(out)
        if sink is None:
            self.core.counters.drop("turn-no-sink")
            return
        sink.pending.append((out.data, 0, 0, out.dest))

    def _event(self, out: object) -> None:
        if isinstance(out, AllocationEnded):
            self.peer_of.pop(out.relayed, None)
            flow = self.core.flows.pop(out.relayed, None)  # its transceiver flow ends too
            if flow is not None:
                self.core.counters.flows_expired += 1
            close = getattr(self.ports, "close", None)
            if close is not None:
                close(out.relayed)
        elif isinstance(out, AllocationCreated):
            log.debug("relay: TURN allocation %s", out.relayed)
        elif isinstance(out, AllocationMissing):
            self.missing[(out.client, out.local)] = None
            self.wanted.set()

    # -- transceiver -> client (fastpath's internal drain) ---------------------------------

    def back(self, now: float, flow: Flow, buf: memoryview, q: int, size: int) -> None:
        """The transceiver's datagram ``buf[q:q+size]`` to ``flow`` (whose client is a
        relayed address): to the TURN client, as ChannelData with the payload left where it
        is, or as a Data indication (queued on the public socket's sink; the drain flushes)."""
        relayed = flow.client
        peer = self.peer_of.get(relayed)
        if peer is None:
            self.core.counters.drop("turn-no-allocation")
            return
        srv = self.server
        fast = srv.channel_header(now, relayed, peer, size)
        if fast is not None:
            alloc, header = fast
            sink = self.sinks.get((Transport.UDP, alloc.local))
            if sink is not None:
                self.core.counters.add("turn_relayed_out")
                sink.pending.append((header, q, size, alloc.client))
            return
        srv.from_peer(now, relayed, peer, buf[q : q + size])
        while (out := srv.poll_output()) is not None:
            if type(out) is Transmit:
                self.core.counters.add("turn_relayed_out")
                self._send(out)
            else:
                self._event(out)

    # -- peer -> client (relayed sockets) ----------------------------------------------------

    def from_peer(self, now: float, relayed: Address, peer: Address, data: bytes) -> None:
        """A peer's datagram on a relayed socket: to its TURN client, sent at once."""
        srv = self.server
        srv.from_peer(now, relayed, peer, data)
        touched: list[ReturnSink] = []
        while (out := srv.poll_output()) is not None:
            if type(out) is Transmit:
                sink = self._sink(out)
                if sink is not None:
                    sink.pending.append((out.data, 0, 0, out.dest))
                    touched.append(sink)
            else:
                self._event(out)
        self._flush(touched)

    # -- TCP connections (relay/tcp.py) ------------------------------------------------------

    def has_allocation(self, client: Address, public: Address) -> bool:
        return (client, public) in self.server.allocations

    def closed(self, now: float, client: Address, public: Address) -> None:
        """A TURN-over-TCP connection ended: so does its allocation."""
        self.server.close(now, client, public)
        while (out := self.server.poll_output()) is not None:
            if type(out) is not Transmit:
                self._event(out)

    def keep(self, client: Address, public: Address) -> bytes | None:
        """A TURN/TCP connection goes to the keeper (relay/keeper.py): its allocation's
        record, which then follows its changes (:meth:`poll_kept`)."""
        return self.server.keep(client, public)

    def poll_kept(self) -> list[tuple[Address, Address, bytes | None]]:
        return self.server.poll_kept_changes()

    def adopt_stream(self, now: float, record: bytes, client: Address) -> bool:
        """A TURN/TCP connection adopted from the keeper after a worker kill: re-create its
        allocation from the record that came with it (the relayed port is claimed back);
        False when it cannot be (counted ``turn-import-*``)."""
        ok = self.server.import_allocation(now, record, client=client)
        while (out := self.server.poll_output()) is not None:
            if type(out) is not Transmit:
                self._event(out)
        return ok

    # -- a worker restart (turn_store.py) -------------------------------------------------

    def restore(self, now: float, records: Sequence[bytes]) -> int:
        """Re-create the allocations of these cache records (written by the worker this one
        replaces); how many were. Bad records are dropped and counted by the server."""
        n = 0
        for record in records:
            n += self.server.import_allocation(now, record)
        while (out := self.server.poll_output()) is not None:
            self._event(out)
        return n

    def adopt(self, now: float, keys: Sequence[tuple[Address, Address]],
              records: Sequence[bytes]) -> int:
        """The cache's answer to a lookup of ``keys`` (5-tuples this worker lacked): the
        records of those 5-tuples, written by any worker, are imported as moved
        allocations — the freshest record of a 5-tuple wins (the worker a client left
        keeps its copy until it expires) — and every key's lookup ends. How many were
        imported. A record is parsed here only to pick; the server checks it again."""
        wanted = set(keys)
        best: dict[tuple[Address, Address], tuple[float, bytes]] = {}
        for record in records:
            try:
                rec = parse_record_untrusted(record)
            except TurnError:
                self.core.counters.drop("turn-import-corrupt")
                continue
            key = (rec.client, rec.local)
            if key in wanted and (key not in best or rec.expires > best[key][0]):
                best[key] = (rec.expires, record)
        srv = self.server
        n = 0
        for _, record in best.values():
            n += srv.import_allocation(now, record, moved=True)
        for client, local in keys:
            srv.looked_up(now, client, local)
        while (out := srv.poll_output()) is not None:
            if type(out) is not Transmit:
                self._event(out)
        if n:
            log.info("relay: %d TURN allocations of clients moved here taken over", n)
        return n

    # -- time -------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        return self.server.poll_timeout()

    def sweep(self, now: float) -> None:
        """Expire allocations (their sockets close, their flows end)."""
        srv = self.server
        srv.handle_timeout(now)
        while (out := srv.poll_output()) is not None:
            if type(out) is Transmit:
                self._send(out)  # pragma: no cover - timeouts send nothing today
            else:
                self._event(out)


_EMPTY = bytearray(1)


class _RelayTally(TurnCounters):
    """The TURN server's counters written straight into the relay's: ``stats`` reports them
    with every other counter (``turn_*``) and drop (``turn-*``), and merged_stats sums them
    over workers like the rest."""

    def __init__(self, counters: Counters) -> None:
        super().__init__()
        self._c = counters

    def add(self, name: str, n: int = 1) -> None:
        self._c.add(name, n)

    def drop(self, reason: str, n: int = 1) -> None:
        self._c.drop(reason, n)
