"""The SIP listeners of the signaling process: a trio shell around ONE
:class:`~appliance.proto.sip.SipEndpoint` (docs/sip.md "SIP runs inside signaling").

::

    UDP  --sip HOST:PORT ─── recvfrom ─┐
    TCP  --sip HOST:PORT ─┐ per conn.  │                    ┌─► Transmit ─► UDP out channel
    TLS  --sip-tls H:P  ──┴ StreamFramer ─► input(data) ─► SipEndpoint.handle_input
                                        │                    │   drain(): poll_output until
    timer task: sleep until poll_timeout ┘ handle_timeout ─►│   None; Transmit to the socket /
    HTTP routes (sip_http) ─► SipCalls op ─► endpoint op ─►─┘   connection, events to SipCalls

House shell rules: every ``handle_*`` and user operation is followed by :meth:`drain`
(synchronous: sends go through bounded channels to writer tasks, so draining never waits);
the timer task sleeps until ``poll_timeout`` or until a drain wakes it; every task lives in
the nursery of :func:`serve_sip`. A TCP/TLS connection is its own task: a framing error, a
reset or a failed handshake ends that connection only; at most ``max_connections`` at once
(a new one beyond is closed at once), and one silent for ``idle_timeout`` is closed.

Outbound calls (sip_outbound.py) open their TCP/TLS connection with :meth:`SipService.connect`
before the INVITE; the connection then serves like an accepted one (its responses and the
far end's in-dialog requests come back on it). A later Transmit to such an address whose
connection has closed (idle timeout, a reset) opens it again; a Transmit to any other
address we have no connection from is counted (``no-connection``) and dropped.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from dataclasses import dataclass

import trio

from ..proto.sip import EndpointConfig, SipEndpoint, SipError, StreamFramer, Transmit
from .sip_calls import SipCalls
from .sip_config import SipSettings

log = logging.getLogger(__name__)

Addr = tuple[str, int]
UDP_QUEUE = 1024  # datagrams waiting for the socket; beyond, dropped and counted
CONN_QUEUE = 256  # messages waiting for one connection's writer


@dataclass(frozen=True, slots=True)
class SipBound:
    udp_tcp: Addr
    tls: Addr | None


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


async def _bind_pair(host: str, port: int) -> tuple[trio.socket.SocketType, socket.socket]:
    """A UDP socket and a listening TCP socket on the same port (port 0: a number free for
    both, tried a few times)."""
    for _ in range(1 if port else 20):
        udp = trio.socket.socket(_family(host), socket.SOCK_DGRAM)
        tcp = socket.socket(_family(host), socket.SOCK_STREAM)
        try:
            await udp.bind((host, port))
            chosen = udp.getsockname()[1]
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((host, chosen))
            tcp.listen(128)
            return udp, tcp
        except OSError:
            udp.close()
            tcp.close()
            if port:
                raise
    raise OSError(f"no port free for both UDP and TCP on {host}")


def _listen(host: str, port: int) -> socket.socket:
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


class SipService:
    """The endpoint, its sockets and connections (one per signaling process)."""

    def __init__(self, settings: SipSettings, calls: SipCalls, endpoint: SipEndpoint,
                 udp: trio.socket.SocketType) -> None:
        self.settings = settings
        self.calls = calls
        self.endpoint = endpoint
        self.host = endpoint.config.host
        self._udp = udp
        self._udp_out, self._udp_in = trio.open_memory_channel[tuple[bytes, Addr]](UDP_QUEUE)
        self._conns: dict[tuple[Addr, str], trio.MemorySendChannel[bytes]] = {}
        self._wake = trio.Event()
        self.counters: dict[str, int] = {}
        self.nursery: trio.Nursery | None = None  # set by serve_sip
        #: addresses we connected to (outbound calls): how to connect again
        self._dialed: dict[tuple[Addr, str], tuple[str, ssl.SSLContext | None]] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def connections(self) -> int:
        """TCP/TLS connections open now (accepted and dialed)."""
        return len(self._conns)

    # -- the one way into the endpoint --------------------------------------------------------

    def input(self, data: bytes, addr: Addr, transport: str) -> None:
        self.endpoint.handle_input(trio.current_time(), data, addr, transport)
        self.drain()

    def drain(self) -> None:
        """Everything the endpoint has to say, now (house rule 2); never blocks."""
        ep = self.endpoint
        while (out := ep.poll_output()) is not None:
            if isinstance(out, Transmit):
                self._transmit(out)
            else:
                try:
                    self.calls.on_event(out)
                except Exception:  # a bug in call control must not take SIP down
                    log.exception("sip: handling %s failed", type(out).__name__)
        self._wake.set()

    def _transmit(self, out: Transmit) -> None:
        try:
            if out.transport == "udp":
                self._udp_out.send_nowait((out.data, out.addr))
                return
            conn = self._conns.get((out.addr, out.transport))
            if conn is None:
                again = self._dialed.get((out.addr, out.transport))
                if again is None or self.nursery is None:
                    self._count("no-connection")
                    return
                self.nursery.start_soon(self._redial, out, *again)
                return
            conn.send_nowait(out.data)
        except trio.WouldBlock:
            self._count("send-queue-full")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._count("send-closed")

    # -- tasks --------------------------------------------------------------------------------

    async def timers(self) -> None:
        ep = self.endpoint
        while True:
            deadline = ep.poll_timeout()
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await self._wake.wait()
            self._wake = trio.Event()
            now = trio.current_time()
            due = ep.poll_timeout()
            if due is not None and due <= now:
                ep.handle_timeout(now)
                self.drain()

    async def udp_reader(self) -> None:
        while True:
            try:
                data, addr = await self._udp.recvfrom(65535)
            except OSError:  # an ICMP error surfaced on the socket: not fatal
                self._count("udp-recv-error")
                continue
            self.input(data, (addr[0], addr[1]), "udp")

    async def udp_writer(self) -> None:
        async with self._udp_in:
            async for data, addr in self._udp_in:
                try:
                    await self._udp.sendto(data, addr)
                except OSError:
                    self._count("udp-send-error")

    async def connect(self, host: str, port: int, transport: str, *,
                      server_hostname: str | None = None,
                      ssl_context: ssl.SSLContext | None = None) -> Addr:
        """Open a TCP/TLS connection to a trunk (for an outbound call) and serve it in the
        nursery like an accepted one; returns the peer address the endpoint addresses it by.
        An existing connection to the same address is reused. Raises OSError (or
        trio.BrokenResourceError for a failed TLS handshake)."""
        if self.nursery is None:
            raise OSError("the SIP service is not running")
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"{host} does not resolve")
        ip = str(infos[0][4][0])
        key = ((ip, port), transport)
        if key in self._conns:
            return key[0]
        tcp = await trio.open_tcp_stream(ip, port)
        stream: trio.abc.Stream = tcp
        if transport == "tls":
            ctx = ssl_context or ssl.create_default_context()
            stream = trio.SSLStream(tcp, ctx, server_hostname=server_hostname or host,
                                    https_compatible=False)
            try:
                await stream.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            self._dialed[key] = (server_hostname or host, ctx)
        else:
            self._dialed[key] = (host, None)
        try:
            addr: Addr = await self.nursery.start(self._serve_started, stream, transport)
        except RuntimeError:  # refused (connection cap) before it was registered
            raise OSError("too many SIP connections") from None
        self._count(f"{transport}-connected")
        return addr

    async def _serve_started(self, stream: trio.abc.Stream, transport: str, *,
                             task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                             ) -> None:
        await self.serve_stream(stream, transport, task_status=task_status)

    async def _redial(self, out: Transmit, hostname: str, ctx: ssl.SSLContext | None) -> None:
        """A request for a dialog whose connection closed: connect again, then send."""
        try:
            await self.connect(out.addr[0], out.addr[1], out.transport,
                               server_hostname=hostname, ssl_context=ctx)
        except (OSError, trio.BrokenResourceError):
            self._count("redial-failed")
            return
        self._count("redialed")
        self._transmit(out)

    async def serve_stream(self, stream: trio.abc.Stream, transport: str, *,
                           task_status: trio.TaskStatus[Addr] = trio.TASK_STATUS_IGNORED
                           ) -> None:
        """One TCP or TLS connection; ends only itself."""
        tcp = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        try:
            assert isinstance(tcp, trio.SocketStream)
            peer = tcp.socket.getpeername()
        except OSError:  # gone before we looked
            await trio.aclose_forcefully(stream)
            return
        addr: Addr = (peer[0], peer[1])
        key = (addr, transport)
        if len(self._conns) >= self.settings.max_connections or key in self._conns:
            self._count("connections-refused")
            await trio.aclose_forcefully(stream)
            return
        send, recv = trio.open_memory_channel[bytes](CONN_QUEUE)
        self._conns[key] = send
        task_status.started(addr)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, stream, recv, nursery.cancel_scope, transport)
                await self._reader(stream, addr, transport)
                nursery.cancel_scope.cancel()
        except Exception:  # a bug, not the peer: still this connection's end only
            log.exception("sip: %s connection failed", transport)
        finally:
            self._conns.pop(key, None)
            send.close()
            await trio.aclose_forcefully(stream)

    def _closed(self, transport: str, exc: BaseException) -> None:
        self._count(f"{transport}-closed-{type(exc).__name__}")

    async def _reader(self, stream: trio.abc.Stream, addr: Addr, transport: str) -> None:
        """Messages in until EOF, silence, a reset or a framing error (each ends this
        connection only: caught here, never raised into the nursery)."""
        framer = StreamFramer()
        pings = 0
        try:
            while True:
                with trio.move_on_after(self.settings.idle_timeout) as idle:
                    data = await stream.receive_some(65536)
                if idle.cancelled_caught or not data:
                    return
                framer.feed(bytes(data))  # SipError (513) on an endless header: close
                for message in framer:
                    self.input(message, addr, transport)
                while pings < framer.pings:  # RFC 5626 §4.4.1 CRLFCRLF ping -> CRLF pong
                    pings += 1
                    self.input(b"\r\n\r\n", addr, transport)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, SipError) as exc:
            self._closed(transport, exc)

    async def _writer(self, stream: trio.abc.Stream, recv: trio.MemoryReceiveChannel[bytes],
                      scope: trio.CancelScope, transport: str) -> None:
        try:
            async with recv:
                async for data in recv:
                    await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._closed(transport, exc)
            scope.cancel()  # the reader has nothing left to answer on


async def serve_sip(settings: SipSettings, calls: SipCalls, *,
                    task_status: trio.TaskStatus[SipBound] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``--sip`` (UDP + TCP) and ``--sip-tls`` until cancelled; reports the bound
    addresses."""
    host, port = settings.udp_tcp
    udp, tcp_sock = await _bind_pair(host, port)
    bound_port = udp.getsockname()[1]
    listeners: list[tuple[trio.abc.Listener[trio.abc.Stream], str]] = []
    tls_bound: Addr | None = None
    try:
        listeners.append((trio.SocketListener(trio.socket.from_stdlib_socket(tcp_sock)), "tcp"))
        if settings.tls is not None:
            if not (settings.tls_cert and settings.tls_key):
                raise ValueError("--sip-tls needs a certificate (sip_settings makes one)")
            tls_sock = _listen(*settings.tls)
            tls_bound = (settings.tls[0], tls_sock.getsockname()[1])
            listeners.append((trio.SSLListener(
                trio.SocketListener(trio.socket.from_stdlib_socket(tls_sock)),
                tls_context(settings.tls_cert, settings.tls_key), https_compatible=False), "tls"))
        sip_host = settings.sip_host or host
        if sip_host in ("0.0.0.0", "::", ""):
            sip_host = "127.0.0.1"
        endpoint = SipEndpoint(EndpointConfig(
            host=sip_host, port=bound_port, tls_port=tls_bound[1] if tls_bound else None,
            allow=settings.allow_hook(), ring_timeout=settings.answer_timeout,
            rate=settings.rate, burst=2 * settings.rate, max_invites=settings.max_invites))
        service = SipService(settings, calls, endpoint, udp)
        async with trio.open_nursery() as nursery:
            service.nursery = nursery
            calls.attach(service, nursery)
            if calls.outbound is not None:
                calls.outbound.attach(service, nursery)
            settings.bound = ((host, bound_port), tls_bound)
            nursery.start_soon(service.timers)
            nursery.start_soon(service.udp_reader)
            nursery.start_soon(service.udp_writer)
            for listener, transport in listeners:
                nursery.start_soon(_accept_loop, listener, transport, service, nursery)
            log.info("sip listening on udp+tcp %s:%d%s", host, bound_port,
                     f", tls {tls_bound[0]}:{tls_bound[1]}" if tls_bound else "")
            task_status.started(SipBound((host, bound_port), tls_bound))
    finally:
        udp.close()
        with trio.move_on_after(1, shield=True):
            for listener, _ in listeners:
                await listener.aclose()


async def _accept_loop(listener: trio.abc.Listener[trio.abc.Stream], transport: str,
                       service: SipService, nursery: trio.Nursery) -> None:
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: wait a moment, keep serving
                log.warning("sip %s accept: %s", transport, exc)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(service.serve_stream, stream, transport)

