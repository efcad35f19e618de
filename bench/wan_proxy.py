"""A userspace WAN emulator for setup benchmarks: this kernel has no netem (issue 19 item 1).

Sits between a client and a server on loopback and delays every datagram or TCP chunk by
RTT/2 in each direction, with optional seeded loss and jitter:

* **UDP, per client flow.** Each client address that sends to a ``--udp`` listener gets its
  own upstream socket to the target, so the server (the appliance's relay, which keys flows
  by 5-tuple) sees one distinct flow per client, as it would on the Internet.
* **TCP, per connection.** The kernel completes the three-way handshake locally, so the
  client's first bytes are held one extra RTT (a client cannot send before the SYN-ACK has
  come back); after that, chunks are delayed RTT/2 each way, in order. No loss on TCP (a
  lost segment would need TCP's retransmission emulated, not just dropped).
* **An SDP front** (``--sdp-front``), for a full-ICE server that advertises its own host
  candidates (aiortc): an HTTP front that strips the offer's candidates (so the server can
  only reach the client through the proxy, as a peer-reflexive address, RFC 8445 §7.3.1.3)
  and rewrites the answer's first UDP candidate to a new UDP delay listener opened for that
  session. ``appliance up`` needs none of this: ``--public-address`` names the proxy.

Order is kept unless ``--reorder`` lets jitter reorder packets: with jitter and no
``--reorder``, a packet is never released before the one in front of it.

    .venv/bin/python bench/wan_proxy.py --rtt-ms 100 \\
        --udp 127.0.0.2:40000=127.0.0.1:40000 --tcp 127.0.0.2:0=127.0.0.1:8080
    # prints one JSON line: {"udp": [...], "tcp": [...], "front": [...]} with the bound ports

A bench tool, not runtime code: nothing in appliance/ imports it.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import re
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

Addr = tuple[str, int]
MAX_FLOWS = 4096  # client flows per UDP listener: a bench never has more; bounds a stray flood


@dataclass(frozen=True, slots=True)
class Impairment:
    """What one direction of the emulated path does to traffic (seconds, probability)."""

    delay: float = 0.0  # one way: RTT/2
    jitter: float = 0.0  # extra delay drawn uniformly from [0, jitter]
    loss: float = 0.0  # UDP only
    reorder: bool = False  # let jitter reorder packets (else each waits for the one before)

    @classmethod
    def from_rtt(cls, rtt_ms: float, *, jitter_ms: float = 0.0, loss: float = 0.0,
                 reorder: bool = False) -> Impairment:
        return cls(rtt_ms / 2000, jitter_ms / 1000, loss, reorder)


class Link:
    """One direction of one flow: a queue of (release time, payload) drained by ``run``."""

    def __init__(self, imp: Impairment, rng: random.Random,
                 deliver: Callable[[bytes], Awaitable[None] | None]) -> None:
        self.imp = imp
        self.rng = rng
        self.deliver = deliver
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = itertools.count()
        self._last = -math.inf
        self._wake = trio.Event()
        self._empty = trio.Event()
        self._empty.set()
        self.sent = 0
        self.dropped = 0

    def push(self, data: bytes, now: float, *, lossy: bool = True,
             not_before: float = -math.inf) -> None:
        imp = self.imp
        if lossy and imp.loss and self.rng.random() < imp.loss:
            self.dropped += 1
            return
        at = now + imp.delay + (self.rng.uniform(0.0, imp.jitter) if imp.jitter else 0.0)
        at = max(at, not_before)
        if not imp.reorder:
            at = max(at, self._last)  # FIFO: never overtake the packet in front
        self._last = max(self._last, at)
        heapq.heappush(self._heap, (at, next(self._seq), data))
        self._empty = trio.Event() if self._empty.is_set() else self._empty
        self._wake.set()

    async def drained(self) -> None:
        """Return once everything pushed so far has been delivered."""
        await self._empty.wait()

    async def run(self) -> None:
        while True:
            if not self._heap:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            at = self._heap[0][0]
            if at > trio.current_time():
                # Woken early by a push only matters with reordering (an earlier release).
                with trio.move_on_at(at):
                    self._wake = trio.Event()
                    await self._wake.wait()
                continue
            _, _, data = heapq.heappop(self._heap)
            result = self.deliver(data)  # None (UDP, sent at once) or awaitable (TCP)
            if result is not None:
                await result
            self.sent += 1
            if not self._heap:
                self._empty.set()


# -- UDP ---------------------------------------------------------------------------------


def _udp_socket(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.setblocking(False)
    return s


def _sendto_nowait(sock: socket.socket, data: bytes, addr: Addr) -> None:
    # A plain non-blocking send: UDP to loopback does not block, and a full buffer is loss,
    # as on the wire; the Link's release time is the schedule.
    try:
        sock.sendto(data, addr)
    except OSError:
        pass


async def _recvfrom(sock: socket.socket) -> tuple[bytes, Addr]:
    while True:
        try:
            data, addr = sock.recvfrom(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)
            continue
        return data, (addr[0], addr[1])


class UdpProxy:
    """Listens on ``listen``; one upstream socket per client address, towards ``target``."""

    def __init__(self, listen: Addr, target: Addr, imp: Impairment, rng: random.Random,
                 *, upstream_host: str | None = None) -> None:
        self.listen = listen
        self.target = target
        self.imp = imp
        self.rng = rng
        self.upstream_host = upstream_host or listen[0]
        self.sock = _udp_socket(listen[0])
        self.bound: Addr = listen
        self.flows: dict[Addr, tuple[socket.socket, Link]] = {}
        self.links: list[Link] = []

    async def run(self, *, task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        self.sock.bind(self.listen)
        self.bound = self.sock.getsockname()[:2]
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(self.bound)
                while True:
                    try:
                        data, client = await _recvfrom(self.sock)
                    except OSError:
                        continue  # ICMP error from an earlier send, surfaced on read
                    now = trio.current_time()
                    flow = self.flows.get(client)
                    if flow is None:
                        if len(self.flows) >= MAX_FLOWS:
                            continue
                        flow = await self._open_flow(nursery, client)
                    flow[1].push(data, now)
        finally:
            self.sock.close()
            for up, _ in self.flows.values():
                up.close()

    async def _open_flow(self, nursery: trio.Nursery, client: Addr
                         ) -> tuple[socket.socket, Link]:
        up = _udp_socket(self.upstream_host)
        up.bind((self.upstream_host, 0))
        upward = Link(self.imp, self.rng, lambda d: _sendto_nowait(up, d, self.target))
        downward = Link(self.imp, self.rng, lambda d: _sendto_nowait(self.sock, d, client))
        self.links += [upward, downward]
        self.flows[client] = (up, upward)
        nursery.start_soon(upward.run)
        nursery.start_soon(downward.run)
        nursery.start_soon(self._read_upstream, up, downward)
        return up, upward

    async def _read_upstream(self, up: socket.socket, downward: Link) -> None:
        # Anything that reaches the upstream socket goes back to that client: replies, and a
        # full-ICE server's own checks to the address it learned (peer-reflexive).
        while True:
            try:
                data, _ = await _recvfrom(up)
            except OSError:
                continue  # ICMP port unreachable from a closed target, surfaced on read
            downward.push(data, trio.current_time())


# -- TCP ---------------------------------------------------------------------------------


class TcpProxy:
    """Per connection: delay each direction by RTT/2, plus one RTT before the first upward
    bytes to stand in for the three-way handshake the kernel already did locally."""

    def __init__(self, listen: Addr, target: Addr, imp: Impairment, rng: random.Random,
                 *, handshake: bool = True) -> None:
        self.listen = listen
        self.target = target
        self.imp = Impairment(imp.delay, imp.jitter, 0.0, False)  # TCP: in order, no loss
        self.rng = rng
        self.handshake = handshake
        self.bound: Addr = listen
        self.connections = 0

    async def run(self, *, task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        listeners = await trio.open_tcp_listeners(self.listen[1], host=self.listen[0])
        self.bound = listeners[0].socket.getsockname()[:2]
        task_status.started(self.bound)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        accepted = trio.current_time()
        self.connections += 1
        try:
            server = await trio.open_tcp_stream(*self.target)
        except OSError:
            await client.aclose()
            return
        # SYN out (RTT/2) and SYN-ACK back (RTT/2) before the client could have sent a byte.
        first = accepted + 2 * self.imp.delay if self.handshake else -math.inf
        async with client, server, trio.open_nursery() as nursery:
            up = Link(self.imp, self.rng, server.send_all)
            down = Link(self.imp, self.rng, client.send_all)
            nursery.start_soon(_pump_link, up)
            nursery.start_soon(_pump_link, down)
            nursery.start_soon(_pump, client, up, first, server, None)
            nursery.start_soon(_pump, server, down, -math.inf, client, nursery)


async def _pump_link(link: Link) -> None:
    try:
        await link.run()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _pump(src: trio.SocketStream, link: Link, first: float, dst: trio.SocketStream,
                nursery: trio.Nursery | None) -> None:
    """Read ``src`` into ``link``. At the client's EOF, pass the half-close on once the
    queued bytes are out; at the server's, close the connection (``nursery`` given)."""
    try:
        while chunk := await src.receive_some(65536):
            link.push(chunk, trio.current_time(), lossy=False,
                      not_before=first + link.imp.delay)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    await link.drained()
    if nursery is not None:
        nursery.cancel_scope.cancel()
    else:
        try:
            await dst.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


# -- SDP front for a full-ICE server --------------------------------------------------------

_CAND = re.compile(r"^a=candidate:(\S+) (\d+) (udp) (\d+) (\S+) (\d+) typ (\S+)(.*)$", re.I)


def strip_candidates(sdp: str) -> str:
    """The offer without candidate lines: the server then learns the client's address only
    from its checks, which come through the proxy (peer-reflexive, RFC 8445 §7.3.1.3)."""
    keep = [ln for ln in sdp.split("\r\n")
            if not ln.startswith(("a=candidate:", "a=end-of-candidates"))]
    return "\r\n".join(keep)


def first_udp_candidate(sdp: str) -> Addr | None:
    for line in sdp.split("\r\n"):
        m = _CAND.match(line)
        if m and ":" not in m.group(5):
            return (m.group(5), int(m.group(6)))
    return None


def rewrite_answer(sdp: str, proxy: Addr) -> str:
    """One host candidate naming ``proxy``; every other candidate dropped; c=/m= to match."""
    out: list[str] = []
    done = False
    for line in sdp.split("\r\n"):
        m = _CAND.match(line)
        if line.startswith("a=candidate:"):
            if m and not done:
                out.append(f"a=candidate:{m.group(1)} {m.group(2)} udp {m.group(4)} "
                           f"{proxy[0]} {proxy[1]} typ host")
                done = True
            continue
        if line.startswith("c=IN IP4 "):
            line = f"c=IN IP4 {proxy[0]}"
        elif line.startswith("m=audio "):
            parts = line.split(" ")
            parts[1] = str(proxy[1])
            line = " ".join(parts)
        out.append(line)
    return "\r\n".join(out)


async def _read_http(stream: trio.SocketStream) -> tuple[str, dict[str, str], bytes] | None:
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = await stream.receive_some(65536)
        if not chunk or len(buf) > 1 << 16:
            return None
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    need = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < need:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        body += chunk
    return lines[0], headers, bytes(body[:need])


def _message(first: str, headers: dict[str, str], body: bytes) -> bytes:
    hdrs = {k: v for k, v in headers.items() if k not in ("content-length", "connection")}
    hdrs["content-length"] = str(len(body))
    hdrs["connection"] = "close"
    return (first + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
            + "\r\n").encode("latin-1") + body


class SdpFront:
    """HTTP front of a full-ICE WHIP-style server: one UDP delay listener per session."""

    def __init__(self, listen: Addr, target: Addr, imp: Impairment, rng: random.Random,
                 *, udp_host: str) -> None:
        self.listen = listen
        self.target = target
        self.imp = imp
        self.rng = rng
        self.udp_host = udp_host
        self.bound: Addr = listen
        self.sessions: dict[str, trio.CancelScope] = {}

    async def run(self, *, task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            listeners = await trio.open_tcp_listeners(self.listen[1], host=self.listen[0])
            self.bound = listeners[0].socket.getsockname()[:2]
            task_status.started(self.bound)
            await trio.serve_listeners(self._handle, listeners)

    async def _session_proxy(self, target: Addr, scope: trio.CancelScope,
                             *, task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                             ) -> None:
        with scope:
            proxy = UdpProxy((self.udp_host, 0), target, self.imp, self.rng)
            await proxy.run(task_status=task_status)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            req = await _read_http(client)
            if req is None:
                return
            first, headers, body = req
            method, path, _ = first.split(" ", 2)
            if method == "POST":
                body = strip_candidates(body.decode()).encode()
            async with await trio.open_tcp_stream(*self.target) as server:
                headers["host"] = f"{self.target[0]}:{self.target[1]}"
                await server.send_all(_message(first, headers, body))
                resp = await _read_http(server)
            if resp is None:
                return
            status, rheaders, rbody = resp
            if method == "POST" and " 201 " in status + " ":
                cand = first_udp_candidate(rbody.decode())
                if cand is not None:
                    scope = trio.CancelScope()
                    bound = await self._nursery.start(self._session_proxy, cand, scope)
                    rbody = rewrite_answer(rbody.decode(), bound).encode()
                    self.sessions[rheaders.get("location", "")] = scope
            elif method == "DELETE":
                scope_ = self.sessions.pop(path, None)
                if scope_ is not None:
                    scope_.cancel()
            await client.send_all(_message(status, rheaders, rbody))


# -- CLI -------------------------------------------------------------------------------------


def _hostport(text: str) -> Addr:
    host, _, port = text.rpartition(":")
    return (host.strip("[]") or "127.0.0.1", int(port))


def _pair(text: str) -> tuple[Addr, Addr]:
    listen, _, target = text.partition("=")
    if not target:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LISTEN=TARGET (host:port each)")
    return _hostport(listen), _hostport(target)


async def serve(args: argparse.Namespace) -> None:
    imp = Impairment.from_rtt(args.rtt_ms, jitter_ms=args.jitter_ms, loss=args.loss,
                              reorder=args.reorder)
    rng = random.Random(args.seed)
    bound: dict[str, list[str]] = {"udp": [], "tcp": [], "front": []}
    async with trio.open_nursery() as nursery:
        for listen, target in args.udp:
            a = await nursery.start(UdpProxy(listen, target, imp, rng).run)
            bound["udp"].append(f"{a[0]}:{a[1]}")
        for listen, target in args.tcp:
            a = await nursery.start(TcpProxy(listen, target, imp, rng,
                                             handshake=not args.no_handshake).run)
            bound["tcp"].append(f"{a[0]}:{a[1]}")
        for listen, target in args.sdp_front:
            # The front itself is undelayed on loopback; the TCP delay proxy sits before it.
            front = SdpFront(("127.0.0.1", 0), target, imp, rng, udp_host=listen[0])
            f = await nursery.start(front.run)
            a = await nursery.start(TcpProxy(listen, f, imp, rng,
                                             handshake=not args.no_handshake).run)
            bound["front"].append(f"{a[0]}:{a[1]}")
        print(json.dumps(bound), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rtt-ms", type=float, default=100.0, help="round trip added (RTT/2 each way)")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="extra one-way delay, U[0, j]")
    p.add_argument("--loss", type=float, default=0.0, help="UDP loss probability per direction")
    p.add_argument("--seed", type=int, default=1, help="seed of the loss and jitter draws")
    p.add_argument("--reorder", action="store_true", help="let jitter reorder packets")
    p.add_argument("--no-handshake", action="store_true",
                   help="do not hold a TCP connection's first bytes one RTT for the handshake")
    p.add_argument("--udp", type=_pair, action="append", default=[], metavar="LISTEN=TARGET")
    p.add_argument("--tcp", type=_pair, action="append", default=[], metavar="LISTEN=TARGET")
    p.add_argument("--sdp-front", type=_pair, action="append", default=[],
                   metavar="LISTEN=TARGET",
                   help="TCP delay + SDP-rewriting HTTP front of a full-ICE server; its "
                        "per-session UDP listeners bind LISTEN's host")
    args = p.parse_args(argv)
    if not (args.udp or args.tcp or args.sdp_front):
        p.error("nothing to proxy: give --udp, --tcp or --sdp-front")
    try:
        trio.run(serve, args)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
