"""Smoke test of bench/wan_proxy.py, the WAN emulator of issue 19's setup benchmark: it adds
at least the round trip it claims (no upper bound asserted: the box is shared and noisy),
keeps one upstream flow per client, keeps order under jitter, drops with its seeded loss,
and forwards TCP (holding the first bytes one more RTT for the handshake)."""

from __future__ import annotations

import importlib.util
import random
import socket
import sys
from functools import partial
from pathlib import Path
from types import ModuleType

import trio

RTT = 0.060


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "wan_proxy.py"
    spec = importlib.util.spec_from_file_location("wan_proxy", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["wan_proxy"] = mod  # dataclasses look the module up while it loads
    spec.loader.exec_module(mod)
    return mod


wp = _load()


def _udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    return s


async def _recv(s: socket.socket) -> tuple[bytes, tuple[str, int]]:
    while True:
        try:
            data, addr = s.recvfrom(65536)
            return data, (addr[0], addr[1])
        except BlockingIOError:
            await trio.lowlevel.wait_readable(s)


async def _udp_echo(s: socket.socket, seen: set[tuple[str, int]]) -> None:
    while True:
        data, addr = await _recv(s)
        seen.add(addr)
        s.sendto(data, addr)


async def _udp_proxy(nursery: trio.Nursery, target: tuple[str, int], imp: object
                     ) -> tuple[str, int]:
    proxy = wp.UdpProxy(("127.0.0.1", 0), target, imp, random.Random(7))
    bound: tuple[str, int] = await nursery.start(proxy.run)
    return bound


async def test_udp_round_trip_is_at_least_the_configured_rtt() -> None:
    server, seen = _udp(), set[tuple[str, int]]()
    a, b = _udp(), _udp()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_udp_echo, server, seen)
        proxy = await _udp_proxy(nursery, server.getsockname(), wp.Impairment.from_rtt(RTT * 1000))
        rtts = []
        for client in (a, b, a):
            t0 = trio.current_time()
            client.sendto(b"ping", proxy)
            data, addr = await _recv(client)
            rtts.append(trio.current_time() - t0)
            assert data == b"ping" and addr == proxy
        assert min(rtts) >= RTT, rtts
        # One upstream socket per client address: the server saw two flows, not one.
        assert len(seen) == 2, seen
        nursery.cancel_scope.cancel()
    for s in (server, a, b):
        s.close()


async def test_zero_rtt_forwards_and_jitter_keeps_order() -> None:
    server, seen = _udp(), set[tuple[str, int]]()
    client = _udp()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_udp_echo, server, seen)
        proxy = await _udp_proxy(nursery, server.getsockname(),
                                 wp.Impairment.from_rtt(20, jitter_ms=15))
        for i in range(40):
            client.sendto(i.to_bytes(2, "big"), proxy)
        got = [int.from_bytes((await _recv(client))[0], "big") for _ in range(40)]
        assert got == list(range(40))  # jitter without --reorder never reorders
        nursery.cancel_scope.cancel()
    server.close()
    client.close()


async def test_seeded_loss_drops_some_and_forwards_the_rest() -> None:
    server, seen = _udp(), set[tuple[str, int]]()
    client = _udp()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_udp_echo, server, seen)
        imp = wp.Impairment.from_rtt(0, loss=0.3)
        proxy_obj = wp.UdpProxy(("127.0.0.1", 0), server.getsockname(), imp, random.Random(3))
        proxy = await nursery.start(proxy_obj.run)
        for i in range(200):
            client.sendto(i.to_bytes(2, "big"), proxy)
        # Every packet is either dropped on the way up, dropped on the way down, or echoed.
        received = 0
        while True:
            links = proxy_obj.links
            dropped = sum(link.dropped for link in links)
            if len(links) == 2 and received + dropped == 200:
                break
            with trio.move_on_after(2) as scope:
                await _recv(client)
                received += 1
            assert not scope.cancelled_caught, (received, dropped)
        assert 0 < dropped < 200 and 0 < received < 200
        nursery.cancel_scope.cancel()
    server.close()
    client.close()


async def _tcp_echo(stream: trio.SocketStream) -> None:
    async with stream:
        while data := await stream.receive_some(65536):
            await stream.send_all(data)


async def test_tcp_is_forwarded_with_the_delay_and_the_handshake_rtt() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, _tcp_echo, 0, host="127.0.0.1"))
        target = listeners[0].socket.getsockname()[:2]
        proxy = wp.TcpProxy(("127.0.0.1", 0), target, wp.Impairment.from_rtt(RTT * 1000),
                            random.Random(1))
        bound = await nursery.start(proxy.run)
        t0 = trio.current_time()
        stream = await trio.open_tcp_stream(*bound)
        await stream.send_all(b"hello")
        got = b""
        while len(got) < 5:
            got += await stream.receive_some(100)
        first = trio.current_time() - t0
        assert got == b"hello"
        # The emulated handshake (one RTT) plus the request's own round trip.
        assert first >= 2 * RTT, first
        t1 = trio.current_time()
        await stream.send_all(b"x" * 100_000)
        n = 0
        while n < 100_000:
            n += len(await stream.receive_some(65536))
        assert trio.current_time() - t1 >= RTT
        await stream.aclose()
        nursery.cancel_scope.cancel()


def test_answer_rewrite_names_the_proxy_only() -> None:
    answer = "\r\n".join([
        "v=0", "m=audio 51234 UDP/TLS/RTP/SAVPF 111", "c=IN IP4 10.0.0.5",
        "a=candidate:1 1 udp 2130706431 10.0.0.5 51234 typ host",
        "a=candidate:2 1 udp 2130706431 fe80::1 51235 typ host",
        "a=candidate:3 1 tcp 1 10.0.0.5 9 typ host tcptype active",
        "a=end-of-candidates", ""])
    assert wp.first_udp_candidate(answer) == ("10.0.0.5", 51234)
    out = wp.rewrite_answer(answer, ("127.0.0.3", 4000))
    cands = [ln for ln in out.split("\r\n") if ln.startswith("a=candidate")]
    assert cands == ["a=candidate:1 1 udp 2130706431 127.0.0.3 4000 typ host"]
    assert "m=audio 4000 " in out and "c=IN IP4 127.0.0.3" in out
    offer = "v=0\r\na=candidate:1 1 udp 1 192.0.2.1 9 typ host\r\na=end-of-candidates\r\na=mid:0\r\n"
    assert wp.strip_candidates(offer) == "v=0\r\na=mid:0\r\n"
