"""ICE-TCP through the relay (relay/tcp.py; RFC 6544, RFC 4571 framing) over real loopback
TCP and UDP sockets, with a fake transceiver that speaks PROXY v2 and echoes each payload
back with the header it came with (STREAM stays STREAM, as DESIGN.md says a transceiver
replies). Every test runs over both hot-loop I/O paths (the ``io`` fixture).

Hostile input (garbage first frame, slowloris, oversize frames, floods, a slow reader) is
checked against an established UDP call *and* an established TCP call on the same relay:
their echoes keep coming, and the drop is counted under its own reason.
"""

from __future__ import annotations

import signal
import socket as stdsocket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import OPEN_SOCKETS, RTP, SECRET, check, eventually, open_client, ufrag

from appliance.proto.framing import Deframer, encode_frame
from appliance.proto.proxy import STREAM, StreamAddr, encode_header, parse_transport_untrusted
from appliance.relay import RelayHandle
from appliance.relay.tcp import TcpLimits

pytestmark = pytest.mark.usefixtures("close_sockets")

Address = tuple[str, int]


@dataclass
class StreamEcho:
    """A fake transceiver: records (client, public, transport, payload), echoes with the
    same header shape; ``flood`` extra copies of each RTP echo make a burst."""

    sock: trio.socket.SocketType
    got: list[tuple[Address, Address, int, bytes]] = field(default_factory=list)
    sources: set[Address] = field(default_factory=set)  # the relays' internal addresses
    flood: int = 0

    @property
    def address(self) -> Address:
        name = self.sock.getsockname()
        return (name[0], name[1])

    async def run(self) -> None:
        while True:
            data, src = await self.sock.recvfrom(65536)
            self.sources.add((src[0], src[1]))
            client, public, off, transport = parse_transport_untrusted(data)
            payload = data[off:]
            self.got.append((client, public, transport, payload))
            header = encode_header(client, public, transport=transport)
            copies = 1 + (self.flood if payload[:1] == b"\x80" else 0)
            for _ in range(copies):
                await self.sock.sendto(header + payload, src)


async def open_echo(nursery: trio.Nursery) -> StreamEcho:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    OPEN_SOCKETS.append(sock)
    await sock.bind(("127.0.0.1", 0))
    echo = StreamEcho(sock)
    nursery.start_soon(echo.run)
    return echo


class TcpClient:
    """An ICE-TCP client (a browser's active candidate): RFC 4571 frames over a stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.deframer = Deframer()

    @property
    def address(self) -> Address:
        name = self.stream.socket.getsockname()
        return (name[0], name[1])

    async def send(self, payload: bytes) -> None:
        await self.stream.send_all(encode_frame(payload))

    async def recv(self, within: float = 5.0) -> bytes:
        with trio.fail_after(within):
            while (frame := self.deframer.poll_output()) is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("relay closed the connection")
                self.deframer.handle_input(data)
        return frame

    async def closed_by_peer(self, within: float = 5.0) -> bool:
        """True once the relay has closed the connection (EOF or reset)."""
        with trio.fail_after(within):
            try:
                while await self.stream.receive_some(65536):
                    pass
            except trio.BrokenResourceError:
                pass
        return True


async def tcp_client(relay: RelayHandle) -> TcpClient:
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    OPEN_SOCKETS.append(stream.socket)
    return TcpClient(stream)


async def _relay(start_relay: StartRelay, echo: StreamEcho, **limits: float) -> RelayHandle:
    return await start_relay(transceivers={0: echo.address}, tcp=(("127.0.0.1", 0),),
                             tcp_limits=TcpLimits(**limits))  # type: ignore[arg-type]


async def _established_tcp(relay: RelayHandle) -> TcpClient:
    c = await tcp_client(relay)
    await c.send(check(ufrag()))
    assert (await c.recv())[:2] == b"\x00\x01"  # the echo of our check
    return c


async def _echoes(c: TcpClient, tag: bytes = b"") -> None:
    await c.send(RTP + tag)
    assert await c.recv() == RTP + tag


async def test_frames_travel_as_stream_datagrams_both_ways(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """The first frame (a check with a valid server ufrag) makes the flow; each frame is one
    internal datagram with a STREAM header (source = the client's TCP address, destination
    = the relay's TCP address); the echo comes back framed. A UDP flow beside it is DGRAM."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo)
    c = await _established_tcp(relay)
    for i in range(5):
        await _echoes(c, bytes([i]))
    client, public, transport, payload = echo.got[-1]
    assert transport == STREAM and client == c.address and public == relay.tcp[0]
    assert payload == RTP + bytes([4])
    # A UDP client beside it: DGRAM, its own flow.
    u = await open_client(relay.public[0])
    await u.send(check(ufrag()))
    await u.recv()
    assert echo.got[-1][2] == 2
    flows = relay.core.flows
    assert StreamAddr(c.address) in flows and u.address in flows
    assert flows[StreamAddr(c.address)].header[13] == 0x11
    counters = relay.stats()["counters"]
    assert counters["tcp_accepted"] == 1 and counters["tcp_established"] == 1
    # The flow ends with the connection.
    key = StreamAddr(c.address)
    await c.stream.aclose()
    await eventually(lambda: key not in relay.core.flows)
    await eventually(lambda: relay.stats()["counters"]["tcp_closed"] == 1)
    assert u.address in relay.core.flows


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", "tcp-first-frame"),  # not STUN
        (RTP, "tcp-first-frame"),  # media before any check
        (check("notavalidufrag"), "tcp-first-frame"),  # a ufrag that does not verify
    ],
    # Named ids: the STUN check carries a random transaction id, and xdist's workers must
    # collect the same test names.
    ids=["http", "rtp", "bad-ufrag"],
)
async def test_bad_first_frame_closes(
    nursery: trio.Nursery, start_relay: StartRelay, first: bytes, reason: str
) -> None:
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo)
    live = await _established_tcp(relay)
    c = await tcp_client(relay)
    addr = c.address
    await c.send(first)
    assert await c.closed_by_peer()
    assert relay.stats()["counters"]["drops"].get(reason) == 1
    await _echoes(live)  # the established call is untouched
    assert all(e[0] != addr for e in echo.got)


async def test_raw_garbage_and_oversize_frames_close(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo)
    live = await _established_tcp(relay)
    # Unframed bytes read as a huge length prefix: closed before the body is buffered.
    c = await tcp_client(relay)
    await c.stream.send_all(b"\x16\x03\x01\x02\x00\x01\x00")  # a TLS ClientHello's start
    assert await c.closed_by_peer()
    assert relay.stats()["counters"]["drops"].get("tcp-frame-too-long") == 1
    # An established connection that sends an oversize frame is closed too.
    big = await _established_tcp(relay)
    await big.stream.send_all(b"\xff\xff" + bytes(100))
    assert await big.closed_by_peer()
    assert relay.stats()["counters"]["drops"].get("tcp-frame-too-long") == 2
    await _echoes(live)


async def test_slowloris_and_half_open_time_out(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """A connection that sends nothing, or one byte of a frame, is closed after the
    first-frame timeout; an established one that goes silent after the idle timeout."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, first_frame_timeout=0.3, idle_timeout=1.0)
    live = await _established_tcp(relay)
    silent = await tcp_client(relay)
    dribble = await tcp_client(relay)
    await dribble.stream.send_all(b"\x00")  # half a length prefix, then nothing
    # The live call keeps talking meanwhile (each echo resets its idle timer).
    with trio.move_on_after(0.6):
        while True:
            await _echoes(live)
            await trio.sleep(0.05)  # pacing of the live call; the closes are waited on below
    assert await silent.closed_by_peer() and await dribble.closed_by_peer()
    assert relay.stats()["counters"]["drops"].get("tcp-first-timeout") == 2
    await _echoes(live)
    # Now the live one goes silent: closed after idle_timeout, its flow gone.
    assert await live.closed_by_peer(within=5)
    assert relay.stats()["counters"]["drops"].get("tcp-idle") == 1
    assert not any(type(k) is StreamAddr for k in relay.core.flows)


async def test_connection_caps(nursery: trio.Nursery, start_relay: StartRelay) -> None:
    """A flood of connections from one IP hits the per-IP cap; beyond the total cap every
    connection is refused at accept — the established call stays up through both."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, max_per_ip=4, max_connections=6)
    live = await _established_tcp(relay)
    flood = [await tcp_client(relay) for _ in range(10)]
    refused = 0
    for c in flood[3:]:
        assert await c.closed_by_peer()
        refused += 1
    assert relay.stats()["counters"]["drops"].get("tcp-refused-ip") == refused == 7
    await _echoes(live)
    # Another source IP (127.0.0.2 is loopback too) gets its own per-IP budget, up to the
    # total cap of 6: live + 3 flood + 2 more.
    others = []
    for _ in range(3):
        s = trio.socket.socket()
        OPEN_SOCKETS.append(s)
        await s.bind(("127.0.0.2", 0))
        await s.connect(relay.tcp[0])
        others.append(TcpClient(trio.SocketStream(s)))
    assert await others[2].closed_by_peer()
    assert relay.stats()["counters"]["drops"].get("tcp-refused-total") == 1
    await _echoes(live)


async def test_slow_reader_drops_its_own_frames_only(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """A client that never reads: the echoes for it fill the kernel's buffers, then its
    backlog (capped at write_buffer) — further frames to it are dropped and counted
    (tcp-write-full), the relay holds at most the cap for it, and another connection's
    echoes keep coming."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, write_buffer=8192)
    live = await _established_tcp(relay)
    slow = await _established_tcp(relay)
    slow.stream.socket.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
    echo.flood = 50  # each RTP frame from the slow client comes back 51 times
    sink = relay.core.sinks[next(k for k in relay.core.sinks if k[0].name == "TCP")]
    big = b"\x80\x6f" + bytes(1198)  # a full-size RTP packet
    for _ in range(200):
        await slow.send(big)
    await eventually(lambda: relay.stats()["counters"]["drops"].get("tcp-write-full", 0) > 0,
                     within=10)
    conn = sink.conns[StreamAddr(slow.address)]  # type: ignore[attr-defined]
    assert len(conn.backlog) <= 8192
    echo.flood = 0
    for i in range(5):
        await _echoes(live, bytes([i]))


@pytest.mark.usefixtures("close_sockets")
async def test_two_worker_processes_share_the_tcp_port(
    nursery: trio.Nursery, tmp_path: Path, io: str
) -> None:
    """``appliance relay --workers 2 --tcp 127.0.0.1:0``: the first worker picks the port,
    the second binds the same one (SO_REUSEPORT), the ready line names it, and connections
    spread over both workers echo through whichever got them."""
    secret = tmp_path / "routing.secret"
    secret.write_bytes(SECRET + b"\n")
    echo = await open_echo(nursery)
    argv = [sys.executable, "-m", "appliance.relay.cli", "--listen", "127.0.0.1:0",
            "--tcp", "127.0.0.1:0", "--workers", "2",
            "--transceiver", f"0={echo.address[0]}:{echo.address[1]}",
            "--secret-file", str(secret), "--log-level", "warning", "--io", io]
    proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
        text = line.decode().strip()
        assert " tcp 127.0.0.1:" in text, text
        host, port = text.split(" tcp ")[1].rsplit(":", 1)
        addr = (host, int(port))
        clients = []
        for i in range(12):
            stream = await trio.open_tcp_stream(*addr)
            OPEN_SOCKETS.append(stream.socket)
            c = TcpClient(stream)
            await c.send(check(ufrag()))
            await c.recv()
            await _echoes(c, bytes([i]))
            clients.append(c)
        assert len(echo.sources) == 2, echo.sources  # both workers' internal sockets forwarded frames
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            await proc.wait()
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()  # reaped here, not blamed on a later test's GC
            await proc.aclose()


async def test_ipv6_listener(nursery: trio.Nursery, start_relay: StartRelay) -> None:
    """An IPv6 ``--tcp`` listener: its frames carry a STREAM-over-IPv6 header (0x21)."""
    if not stdsocket.has_ipv6:
        pytest.fail("no IPv6 on this host: the IPv6 listener cannot be tested")
    echo = await open_echo(nursery)
    relay = await start_relay(transceivers={0: echo.address}, tcp=(("::1", 0),))
    assert relay.tcp[0][0] == "::1"
    c = await tcp_client(relay)
    await c.send(check(ufrag()))
    await c.recv()
    await _echoes(c)
    client, public, transport, _ = echo.got[-1]
    assert transport == STREAM and public == relay.tcp[0] and client[0] == "::1"
    assert relay.core.flows[StreamAddr(client)].header[13] == 0x21
