"""A TURN server (RFC 8656) as a sans-IO core, built on the one STUN codec.

Implemented: §7 Allocate (with §7.2's checks: REQUESTED-TRANSPORT UDP only, REQUESTED-
ADDRESS-FAMILY, ADDITIONAL-ADDRESS-FAMILY answered with ADDRESS-ERROR-CODE 440, DONT-FRAGMENT
accepted, EVEN-PORT honoured without a reservation, EVEN-PORT with R and RESERVATION-TOKEN
refused 508), §8 Refresh (lifetime 0 deletes),
§9 permissions (per peer IP, 300 s), §10 CreatePermission, §11 Send and Data indications,
§12 channels (ChannelBind, 600 s bindings, the 5-minute rebinding rule of §12, ChannelData
both ways, padded on streams), long-term credentials (RFC 8489 §9.2) in the TURN REST API
form (:mod:`.credentials`) with MESSAGE-INTEGRITY or MESSAGE-INTEGRITY-SHA256 and
PASSWORD-ALGORITHM MD5 or SHA-256 (§9.2.4, offered with the nonce cookie when it fits),
nonces with expiry (438 Stale Nonce), FINGERPRINT echoed on responses.

Deliberately omitted: TCP allocations (RFC 6062 Connect/ConnectionBind), dual allocations
(one family per allocation: an ADDITIONAL-ADDRESS-FAMILY request gets ADDRESS-ERROR-CODE),
reservations (508), USERHASH (no username anonymity is offered), ICMP
attributes (the shell does not read ICMP errors), port reservations (EVEN-PORT's R bit,
RESERVATION-TOKEN: 508), the 40-second response cache of RFC 8489
§6.3.4 (Allocate retransmissions are recognised by transaction id, §7.2; Refresh,
CreatePermission and ChannelBind are idempotent).

Verbs (docs/style.md rule 18)::

    handle_input(now, data, addr, local=..., stream=False)   a datagram (or, on TCP/TLS,
                                                             one framed message) from a client
    from_peer(now, relayed, peer, data)                      a datagram from a peer arrived
                                                             at an allocation's relayed address
    poll_output() -> Transmit | PeerData | AllocationCreated | AllocationEnded | None
    poll_timeout() / handle_timeout(now)                     allocation expiry
    poll_changes() / import_allocation(now, record)          UDP allocations to and from
                                                             the flow cache (.snapshot)
    looked_up(now, client, local)                            a lookup asked by
                                                             AllocationMissing is over

``now`` is any monotonic clock in seconds; ``unix_offset`` turns it into Unix time for the
REST credentials' expiry and the nonces. The relayed addresses come from the shell through an
injected :class:`RelayPorts` (``bind`` has to answer synchronously: the success response
names the address), and go back with :class:`AllocationEnded`.

What is answered, and to whom (the server's whole attack surface)::

    input                                         action
    ChannelData / Send indication without an      drop, counted (turn-no-allocation,
      allocation, channel, permission, or to a     turn-channel-unbound, turn-no-permission,
      peer we do not relay to                      turn-peer-forbidden); with no allocation
                                                   and look_up_misses, first an
                                                   AllocationMissing (one per 5-tuple in
                                                   flight, at most max_lookups)
    request without MESSAGE-INTEGRITY             401 + REALM + NONCE    ┐ unauthenticated:
    request with a stale or foreign NONCE         438 + REALM + NONCE    │ each costs a token
    malformed auth attributes                     400                    │ of the source IP's
    unknown comprehension-required attribute      420                    │ bucket, and is sent
    bad credential, expired REST username,        401 + REALM + NONCE    │ only if it is at most
      wrong realm, failed integrity                                      ┘ len(request) + 32
    authenticated request                         answered in full, signed with the same
                                                  integrity attribute(s) the request used

No amplification (DESIGN.md): every answer to an unauthenticated request is at most
``len(request) + amplification`` bytes (32, the relay's reflexive-answer bound); a 401 that
would be larger is not sent (``turn-amplification``). Chromium's first Allocate is 28 bytes,
so the 401 must fit in 60: 20 (header) + 8 (ERROR-CODE, no reason phrase) + 16 (NONCE, 12
characters) + REALM (at most 12 characters). Bigger requests also get PASSWORD-ALGORITHMS and
the nonce cookie. "Never larger than the request" cannot be kept by any TURN server that
challenges a 28-byte request: no 401 fits in 28 bytes.

No open relay: a peer is relayed to only if it is one of the appliance's own media addresses
(``own``, exact ip:port) or inside an operator's ``peers`` CIDR; permissions are granted for
the same IPs (a permission for our own IP does not open its other ports: a Send or ChannelBind
to them is refused); multicast, unspecified, broadcast and IPv4-mapped IPv6 peers never are.

Bounded state: allocations are capped in total, per source IP and per username; permissions
and channels per allocation; the unauthenticated-answer buckets per source IP (LRU). Nonces
are stateless.
"""

from __future__ import annotations

import heapq
import ipaddress
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from appliance.proto.ratelimit import Gcra, TokenBuckets
from appliance.proto.stun import (
    Addr,
    AttrType,
    AttrValue,
    Class,
    Message,
    Method,
    PasswordAlgorithm,
    StunError,
    encode_password_algorithms,
    find_attribute,
    long_term_key,
    parse_password_algorithm_untrusted,
    verify_integrity,
    verify_integrity_sha256,
)

from .channel import (
    CHANNEL_MAX,
    CHANNEL_MIN,
    encode_channel_data,
    parse_channel_data_untrusted,
)
from .credentials import NonceCodec, parse_rest_username_untrusted, rest_password
from .errors import TurnError
from .snapshot import AllocationRecord, encode_record, parse_record_untrusted

__all__ = [
    "PERMISSION_LIFETIME",
    "CHANNEL_LIFETIME",
    "AllocationCreated",
    "AllocationEnded",
    "PeerData",
    "ReclaimPorts",
    "RelayPorts",
    "Transmit",
    "TurnConfig",
    "TurnCounters",
    "TurnServer",
    "address_error_code",
]

#: RFC 8656 §9: a permission lasts 300 s unless refreshed.
PERMISSION_LIFETIME = 300.0
#: RFC 8656 §12: a channel binding lasts 600 s unless refreshed, and its number and peer
#: stay reserved for 300 s after it expires.
CHANNEL_LIFETIME = 600.0
CHANNEL_COOLDOWN = 300.0
#: RFC 8656 §3.7 / §18.8: the only transport we relay, UDP.
UDP = 17
FAMILY_V4 = 0x01
FAMILY_V6 = 0x02

#: Reason phrases of the errors an *authenticated* request can get (RFC 8489 §14.8,
#: RFC 8656 §18); unauthenticated errors carry none, to stay inside the amplification bound.
REASONS: Mapping[int, str] = {
    400: "Bad Request",
    403: "Forbidden",
    420: "Unknown Attribute",
    437: "Allocation Mismatch",
    440: "Address Family not Supported",
    441: "Wrong Credentials",
    442: "Unsupported Transport Protocol",
    443: "Peer Address Family Mismatch",
    486: "Allocation Quota Reached",
    508: "Insufficient Capacity",
}

#: What the server offers in PASSWORD-ALGORITHMS (SHA-256 first: preferred), as sent.
OFFERED_ALGORITHMS = (PasswordAlgorithm.SHA256, PasswordAlgorithm.MD5)
_OFFERED = encode_password_algorithms(OFFERED_ALGORITHMS)

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


# --- outputs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send ``data`` to the client at ``dest``, from ``local`` (the address it talks to)."""

    dest: Addr
    data: bytes
    local: Addr


@dataclass(frozen=True, slots=True, eq=False)
class PeerData:
    """Relay ``data`` from the allocation at ``relayed`` to ``peer``. ``data`` is a view of
    the input, ``data == input[offset:offset + len(data)]`` — valid until the next
    ``handle_input``, so a shell can send it without a copy."""

    relayed: Addr
    peer: Addr
    data: memoryview
    offset: int


@dataclass(frozen=True, slots=True)
class AllocationCreated:
    """An allocation now owns ``relayed`` for the client ``client`` (on ``local``)."""

    relayed: Addr
    client: Addr
    local: Addr


@dataclass(frozen=True, slots=True)
class AllocationEnded:
    """The allocation at ``relayed`` is gone (``reason``: ``expired``, ``deleted``,
    ``closed`` — its TCP connection ended): the shell releases the address."""

    relayed: Addr
    client: Addr
    reason: str


@dataclass(frozen=True, slots=True)
class AllocationMissing:
    """A UDP client sent what needs an allocation (ChannelData, a Send indication, an
    authenticated Refresh, CreatePermission or ChannelBind) and this server has none for
    its 5-tuple — with :attr:`TurnServer.look_up_misses`, the shell's cue to look for it in
    the flow cache: another relay worker made it and the ``SO_REUSEPORT`` hash moved the
    client here. The shell imports what it finds (``import_allocation(..., moved=True)``)
    and then calls :meth:`TurnServer.looked_up`. Until then the client's datagrams are
    dropped (``turn-lookup-pending``) and its requests left unanswered (it retransmits),
    not refused with 437 (which would end its allocation in its own eyes)."""

    client: Addr
    local: Addr


Output: TypeAlias = (Transmit | PeerData | AllocationCreated | AllocationEnded
                     | AllocationMissing)


class RelayPorts(Protocol):
    """The shell's relayed addresses: ``bind`` one of ``family`` (1 IPv4, 2 IPv6) for
    ``client`` now — on an even port with ``even`` (EVEN-PORT, RFC 8656 §7.2) — or None when
    there is none; released when :class:`AllocationEnded` names it."""

    def bind(self, family: int, client: Addr, even: bool = False) -> Addr | None: ...


class ReclaimPorts(RelayPorts, Protocol):
    """Ports that can also take back one exact relayed address (``claim``: True when it is
    now ours), for allocations imported from the cache after a worker restart, or hold it as
    an identity (``adopt``)."""

    def claim(self, relayed: Addr) -> bool: ...

    def adopt(self, relayed: Addr) -> bool:
        """Take ``relayed`` as an identity without its socket (another live worker holds
        it: a moved client's allocation, ``import_allocation(moved=True)``); the shell
        hands it to no other allocation and takes the socket when it is free."""
        ...


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """Everything the server decides by. ``secrets`` are the REST API shared secrets (all
    verify); ``nonce_key`` keys the nonces (shared by workers so a nonce survives a worker
    restart); ``own`` are the appliance's own media addresses (always relayed to, exact
    ip:port, canonical IP text); ``peers`` the operator's extra allowed peer networks."""

    secrets: tuple[bytes, ...]
    nonce_key: bytes
    realm: str = "appliance"
    own: frozenset[Addr] = frozenset()
    peers: tuple[Network, ...] = ()
    nonce_lifetime: float = 600.0
    #: RFC 8656 §3.9: 10 minutes by default; we cap what a client may ask for.
    default_lifetime: int = 600
    max_lifetime: int = 3600
    max_allocations: int = 2000
    max_per_source: int = 16
    max_per_username: int = 8
    max_permissions: int = 16
    max_channels: int = 16
    #: unauthenticated answers (challenges, errors) per source IP: rate/s and burst
    unauth_rate: float = 20.0
    unauth_burst: float = 40.0
    max_sources: int = 65_536
    #: an answer to an unauthenticated request is at most len(request) + this
    amplification: int = 32
    #: cache lookups for missing allocations (AllocationMissing) in flight at most; one not
    #: answered within lookup_wait is given up; a 5-tuple found in no cache is not asked
    #: about again for absent_for seconds
    max_lookups: int = 1024
    lookup_wait: float = 2.0
    absent_for: float = 1.0
    #: new lookups per second and burst: every client of a killed worker at once fits the
    #: burst; ChannelData from made-up sources costs at most the rate (turn-lookup-rate)
    lookup_rate: float = 500.0
    lookup_burst: float = 2000.0
    #: offer PASSWORD-ALGORITHMS (SHA-256, MD5) with the nonce cookie when the 401 fits
    offer_sha256: bool = True

    def __post_init__(self) -> None:
        if not self.secrets or not all(self.secrets):
            raise ValueError("TURN needs at least one non-empty shared secret")
        if not 1 <= len(self.realm.encode()) <= 12 or not self.realm.isprintable():
            # 12: the largest REALM with which a 401 to Chromium's 28-byte Allocate still
            # fits the amplification bound (module docstring).
            raise ValueError("the TURN realm is 1-12 printable characters")
        if not 0 < self.default_lifetime <= self.max_lifetime:
            raise ValueError("0 < default lifetime <= max lifetime")
        if min(self.max_allocations, self.max_per_source, self.max_per_username,
               self.max_permissions, self.max_channels) < 1:
            raise ValueError("TURN quotas must be >= 1")


# --- state --------------------------------------------------------------------------------


class Channel:
    """A channel binding (RFC 8656 §12): bound until ``expires``, reserved (number and peer)
    until ``expires + CHANNEL_COOLDOWN``."""

    __slots__ = ("expires", "header", "number", "peer")

    def __init__(self, number: int, peer: Addr, expires: float) -> None:
        self.number = number
        self.peer = peer
        self.expires = expires
        self.header = number.to_bytes(2, "big")


class Allocation:
    """One allocation: the 5-tuple (``client`` + ``local``, and the transport) it belongs
    to, its relayed address and what it may reach. Mutable; owned by the server."""

    __slots__ = ("by_peer", "channels", "client", "expires", "family", "kept", "local",
                 "permissions", "relayed", "stream", "tid", "username")

    def __init__(self, client: Addr, local: Addr, relayed: Addr, family: int, username: str,
                 tid: bytes, expires: float, stream: bool) -> None:
        self.client = client
        self.local = local
        self.relayed = relayed
        self.family = family
        self.username = username
        #: transaction id of the Allocate that made it: a retransmission is answered again
        #: (RFC 8656 §7.2 item 2), any other Allocate on the 5-tuple gets 437
        self.tid = tid
        self.expires = expires
        #: TCP/TLS client: ChannelData to it is padded to 4 bytes (§12.5)
        self.stream = stream
        #: a TCP allocation whose connection a keeper holds a copy of (:meth:`TurnServer.keep`):
        #: its changes are reported by poll_kept_changes, so its record follows the connection
        self.kept = False
        #: peer IP (canonical text) -> expiry
        self.permissions: dict[str, float] = {}
        self.channels: dict[int, Channel] = {}
        self.by_peer: dict[Addr, Channel] = {}

    def permitted(self, ip: str, now: float) -> bool:
        return self.permissions.get(ip, -1.0) > now

    def prune(self, now: float) -> None:
        """Forget expired permissions and channels past their cooldown (lazily: an expired
        entry already behaves as absent where it matters)."""
        for ip in [ip for ip, t in self.permissions.items() if t <= now]:
            del self.permissions[ip]
        for ch in [c for c in self.channels.values() if c.expires + CHANNEL_COOLDOWN <= now]:
            del self.channels[ch.number]
            del self.by_peer[ch.peer]


@dataclass(slots=True)
class Auth:
    """An authenticated request: who, and how to sign the answer."""

    username: str
    key: bytes
    integrity: str  # "sha1" or "sha256", as the request was signed


@dataclass(slots=True)
class TurnCounters:
    """What the server counts, for a shell to export: events by name and drops by reason
    (every reason starts ``turn-``)."""

    counts: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n


def _canonical_addr(addr: Addr) -> Addr | None:
    ip = _canonical_ip(addr[0])
    return None if ip is None else (str(ip), addr[1])


def _canonical_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class TurnServer:
    """The TURN server of the module docstring."""

    def __init__(self, config: TurnConfig, ports: RelayPorts, *, unix_offset: float = 0.0,
                 counters: TurnCounters | None = None) -> None:
        self.config = config
        self.ports = ports
        #: Unix time = now + unix_offset (credentials' expiry and nonces)
        self.unix_offset = unix_offset
        self.counters = counters if counters is not None else TurnCounters()
        self.nonces = NonceCodec(config.nonce_key, config.nonce_lifetime)
        self._own_ips = frozenset(ip for ip, _ in config.own)
        #: (client, local) -> allocation; relayed -> allocation
        self.allocations: dict[tuple[Addr, Addr], Allocation] = {}
        self.by_relayed: dict[Addr, Allocation] = {}
        self._per_source: dict[str, int] = {}
        self._per_user: dict[str, int] = {}
        self._unauth: TokenBuckets[str] = TokenBuckets(
            config.unauth_rate, config.unauth_burst, config.max_sources)
        #: (expires, seq, allocation): lazily invalidated (a refreshed allocation pushes a
        #: new entry; an entry whose expiry no longer matches is skipped)
        self._heap: list[tuple[float, int, Allocation]] = []
        self._seq = 0
        self._transmits: deque[Transmit | PeerData] = deque()
        self._events: deque[AllocationCreated | AllocationEnded | AllocationMissing] = deque()
        #: UDP allocations changed (made, refreshed, permissions, channels) or ended since
        #: the last poll_changes, by relayed address: what the shell writes to its cache
        self._changed: dict[Addr, Allocation | None] = {}
        #: kept TCP allocations changed or ended since the last poll_kept_changes, by
        #: 5-tuple: what the shell sends its keeper with the connection's record
        self._kept_changed: dict[tuple[Addr, Addr], Allocation | None] = {}
        #: AllocationMissing is emitted only when a shell answers it (it has a cache)
        self.look_up_misses = False
        #: 5-tuples asked about (-> when), and found in no cache (-> until when)
        self._lookups: dict[tuple[Addr, Addr], float] = {}
        self._absent: dict[tuple[Addr, Addr], float] = {}
        self._lookup_budget = Gcra(config.lookup_rate, config.lookup_burst)
        # (class, method) -> handler: every request and indication a client may send.
        self._handlers = {
            (Class.REQUEST, Method.ALLOCATE): self._allocate,
            (Class.REQUEST, Method.REFRESH): self._refresh,
            (Class.REQUEST, Method.CREATE_PERMISSION): self._create_permission,
            (Class.REQUEST, Method.CHANNEL_BIND): self._channel_bind,
        }

    # -- the verbs -----------------------------------------------------------------------

    def handle_input(self, now: float, data: bytes | bytearray | memoryview, addr: Addr,
                     local: Addr = ("", 0), stream: bool = False) -> None:
        """One datagram (or one message of a TCP/TLS stream, ``stream=True``) from the
        client at ``addr`` to our ``local`` address. Never raises for peer bytes."""
        if not data:
            self.counters.drop("turn-empty")
            return
        top = data[0] >> 6
        if top == 1:
            self._channel_data(now, data, addr, local, stream)
        elif top == 0:
            self._stun(now, data, addr, local, stream)
        else:
            self.counters.drop("turn-not-turn")

    def poll_output(self) -> Output | None:
        """The next output — transmits (:class:`Transmit`, :class:`PeerData`) first, then
        events — or None when drained."""
        if self._transmits:
            return self._transmits.popleft()
        if self._events:
            return self._events.popleft()
        return None

    def poll_timeout(self) -> float | None:
        """When the next allocation expires (None without allocations)."""
        heap = self._heap
        while heap and (heap[0][2].expires != heap[0][0]
                        or self.by_relayed.get(heap[0][2].relayed) is not heap[0][2]):
            heapq.heappop(heap)  # refreshed or deleted since
        return heap[0][0] if heap else None

    def handle_timeout(self, now: float) -> None:
        """Delete the allocations whose lifetime ran out (RFC 8656 §8: no Refresh in time)."""
        while (deadline := self.poll_timeout()) is not None and deadline <= now:
            _, _, alloc = heapq.heappop(self._heap)
            self._delete(alloc, "expired")

    def from_peer(self, now: float, relayed: Addr, peer: Addr,
                  data: bytes | bytearray | memoryview) -> None:
        """A datagram from ``peer`` arrived at ``relayed``: to the client as ChannelData if a
        channel is bound to ``peer``, else as a Data indication, if a permission for the
        peer's IP exists (RFC 8656 §9, §11.3, §12.7); otherwise dropped and counted."""
        alloc = self.by_relayed.get(relayed)
        if alloc is None:
            self.counters.drop("turn-no-allocation")
            return
        if not alloc.permitted(peer[0], now):
            self.counters.drop("turn-no-permission")
            return
        ch = alloc.by_peer.get(peer)
        if ch is not None and ch.expires > now:
            out = encode_channel_data(ch.number, data, pad=alloc.stream)
        else:
            if len(data) > 0xFFFF - 64:
                self.counters.drop("turn-too-long")
                return
            out = Message(Method.DATA, Class.INDICATION, _tid(self._seq_next()), (
                (AttrType.XOR_PEER_ADDRESS, peer), (AttrType.DATA, bytes(data)),
            )).encode(fingerprint=False)
        self.counters.add("turn_packets_from_peer")
        self._transmits.append(Transmit(alloc.client, out, alloc.local))

    def close(self, now: float, addr: Addr, local: Addr = ("", 0)) -> None:
        """The TCP/TLS connection from ``addr`` to ``local`` closed: its allocation goes with
        it (RFC 8656 §3.1: a TCP-carried allocation lives as long as its connection)."""
        alloc = self.allocations.get((addr, local))
        if alloc is not None:
            self._delete(alloc, "closed")

    def channel_header(self, now: float, relayed: Addr, peer: Addr, length: int) -> tuple[
            Allocation, bytes] | None:
        """The fast spelling of :meth:`from_peer` for a shell that sends header and payload
        as two pieces (the relay's return path, no copy of the payload): ``(allocation,
        ChannelData header)`` when a channel to ``peer`` is bound and permitted and the
        client is on UDP (no padding to add), else None — then call :meth:`from_peer`."""
        alloc = self.by_relayed.get(relayed)
        if alloc is None or alloc.stream or not alloc.permitted(peer[0], now):
            return None
        ch = alloc.by_peer.get(peer)
        if ch is None or ch.expires <= now:
            return None
        self.counters.add("turn_packets_from_peer")
        return alloc, ch.header + length.to_bytes(2, "big")

    # -- surviving a worker restart (.snapshot) ---------------------------------------------

    def _mark(self, alloc: Allocation) -> None:
        if not alloc.stream:
            self._changed[alloc.relayed] = alloc
        elif alloc.kept:  # its record travels with its connection, not through the cache
            self._kept_changed[(alloc.client, alloc.local)] = alloc

    def keep(self, addr: Addr, local: Addr) -> bytes | None:
        """The TCP connection from ``addr`` to ``local`` is handed to a keeper (a copy of it
        outlives this process): its allocation's record, Unix times, and from now on its
        changes through :meth:`poll_kept_changes`. None without an allocation."""
        alloc = self.allocations.get((addr, local))
        if alloc is None or not alloc.stream:
            return None
        alloc.kept = True
        self._kept_changed.pop((addr, local), None)
        return self.export_allocation(alloc)

    def poll_kept_changes(self) -> list[tuple[Addr, Addr, bytes | None]]:
        """Kept TCP allocations changed (Refresh, permissions, channels) or ended since the
        last call: ``(client, local, record or None when it ended)``."""
        if not self._kept_changed:
            return []
        out: list[tuple[Addr, Addr, bytes | None]] = []
        for (client, local), alloc in self._kept_changed.items():
            if alloc is None or self.allocations.get((client, local)) is not alloc:
                out.append((client, local, None))
            else:
                out.append((client, local, self.export_allocation(alloc)))
        self._kept_changed.clear()
        return out

    def export_allocation(self, alloc: Allocation) -> bytes:
        """``alloc`` as a cache record (:mod:`.snapshot`): no secret, no key, Unix times."""
        off = self.unix_offset
        return encode_record(AllocationRecord(
            client=alloc.client, local=alloc.local, relayed=alloc.relayed,
            family=alloc.family, username=alloc.username, tid=alloc.tid,
            expires=alloc.expires + off,
            permissions=tuple((ip, t + off) for ip, t in alloc.permissions.items()),
            channels=tuple((ch.number, ch.peer, ch.expires + off)
                           for ch in alloc.channels.values()),
            stream=alloc.stream))

    def unsaved(self, addr: Addr, local: Addr) -> bool:
        """Whether the UDP allocation of ``addr`` at ``local`` changed since the last
        :meth:`poll_changes` (the shell holds its answer until the change is written:
        relay/turn_store.py)."""
        alloc = self.allocations.get((addr, local))
        return alloc is not None and not alloc.stream and \
            self._changed.get(alloc.relayed) is alloc

    def poll_changes(self) -> list[tuple[Addr, bytes | None, float]]:
        """The UDP allocations changed or ended since the last call, as ``(relayed, record
        or None when it ended, seconds it has left)``: the shell writes or deletes them."""
        if not self._changed:
            return []
        out: list[tuple[Addr, bytes | None, float]] = []
        for relayed, alloc in self._changed.items():
            if alloc is None or self.by_relayed.get(relayed) is not alloc:
                out.append((relayed, None, 0.0))
            else:
                out.append((relayed, self.export_allocation(alloc), alloc.expires))
        self._changed.clear()
        return out

    def import_allocation(self, now: float, data: bytes | bytearray | memoryview, *,
                          moved: bool = False, client: Addr | None = None) -> bool:
        """Re-create the allocation of a cache record (written by a worker that died), so the
        client's next ChannelData or Send is relayed with no new Allocate. The record is
        untrusted: a corrupt one, one past its expiry, one beyond this server's caps or
        whose 5-tuple or relayed address is taken is dropped and counted (``turn-import-*``),
        never raised. The relayed address must be :meth:`ReclaimPorts.claim`-ed back.

        ``moved``: the record answers an :class:`AllocationMissing` — its client is sending
        to this worker now, and the worker that made the allocation may still be alive and
        hold the relayed socket. If the address cannot be claimed it is
        :meth:`ReclaimPorts.adopt`-ed instead: an identity, which is all an allocation
        whose peer is our own media address needs (data to it is routed in-process);
        data to a peer beyond it needs the socket (the shell drops and counts it).

        ``client``: the record came with a TCP connection the shell adopted (its keeper's
        copy, after a kill): the connection's client address, which a TCP record must name
        (the allocation is keyed by it, and kept). A TCP record without one, or a UDP
        record with one, is dropped (``turn-import-stream``)."""
        c = self.counters
        try:
            rec = parse_record_untrusted(data)
        except TurnError:
            c.drop("turn-import-corrupt")
            return False
        if rec.stream != (client is not None) or (
                client is not None and _canonical_addr(client) != rec.client):
            c.drop("turn-import-stream")
            return False
        off = self.unix_offset
        expires = rec.expires - off
        cfg = self.config
        if expires <= now:
            c.drop("turn-import-expired")
            return False
        if expires > now + cfg.max_lifetime or len(rec.permissions) > cfg.max_permissions \
                or len(rec.channels) > cfg.max_channels:
            c.drop("turn-import-corrupt")  # no server of ours writes that
            return False
        # No open relay through the cache either: what the record permits must be what this
        # server would permit (a cache written under other --turn-peer networks included).
        for ip_text, _ in rec.permissions:
            # canonical already (.snapshot)
            if not self._ip_allowed(ipaddress.ip_address(ip_text), rec.family):
                c.drop("turn-import-forbidden")
                return False
        if not all(self._peer_allowed(peer, rec.family) for _, peer, _ in rec.channels):
            c.drop("turn-import-forbidden")
            return False
        key = (rec.client if client is None else client, rec.local)
        if key in self.allocations or rec.relayed in self.by_relayed:
            c.drop("turn-import-exists")
            return False
        if len(self.allocations) >= cfg.max_allocations or \
                self._per_user.get(rec.username, 0) >= cfg.max_per_username or \
                self._per_source.get(rec.client[0], 0) >= cfg.max_per_source:
            c.drop("turn-import-quota")
            return False
        claim = getattr(self.ports, "claim", None)
        adopt = getattr(self.ports, "adopt", None)
        if claim is None or not claim(rec.relayed):
            if not moved or adopt is None or not adopt(rec.relayed):
                c.drop("turn-import-port-taken")  # another allocation has it now
                return False
            c.add("turn_allocations_adopted")
        alloc = Allocation(rec.client if client is None else client, rec.local, rec.relayed,
                           rec.family, rec.username, rec.tid, expires, rec.stream)
        alloc.kept = rec.stream
        for peer_ip, t in rec.permissions:
            alloc.permissions[peer_ip] = t - off
        for number, peer, t in rec.channels:
            ch = Channel(number, peer, t - off)
            alloc.channels[number] = ch
            alloc.by_peer[peer] = ch
        alloc.prune(now)
        self.allocations[key] = alloc
        self.by_relayed[rec.relayed] = alloc
        self._per_user[rec.username] = self._per_user.get(rec.username, 0) + 1
        self._per_source[rec.client[0]] = self._per_source.get(rec.client[0], 0) + 1
        self._schedule(alloc)
        self._mark(alloc)  # this worker is its keeper now: written under its own name
        self._lookups.pop(key, None)
        self._absent.pop(key, None)
        c.add("turn_allocations_imported")
        self._events.append(AllocationCreated(rec.relayed, alloc.client, rec.local))
        return True

    def looked_up(self, now: float, client: Addr, local: Addr) -> None:
        """The shell's lookup for an :class:`AllocationMissing` is over (what it found, if
        anything, was imported first): a 5-tuple still without an allocation is treated as
        having none for ``absent_for`` seconds (its requests get 437, as they would have)."""
        key = (client, local)
        if self._lookups.pop(key, None) is not None and key not in self.allocations:
            self._set_absent(key, now)

    def _set_absent(self, key: tuple[Addr, Addr], now: float) -> None:
        absent = self._absent
        absent.pop(key, None)
        while len(absent) >= self.config.max_lookups:  # bounded: the oldest go first
            del absent[next(iter(absent))]
        absent[key] = now + self.config.absent_for

    def _missing(self, now: float, addr: Addr, local: Addr, stream: bool) -> bool:
        """No allocation for this 5-tuple: True while a cache lookup for it is in flight
        (asked now, or earlier) — the caller drops the input unanswered — else False, and
        the caller does what it always did (drop and count, or 437)."""
        if stream or not self.look_up_misses:
            return False  # a TCP/TLS allocation never moves: it dies with its connection
        key = (addr, local)
        cfg = self.config
        asked = self._lookups.get(key)
        if asked is not None:
            if now - asked < cfg.lookup_wait:
                self.counters.drop("turn-lookup-pending")
                return True
            del self._lookups[key]  # the shell never answered: given up
            self._set_absent(key, now)
            return False
        until = self._absent.get(key)
        if until is not None:
            if until > now:
                return False
            del self._absent[key]
        if len(self._lookups) >= cfg.max_lookups:
            self.counters.drop("turn-lookup-overflow")
            return False
        if not self._lookup_budget.allow(now):
            self.counters.drop("turn-lookup-rate")
            return False
        self._lookups[key] = now
        self._events.append(AllocationMissing(addr, local))
        self.counters.add("turn_lookups")
        self.counters.drop("turn-lookup-pending")
        return True

    # -- client -> peer data ---------------------------------------------------------------

    def _channel_data(self, now: float, data: bytes | bytearray | memoryview, addr: Addr,
                      local: Addr, stream: bool) -> None:
        # RFC 8656 §12.6: a bound channel's data goes to its peer, if the permission holds.
        try:
            number, length = parse_channel_data_untrusted(data)
        except TurnError as exc:
            self.counters.drop(f"turn-{exc.hint}")
            return
        alloc = self.allocations.get((addr, local))
        if alloc is None:
            if not self._missing(now, addr, local, stream):
                self.counters.drop("turn-no-allocation")
            return
        ch = alloc.channels.get(number)
        if ch is None or ch.expires <= now:
            self.counters.drop("turn-channel-unbound")
            return
        if not alloc.permitted(ch.peer[0], now):
            self.counters.drop("turn-no-permission")
            return
        self.counters.add("turn_packets_to_peer")
        self._transmits.append(
            PeerData(alloc.relayed, ch.peer, memoryview(data)[4 : 4 + length], 4))

    def _send(self, now: float, msg: Message, data: bytes | bytearray | memoryview,
              addr: Addr, local: Addr, stream: bool) -> None:
        # RFC 8656 §11.2: XOR-PEER-ADDRESS and DATA, a permission for the peer's IP; anything
        # else is silently discarded (indications are never answered).
        alloc = self.allocations.get((addr, local))
        if alloc is None:
            if not self._missing(now, addr, local, stream):
                self.counters.drop("turn-no-allocation")
            return
        peer = _address(msg.get(AttrType.XOR_PEER_ADDRESS))
        span = find_attribute(data, AttrType.DATA)
        if peer is None or span is None:
            self.counters.drop("turn-bad-send")
            return
        if not alloc.permitted(peer[0], now):
            self.counters.drop("turn-no-permission")
            return
        if not self._peer_allowed(peer, alloc.family):
            # A permission is per IP; the port matters for our own IP (module docstring).
            self.counters.drop("turn-peer-forbidden")
            return
        off, length = span
        self.counters.add("turn_packets_to_peer")
        self._transmits.append(
            PeerData(alloc.relayed, peer, memoryview(data)[off : off + length], off))

    # -- STUN --------------------------------------------------------------------------------

    def _stun(self, now: float, data: bytes | bytearray | memoryview, addr: Addr, local: Addr,
              stream: bool) -> None:
        try:
            msg = Message.parse_untrusted(data)
        except StunError:
            self.counters.drop("turn-malformed")
            return
        if msg.msg_class == Class.INDICATION and msg.method == Method.SEND:
            self._send(now, msg, data, addr, local, stream)
            return
        handler = self._handlers.get((msg.msg_class, msg.method))
        if handler is None:
            # Responses, Data indications from a client, Binding (the relay answers those
            # itself): nothing a TURN server answers.
            self.counters.drop("turn-unexpected")
            return
        self.counters.add("turn_requests")
        if msg.unknown_required:
            # RFC 8489 §6.3.1: 420 listing them (before authentication: unsigned, bounded).
            self._unauthenticated(now, msg, data, addr, local, 420,
                                  ((AttrType.UNKNOWN_ATTRIBUTES, msg.unknown_required),))
            return
        auth = self._authenticate(now, msg, data, addr, local)
        if auth is None:
            return
        handler(now, msg, auth, addr, local, stream)

    # -- authentication (RFC 8489 §9.2.4) -------------------------------------------------------

    def _authenticate(self, now: float, msg: Message, data: bytes | bytearray | memoryview,
                      addr: Addr, local: Addr) -> Auth | None:
        """The request's credentials, verified; or None with the error answer queued."""
        sha256 = msg.has(AttrType.MESSAGE_INTEGRITY_SHA256)
        if not sha256 and not msg.has(AttrType.MESSAGE_INTEGRITY):
            self.counters.add("turn_challenges")
            self._challenge(now, msg, data, addr, local, 401)
            return None
        username = msg.username
        realm = msg.get(AttrType.REALM)
        nonce = msg.get(AttrType.NONCE)
        if username is None or not isinstance(realm, str) or not isinstance(nonce, str):
            self._fail("turn-auth-missing")
            self._unauthenticated(now, msg, data, addr, local, 400)
            return None
        unix = now + self.unix_offset
        verdict, cookie = self.nonces.check(nonce, unix, addr)
        if verdict != "ok":
            self._fail(f"turn-nonce-{verdict}")
            self._challenge(now, msg, data, addr, local, 438)
            return None
        algorithm = self._password_algorithm(msg, cookie)
        if algorithm is None:
            self._fail("turn-password-algorithm")
            self._unauthenticated(now, msg, data, addr, local, 400)
            return None
        try:
            expiry, _ = parse_rest_username_untrusted(username)
        except TurnError:
            self._fail("turn-bad-username")
            self._challenge(now, msg, data, addr, local, 401)
            return None
        if realm != self.config.realm or expiry < unix:
            self._fail("turn-wrong-realm" if realm != self.config.realm
                       else "turn-expired-credential")
            self._challenge(now, msg, data, addr, local, 401)
            return None
        # Every secret is tried, without an early exit: the time taken does not say which
        # secret (or none) matched. Each comparison is hmac.compare_digest.
        verify = verify_integrity_sha256 if sha256 else verify_integrity
        good: bytes | None = None
        for secret in self.config.secrets:
            key = long_term_key(username, realm, rest_password(secret, username), algorithm)
            if verify(data, key) and good is None:
                good = key
        if good is None:
            self._fail("turn-integrity")
            self._challenge(now, msg, data, addr, local, 401)
            return None
        return Auth(username, good, "sha256" if sha256 else "sha1")

    def _password_algorithm(self, msg: Message, cookie: bool) -> int | None:
        """RFC 8489 §9.2.4: with the nonce cookie, PASSWORD-ALGORITHMS must come back as we
        sent it, with a PASSWORD-ALGORITHM from it (or neither: MD5); without, MD5."""
        offered = msg.get(AttrType.PASSWORD_ALGORITHMS)
        chosen = msg.get(AttrType.PASSWORD_ALGORITHM)
        if offered is None and chosen is None:
            return int(PasswordAlgorithm.MD5)
        if not cookie or offered != _OFFERED or not isinstance(chosen, bytes):
            return None
        try:
            algorithm = parse_password_algorithm_untrusted(chosen)
        except StunError:
            return None
        return algorithm if algorithm in OFFERED_ALGORITHMS else None

    def _fail(self, reason: str) -> None:
        self.counters.drop(reason)
        self.counters.add("turn_auth_failures")

    def _challenge(self, now: float, msg: Message, data: bytes | bytearray | memoryview,
                   addr: Addr, local: Addr, code: int) -> None:
        """401 or 438 with REALM and a fresh NONCE (RFC 8489 §9.2.4), with the nonce cookie
        and PASSWORD-ALGORITHMS when that still fits the amplification bound."""
        unix = now + self.unix_offset
        realm = (AttrType.REALM, self.config.realm)
        forms = [False]
        if self.config.offer_sha256:
            forms.insert(0, True)
        for cookie in forms:
            attrs: list[tuple[AttrType, AttrValue]] = [
                realm, (AttrType.NONCE, self.nonces.mint(unix, addr, cookie=cookie))]
            if cookie:
                attrs.append((AttrType.PASSWORD_ALGORITHMS, _OFFERED))
            if self._unauthenticated(now, msg, data, addr, local, code, tuple(attrs),
                                     last=not cookie):
                return

    def _unauthenticated(self, now: float, msg: Message, data: bytes | bytearray | memoryview,
                         addr: Addr, local: Addr, code: int,
                         attrs: tuple[tuple[AttrType, AttrValue], ...] = (),
                         *, last: bool = True) -> bool:
        """Queue an unsigned error answer if it fits the amplification bound and the source's
        budget; True when it was queued (or finally refused: ``last``)."""
        resp = Message(msg.method, Class.ERROR, msg.transaction_id,
                       ((AttrType.ERROR_CODE, (code, "")), *attrs)
                       ).encode(fingerprint=msg.has(AttrType.FINGERPRINT))
        if len(resp) > len(data) + self.config.amplification:
            if last:
                self.counters.drop("turn-amplification")
            return last
        if not self._unauth.allow(addr[0], now):
            self.counters.drop("turn-rate-limited")
            return True
        self._transmits.append(Transmit(addr, resp, local))
        return True

    # -- authenticated answers -------------------------------------------------------------------

    def _answer(self, msg: Message, auth: Auth, addr: Addr, local: Addr,
                attrs: tuple[tuple[AttrType, AttrValue], ...] = (), code: int = 0) -> None:
        cls = Class.SUCCESS
        if code:
            cls = Class.ERROR
            attrs = ((AttrType.ERROR_CODE, (code, REASONS.get(code, ""))), *attrs)
            self.counters.drop(f"turn-error-{code}")
        resp = Message(msg.method, cls, msg.transaction_id, attrs).encode(
            integrity_key=auth.key, fingerprint=msg.has(AttrType.FINGERPRINT),
            integrity=auth.integrity)
        self._transmits.append(Transmit(addr, resp, local))

    def _own_allocation(self, now: float, msg: Message, auth: Auth, addr: Addr,
                        local: Addr, stream: bool) -> Allocation | None:
        """The 5-tuple's allocation, made with this username (RFC 8656 §5: 437, 441; no
        answer while a cache lookup for it is in flight: AllocationMissing)."""
        alloc = self.allocations.get((addr, local))
        if alloc is None:
            if not self._missing(now, addr, local, stream):
                self._answer(msg, auth, addr, local, code=437)
            return None
        if alloc.username != auth.username:
            self._answer(msg, auth, addr, local, code=441)
            return None
        return alloc

    def _lifetime(self, msg: Message, *, refresh: bool) -> int:
        """RFC 8656 §7.2 item 8 / §8.2: the "desired lifetime" (0 only for a Refresh that
        asks for 0: delete)."""
        asked = msg.get(AttrType.LIFETIME)
        if not isinstance(asked, int):
            return self.config.default_lifetime
        if asked == 0 and refresh:
            return 0
        return max(min(asked, self.config.max_lifetime), self.config.default_lifetime)

    # -- Allocate (RFC 8656 §7.2) --------------------------------------------------------------

    def _allocate(self, now: float, msg: Message, auth: Auth, addr: Addr, local: Addr,
                  stream: bool) -> None:
        existing = self.allocations.get((addr, local))
        if existing is not None:
            if existing.tid == msg.transaction_id and existing.username == auth.username:
                # A retransmission of the request that made it: the same answer again.
                self._allocated(now, msg, auth, existing)
            else:
                self._answer(msg, auth, addr, local, code=437)
            return
        transport = msg.get(AttrType.REQUESTED_TRANSPORT)
        if not isinstance(transport, int):
            self._answer(msg, auth, addr, local, code=400)
            return
        if transport != UDP:
            self._answer(msg, auth, addr, local, code=442)
            return
        family = msg.get(AttrType.REQUESTED_ADDRESS_FAMILY)
        additional = msg.get(AttrType.ADDITIONAL_ADDRESS_FAMILY)
        if msg.has(AttrType.RESERVATION_TOKEN) and (family is not None or additional is not None):
            self._answer(msg, auth, addr, local, code=400)
            return
        if family is not None and additional is not None:
            self._answer(msg, auth, addr, local, code=400)
            return
        if additional is not None and additional != FAMILY_V6:
            self._answer(msg, auth, addr, local, code=400)  # §7.2: only IPv6 may be added
            return
        even = msg.get(AttrType.EVEN_PORT)
        if msg.has(AttrType.RESERVATION_TOKEN) or even == 1:
            self._answer(msg, auth, addr, local, code=508)  # no reservations here
            return
        fam = FAMILY_V4 if family is None else family
        if fam not in (FAMILY_V4, FAMILY_V6):
            self._answer(msg, auth, addr, local, code=440)
            return
        # Quotas: per username and per source IP (486), the server's total (508).
        if self._per_user.get(auth.username, 0) >= self.config.max_per_username or \
                self._per_source.get(addr[0], 0) >= self.config.max_per_source:
            self.counters.drop("turn-quota")
            self._answer(msg, auth, addr, local, code=486)
            return
        if len(self.allocations) >= self.config.max_allocations:
            self.counters.drop("turn-capacity")
            self._answer(msg, auth, addr, local, code=508)
            return
        lifetime = self._lifetime(msg, refresh=False)
        relayed = self.ports.bind(fam, addr, even=even == 0)
        if relayed is None:
            self._answer(msg, auth, addr, local, code=440 if family is not None else 508)
            return
        alloc = Allocation(addr, local, relayed, fam, auth.username, msg.transaction_id,
                           now + lifetime, stream)
        self.allocations[(addr, local)] = alloc
        self.by_relayed[relayed] = alloc
        self._per_user[auth.username] = self._per_user.get(auth.username, 0) + 1
        self._per_source[addr[0]] = self._per_source.get(addr[0], 0) + 1
        self._schedule(alloc)
        self._mark(alloc)
        self.counters.add("turn_allocations_created")
        self._allocated(now, msg, auth, alloc, dual=additional is not None)
        self._events.append(AllocationCreated(relayed, addr, local))

    def _allocated(self, now: float, msg: Message, auth: Auth, alloc: Allocation,
                   dual: bool = False) -> None:
        attrs: list[tuple[AttrType, AttrValue]] = [
            (AttrType.XOR_RELAYED_ADDRESS, alloc.relayed),
            (AttrType.LIFETIME, max(0, int(alloc.expires - now))),
            (AttrType.XOR_MAPPED_ADDRESS, (alloc.client[0], alloc.client[1])),
        ]
        if dual:
            # §7.2: an IPv6 relayed address was asked for too; we keep one family.
            attrs.append((AttrType.ADDRESS_ERROR_CODE, address_error_code(FAMILY_V6, 440)))
        self._answer(msg, auth, alloc.client, alloc.local, tuple(attrs))

    def _schedule(self, alloc: Allocation) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (alloc.expires, self._seq, alloc))

    def _delete(self, alloc: Allocation, reason: str) -> None:
        key = (alloc.client, alloc.local)
        if self.allocations.get(key) is not alloc:
            return
        del self.allocations[key]
        del self.by_relayed[alloc.relayed]
        for table, k in ((self._per_user, alloc.username), (self._per_source, alloc.client[0])):
            left = table.get(k, 1) - 1
            if left > 0:
                table[k] = left
            else:
                table.pop(k, None)
        self.counters.add(f"turn_allocations_{reason}")
        if not alloc.stream:
            self._changed[alloc.relayed] = None
        elif alloc.kept:
            self._kept_changed[key] = None
        self._events.append(AllocationEnded(alloc.relayed, alloc.client, reason))

    # -- Refresh (§8.2) -----------------------------------------------------------------------

    def _refresh(self, now: float, msg: Message, auth: Auth, addr: Addr, local: Addr,
                 stream: bool) -> None:
        alloc = self._own_allocation(now, msg, auth, addr, local, stream)
        if alloc is None:
            return
        family = msg.get(AttrType.REQUESTED_ADDRESS_FAMILY)
        if family is not None and family != alloc.family:
            self._answer(msg, auth, addr, local, code=443)
            return
        lifetime = self._lifetime(msg, refresh=True)
        if lifetime == 0:
            self._delete(alloc, "deleted")
        else:
            alloc.expires = now + lifetime
            self._schedule(alloc)
            alloc.prune(now)  # dead permissions and channels go at every refresh
            self._mark(alloc)
        self._answer(msg, auth, addr, local, ((AttrType.LIFETIME, lifetime),))

    # -- permissions and channels (§10.2, §11.2) -------------------------------------------------

    def _peer_allowed(self, peer: Addr, family: int) -> bool:
        """Whether data may be relayed to ``peer`` from an allocation of ``family``: our own
        media address exactly, or any port inside an operator's network. (A permission for
        our IP does not open its other ports.)"""
        ip = _canonical_ip(peer[0])
        if ip is None or not self._ip_allowed(ip, family) or not 0 < peer[1] <= 0xFFFF:
            return False
        return (str(ip), peer[1]) in self.config.own or \
            any(ip in net for net in self.config.peers)

    def _ip_allowed(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
                    family: int) -> bool:
        """Whether a permission may be installed for ``ip`` (RFC 8656 §9: per IP)."""
        if (ip.version == 4) != (family == FAMILY_V4):
            return False
        if ip.is_multicast or ip.is_unspecified or str(ip) == "255.255.255.255":
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:
            return False  # a v4 peer dressed as v6 must not bypass the v4 networks
        return str(ip) in self._own_ips or any(ip in net for net in self.config.peers)

    def _check_peer(self, msg: Message, auth: Auth, alloc: Allocation, peer: Addr,
                    *, port: bool) -> bool:
        """443 for the other family, 403 for a peer we do not relay to; True if allowed."""
        ip = _canonical_ip(peer[0])
        if ip is None or (ip.version == 4) != (alloc.family == FAMILY_V4):
            self._answer(msg, auth, alloc.client, alloc.local, code=443)
            return False
        allowed = self._peer_allowed(peer, alloc.family) if port else \
            self._ip_allowed(ip, alloc.family)
        if not allowed:
            self.counters.add("turn_forbidden")
            self._answer(msg, auth, alloc.client, alloc.local, code=403)
            return False
        return True

    def _create_permission(self, now: float, msg: Message, auth: Auth, addr: Addr,
                           local: Addr, stream: bool) -> None:
        alloc = self._own_allocation(now, msg, auth, addr, local, stream)
        if alloc is None:
            return
        peers = [p for p in (_address(v) for v in msg.get_all(AttrType.XOR_PEER_ADDRESS))
                 if p is not None]
        if not peers:
            self._answer(msg, auth, addr, local, code=400)
            return
        # All or nothing (§10.2): every peer is checked before any permission is installed.
        for peer in peers:
            if not self._check_peer(msg, auth, alloc, peer, port=False):
                return
        alloc.prune(now)
        new = {p[0] for p in peers} - alloc.permissions.keys()
        if len(alloc.permissions) + len(new) > self.config.max_permissions:
            self.counters.drop("turn-permissions-full")
            self._answer(msg, auth, addr, local, code=508)
            return
        for peer in peers:
            alloc.permissions[peer[0]] = now + PERMISSION_LIFETIME
        self._mark(alloc)
        self.counters.add("turn_permissions", len(peers))
        self._answer(msg, auth, addr, local)

    def _channel_bind(self, now: float, msg: Message, auth: Auth, addr: Addr, local: Addr,
                      stream: bool) -> None:
        alloc = self._own_allocation(now, msg, auth, addr, local, stream)
        if alloc is None:
            return
        number = msg.get(AttrType.CHANNEL_NUMBER)
        peer = _address(msg.get(AttrType.XOR_PEER_ADDRESS))
        if not isinstance(number, int) or peer is None or not CHANNEL_MIN <= number <= CHANNEL_MAX:
            self._answer(msg, auth, addr, local, code=400)
            return
        if not self._check_peer(msg, auth, alloc, peer, port=True):
            return
        alloc.prune(now)
        # §12 rebinding rules: a number stays with its peer, and a peer with its number,
        # while bound and for CHANNEL_COOLDOWN after (the entries live that long).
        by_number = alloc.channels.get(number)
        by_peer = alloc.by_peer.get(peer)
        if (by_number is not None and by_number.peer != peer) or \
                (by_peer is not None and by_peer.number != number):
            self.counters.drop("turn-channel-conflict")
            self._answer(msg, auth, addr, local, code=400)
            return
        if by_number is None:
            if len(alloc.channels) >= self.config.max_channels:
                self.counters.drop("turn-channels-full")
                self._answer(msg, auth, addr, local, code=508)
                return
            if peer[0] not in alloc.permissions and \
                    len(alloc.permissions) >= self.config.max_permissions:
                self.counters.drop("turn-permissions-full")
                self._answer(msg, auth, addr, local, code=508)
                return
            ch = Channel(number, peer, now + CHANNEL_LIFETIME)
            alloc.channels[number] = ch
            alloc.by_peer[peer] = ch
            self.counters.add("turn_channels_bound")
        else:
            by_number.expires = now + CHANNEL_LIFETIME
        # §11.2: binding (or refreshing) a channel installs or refreshes the permission.
        alloc.permissions[peer[0]] = now + PERMISSION_LIFETIME
        self._mark(alloc)
        self._answer(msg, auth, addr, local)

    def _seq_next(self) -> int:
        self._seq += 1
        return self._seq


def _tid(seq: int) -> bytes:
    # Indications need a transaction id, never matched by anyone (RFC 8489 §6.1): a counter.
    return seq.to_bytes(12, "big")


def _address(value: AttrValue) -> Addr | None:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], int):
        return (value[0], value[1])
    return None


def address_error_code(family: int, code: int, reason: str = "") -> bytes:
    """The value of ADDRESS-ERROR-CODE (RFC 8656 §18.12): family, then ERROR-CODE's layout."""
    return bytes((family, 0, code // 100, code % 100)) + reason.encode()

