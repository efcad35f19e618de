"""ICE-TCP (RFC 6544) through the relay: a TCP listener as one more source and sink.

The client (a browser that found the answer's ``tcptype passive`` candidate, RFC 6544 §4.2)
opens a TCP connection to the relay and speaks RFC 4571 framing on it: each frame is one
STUN, DTLS or SRTP packet (:mod:`appliance.proto.framing`). The relay keeps its design
(DESIGN.md "Relay <-> transceiver datagram format", ICE-TCP paragraph):

* the **first frame** must be a well-formed STUN Binding request whose USERNAME carries a
  server ufrag that verifies (the relay's own codec, ``RelayCore.codec``), within
  ``first_frame_timeout`` of the accept; otherwise the connection is closed and counted
  (``tcp-first-frame`` / ``tcp-first-timeout``). Until the core has made a flow of the
  connection (its rate limits and STUN budget apply as on UDP) only such frames are taken;
* after that **each frame is one opaque datagram** of the flow: it is copied into the
  listener's slot buffer and handed to the same routing loop as the UDP sockets'
  (:func:`.fastpath.make_drain`, ``transport=Transport.TCP``), which forwards it on the
  internal UDP leg with a STREAM PROXY v2 header (source = the client's TCP address as a
  :class:`~appliance.proto.proxy.StreamAddr`, destination = the listener's address);
* return datagrams whose header says STREAM are queued on this listener's
  :class:`TcpSink` by the internal drain and framed back onto the connection;
* the **flow ends with the connection** (``RelayCore.flows`` loses it at once).

Bounded under abuse (issue 18 #5): connections per source IP (``max_per_ip``) and in total
(``max_connections``) are capped at accept (``tcp-refused-ip`` / ``tcp-refused-total``, the
socket is closed before a byte is read); frames longer than ``max_frame`` close the
connection (``tcp-frame-too-long``) before their body is buffered; a frame whose first byte
RFC 7983 gives to nothing we relay is dropped (``tcp-junk``: the UDP sockets' kernel filter,
:mod:`.filter`, has no TCP equivalent); a connection silent for ``idle_timeout`` is closed
(``tcp-idle``: half-open peers); and writes are **back-pressured per connection**: a
connection's unsent bytes are capped at ``write_buffer``; a frame that does not fit is dropped
and counted (``tcp-write-full``), so a slow reader costs at most that much memory and never
delays another connection (every send is non-blocking; a connection with a backlog is
drained by its own writer task when the kernel says it is writable).

One port for HTTPS and ICE-TCP (issue 18 #4, ``https`` / ``--tcp-https``): RFC 4571 frames
the relay accepts are at most 2048 bytes, so a connection's first byte is 0x00-0x07; a TLS
connection starts with a handshake record, byte 0x16 (RFC 8446 §5.1). With an HTTPS backend
configured, a connection whose first byte is 0x16 is spliced, bytes as they are, to that
address (signaling's PROXY-aware HTTPS backend, ``--relay-https``; ``tcp_https`` counts
them) behind a PROXY v2 header (STREAM) naming the client's TCP address and the address it
reached, so signaling judges each request by the real client, never by this loopback hop
(issue 40 item 0); anything else goes through the ICE-TCP rules above.

TURN over TCP (RFC 8656 §12.5, issue 40; with ``--turn``): a connection whose first bytes are
a STUN message itself — the magic cookie at bytes 4-7, where an RFC 4571 frame has it at 6-9
— is a TURN client's. Its stream is STUN messages and 4-byte-padded ChannelData back to back
(:class:`~appliance.proto.turn.StreamFramer`, messages capped at ``max_frame``); each message
goes to the same drain and from there to the TURN gate (relay/turn.py), and what goes back
to the client is written without the RFC 4571 prefix. Until the connection has an allocation
it is held to ``first_frame_timeout``, then to ``idle_timeout``; when it closes its allocation
is deleted (RFC 8656 §3.1). Detection needs the first read to hold 8 bytes; a TURN client's
first Allocate is at least 28, sent in one segment.

TURN over TLS and the TLS split (issue 40 item 4; relay/tls.py): with TURN/TLS configured
(``--turn-tls-cert/--turn-tls-key``) or an HTTPS backend, a connection whose first byte is
0x16 is held (within ``first_frame_timeout``) until its whole ClientHello is in, and the
hello's ALPN and SNI (:mod:`appliance.proto.dtls.tlspeek`) choose: HTTPS is spliced as
above; TURN is terminated here — the handshake by OpenSSL over memory BIOs
(:class:`~.tls.TlsSession`), the records after it by our own layer — and its plaintext is
the TURN-over-TCP stream above, its return messages encrypted onto the same
back-pressured backlog; a malformed hello is closed and counted (``tcp-tls-hello``), as is
one asking for an ALPN protocol we do not speak (``tcp-tls-alpn``) and a failed handshake
(``tcp-tls-handshake``).

A front proxy (``TcpLimits.proxy_from``, ``--tcp-proxy-from``; docs/turn.md "A proxy in
front of 443"): a connection from those networks must open with a PROXY v1/v2 header
(:mod:`appliance.proto.proxy.stream`) within ``first_frame_timeout``; the client it names
becomes the connection's client for everything above (flows, TURN, the per-IP bound, the
HTTPS splice's header), and the bytes after it are the connection's first. No header, a bad
one, or one naming no client (``UNKNOWN``/``LOCAL``: health checks) is closed and counted
(``tcp-proxy-*``); connections from elsewhere are never asked for one.

A worker kill (issue 40 item 2, :mod:`.keeper`): an established ICE-TCP or TURN/TCP
connection is handed to the keeper in the worker's fork template (a copy of its descriptor
and a record; TURN/TCP's allocation snapshot follows its changes), dropped when it ends;
after a SIGKILL the successor :meth:`TcpListener.adopt`-s it and carries on. So closing a
connection is ``shutdown`` then ``close`` (the keeper's copy would keep it open), and bytes
only peeked at are discarded first (a close with unread bytes is a reset, not a FIN).
TURN/TLS connections are kept too, with their keys. Each kept connection has a slot on
the worker's board (relay/board.py): before each send the chunk of whole frames it may hand
the kernel is published there (the send is cut to it: :func:`send_backlog`), so a successor
finishes a frame the kill cut in two, and a TLS connection's sequence numbers with it
(reads: relay/tls.py ``TlsLink``). A rolling restart
(SIGHUP, :mod:`.handover`): when the stop is a roll's, a kept connection whose task the stop
cancels is *released* (:meth:`TcpListener._release`: out of the tables, its unsent bytes and
a fresh record to the hand-over, our descriptor closed later without a shutdown) and the
successor adopts it as after a kill; one that ends by itself still closes.

Reads: one ``recv_into(MSG_PEEK)`` (up to 64 kB) per readability; the whole frames in it
(:func:`~appliance.proto.framing.frame_spans_untrusted`, for TURN
:func:`~appliance.proto.turn.message_spans_untrusted`) are handed to the drain as one batch
and only then taken out of the kernel (``recv(n, MSG_TRUNC)``: discarded, not copied), so a
worker killed between two reads leaves the stream at a frame boundary for its successor;
while only part of a frame is in, ``SO_RCVLOWAT`` is the frame's size, so the task is not
woken for every segment of it. A front proxy's header is peeked and taken the same way.
That is a trio wake-up per TCP segment burst rather than the UDP path's batched epoll loop
— ICE-TCP is the fallback path, measured in docs/performance.md. TURN/TLS peeks and takes
whole TLS records the same way (:func:`~appliance.proto.dtls.tlsrecord.record_spans_untrusted`),
OpenSSL's handshake records one at a time, then records our own layer opens
(:class:`~appliance.proto.dtls.tlsrecord.RecordLayer`), their plaintext framed by
:class:`~appliance.proto.turn.StreamFramer`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ..netio.sockets import bind_error, family_of, format_addr, sockname
from ..netio.splice import splice
from ..proto.dtls import DtlsError
from ..proto.dtls.tlspeek import MAX_HELLO_BYTES, HelloPeek, peek_client_hello_untrusted
from ..proto.dtls.tlsrecord import RecordLayer, record_spans_untrusted
from ..proto.framing import FramingError, frame_spans_untrusted
from ..proto.mux import Kind, first_byte_kind
from ..proto.proxy import STREAM, ProxyError, StreamAddr, encode_header
from ..proto.proxy.stream import parse_stream_header_untrusted
from ..proto.stun import StunError, peek_username_untrusted
from ..proto.stun.message import COOKIE_BYTES
from ..proto.turn import StreamFramer, TurnError, message_spans_untrusted
from ..proto.ufrag import UfragError
from .board import Board, Outgoing, resolve, resume_out, stream_offsets
from .core import IS_STUN, Address, RelayCore
from .fastpath import HEADROOM, PUBLIC_SLOT, Drain, Outbox, make_drain
from .filter import MAX_DATAGRAM
from .keeper import KeeperLink, Kept, kept_record
from .tls import Route, TlsLink, TlsServer, TlsSession, TurnTls, route
from .transport import Out, Transport

if TYPE_CHECKING:
    from .handover import Handover

log = logging.getLogger(__name__)

#: ``RELAYED[b]``: a frame starting with ``b`` is STUN, DTLS or RTP/RTCP (RFC 7983 §7), the
#: same classes the UDP sockets' kernel filter lets through.
RELAYED = bytes(0 if first_byte_kind(b) is Kind.UNKNOWN else 1 for b in range(256))
#: Frames handed to the drain per batch (slots of the listener's buffer).
TCP_BATCH = 32
READ_SIZE = 65536
#: RFC 8446 §5.1: ContentType.handshake, the first byte of every TLS connection.
TLS_HANDSHAKE = 0x16
BACKLOG = 1024
#: Bytes a TLS record adds to a message at most (TLS 1.2 AES-GCM: 5 header + 8 explicit
#: nonce + 16 tag; TLS 1.3: 5 + 1 inner type + 16 tag): the write cap counts them.
TLS_OVERHEAD = 29


@dataclass(frozen=True, slots=True)
class TcpLimits:
    """The ICE-TCP listener's bounds (module docstring)."""

    max_connections: int = 10_000
    max_per_ip: int = 64
    first_frame_timeout: float = 5.0
    idle_timeout: float = 60.0
    max_frame: int = MAX_DATAGRAM
    write_buffer: int = 64 * 1024
    #: front proxies (``--tcp-proxy-from``): a connection from these must open with a PROXY
    #: header, and the client it names is the connection's client (module docstring)
    proxy_from: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


def tcp_listener(addr: Address, *, reuseport: bool = True) -> socket.socket:
    """A bound, listening, non-blocking TCP socket on ``addr`` (IPv6: v6only, so an IPv4
    listener on the same port is separate). ``SO_REUSEPORT`` lets worker processes share it:
    the kernel spreads connections over them."""
    sock = socket.socket(family_of(addr[0]), socket.SOCK_STREAM)
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise bind_error(exc, f"cannot listen on TCP {format_addr(addr)} (ICE-TCP)") from None
    except BaseException:
        sock.close()
        raise
    return sock


class TcpConnection:
    """One accepted client connection: its socket, write backlog and state."""

    __slots__ = ("backlog", "blocked", "client", "closed", "flowed", "kept", "lowat", "out",
                 "reached", "sock", "tls", "turn", "wake")

    def __init__(self, sock: socket.socket, client: StreamAddr) -> None:
        self.sock = sock
        self.client = client
        #: its id at the keeper (relay/keeper.py) once handed over, else None
        self.kept: int | None = None
        #: the socket's SO_RCVLOWAT: the bytes the next frame needs while only part of it
        #: is in (peeking, the reader would otherwise wake for every segment), else 1
        self.lowat = 1
        #: the address the client reached: ours, or a front proxy's (its header says)
        self.reached: Address | None = None
        #: framed bytes the kernel has not taken yet (bounded by TcpLimits.write_buffer)
        self.backlog = bytearray()
        #: the writer task owns the backlog until it is empty (no direct sends meanwhile,
        #: so frames stay in order)
        self.blocked = False
        self.wake = trio.Event()
        self.flowed = False  # the core made a flow of it (TURN: an allocation)
        self.closed = False
        #: a TURN-over-TCP client (module docstring): no RFC 4571 prefix on what we write
        self.turn = False
        #: TURN over TLS, once its handshake is done: its records (relay/tls.py)
        self.tls: TlsLink | None = None
        #: kept with a slot on the worker's board: its backlog as the board sees it
        #: (relay/board.py "Writes"), else None
        self.out: Outgoing | None = None


class TcpSink:
    """The return sink of one TCP listener (:class:`~.transport.ReturnSink`): frames each
    queued datagram onto its client's connection."""

    transport = Transport.TCP

    def __init__(self, public: Address, core: RelayCore, write_buffer: int) -> None:
        self.public = public
        self.pending: list[Out] = []
        self.conns: dict[Address, TcpConnection] = {}
        self._core = core
        self._cap = write_buffer

    def flush(self, buf: bytearray, pending: list[Out]) -> tuple[int, int, int]:
        """Frame every entry onto its connection, then one non-blocking ``send`` per
        connection touched. Never blocks, never raises; drops are counted here."""
        drop = self._core.counters.drop
        cap = self._cap
        get = self.conns.get
        sent = nbytes = 0
        touched: list[TcpConnection] = []
        for header, p, n, dest in pending:
            conn = get(dest)
            if conn is None or conn.closed:
                drop("tcp-gone")  # the connection closed while the transceiver answered
                continue
            size = len(header) + n
            backlog = conn.backlog
            if len(backlog) + (TLS_OVERHEAD if conn.tls else 2) + size > cap:
                drop("tcp-write-full")  # a slow reader: its own frames go, nobody else's
                continue
            if not backlog:
                touched.append(conn)
            if conn.tls is not None:  # TURN/TLS: the TURN-over-TCP stream, encrypted
                layer = conn.tls.layer
                try:
                    records = layer.seal(bytes(header) + buf[p : p + n])
                except DtlsError:  # its sequence numbers ran out
                    drop("tcp-tls-write")
                    continue
                backlog += records
                if conn.out is not None:
                    conn.out.appended(len(records), layer.wgen, layer.wseq)
            else:
                if not conn.turn:
                    backlog += size.to_bytes(2, "big")  # RFC 4571 §2 length prefix
                if header:
                    backlog += header
                if n:
                    backlog += memoryview(buf)[p : p + n]
                if conn.out is not None:
                    conn.out.appended(size + (0 if conn.turn else 2))
            sent += 1
            nbytes += size
        for conn in touched:
            if not conn.blocked:
                push(conn)
        return sent, nbytes, 0


def queue(conn: TcpConnection, data: bytes) -> None:
    """Bytes of our own (TLS handshake flights, alerts; after the handshake the record
    layer's own records) onto the connection, in order."""
    if data and not conn.closed:
        conn.backlog += data
        if conn.out is not None:
            layer = None if conn.tls is None else conn.tls.layer
            conn.out.appended(len(data), *((layer.wgen, layer.wseq) if layer else (0, 0)))
        if not conn.blocked:
            push(conn)


def push(conn: TcpConnection) -> None:
    """Send what the kernel takes now; leave the rest to the connection's writer task."""
    try:
        n = send_backlog(conn)
    except BlockingIOError:
        n = 0
    except OSError:
        conn.backlog.clear()
        conn.closed = True  # the reader sees the error or EOF and cleans up
        conn.wake.set()
        return
    del conn.backlog[:n]
    if conn.out is not None:
        conn.out.wrote(n)
    if conn.backlog:
        conn.blocked = True
        conn.wake.set()


def send_backlog(conn: TcpConnection) -> int:
    """One non-blocking ``send`` of the backlog — of a kept connection's, the chunk its
    board entry names first (relay/board.py "Writes"). Raises what ``send`` raises."""
    backlog = conn.backlog
    if conn.out is None:
        return conn.sock.send(backlog)
    n = conn.out.chunk(backlog)
    return conn.sock.send(backlog if n == len(backlog) else backlog[:n])


_SCRATCH = bytearray(READ_SIZE)  # never written: MSG_TRUNC discards on TCP
_ASK_GATE = object()  # TcpListener._record: the allocation's record is the gate's, now


def close_socket(sock: socket.socket) -> None:
    """Close an accepted connection so that its client sees the end: the bytes it sent
    that were only peeked at are discarded first (Linux answers a close with unread bytes
    with a reset, not a FIN), and it is shut down before the close, for the keeper may
    hold a copy of it (relay/keeper.py) that would otherwise keep it open."""
    try:
        for _ in range(16):
            if sock.recv_into(_SCRATCH, READ_SIZE, socket.MSG_TRUNC | socket.MSG_DONTWAIT) <= 0:
                break
    except OSError:
        pass  # nothing (more) to read, or not connected
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected any more
    sock.close()


def _take(conn: TcpConnection, rbuf: bytearray, n: int, want: int) -> None:
    """Take the ``n`` bytes just peeked out of the kernel, without copying them (on TCP,
    ``MSG_TRUNC`` discards), and make the socket readable again only once ``want`` bytes
    are in (``SO_RCVLOWAT``: the rest of a frame whose start is in; 0: any byte), so
    waiting for the rest of a frame does not spin."""
    sock = conn.sock
    while n > 0:
        try:
            got = sock.recv_into(rbuf, n, socket.MSG_TRUNC)
        except (BlockingIOError, InterruptedError):  # pragma: no cover - they were peeked
            break
        except OSError:
            return
        if got <= 0:
            break
        n -= got
    lowat = max(1, want)
    if lowat != conn.lowat:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        except OSError:
            return
        conn.lowat = lowat


class TcpListener:
    """One ``--tcp`` address: accepts, reads frames into the drain, writes frames back."""

    def __init__(self, core: RelayCore, sock: socket.socket, internal: Outbox,
                 limits: TcpLimits, https: Address | None = None,
                 tls: TurnTls | None = None) -> None:
        self.core = core
        #: TURN/TLS (relay/tls.py): the split's names and the server context, or None
        self.tls = tls
        self.tls_server = None if tls is None else TlsServer(tls)
        #: where TLS connections go in shared-port mode (module docstring), or None
        self.https = https
        self.sock = sock
        self.public = sockname(sock)
        self.limits = limits
        self.sink = TcpSink(self.public, core, limits.write_buffer)
        core.sinks[(Transport.TCP, self.public)] = self.sink
        self.per_ip: dict[str, int] = {}
        #: connections from a front proxy whose header is not in yet (they count toward
        #: max_connections; per-IP bounds apply to the client they name)
        self.proxied_pending = 0
        self.buf = bytearray(PUBLIC_SLOT * TCP_BATCH)
        self._batch: list[tuple[int, Address]] = []
        #: the worker's link to its keeper (relay/keeper.py), set by the shell, or None
        self.keeper: KeeperLink | None = None
        #: the roll's hand-over (relay/handover.py), set by the shell, or None: while it is
        #: leaving, a kept connection whose task the stop ends is released to it, not closed
        self.handover: Handover | None = None
        self._nursery: trio.Nursery | None = None
        #: set once :meth:`serve` runs (adopted connections need its nursery)
        self.started = trio.Event()
        #: the hot loop's ``wake`` (server.py): what a drain queued for other tasks (a
        #: look-up: an adopted connection's flow is asked for) must not wait for the hot
        #: loop's next wake-up, which a worker with only TCP traffic may not have for long
        self.wake: Callable[[], None] | None = None
        self.drain: Drain = make_drain(
            core, recv=self._take, buf=self.buf, slot=PUBLIC_SLOT, count=TCP_BATCH,
            internal=internal, public=self.public, reply=self.sink, transport=Transport.TCP)

    def _drain_now(self) -> None:
        self.drain(trio.current_time())
        if self.wake is not None:
            self.wake()

    def _take(self) -> list[tuple[int, Address]]:
        batch, self._batch = self._batch, []
        return batch

    def stats(self) -> dict[str, Any]:
        return {"public": format_addr(self.public), "connections": len(self.sink.conns)}

    async def serve(self) -> None:
        """Accept until cancelled; every connection runs in this nursery."""
        limits = self.limits
        counters = self.core.counters
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # adopted connections run here too
            self.started.set()
            while True:
                await trio.lowlevel.wait_readable(self.sock)
                try:
                    csock, peer = self.sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:  # ECONNABORTED, EMFILE: not fatal for the listener
                    counters.drop("tcp-accept-failed")
                    await trio.sleep(0.01)  # EMFILE would spin: let connections close
                    continue
                ip = str(peer[0])
                if len(self.sink.conns) + self.proxied_pending >= limits.max_connections:
                    csock.close()
                    counters.drop("tcp-refused-total")
                    continue
                from_proxy = self._from_proxy(ip)
                if not from_proxy and self.per_ip.get(ip, 0) >= limits.max_per_ip:
                    csock.close()
                    counters.drop("tcp-refused-ip")
                    continue
                csock.setblocking(False)
                csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # media: no Nagle
                conn = TcpConnection(csock, StreamAddr((ip, int(peer[1]))))
                counters.tcp_accepted += 1
                if from_proxy:  # its client is known once its header is in
                    self.proxied_pending += 1
                    nursery.start_soon(self._proxied, conn)
                elif self._admit(conn):
                    nursery.start_soon(self._connection, conn)

    def _from_proxy(self, ip: str) -> bool:
        nets = self.limits.proxy_from
        if not nets:
            return False
        try:
            addr = ipaddress.ip_address(ip.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in n for n in nets)

    def _admit(self, conn: TcpConnection) -> bool:
        """Enter the connection in the tables under its client; False (closed, counted)
        when that client is over its per-IP bound or already connected."""
        client = conn.client
        ip = client[0]
        if self.per_ip.get(ip, 0) >= self.limits.max_per_ip:
            self._discard(conn, "tcp-refused-ip")
            return False
        if client in self.sink.conns:  # the kernel reused a live 4-tuple, or a proxy lied
            self._discard(conn, "tcp-duplicate-client")
            return False
        self.sink.conns[client] = conn
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        return True

    def _discard(self, conn: TcpConnection, reason: str | None) -> None:
        """Close an accepted connection that never entered the tables (counted as closed,
        so accepted - closed stays the open count)."""
        close_socket(conn.sock)
        if reason:
            self.core.counters.drop(reason)
        self.core.counters.tcp_closed += 1

    async def _proxied(self, conn: TcpConnection) -> None:
        """A connection from a front proxy (``proxy_from``): read its PROXY v1/v2 header
        within ``first_frame_timeout``; the client it names becomes the connection's client
        (quotas, flows, TURN allocations and the API's trust follow it) and the bytes after
        it are the connection's first. No header, a bad one or one naming no client (a
        health check): closed and counted."""
        deadline = trio.current_time() + self.limits.first_frame_timeout
        rbuf = bytearray(READ_SIZE)
        got = None
        try:  # (cancelled meanwhile: the socket is closed below, never left open)
            while got is None:
                with trio.move_on_at(deadline):
                    await trio.lowlevel.wait_readable(conn.sock)
                if trio.current_time() >= deadline:
                    self._discard(conn, "tcp-proxy-timeout")
                    return
                try:  # peeked: only the header is taken, the stream stays whole
                    n = conn.sock.recv_into(rbuf, READ_SIZE, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self._discard(conn, None)
                    return
                if not n:
                    self._discard(conn, None)
                    return
                try:
                    got = parse_stream_header_untrusted(memoryview(rbuf)[:n])
                except ProxyError as exc:
                    self._discard(conn, f"tcp-proxy-{exc.hint}")
                    return
                if got is None:
                    _take(conn, rbuf, 0, n + 1)  # wake when more is in, not before
                else:
                    _take(conn, rbuf, got[2], 0)
        finally:
            self.proxied_pending -= 1
            if got is None:
                close_socket(conn.sock)
        src, dst, _ = got
        conn.client = StreamAddr(src)
        conn.reached = dst
        if self._admit(conn):
            self.core.counters.tcp_proxied += 1
            await self._connection(conn)

    async def _connection(self, conn: TcpConnection) -> None:
        ended = False  # by itself (its peer, its input, its timeouts), not by a stop
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, conn)
                await self._reader(conn)
                ended = True
                nursery.cancel_scope.cancel()
        finally:
            if ended or not self._release(conn):
                self._close(conn)

    def _release(self, conn: TcpConnection) -> bool:
        """A stop for a roll (relay/handover.py) ends a kept connection's task: it goes to
        the successor with its record — made now, so a TURN/TCP allocation's latest state
        travels — and its unsent bytes, our descriptor later closed without a shutdown.
        False (it is closed as before): no hand-over under way, not kept, or broken."""
        handover = self.handover
        if handover is None or not handover.leaving or conn.kept is None or conn.closed:
            return False
        record = self._record(conn, handed=True)
        if record is None:
            return False
        self._untable(conn)
        kept, conn.kept = conn.kept, None
        if self.keeper is not None:
            self.keeper.drop(kept)  # a keeper still linked closes its copy (no shutdown)
        self._unboard(conn)
        handover.release(conn.sock, record, bytes(conn.backlog))
        conn.backlog.clear()
        return True

    def _record(self, conn: TcpConnection, *, handed: bool = False,
                allocation: bytes | None | object = _ASK_GATE) -> dict[str, Any] | None:
        """The keeper's record of ``conn`` (relay/keeper.py :func:`~.keeper.kept_record`):
        its slot on the board (relay/board.py) if it has one; TURN with its allocation's
        snapshot (``allocation`` when the gate just gave it — None: it ended —, else the
        gate's now: None, it has none, and it is not kept); TURN/TLS with its keys.
        ``handed`` to a roll's successor: no slot (our board is not the successor's) and
        TLS's record state as of now (its reader is stopped, its backlog is written out
        before the hand-over). None: it cannot be kept (TLS with no slot)."""
        if not conn.turn:
            allocation = None
        elif allocation is _ASK_GATE:
            turn = self.core.turn
            allocation = None if turn is None else turn.keep(conn.client, self.public)
            if allocation is None:
                return None
        assert allocation is None or isinstance(allocation, bytes)
        slot = None if handed or conn.out is None else conn.out.slot
        tls: dict[str, Any] | None = None
        if conn.tls is not None:
            tls = {"k": conn.tls.layer.keys.to_record()}
            if handed:
                tls["st"] = list(conn.tls.layer.state)
                held = conn.tls.framer.held
                if held:  # a TURN message its reader had half read
                    tls["p"] = held.hex()
            elif slot is None:
                return None
        return kept_record("turn" if conn.turn else "ice", conn.client, self.public,
                           allocation, tls, slot)

    def _board(self, conn: TcpConnection, written: int | None = None) -> bool:
        """Give ``conn`` a slot on the keeper's board (relay/board.py): its writes, and a
        TLS connection's reads, published there from now on. ``written``: the kernel's
        count of the bytes written, if known. False: no board, a full one, or no count."""
        board = None if self.keeper is None else self.keeper.board
        if board is None or conn.out is not None:
            return conn.out is not None
        try:
            read, sent = stream_offsets(conn.sock) if written is None else (0, written)
        except OSError:
            return False
        slot = board.alloc()
        if slot is None:
            return False
        layer = None if conn.tls is None else conn.tls.layer
        conn.out = Outgoing(board, slot, sent, sent + len(conn.backlog),
                            *((layer.wgen, layer.wseq) if layer else (0, 0)))
        if conn.tls is not None:
            conn.tls.attach(board, slot)
        return True

    def _unboard(self, conn: TcpConnection) -> None:
        if conn.out is not None:
            conn.out.release()
            conn.out = None
        if conn.tls is not None:
            conn.tls.detach()

    def _untable(self, conn: TcpConnection) -> None:
        """``conn`` out of the listener's tables (it ends here, or is handed over)."""
        conn.closed = True
        client = conn.client
        if self.sink.conns.get(client) is conn:
            del self.sink.conns[client]
            ip = client[0]
            left = self.per_ip.get(ip, 1) - 1
            if left > 0:
                self.per_ip[ip] = left
            else:
                self.per_ip.pop(ip, None)
        flow = self.core.flows.get(client)
        if flow is not None and flow.upstream is None:
            del self.core.flows[client]  # the flow ends with its connection

    def _close(self, conn: TcpConnection) -> None:
        self._untable(conn)
        client = conn.client
        if conn.turn and self.core.turn is not None:
            self.core.turn.closed(trio.current_time(), client, self.public)
        self.core.counters.tcp_closed += 1
        kept, conn.kept = conn.kept, None
        close_socket(conn.sock)
        if kept is not None and self.keeper is not None:
            self.keeper.drop(kept)
        self._unboard(conn)

    async def _writer(self, conn: TcpConnection) -> None:
        """Drains the backlog when the kernel could not take it at once."""
        sock = conn.sock
        while True:
            await conn.wake.wait()
            conn.wake = trio.Event()
            while conn.backlog and not conn.closed:
                await trio.lowlevel.wait_writable(sock)
                try:
                    n = send_backlog(conn)
                except BlockingIOError:
                    continue
                except OSError:
                    conn.backlog.clear()
                    conn.closed = True
                    break
                del conn.backlog[:n]
                if conn.out is not None:
                    conn.out.wrote(n)
            conn.blocked = False

    async def _readable(self, conn: TcpConnection, deadline: float) -> bool:
        """Wait until ``conn`` has bytes (or its end) to read: False when it closed
        meanwhile or stayed silent too long (before its first frame until ``deadline``,
        after it ``idle_timeout``; counted ``tcp-first-timeout`` / ``tcp-idle``)."""
        when = (trio.current_time() + self.limits.idle_timeout) if conn.flowed else deadline
        with trio.move_on_at(when):
            await trio.lowlevel.wait_readable(conn.sock)
        if conn.closed:
            return False
        if trio.current_time() >= when:
            self.core.counters.drop("tcp-idle" if conn.flowed else "tcp-first-timeout")
            return False
        return True

    async def _reader(self, conn: TcpConnection) -> None:
        """An ICE-TCP connection's frames into the drain (module docstring), or, by its
        first bytes, TURN over TCP or a TLS connection. Reads *peek*, and only whole
        frames are taken out of the kernel (:func:`_take`): a worker killed between two
        reads leaves the stream at a frame boundary for the worker that adopts it."""
        limits = self.limits
        deadline = trio.current_time() + limits.first_frame_timeout
        if conn.tls is not None:  # adopted: a TURN/TLS connection with its allocation
            await self._tls_reader(conn, deadline)
            return
        if conn.turn:  # adopted: a TURN/TCP connection with its allocation
            await self._turn_tcp_reader(conn, deadline)
            return
        core = self.core
        counters = core.counters
        drop = counters.drop
        sock = conn.sock
        client = conn.client
        rbuf = bytearray(READ_SIZE)
        rmv = memoryview(rbuf)
        buf = self.buf
        slot = PUBLIC_SLOT
        fresh = not conn.flowed  # nothing taken from the kernel yet: the first bytes decide
        while not conn.closed:
            if not await self._readable(conn, deadline):
                return
            try:
                n = sock.recv_into(rbuf, READ_SIZE, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return  # reset by the peer
            if n == 0:
                return  # the client closed (or half-closed: nothing more will come)
            if fresh:
                if (self.https is not None or self.tls is not None) \
                        and rbuf[0] == TLS_HANDSHAKE:
                    head = bytes(rmv[:n])
                    _take(conn, rbuf, n, 0)
                    await self._tls_split(conn, head, deadline)
                    return
                if core.turn is not None and rbuf[0] < 0x40:
                    if n < 8:  # a TURN client's first message is at least 28 bytes
                        _take(conn, rbuf, 0, 8)
                        continue
                    if rbuf[4:8] == COOKIE_BYTES:
                        # A STUN message, not an RFC 4571 frame: TURN over TCP.
                        conn.turn = True
                        _take(conn, rbuf, 0, 0)
                        await self._turn_tcp_reader(conn, deadline)
                        return
            try:
                spans, end, want = frame_spans_untrusted(rmv[:n], limits.max_frame)
            except FramingError:
                drop("tcp-frame-too-long")
                return
            flowed = was = conn.flowed
            try:
                batch = self._batch
                for off, size in spans:
                    if not flowed:
                        if not self._first_frame_ok(bytes(rmv[off : off + size])):
                            drop("tcp-first-frame")
                            return
                    elif not size or not RELAYED[rbuf[off]]:
                        drop("tcp-junk")
                        continue
                    at = len(batch) * slot + HEADROOM
                    buf[at : at + size] = rmv[off : off + size]
                    batch.append((size, client))
                    if len(batch) == TCP_BATCH:
                        self._drain_now()
                        batch = self._batch
                        flowed = flowed or client in core.flows
            finally:
                if self._batch:
                    self._drain_now()
            _take(conn, rbuf, end, want)
            fresh = fresh and not end
            if not was and client in core.flows:
                conn.flowed = True
                counters.tcp_established += 1
                self._keep(conn)

    async def _turn_tcp_reader(self, conn: TcpConnection, deadline: float) -> None:
        """A TURN-over-TCP connection (module docstring): its messages into the drain,
        peeking and taking only whole messages out of the kernel, like :meth:`_reader`."""
        limits = self.limits
        core = self.core
        turn = core.turn
        assert turn is not None
        drop = core.counters.drop
        sock = conn.sock
        client = conn.client
        rbuf = bytearray(READ_SIZE)
        rmv = memoryview(rbuf)
        buf = self.buf
        slot = PUBLIC_SLOT
        while not conn.closed:
            if not await self._readable(conn, deadline):
                return
            try:
                n = sock.recv_into(rbuf, READ_SIZE, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if n == 0:
                return
            try:
                spans, end, want = message_spans_untrusted(rmv[:n], limits.max_frame)
            except TurnError as exc:
                drop(f"tcp-turn-{exc.hint}")
                return
            try:
                batch = self._batch
                for off, size in spans:
                    at = len(batch) * slot + HEADROOM
                    buf[at : at + size] = rmv[off : off + size]
                    batch.append((size, client))
                    if len(batch) == TCP_BATCH:
                        self._drain_now()
                        batch = self._batch
            finally:
                if self._batch:
                    self._drain_now()
            _take(conn, rbuf, end, want)
            self._turn_read(conn)

    def _turn_read(self, conn: TcpConnection) -> None:
        """After a TURN/TCP or TURN/TLS connection's messages went to the gate: kept once it
        has an allocation; once kept, what its requests changed goes to the keeper now,
        before the client reads the answer and uses what it made."""
        turn = self.core.turn
        if not conn.flowed and turn is not None and turn.has_allocation(conn.client,
                                                                        self.public):
            conn.flowed = True
            self.core.counters.tcp_established += 1
            self._keep(conn)
        elif conn.kept is not None and self.keeper is not None:
            self.keeper.follow()

    # -- the keeper (relay/keeper.py) ---------------------------------------------------------

    def _keep(self, conn: TcpConnection) -> None:
        """Hand an established connection to the keeper: ICE-TCP once it has a flow,
        TURN/TCP and TURN/TLS once it has an allocation (its record goes with it; TLS's
        keys too), with a slot on the board for what a successor needs exactly
        (relay/board.py). Without a slot (no board, a full one) a TCP connection is kept
        as before — a kill that cuts a frame in two breaks its stream — and a TLS one not."""
        keeper = self.keeper
        if keeper is None or conn.kept is not None:
            return
        self._board(conn)
        record = self._record(conn)
        if record is not None:
            conn.kept = keeper.keep(conn.sock, record)

    def kept_changed(self, client: Address, record: bytes | None) -> None:
        """A kept TURN/TCP or TURN/TLS connection's allocation changed (or ended): the
        keeper's record follows."""
        conn = self.sink.conns.get(client)
        if conn is not None and conn.kept is not None and self.keeper is not None:
            rec = self._record(conn, allocation=record)
            if rec is not None:
                self.keeper.update(conn.kept, rec)

    def adopt(self, sock: socket.socket, kept: Kept, ident: int,
              board: Board | None = None) -> bool | None:
        """Take over a connection the keeper pushed (its worker died) or a roll's
        predecessor handed over: back in the tables, its reader and writer running, already
        flowed. What the dead worker had half handed the kernel is finished first, and a
        TURN/TLS connection's records carry on with the state its ``board`` entries give
        for the kernel's count of the stream (relay/board.py; a roll's record carries the
        state itself). An ICE-TCP flow is re-learnt from its next frame (the transceivers
        vouch for it, reseed.py); a TURN allocation is re-created from the record. Then it
        is kept again, with a slot on our own board. False (the caller closes it): no room,
        an allocation that cannot be re-created, a stream the board cannot account for
        (``tcp-resume``: not expected). None: a connection we hold already (the caller
        lets its copy go, without a shutdown)."""
        nursery = self._nursery
        client = kept.client
        if client in self.sink.conns:
            # We hold this connection already (a 4-tuple names one live connection): the
            # copy pushed is a duplicate, to be let go — never shut down under us.
            return None
        if nursery is None or self.per_ip.get(client[0], 0) >= self.limits.max_per_ip or \
                len(self.sink.conns) >= self.limits.max_connections:
            return False
        try:
            sock.setblocking(False)
            # The dead worker may have left its low-water mark on the shared socket.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            read, written = stream_offsets(sock)
        except OSError:
            return False
        conn = TcpConnection(sock, client)
        conn.flowed = True
        conn.kept = ident
        wstate = (0, 0)
        if kept.slot is not None:  # what a kill left half in the kernel, finished first
            try:
                out = None if board is None else resume_out(board.read_out(kept.slot), written)
            except ValueError:
                out = None
            if out is None:
                self.core.counters.drop("tcp-resume")
                return False
            wstate = out[0], out[1]
            if out[2]:  # a frame (or chunk of them) the kill cut: finished first
                conn.backlog += out[2]
                self.core.counters.add("tcp_frames_finished")
        if kept.tls is not None:
            link = self._resume_tls(kept, board, read, wstate)
            if link is None:
                self.core.counters.drop("tcp-resume")
                return False
            conn.tls = link
        if kept.kind == "turn":
            turn = self.core.turn
            if turn is None or kept.allocation is None or \
                    not turn.adopt_stream(trio.current_time(), kept.allocation, client):
                return False
            conn.turn = True
        self.sink.conns[client] = conn
        self.per_ip[client[0]] = self.per_ip.get(client[0], 0) + 1
        self.core.counters.tcp_accepted += 1
        if self.keeper is not None:
            # Kept again under its id, with a slot on our own board (or let go: TLS needs one).
            self._board(conn, written)
            record = self._record(conn)
            if record is None:
                self.keeper.drop(ident)
                conn.kept = None
            else:
                self.keeper.rekeep(ident, record)
        if conn.backlog:
            push(conn)
        nursery.start_soon(self._connection, conn)
        return True

    def _resume_tls(self, kept: Kept, board: Board | None, read: int,
                    wstate: tuple[int, int]) -> TlsLink | None:
        """The record layer an adopted TURN/TLS connection carries on with (:meth:`adopt`):
        its read state from the board entry the kernel's count agrees with, its write state
        from the write entry (``wstate``) — or both from a roll's record."""
        tls = kept.tls
        assert tls is not None
        if tls.state is not None:  # a roll's: exact as of the hand-over
            rgen, rseq, wgen, wseq = tls.state
            held = tls.partial
        else:
            if board is None or kept.slot is None:
                return None
            try:
                r = resolve(board.read_read(kept.slot), read)
            except ValueError:
                return None
            if r is None:
                return None
            (rgen, rseq, held), (wgen, wseq) = r, wstate
        try:
            layer = RecordLayer(tls.keys, rgen, rseq, wgen, wseq)
        except DtlsError:
            return None
        framer = StreamFramer(self.limits.max_frame)
        try:
            framer.handle_input(held)  # the TURN message the dead worker had half read
        except TurnError:
            return None
        if framer.poll_output() is not None:  # a whole message was never half read
            return None
        return TlsLink(layer, framer, read)

    async def _tls_handshake(self, conn: TcpConnection, hello: HelloPeek, head: bytes,
                             deadline: float) -> None:
        """A TURN-over-TLS connection from its ClientHello on: OpenSSL does the handshake
        (whole records fed one at a time, peeked and taken like TURN/TCP's messages, so it
        ends exactly at the handshake's last record); then our record layer takes the
        connection over (relay/tls.py :class:`~.tls.TlsServer`) and :meth:`_tls_reader`
        reads it."""
        server = self.tls_server
        assert server is not None
        drop = self.core.counters.drop
        session = server.session(hello)
        if session is None:
            drop("tcp-tls-random")  # another handshake has this hello's random
            return
        try:
            took = await self._tls_handshake_flights(conn, session, head, deadline)
        finally:
            server.done(session)
        if took is None:
            return
        layer, leftover = took
        try:
            read, _ = stream_offsets(conn.sock)
        except OSError:
            return
        conn.tls = TlsLink(layer, StreamFramer(self.limits.max_frame), read)
        if leftover:  # pragma: no cover - records are fed one at a time
            drop("tcp-tls-handshake")
            return
        await self._tls_reader(conn, deadline)

    async def _tls_handshake_flights(self, conn: TcpConnection, session: TlsSession,
                                     head: bytes, deadline: float
                                     ) -> tuple[RecordLayer, bytes] | None:
        """:meth:`_tls_handshake`'s OpenSSL part: the record layer it hands over, or None
        (the connection failed, ended, or timed out: counted)."""
        drop = self.core.counters.drop
        sock = conn.sock
        rbuf = bytearray(READ_SIZE)
        rmv = memoryview(rbuf)
        data: bytes | memoryview = head
        while True:
            try:
                session.receive(data)
            except ssl.SSLError:
                queue(conn, session.pending())  # the alert, best effort
                drop("tcp-tls-handshake")
                return None
            queue(conn, session.pending())
            if session.established:
                break
            while True:
                if not await self._readable(conn, deadline):
                    return None
                try:
                    n = sock.recv_into(rbuf, READ_SIZE, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    return None
                if n == 0:
                    return None
                try:
                    spans, _, want = record_spans_untrusted(rmv[:n])
                except DtlsError:
                    drop("tcp-tls-handshake")
                    return None
                if spans:
                    break
                _take(conn, rbuf, 0, want)
            off, size = spans[0]  # one record at a time: the handshake may end in it
            data = bytes(rmv[off : off + size])
            _take(conn, rbuf, off + size, 0)
        took = session.take_over()
        if took is None:
            drop("tcp-tls-keys")
        return took

    async def _tls_reader(self, conn: TcpConnection, deadline: float) -> None:
        """A TURN-over-TLS connection's records (ours, proto/dtls/tlsrecord.py): peeked,
        opened, their plaintext — the TURN-over-TCP stream — framed into the drain, and
        only then taken out of the kernel, whole records at a time, with the read state
        published around the take (relay/tls.py :class:`~.tls.TlsLink`), so that a worker
        killed between two reads leaves its successor a stream it can carry on."""
        tls = conn.tls
        assert tls is not None
        core = self.core
        turn = core.turn
        assert turn is not None
        drop = core.counters.drop
        sock = conn.sock
        client = conn.client
        layer = tls.layer
        framer = tls.framer
        rbuf = bytearray(READ_SIZE)
        rmv = memoryview(rbuf)
        buf = self.buf
        slot = PUBLIC_SLOT
        while not conn.closed:
            if not await self._readable(conn, deadline):
                return
            try:
                n = sock.recv_into(rbuf, READ_SIZE, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if n == 0:
                return
            try:
                spans, end, want = record_spans_untrusted(rmv[:n])
                batch = self._batch
                try:
                    for off, size in spans:
                        framer.handle_input(layer.open(rmv[off : off + size]))
                        while (msg := framer.poll_output()) is not None:
                            at = len(batch) * slot + HEADROOM
                            buf[at : at + len(msg)] = msg
                            batch.append((len(msg), client))
                            if len(batch) == TCP_BATCH:
                                self._drain_now()
                                batch = self._batch
                        if layer.closed:
                            return  # close_notify: the end of the stream
                finally:
                    if self._batch:
                        self._drain_now()
                    queue(conn, layer.pending())  # a KeyUpdate's answer
            except DtlsError as exc:
                with contextlib.suppress(DtlsError):  # (its sequence numbers ran out)
                    queue(conn, layer.alert(int(exc.hint)))
                drop("tcp-tls-record")
                return
            except TurnError as exc:
                drop(f"tcp-turn-{exc.hint}")
                return
            tls.taking(end)
            _take(conn, rbuf, end, want)
            tls.took(end)
            self._turn_read(conn)

    async def _tls_split(self, conn: TcpConnection, head: bytes, deadline: float) -> None:
        """A connection that starts with a TLS record: read its ClientHello whole, then
        splice it to HTTPS or terminate TURN/TLS here (relay/tls.py :func:`~.tls.route`)."""
        drop = self.core.counters.drop
        rbuf = bytearray(READ_SIZE)
        while True:
            try:
                peek = peek_client_hello_untrusted(head)
            except DtlsError:
                drop("tcp-tls-hello")
                return
            if peek is not None:
                break
            if len(head) >= MAX_HELLO_BYTES:  # pragma: no cover - the peek refuses first
                drop("tcp-tls-hello")
                return
            with trio.move_on_at(deadline):
                await trio.lowlevel.wait_readable(conn.sock)
            if trio.current_time() >= deadline:
                drop("tcp-first-timeout")
                return
            try:
                n = conn.sock.recv_into(rbuf)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                return
            if n == 0:
                return
            head += rbuf[:n]
        del rbuf  # the TURN reader has its own: not two 64 kB buffers per TLS connection
        tls = self.tls if self.core.turn is not None else None
        where = route(peek, tls, self.https is not None)
        if where is Route.HTTPS:
            await self._splice(conn, head)
        elif where is Route.TURN:
            conn.turn = True
            self.core.counters.tcp_turn_tls += 1
            await self._tls_handshake(conn, peek, head, deadline)
        else:
            drop("tcp-tls-alpn")

    async def _splice(self, conn: TcpConnection, head: bytes) -> None:
        """Shared-port mode: relay a TLS connection to the HTTPS backend, both ways, until
        either side closes."""
        assert self.https is not None
        counters = self.core.counters
        try:
            with trio.fail_after(self.limits.first_frame_timeout):
                backend = await trio.open_tcp_stream(*self.https)
        except (OSError, trio.TooSlowError):
            counters.drop("tcp-https-unreachable")
            return
        counters.tcp_https += 1
        client = trio.SocketStream(trio.socket.from_stdlib_socket(conn.sock))

        # The backend learns who the client is from a PROXY v2 header (STREAM: source = the
        # client's TCP address, destination = the address it reached), not from this hop,
        # which is loopback: signaling judges the API token by the real client (issue 40
        # item 0; signaling/proxied.py reads it).
        try:
            local = conn.reached or conn.sock.getsockname()[:2]
            proxy = encode_header((conn.client[0], conn.client[1]), (local[0], local[1]),
                                  transport=STREAM)
        except (OSError, ValueError):
            counters.drop("tcp-https-unreachable")
            return
        async with backend:
            try:
                await backend.send_all(proxy + head)
            except trio.BrokenResourceError:
                return
            await splice(client, backend)

    def _first_frame_ok(self, frame: bytes) -> bool:
        """A frame before the connection has a flow: a Binding request whose server ufrag
        verifies (the core's own codec; the core then applies its budgets)."""
        if not frame or not IS_STUN[frame[0]]:
            return False
        try:
            username = peek_username_untrusted(frame)
        except StunError:
            return False
        if username is None:
            return False
        try:
            self.core.codec.decode_untrusted(username.split(b":", 1)[0])
        except UfragError:
            return False
        return True
