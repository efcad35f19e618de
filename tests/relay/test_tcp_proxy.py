"""A front proxy before the media port's TCP listener (``--tcp-proxy-from``, issue 40 items
0, 4 and 8): a connection from a named proxy network must open with a PROXY v1/v2 header,
and the client it names is the connection's client — in the ICE-TCP flow, the per-IP bound,
and the PROXY v2 header the HTTPS splice writes for signaling's trust. A connection from
anywhere else is not asked for a header, and one it sends is not believed.
"""

from __future__ import annotations

import ipaddress
import ssl

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import OPEN_SOCKETS, RTP, check, eventually, ufrag
from relay.test_tcp import StreamEcho, TcpClient, open_echo
from relay.test_tls_split import Backend, _client_context

from appliance.proto.framing import encode_frame
from appliance.proto.proxy import STREAM, StreamAddr, encode_header, parse_transport_untrusted
from appliance.relay import RelayHandle
from appliance.relay.tcp import TcpLimits

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


def v1(client: tuple[str, int], reached: tuple[str, int] = ("198.51.100.1", 443)) -> bytes:
    return (f"PROXY TCP4 {client[0]} {reached[0]} {client[1]} {reached[1]}\r\n").encode()


async def _relay(start_relay: StartRelay, echo: StreamEcho, **limits: object) -> RelayHandle:
    return await start_relay(transceivers={0: echo.address}, tcp=(("127.0.0.1", 0),),
                             tcp_limits=TcpLimits(**limits))  # type: ignore[arg-type]


async def _connect(relay: RelayHandle) -> TcpClient:
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    OPEN_SOCKETS.append(stream.socket)
    return TcpClient(stream)


async def _closed(c: TcpClient) -> None:
    with trio.fail_after(10):
        assert await c.stream.receive_some(100) == b""


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_ice_tcp_through_a_front_proxy_is_the_named_clients_flow(
        nursery: trio.Nursery, start_relay: StartRelay, version: str) -> None:
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, proxy_from=LOOPBACK)
    c = await _connect(relay)
    header = (v1(("192.0.2.7", 5555)) if version == "v1" else
              encode_header(("192.0.2.7", 5555), ("198.51.100.1", 443), transport=STREAM))
    # The header and the first frame in one segment, as a proxy that has them both sends.
    await c.stream.send_all(header + encode_frame(check(ufrag())))
    await c.recv()
    await c.send(RTP)
    assert await c.recv() == RTP
    client, public, transport, _ = echo.got[-1]
    assert client == ("192.0.2.7", 5555) and transport == STREAM  # not the proxy's address
    assert public == relay.tcp[0]
    assert StreamAddr(("192.0.2.7", 5555)) in relay.core.flows
    assert relay.stats()["counters"]["tcp_proxied"] == 1


async def test_the_per_ip_bound_counts_the_named_clients(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    """Every connection comes from the proxy's address: the bound is the client's."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, proxy_from=LOOPBACK, max_per_ip=1)
    a, b, again = [await _connect(relay) for _ in range(3)]
    for c, client in ((a, ("192.0.2.7", 1)), (b, ("192.0.2.8", 1))):
        await c.stream.send_all(v1(client) + encode_frame(check(ufrag())))
        await c.recv()
    await again.stream.send_all(v1(("192.0.2.7", 2)))
    await _closed(again)
    assert "tcp-refused-ip" in relay.stats()["counters"]["drops"]


@pytest.mark.parametrize(("first", "reason"), [
    (encode_frame(b"\x00\x01"), "tcp-proxy-signature"),  # ICE-TCP with no header
    (b"\x16\x03\x01\x00\x05", "tcp-proxy-signature"),  # TLS with no header
    (b"PROXY UNKNOWN\r\n", "tcp-proxy-local"),
    (b"\r\n\r\n\x00\r\nQUIT\n\x20\x11\x00\x00", "tcp-proxy-local"),  # a health check
    (b"PROXY TCP4 not-an-ip 198.51.100.1 1 443\r\n", "tcp-proxy-syntax"),
])
async def test_a_proxy_connection_without_a_client_header_is_closed_and_counted(
        nursery: trio.Nursery, start_relay: StartRelay, first: bytes, reason: str) -> None:
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, proxy_from=LOOPBACK)
    c = await _connect(relay)
    await c.stream.send_all(first)
    await _closed(c)
    await eventually(lambda: reason in relay.stats()["counters"]["drops"])
    counters = relay.stats()["counters"]
    assert counters["tcp_accepted"] == counters["tcp_closed"] == 1  # nothing left open
    assert echo.got == []


async def test_a_silent_proxy_connection_times_out(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo, proxy_from=LOOPBACK, first_frame_timeout=0.3)
    c = await _connect(relay)
    await c.stream.send_all(b"PROXY TCP4 192.0.2.7")  # and nothing more
    await _closed(c)
    await eventually(lambda: "tcp-proxy-timeout" in relay.stats()["counters"]["drops"])


async def test_a_header_from_anywhere_else_is_not_believed(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    """Loopback is not a proxy here: its PROXY line is just a first frame that is no
    STUN check, and the connection is closed as ICE-TCP closes such a one."""
    echo = await open_echo(nursery)
    relay = await _relay(start_relay, echo,
                         proxy_from=(ipaddress.ip_network("10.0.0.0/8"),))
    c = await _connect(relay)
    await c.stream.send_all(v1(("192.0.2.7", 5555)) + encode_frame(check(ufrag())))
    await _closed(c)
    assert echo.got == [] and relay.stats()["counters"]["tcp_proxied"] == 0


async def test_https_through_a_front_proxy_names_the_real_client_to_signaling(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    """The splice's PROXY v2 header (what signaling judges the API token by) names the
    client and the address it reached from the front proxy's header, not the proxy."""
    backend = Backend()
    await nursery.start(backend.serve)
    relay = await start_relay(tcp=(("127.0.0.1", 0),), tcp_https=backend.address,
                              tcp_limits=TcpLimits(proxy_from=LOOPBACK))
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    async with stream:
        out = ssl.MemoryBIO()
        tls = _client_context(["h2"]).wrap_bio(ssl.MemoryBIO(), out)
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        hello = out.read()  # a real ClientHello: the split peeks at it
        await stream.send_all(v1(("203.0.113.9", 40000), ("198.51.100.1", 443)) + hello)
        await eventually(lambda: bool(backend.got))
    src, dst, end, transport = parse_transport_untrusted(backend.got[0])
    assert (src, dst, transport) == (("203.0.113.9", 40000), ("198.51.100.1", 443), STREAM)
    assert backend.got[0][end:].startswith(b"\x16\x03\x01")
