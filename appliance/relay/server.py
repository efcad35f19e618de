"""The relay's trio shell: sockets, the hot loops, housekeeping, Redis, the control channel.

One call of :func:`serve_relay` is one relay worker: one public UDP socket per listen address
(``SO_REUSEPORT``, so M worker processes share the port and the kernel spreads clients over
them by 4-tuple hash) and one internal UDP socket (loopback, ephemeral port by default) that
talks PROXY v2 framed datagrams with transceivers and with other relays (DESIGN.md "Relay ↔
transceiver datagram format").

Hot path (DESIGN.md "Relay behaviour"). Per-datagram event-loop round trips are what make a
textbook trio relay slow, so one task (:meth:`_Worker.hot_loop`) serves all of a worker's
sockets: it waits for readability of an epoll set holding them, then *drains* each ready
socket with non-blocking ``recvfrom_into`` calls into a buffer allocated once (up to
``BATCH`` datagrams per socket and round), and while traffic keeps coming it waits on that
epoll set directly (at most ``HOLD``) rather than through trio, yielding to trio every
``YIELD_EVERY``. A datagram from a known flow is
forwarded without leaving the loop: its flow's pre-encoded PROXY header is copied into the
``HEADROOM`` bytes in front of the payload, and the header + payload slice is sent with one
``sendto`` — no concatenation, no parsing beyond the first byte. Counters are summed in
locals and flushed once per batch; the clock is read once per batch. Nothing is logged per
packet. Everything else goes to :meth:`RelayCore.handle_datagram` (the slow path).

Junk is dropped as early as possible (issue 9, floods). On Linux each public socket gets a
classic BPF filter (:func:`attach_public_filter`, no privilege needed) that drops, in the
kernel and before the datagram takes room in the socket buffer, payloads larger than
``MAX_DATAGRAM`` and payloads whose first byte RFC 7983 gives to nothing we relay (not
STUN, DTLS or RTP/RTCP) — those never reach a transceiver anyway. In the loop, a non-STUN
datagram from an unknown flow is dropped (``no-flow``) right after the flow look-up, without
a call into the core (unless Redis may know the flow). Socket buffers: we ask for
``SOCKET_BUFFER``; the kernel caps the request at ``net.core.rmem_max``/``wmem_max`` (and
doubles it); the granted sizes are logged at start and reported by ``stats``.

Return traffic arrives on the internal socket from a transceiver (or a downstream relay) as
``PROXY(src=client, dst=public) + payload``; it is sent from the public socket named by the
header's destination to the client — or, for a flow that reached us through an upstream relay,
re-framed and sent back to that relay's internal address. Only configured transceivers and
next hops may send return traffic; any other source on the internal socket is treated as an
upstream relay, whose datagrams are routed exactly like a client's (first packet must be a
verified STUN request).

Transceiver addresses by name (issue 10): ``transceiver_pattern`` (e.g.
``transceiver-{id}.transceiver.ns.svc:4000``, a StatefulSet ordinal as the id) names every
transceiver; ids ``0..transceiver_count-1`` are resolved at start (a name that does not
resolve yet is not fatal), any other id — or all of them without a count — on first use: the
first verified check for an unresolved id is dropped (``transceiver-resolving``) and the
resolver task looks the name up; the client's next check (ICE retransmits) finds it. Every
name (pattern or a host name given with ``transceivers``) is re-resolved every
``resolve_interval`` seconds off the hot path; a changed address re-points the flows
(:meth:`RelayCore.set_transceiver`) and is accepted as a source of return traffic, so a pod
restarted with a new IP keeps working without restarting the relays.
"""

from __future__ import annotations

import ctypes
import ipaddress
import logging
import math
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ..config import parse_hostport
from ..control import serve_control
from ..logs import redact
from ..proto.proxy import (
    FAM_UDP4,
    TLV_RELAY_ID,
    ProxyError,
    encode_header,
    encode_tlv,
    parse_untrusted,
)
from .core import IS_STUN, SLOW_FIRST, Address, CoreConfig, Flow, RelayCore

try:  # optional C extension (setup.py): recvmmsg/sendmmsg batching, Linux only
    from ..netio import _mmsg
except ImportError:  # pragma: no cover - not built (no compiler/headers) or not Linux
    _mmsg = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: ``io`` modes: ``python`` (one recvfrom_into/sendto per datagram), ``mmsg`` (the batch
#: syscalls of :mod:`appliance.netio._mmsg`), ``auto`` (mmsg when the module is built; the
#: environment variable ``APPLIANCE_RELAY_IO`` can force either).
IO_MODES = ("auto", "python", "mmsg")
IO_ENV = "APPLIANCE_RELAY_IO"
#: Datagrams per recvmmsg call (the hot loop still drains up to ``BATCH`` per socket).
MMSG_BATCH = 64
#: Internal socket slots hold any UDP datagram (nothing is truncated, as in the Python loop);
#: the odd stride keeps the slots' first cache lines off the same L1 sets.
INTERNAL_SLOT = 256 + 65536 + 320


#: ``APPLIANCE_RELAY_GSO=0`` turns off UDP GSO in the batch path's sends (A/B measurements).
GSO_ENV = "APPLIANCE_RELAY_GSO"


def mmsg_available() -> bool:
    return _mmsg is not None


def select_io(mode: str = "auto") -> str:
    """The I/O path a worker uses: ``python`` or ``mmsg``. ``auto`` defers to
    ``$APPLIANCE_RELAY_IO`` when set, else picks ``mmsg`` if the extension is built; asking
    for ``mmsg`` without it is an error (ValueError)."""
    if mode == "auto":
        mode = os.environ.get(IO_ENV, "") or "auto"
    if mode not in IO_MODES:
        raise ValueError(f"relay io {mode!r}: expected one of {', '.join(IO_MODES)}")
    if mode == "auto":
        return "mmsg" if _mmsg is not None else "python"
    if mode == "mmsg" and _mmsg is None:
        raise ValueError("relay io 'mmsg': the appliance.netio._mmsg extension is not built "
                         "(pip install -e . needs gcc and the Python headers)")
    return mode

#: Room in front of a received payload for the PROXY header we prepend (≤ 52 + 3 + 64).
HEADROOM = 256
#: Largest UDP payload plus the headroom: nothing is ever truncated.
BUFSIZE = HEADROOM + 65536
#: Datagrams drained per wake-up before yielding to trio (fairness for the other tasks).
BATCH = 512
#: Longest blocking wait on the worker's own epoll set before going back to trio's
#: ``wait_readable`` (epoll's timeout has millisecond granularity).
HOLD = 0.001
#: Coalescing (see :func:`coalesce_wait`): a wake-up that found fewer than this many
#: datagrams, less than ``DENSE`` after the previous one, waits ``RelayConfig.coalesce``.
COALESCE_BELOW = 4
DENSE = 200e-6


def coalesce_wait(coalesce: float, got: int, since_last_wake: float) -> float:
    """How long the hot loop waits before its next poll, so that the next wake-up finds a
    batch instead of one datagram.

    Measured (docs/performance.md, "Relay", coalescing): at 50 000 datagrams/s each way
    most wake-ups carried 1-2 datagrams, each paying a poll, a ``recvmmsg`` and a
    ``sendmmsg`` of its own; waiting 20 µs after such a sparse wake-up gathers ~5 per
    wake-up and cuts the relay's CPU from ~83 % to ~69 % of a core, adding ≤ 20 µs (plus
    the wake-up) to the datagrams that arrive meanwhile. Only under dense traffic (the
    previous wake-up less than ``DENSE`` ago): at low rates nothing would arrive in the
    window, so nothing is waited.
    """
    if coalesce > 0 and got < COALESCE_BELOW and since_last_wake < DENSE:
        return coalesce
    return 0.0


def _fine_timer_slack() -> None:
    """Linux rounds a thread's timed sleeps up by its timer slack (50 µs by default), which
    would turn a 20 µs coalescing wait into 70 µs: ask for 1 µs (``PR_SET_TIMERSLACK``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl Linux
        pass
#: While traffic keeps the hot loop off trio's scheduler, it yields this often.
YIELD_EVERY = 0.002
#: Kernel socket buffers: absorb bursts while the loop is busy with the other socket.
#: The kernel caps the request at net.core.rmem_max / wmem_max (docs/reliability.md).
SOCKET_BUFFER = 16 << 20
#: Largest client payload relayed. WebRTC stacks keep datagrams under the path MTU
#: (libwebrtc: ~1200 bytes of RTP, DTLS records fragmented to the MTU); this leaves room
#: for jumbo-ish paths while a 65 kB datagram never occupies the socket buffer.
MAX_DATAGRAM = 2048

#: Internal socket: parsed PROXY headers are cached by their first 28 bytes (the fixed
#: 16-byte part and the IPv4 address block); the cache is cleared when it reaches this size.
PARSED_MAX = 65_536
_PARSED_KEY = struct.Struct("28s")

_SO_ATTACH_FILTER = 26  # Linux, <asm-generic/socket.h>; absent from Python's socket module


def _public_filter_program(max_payload: int) -> bytes:
    """Classic BPF for a UDP socket (the UDP header is at offset 0, the payload at 8):
    accept an empty payload (the loop counts it) and payloads of at most ``max_payload``
    bytes whose first byte is STUN [0..3], DTLS [20..63] or RTP/RTCP [128..191]."""
    ld_len, ldb_abs, ret_k = 0x80, 0x30, 0x06
    jgt_k, jge_k = 0x25, 0x35
    accept, drop = 0xFFFFFFFF, 0
    prog = [  # (code, jt, jf, k); jumps count instructions after the next one
        (ld_len, 0, 0, 0),
        (jgt_k, 8, 0, max_payload + 8),  # 1: too long -> drop
        (jgt_k, 0, 6, 8),  # 2: empty payload -> accept
        (ldb_abs, 0, 0, 8),  # 3: first payload byte
        (jge_k, 5, 0, 192),  # 4: 192..255 -> drop
        (jge_k, 3, 0, 128),  # 5: RTP/RTCP -> accept
        (jge_k, 3, 0, 64),  # 6: 64..127 (TURN channel, QUIC, unassigned) -> drop
        (jge_k, 1, 0, 20),  # 7: DTLS -> accept
        (jge_k, 1, 0, 4),  # 8: 4..19 (ZRTP, unassigned) -> drop; else STUN
        (ret_k, 0, 0, accept),  # 9
        (ret_k, 0, 0, drop),  # 10
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def attach_public_filter(sock: socket.socket, max_payload: int = MAX_DATAGRAM) -> bool:
    """Attach the public-socket filter (Linux only); False if the kernel refused it."""
    if not sys.platform.startswith("linux"):
        return False  # pragma: no cover
    code = _public_filter_program(max_payload)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))  # struct sock_fprog
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
    except OSError:  # pragma: no cover - e.g. a seccomp profile; the loop still drops
        return False
    return True


def socket_buffers(sock: socket.socket) -> dict[str, int]:
    """What the kernel granted (Linux reports twice the accepted request)."""
    return {
        "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        "sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    }


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """One relay worker's configuration (the CLI builds it from flags and the TOML file).

    Host names in ``next_hops`` are resolved once at start; transceiver names (given in
    ``transceivers`` or by ``transceiver_pattern``) are also re-resolved every
    ``resolve_interval`` seconds (see the module docstring).
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


def pattern_address(pattern: str, ident: int) -> Address:
    """``transceiver-{id}.transceiver.ns.svc:4000`` and id 3 -> (``transceiver-3...``, 4000)."""
    if "{id}" not in pattern:
        raise ValueError(f"transceiver pattern {pattern!r} has no {{id}}")
    host, port = parse_hostport(pattern.replace("{id}", str(ident)), default_host="")
    if not host or not port:
        raise ValueError(f"transceiver pattern {pattern!r}: expected HOST:PORT with {{id}}")
    return host, port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class RelayHandle:
    """What :func:`serve_relay` reports through ``task_status.started``."""

    public: tuple[Address, ...]
    internal: Address
    core: RelayCore
    worker: int = 0
    sockets: Mapping[str, Any] = field(default_factory=dict)
    io: str = "python"

    def stats(self) -> dict[str, Any]:
        return {
            "ok": True,
            "counters": self.core.counters.as_dict(),
            "flows": len(self.core.flows),
            "worker": self.worker,
            "sockets": dict(self.sockets),
            "io": self.io,
        }


def _udp_socket(addr: Address, *, reuseport: bool, public: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if family == socket.AF_INET6:
            # Let 0.0.0.0:P and [::]:P be two sockets (one per listen address).
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:  # pragma: no cover - capped by the kernel, never fatal
                pass
        if public:
            attach_public_filter(sock)
        sock.bind(addr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def _resolve(addr: Address, family: int = 0) -> Address:
    """A host name to an IP literal (``sendto`` with a name would resolve per packet), of the
    internal socket's family when given."""
    infos = await trio.socket.getaddrinfo(addr[0], addr[1], family=family,
                                          type=trio.socket.SOCK_DGRAM)
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"cannot resolve {addr[0]}")
    sockaddr = infos[0][4]
    return (str(sockaddr[0]), int(sockaddr[1]))


class _Worker:
    def __init__(
        self,
        config: RelayConfig,
        core: RelayCore,
        pubs: Sequence[socket.socket],
        isock: socket.socket,
        return_sources: set[Address],
        io: str = "python",
    ) -> None:
        self.config = config
        self.io = io
        self.core = core
        self.pubs = pubs
        self.isock = isock
        self.public = tuple(_name(s) for s in pubs)
        self.pub_by_addr = dict(zip(self.public, pubs, strict=True))
        #: mutated in place (never rebound): internal_drain holds a reference to it
        self.return_sources = return_sources
        self.tlv = encode_tlv(TLV_RELAY_ID, config.relay_id.encode()[:64])
        self.lookup_wanted = trio.Event()
        self.resolve_wanted = trio.Event()
        self.sockets: dict[str, Any] = {}
        #: transceiver id -> the name it is resolved from (pattern or configured host name)
        self.names: dict[int, Address] = {}
        self.next_hops: dict[int, Address] = {}

    def _wake_lookups(self) -> None:
        core = self.core
        if core.lookups_pending and not self.lookup_wanted.is_set():
            self.lookup_wanted.set()
        if core.resolutions_pending and not self.resolve_wanted.is_set():
            self.resolve_wanted.set()

    async def hot_loop(self) -> None:
        """Every socket of the worker, in one task (see the module docstring).

        trio waits on an epoll set of our own (level-triggered, the public sockets and the
        internal one): one trio wake-up serves both directions. While datagrams keep
        coming, the task stays on that epoll set — a blocking ``poll`` of at most
        ``HOLD`` — instead of going back through trio's scheduler for every wake-up (a
        trio round trip costs about twice a bare epoll one, docs/performance.md "Relay");
        it yields to trio at least every ``YIELD_EVERY`` seconds and goes back to
        ``wait_readable`` after ``HOLD`` without traffic.
        """
        mmsg = self.io == "mmsg"
        public_drain = self.public_drain_mmsg if mmsg else self.public_drain
        drains: dict[int, Callable[[float], bool]] = {
            sock.fileno(): public_drain(sock, public)
            for sock, public in zip(self.pubs, self.public, strict=True)
        }
        drains[self.isock.fileno()] = (self.internal_drain_mmsg if mmsg
                                       else self.internal_drain)()
        c = self.core.counters
        clock = trio.current_time
        wake = self._wake_lookups
        coalesce = self.config.coalesce
        sleep = time.sleep
        if coalesce:
            _fine_timer_slack()
        ep = select.epoll()
        try:
            for fd in drains:
                ep.register(fd, select.EPOLLIN)
            poll = ep.poll
            while True:
                await trio.lowlevel.wait_readable(ep)
                now = clock()
                yield_at = now + YIELD_EVERY
                timeout = 0.0
                last_wake = -math.inf
                while True:
                    events = poll(timeout)
                    if not events:
                        wake()
                        break  # HOLD without traffic: back to trio
                    c.wakeups += 1
                    now = clock()
                    before = c.packets_in
                    more = False
                    for fd, _ in events:
                        if drains[fd](now):
                            more = True
                    if now >= yield_at:
                        # Only here (and before going back to wait_readable) can the Redis
                        # and resolver tasks run, so this is where they are woken.
                        wake()
                        await trio.lowlevel.checkpoint()
                        yield_at = clock() + YIELD_EVERY
                    if more:
                        timeout = 0.0
                    else:
                        timeout = HOLD
                        wait = coalesce_wait(coalesce, c.packets_in - before, now - last_wake)
                        if wait:
                            c.coalesced += 1
                            sleep(wait)  # blocking on purpose: see coalesce_wait
                    last_wake = now
        finally:
            ep.close()

    def public_drain(self, sock: socket.socket, public: Address) -> Callable[[float], bool]:
        """The public socket's drain: up to ``BATCH`` datagrams per call; True if the
        socket may hold more."""
        core = self.core
        c = core.counters
        drop = c.drop
        flows = core.flows
        get = flows.get
        lru = flows.move_to_end
        slow = core.handle_datagram
        recv = sock.recvfrom_into
        psend = sock.sendto
        isend = self.isock.sendto
        v6 = sock.family == socket.AF_INET6
        is_stun = IS_STUN
        slow_first = SLOW_FIRST
        # Without Redis a non-STUN datagram from an unknown flow can only be dropped.
        lookups = core.config.redis
        H = HEADROOM
        MAX = MAX_DATAGRAM
        buf = bytearray(BUFSIZE)
        mv = memoryview(buf)
        rx = mv[H:]

        def drain(now: float) -> bool:
            pin = bin_ = pout = bout = no_flow = oversize = 0
            readable = True
            for _ in range(BATCH):
                try:
                    n, addr = recv(rx)
                except BlockingIOError:
                    readable = False
                    break
                except OSError:  # pragma: no cover - an ICMP error queued on the socket
                    continue
                if v6:
                    addr = addr[:2]
                pin += 1
                bin_ += n
                if n > MAX:  # where the kernel filter is missing
                    oversize += 1
                    continue
                flow = get(addr)
                if flow is None:
                    if not lookups and (not n or not is_stun[buf[H]]):
                        no_flow += 1  # junk from an unknown flow: no call into the core
                        continue
                # The fast path: a known flow's non-STUN datagram (DTLS, RTP, RTCP) — not
                # DTLS handshake records (issue 9: dtls-budget, core.SLOW_FIRST).
                elif n and not slow_first[buf[H]] and flow.upstream is None:
                    h = flow.header
                    s = H - len(h)
                    buf[s:H] = h
                    try:
                        isend(mv[s : H + n], flow.dest)
                    except OSError:
                        drop("send-failed")
                        continue
                    flow.last_seen = now
                    lru(addr)
                    pout += 1
                    bout += n + len(h)
                    continue
                res = slow(now, addr, rx[:n], public, None)
                if res is None:
                    continue
                try:
                    if isinstance(res, Flow):
                        h = res.header
                        s = H - len(h)
                        buf[s:H] = h
                        bout += isend(mv[s : H + n], res.dest)
                    else:
                        bout += psend(res, addr)
                except OSError:
                    drop("send-failed")
                    continue
                pout += 1
            c.packets_in += pin
            c.bytes_in += bin_
            c.packets_out += pout
            c.bytes_out += bout
            if no_flow:
                drop("no-flow", no_flow)
            if oversize:
                drop("oversize", oversize)
            return readable

        return drain

    def internal_drain(self) -> Callable[[float], bool]:
        """The internal socket's drain (return traffic, upstream relays), like
        :meth:`public_drain`."""
        core = self.core
        c = core.counters
        drop = c.drop
        flows = core.flows
        get = flows.get
        lru = flows.move_to_end
        slow = core.handle_datagram
        sock = self.isock
        recv = sock.recvfrom_into
        isend = sock.sendto
        v6 = sock.family == socket.AF_INET6
        pub_get = {a: s.sendto for a, s in self.pub_by_addr.items()}.get
        returners = self.return_sources
        tlv = self.tlv
        is_stun = IS_STUN
        parse = parse_untrusted
        parsed: dict[bytes, tuple[Address, Address, int]] = {}
        parsed_get = parsed.get
        key_of = _PARSED_KEY.unpack_from
        H = HEADROOM
        buf = bytearray(BUFSIZE)
        mv = memoryview(buf)
        rx = mv[H:]

        def drain(now: float) -> bool:
            pin = bin_ = pout = bout = 0
            readable = True
            for _ in range(BATCH):
                try:
                    n, src = recv(rx)
                except BlockingIOError:
                    readable = False
                    break
                except OSError:  # pragma: no cover - an ICMP error queued on the socket
                    continue
                if v6:
                    src = src[:2]
                pin += 1
                bin_ += n
                # The PROXY header of a flow's datagrams is the same every time: its first
                # PARSED_KEY bytes (signature .. IPv4 addresses, length field included)
                # determine the parse, so a cache hit skips parse_untrusted (~1 µs).
                key = key_of(buf, H)[0]
                hit = parsed_get(key)
                if hit is not None:
                    client, public, off = hit
                    if off > n:  # shorter than its header says
                        drop("proxy-malformed")
                        continue
                else:
                    try:
                        client, public, off = parse(rx[:n])
                    except ProxyError:
                        drop("proxy-malformed")
                        continue
                    if buf[H + 13] == FAM_UDP4:  # IPv6 addresses do not fit in the key
                        if len(parsed) >= PARSED_MAX:
                            parsed.clear()
                        parsed[key] = (client, public, off)
                p = H + off  # where the client's datagram starts in buf
                end = H + n
                if src in returners:
                    # Return traffic: "send this payload from `public` to `client`".
                    flow = get(client)
                    if flow is not None and not flow.answered:
                        core.note_answer(flow, rx[off:n])  # issue 9: stun-budget (core.py)
                    try:
                        if flow is not None and flow.upstream is not None:
                            # The flow came through an upstream relay: back along the hop.
                            h = flow.header
                            s = p - len(h)
                            buf[s:p] = h
                            bout += isend(mv[s:end], flow.upstream)
                        else:
                            psend = pub_get(public)
                            if psend is None:
                                drop("return-unknown-public")
                                continue
                            bout += psend(mv[p:end], client)
                    except OSError:
                        drop("send-failed")
                        continue
                    pout += 1
                    continue
                # A framed datagram from an upstream relay: route it like a client's.
                flow = get(client)
                if flow is not None and flow.upstream == src and end > p and not is_stun[buf[p]]:
                    h = flow.header
                    s = p - len(h)
                    buf[s:p] = h
                    try:
                        bout += isend(mv[s:end], flow.dest)
                    except OSError:
                        drop("send-failed")
                        continue
                    flow.last_seen = now
                    lru(client)
                    pout += 1
                    continue
                res = slow(now, client, rx[off:n], public, src)
                if res is None:
                    continue
                try:
                    if isinstance(res, Flow):
                        h = res.header
                        s = p - len(h)
                        buf[s:p] = h
                        bout += isend(mv[s:end], res.dest)
                    else:
                        bout += isend(encode_header(client, public, tlv) + res, src)
                except OSError:
                    drop("send-failed")
                    continue
                pout += 1
            c.packets_in += pin
            c.bytes_in += bin_
            c.packets_out += pout
            c.bytes_out += bout
            return readable

        return drain

    # -- the same two drains over recvmmsg/sendmmsg (appliance.netio._mmsg) -----------------
    #
    # Routing is line for line that of public_drain/internal_drain; only the syscalls differ.
    # One recv_batch fills up to MMSG_BATCH slots of a buffer allocated once (datagram i at
    # i*slot + HEADROOM) and returns [(length, source), ...]; instead of one sendto per
    # datagram, each datagram's (header, offset, length, destination) is queued per outgoing
    # socket and the queues go out with one send_batch (sendmmsg, header and payload as two
    # iovecs: nothing is copied in Python) before the next recv_batch reuses the buffer. A
    # short batch means the socket is drained (level-triggered epoll reports later arrivals),
    # so the trailing EAGAIN receive of the Python loop is saved too. Send failures are
    # counted per datagram (``send-failed``), never raised.

    def public_drain_mmsg(self, sock: socket.socket, public: Address) -> Callable[[float], bool]:
        """:meth:`public_drain` with batched syscalls."""
        assert _mmsg is not None
        recv_batch = _mmsg.recv_batch
        send_batch = _mmsg.send_batch
        core = self.core
        c = core.counters
        drop = c.drop
        flows = core.flows
        get = flows.get
        lru = flows.move_to_end
        slow = core.handle_datagram
        fd = sock.fileno()
        ifd = self.isock.fileno()
        is_stun = IS_STUN
        slow_first = SLOW_FIRST  # issue 9: DTLS handshake records take the slow path
        lookups = core.config.redis
        H = HEADROOM
        MAX = MAX_DATAGRAM
        NB = MMSG_BATCH
        SLOT = H + MAX + 64  # MSG_TRUNC reports a longer datagram's real length: n > MAX
        buf = bytearray(SLOT * NB)
        mv = memoryview(buf)
        fwd: list[tuple[bytes, int, int, Address]] = []  # to the internal socket
        back: list[tuple[bytes, int, int, Address]] = []  # STUN answers, from this socket
        forward = fwd.append
        answer = back.append
        flushes = ((ifd, fwd), (fd, back))
        rounds = max(1, BATCH // NB)

        def drain(now: float) -> bool:
            pin = bin_ = pout = bout = no_flow = oversize = failed = 0
            readable = True
            for _ in range(rounds):
                msgs = recv_batch(fd, buf, SLOT, H, MAX, NB)
                p = H - SLOT
                for n, addr in msgs:
                    p += SLOT  # where this datagram starts in buf
                    pin += 1
                    bin_ += n
                    if n > MAX:  # where the kernel filter is missing
                        oversize += 1
                        continue
                    flow = get(addr)
                    if flow is None:
                        if not lookups and (not n or not is_stun[buf[p]]):
                            no_flow += 1
                            continue
                    elif n and not slow_first[buf[p]] and flow.upstream is None:
                        forward((flow.header, p, n, flow.dest))
                        flow.last_seen = now
                        lru(addr)
                        continue
                    res = slow(now, addr, mv[p : p + n], public, None)
                    if res is None:
                        continue
                    if isinstance(res, Flow):
                        forward((res.header, p, n, res.dest))
                    else:
                        answer((res, 0, 0, addr))
                for sfd, queue in flushes:
                    if queue:
                        sent, nbytes, bad = send_batch(sfd, buf, queue)
                        queue.clear()
                        pout += sent
                        bout += nbytes
                        failed += bad
                if len(msgs) < NB:
                    readable = False
                    break
            c.packets_in += pin
            c.bytes_in += bin_
            c.packets_out += pout
            c.bytes_out += bout
            if no_flow:
                drop("no-flow", no_flow)
            if oversize:
                drop("oversize", oversize)
            if failed:
                drop("send-failed", failed)
            return readable

        return drain

    def internal_drain_mmsg(self) -> Callable[[float], bool]:
        """:meth:`internal_drain` with batched syscalls."""
        assert _mmsg is not None
        recv_batch = _mmsg.recv_batch
        send_batch = _mmsg.send_batch
        core = self.core
        c = core.counters
        drop = c.drop
        flows = core.flows
        get = flows.get
        lru = flows.move_to_end
        slow = core.handle_datagram
        note_answer = core.note_answer
        sock = self.isock
        fd = sock.fileno()
        returners = self.return_sources
        tlv = self.tlv
        is_stun = IS_STUN
        parse = parse_untrusted
        parsed: dict[bytes, tuple[Address, Address, int]] = {}
        parsed_get = parsed.get
        key_of = _PARSED_KEY.unpack_from
        H = HEADROOM
        NB = MMSG_BATCH // 2  # 32 slots of 64 kB: any datagram fits
        SLOT = INTERNAL_SLOT
        CAP = SLOT - H - 64
        buf = bytearray(SLOT * NB)
        mv = memoryview(buf)
        out: list[tuple[bytes, int, int, Address]] = []  # from the internal socket
        send_internal = out.append
        queues: dict[Address, list[tuple[bytes, int, int, Address]]] = {
            a: [] for a in self.pub_by_addr
        }
        queue_of = queues.get
        flushes = [(fd, out)] + [(s.fileno(), queues[a]) for a, s in self.pub_by_addr.items()]
        nothing = b""
        rounds = max(1, BATCH // NB)

        def drain(now: float) -> bool:
            pin = bin_ = pout = bout = failed = 0
            readable = True
            for _ in range(rounds):
                msgs = recv_batch(fd, buf, SLOT, H, CAP, NB)
                q = H - SLOT
                for n, src in msgs:
                    q += SLOT  # where this datagram (PROXY header first) starts in buf
                    pin += 1
                    bin_ += n
                    # Cached parses by the header's first 28 bytes, as in internal_drain.
                    key = key_of(buf, q)[0]
                    hit = parsed_get(key)
                    if hit is not None:
                        client, public, off = hit
                        if off > n:  # shorter than its header says
                            drop("proxy-malformed")
                            continue
                    else:
                        try:
                            client, public, off = parse(mv[q : q + n])
                        except ProxyError:
                            drop("proxy-malformed")
                            continue
                        if buf[q + 13] == FAM_UDP4:  # IPv6 addresses do not fit in the key
                            if len(parsed) >= PARSED_MAX:
                                parsed.clear()
                            parsed[key] = (client, public, off)
                    p = q + off  # where the client's datagram starts in buf
                    size = n - off
                    if src in returners:
                        # Return traffic: "send this payload from `public` to `client`".
                        flow = get(client)
                        if flow is not None and not flow.answered:
                            note_answer(flow, mv[p : q + n])  # issue 9: stun-budget (core.py)
                        if flow is not None and flow.upstream is not None:
                            # The flow came through an upstream relay: back along the hop.
                            send_internal((flow.header, p, size, flow.upstream))
                        else:
                            queue = queue_of(public)
                            if queue is None:
                                drop("return-unknown-public")
                                continue
                            queue.append((nothing, p, size, client))
                        continue
                    # A framed datagram from an upstream relay: route it like a client's.
                    flow = get(client)
                    if flow is not None and flow.upstream == src and size > 0 and not is_stun[buf[p]]:
                        send_internal((flow.header, p, size, flow.dest))
                        flow.last_seen = now
                        lru(client)
                        continue
                    res = slow(now, client, mv[p : q + n], public, src)
                    if res is None:
                        continue
                    if isinstance(res, Flow):
                        send_internal((res.header, p, size, res.dest))
                    else:
                        send_internal((encode_header(client, public, tlv) + res, 0, 0, src))
                for sfd, queue in flushes:
                    if queue:
                        sent, nbytes, bad = send_batch(sfd, buf, queue)
                        queue.clear()
                        pout += sent
                        bout += nbytes
                        failed += bad
                if len(msgs) < NB:
                    readable = False
                    break
            c.packets_in += pin
            c.bytes_in += bin_
            c.packets_out += pout
            c.bytes_out += bout
            if failed:
                drop("send-failed", failed)
            return readable

        return drain

    # -- transceiver names: resolved here, off the hot path --------------------------------

    def name_of(self, ident: int) -> Address | None:
        name = self.names.get(ident)
        if name is not None:
            return name
        cfg = self.config
        if cfg.transceiver_pattern is None or ident in cfg.transceivers:
            return None
        if cfg.transceiver_count is not None and ident >= cfg.transceiver_count:
            return None
        return pattern_address(cfg.transceiver_pattern, ident)

    def update_return_sources(self) -> None:
        wanted = set(self.core.transceivers.values()) | set(self.next_hops.values())
        self.return_sources.intersection_update(wanted)
        self.return_sources.update(wanted)

    async def resolve_one(self, ident: int) -> None:
        name = self.name_of(ident)
        if name is None:
            return
        try:
            with trio.fail_after(self.config.resolve_timeout):
                addr = await _resolve(name, self.isock.family)
        except (OSError, trio.TooSlowError) as exc:
            log.debug("relay: transceiver %d (%s) does not resolve: %s", ident, name[0], exc)
            return
        self.names.setdefault(ident, name)
        old = self.core.transceivers.get(ident)
        if old == addr:
            self.core.set_transceiver(ident, addr, trio.current_time())  # parked flows
            return
        moved = self.core.set_transceiver(ident, addr, trio.current_time())
        self.update_return_sources()
        log.info("relay: transceiver %d %s is at %s%s", ident, name[0], format_addr(addr),
                 "" if old is None else f" (was {format_addr(old)}, {moved} flows moved)")

    async def resolver(self) -> None:
        """Resolve ids the core asks for as soon as it asks; re-resolve every known name
        every ``resolve_interval`` seconds."""
        limiter = trio.CapacityLimiter(8)

        async def limited(ident: int) -> None:
            async with limiter:
                await self.resolve_one(ident)

        next_sweep = trio.current_time() + self.config.resolve_interval
        while True:
            with trio.move_on_at(next_sweep):
                await self.resolve_wanted.wait()
            self.resolve_wanted = trio.Event()
            now = trio.current_time()
            ids = set(self.core.poll_resolutions(now))
            if now >= next_sweep:
                ids |= set(self.names)
                next_sweep = now + self.config.resolve_interval
            if ids:
                async with trio.open_nursery() as nursery:
                    for ident in sorted(ids):
                        nursery.start_soon(limited, ident)

    async def housekeeping(self) -> None:
        tick = min(1.0, self.config.flow_timeout / 4)
        while True:
            await trio.sleep(tick)
            self.core.sweep(trio.current_time())

    async def control_handler(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") == "stats":
            return {
                "ok": True,
                "counters": self.core.counters.as_dict(),
                "flows": len(self.core.flows),
                "worker": self.config.worker,
                "pid": os.getpid(),
                "io": self.io,
                "sockets": self.sockets,
                "transceivers": {str(k): format_addr(a)
                                 for k, a in sorted(self.core.transceivers.items())},
            }
        return {"ok": False, "status": 400, "code": "unknown-op",
                "detail": f"unknown op {req.get('op')!r}; this relay serves 'stats'"}

    # -- Redis: everything here runs off the hot path ----------------------------------

    def _key(self, client: Address) -> str:
        return f"appliance:relay:c{self.config.cluster}:{client[0]}:{client[1]}"

    async def redis_writer(self, client: Any) -> None:
        """Batch newly established flows (and TTL refreshes) into one pipeline per tick."""
        ttl = max(1, math.ceil(self.config.flow_timeout))
        while True:
            await trio.sleep(0.05)
            writes = self.core.poll_writes(trio.current_time())
            if not writes:
                continue
            keyed = [(self._key(c), v) for c, v in writes]

            def write(keyed: list[tuple[str, str]] = keyed) -> None:
                pipe = client.pipeline(transaction=False)
                for key, value in keyed:
                    pipe.set(key, value, ex=ttl)
                pipe.execute()

            try:
                await trio.to_thread.run_sync(write, abandon_on_cancel=True)
            except Exception as exc:  # redis.RedisError, OSError: keep relaying
                self.core.counters.drop("redis-error", len(keyed))
                log.warning("relay: redis write failed: %s", exc)

    async def redis_reader(self, client: Any) -> None:
        """Look up unknown flows' non-STUN datagrams in batches, in a worker thread."""
        while True:
            await self.lookup_wanted.wait()
            self.lookup_wanted = trio.Event()
            wanted = self.core.poll_lookups(trio.current_time())
            if not wanted:
                continue
            keys = [self._key(c) for c, _, _ in wanted]
            try:
                raw = await trio.to_thread.run_sync(client.mget, keys, abandon_on_cancel=True)
            except Exception as exc:  # redis.RedisError, OSError
                self.core.counters.drop("redis-error", len(wanted))
                log.warning("relay: redis lookup failed: %s", exc)
                continue
            now = trio.current_time()
            for (c, public, upstream), value in zip(wanted, raw, strict=True):
                text = value.decode("ascii", "replace") if isinstance(value, bytes) else None
                flow = self.core.handle_lookup(now, c, public, upstream, text)
                if flow is not None:
                    log.debug("relay: flow %s recovered from redis -> %s",
                              redact(format_addr(c)), flow.route)


def _name(sock: socket.socket) -> Address:
    name = sock.getsockname()
    return (str(name[0]), int(name[1]))


def format_addr(addr: Address) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


async def serve_relay(
    config: RelayConfig,
    *,
    task_status: trio.TaskStatus[RelayHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run one relay worker until cancelled; reports a :class:`RelayHandle` when ready."""
    io = select_io(config.io)  # a bad mode fails before any socket is bound
    if io == "mmsg" and _mmsg is not None and os.environ.get(GSO_ENV) == "0":
        _mmsg.set_gso(False)
    family = socket.AF_INET6 if ":" in config.internal[0] else socket.AF_INET
    transceivers = {k: await _resolve(a, family) for k, a in config.transceivers.items()}
    next_hops = {k: await _resolve(a, family) for k, a in config.next_hops.items()}
    names = {k: a for k, a in config.transceivers.items() if not _is_ip(a[0])}
    if config.transceiver_pattern is not None:
        pattern_address(config.transceiver_pattern, 1)  # a bad pattern fails now
        for k in range(config.transceiver_count or 0):
            if k in transceivers:
                continue
            names[k] = tname = pattern_address(config.transceiver_pattern, k)
            try:
                with trio.fail_after(config.resolve_timeout):
                    transceivers[k] = await _resolve(tname, family)
            except (OSError, trio.TooSlowError) as exc:
                # Not fatal: a StatefulSet pod that is not ready has no DNS record yet.
                log.warning("relay: transceiver %d (%s) does not resolve yet (%s); will retry",
                            k, tname[0], exc)
    core = RelayCore(
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
            resolve_transceivers=config.transceiver_pattern is not None,
            resolve_limit=0x10000 if config.transceiver_count is None else config.transceiver_count,
        )
    )
    redis_client: Any = None
    if config.redis_url is not None:
        import redis  # optional dependency: only relays started with --redis need it

        redis_client = redis.Redis.from_url(
            config.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0
        )
    socks: list[socket.socket] = []
    try:
        for addr in config.listen:
            socks.append(_udp_socket(addr, reuseport=True, public=True))
        # A fixed internal port is shared by the workers (SO_REUSEPORT) so that one next-hop
        # address reaches all of them; the default ephemeral port is per worker.
        isock = _udp_socket(config.internal, reuseport=config.internal[1] != 0)
        socks.append(isock)
        pubs = socks[:-1]
        worker = _Worker(config, core, pubs, isock, set(), io)
        worker.names = names
        worker.next_hops = next_hops
        worker.update_return_sources()
        for name, sock in [*zip(map(format_addr, worker.public), pubs, strict=True), ("internal", isock)]:
            worker.sockets[name] = socket_buffers(sock)
        handle = RelayHandle(worker.public, _name(isock), core, config.worker, worker.sockets,
                             io)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.hot_loop)
            nursery.start_soon(worker.housekeeping)
            if names or config.transceiver_pattern is not None:
                nursery.start_soon(worker.resolver)
            if redis_client is not None:
                nursery.start_soon(worker.redis_writer, redis_client)
                nursery.start_soon(worker.redis_reader, redis_client)
            if config.control is not None:
                await nursery.start(serve_control, config.control, worker.control_handler)
            log.info(
                "relay worker %d ready: public %s internal %s, %d transceivers, %d next hops, "
                "io %s",
                config.worker, ", ".join(format_addr(a) for a in worker.public),
                format_addr(handle.internal), len(transceivers), len(next_hops), io,
            )
            log.info("relay worker %d socket buffers (kernel-granted): %s", config.worker,
                     worker.sockets)
            task_status.started(handle)
    finally:
        for sock in socks:
            sock.close()
        if redis_client is not None:
            with trio.move_on_after(1, shield=True):
                await trio.to_thread.run_sync(redis_client.close, abandon_on_cancel=True)
