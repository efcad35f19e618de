"""Issue 18 #5/#6: hostile input on the relay's ICE-TCP port while real calls run through it
— two UDP calls and one ICE-TCP call (our ClientPeer speaking RFC 4571 frames on a TCP
connection: ICE, DTLS, SRTP end to end with a transceiver process) — and none of them
notices. The relay and the transceiver are processes (reliability/support.py).

Hostile connections: garbage first frames (HTTP, TLS, RTP before any check, checks whose
ufrag does not verify), half-open connections that never send, slowloris connections that
dribble one byte of a length prefix, oversize frames, a connection flood past the per-IP
cap, and a reader that has made a flow and then never reads. Each is closed or refused and
counted under its reason; the calls keep receiving media at their rate.

The slow reader's *overflow* (its backlog reaching the cap, its frames dropped) needs more
return traffic than an echo call makes in a test's time: tests/relay/test_tcp.py drives it
with a fake transceiver that bursts.
"""

from __future__ import annotations

import socket as stdsocket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from reliability.support import Stack, eventually, open_call, opus_frame
from reliability.tcp_support import open_tcp_call

from appliance.proto.framing import encode_frame
from appliance.proto.stun import binding_request

SECONDS = 3.0


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    s = Stack.make(tmp_path)
    try:
        yield s
    finally:
        s.close()


def _connect(tcp: tuple[str, int], src: str = "127.0.0.1") -> stdsocket.socket:
    s = stdsocket.socket()
    s.bind((src, 0))
    s.connect(tcp)
    return s


def _closed(s: stdsocket.socket) -> bool:
    s.settimeout(0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True  # reset


async def test_tcp_hostile_input_leaves_calls_untouched(stack: Stack) -> None:
    await stack.start_transceiver(0)
    await stack.start_relay("--tcp", "127.0.0.1:0", "--tcp-max-per-ip", "40")
    assert stack.relay is not None
    host, port = stack.relay.line.split(" tcp ")[1].split(",")[0].rsplit(":", 1)
    tcp = (host, int(port))
    payload = opus_frame()
    async with trio.open_nursery() as nursery:
        calls = [await open_call(nursery, stack, 0, f"udp{i}", payload) for i in range(2)]
        calls.append(await open_tcp_call(nursery, stack, tcp, "tcp0", payload))
        with trio.fail_after(15):
            for c in calls:
                await c.connected.wait()
        await eventually(lambda: all(c.received > 10 for c in calls), 10, "media on every call")
        # A quiet window first: the rate each call gets on this (shared, loaded) machine.
        t0, base0 = trio.current_time(), [c.received for c in calls]
        await trio.sleep(SECONDS)
        start = trio.current_time()
        before = [c.received for c in calls]
        baseline = [(n1 - n0) / (start - t0) for n0, n1 in zip(base0, before, strict=True)]

        ufrag = calls[2].peer.ice.remote_ufrag if calls[2].peer.ice else ""  # a live session's
        junk: list[stdsocket.socket] = []
        # Garbage first frames: each closed at its first frame.
        for first in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # unframed: a huge length
                      encode_frame(b"\x80" + bytes(100)),  # RTP before any check
                      encode_frame(binding_request(bytes(12), username="notaufrag:x")),
                      b"\xff\xff" + bytes(64)):  # an oversize frame
            s = _connect(tcp)
            s.sendall(first)
            junk.append(s)
        half_open = [_connect(tcp) for _ in range(5)]  # never send a byte
        slowloris = [_connect(tcp) for _ in range(5)]
        for s in slowloris:
            s.sendall(b"\x00")  # half a length prefix, then silence
        # A reader that makes a flow (a check with the live session's ufrag: it verifies,
        # the transceiver answers 401 to the wrong password) and then never reads.
        silent = _connect(tcp)
        silent.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 2048)
        silent.sendall(encode_frame(binding_request(bytes(12), username=f"{ufrag}:evil")))
        # A connection flood from another loopback address past the per-IP cap (40).
        flood = [_connect(tcp, "127.0.0.2") for _ in range(60)]
        await trio.sleep(SECONDS)  # the calls run meanwhile; their media is the measurement

        stats = (await stack.relay_stats())["counters"]
        drops = stats["drops"]
        assert drops.get("tcp-first-frame", 0) >= 2, drops  # RTP first, bad ufrag
        assert drops.get("tcp-frame-too-long", 0) >= 2, drops  # HTTP as a length, 0xffff
        assert drops.get("tcp-refused-ip", 0) >= 20, drops
        # The TCP call and the silent reader made flows; nothing hostile did.
        assert stats["tcp_established"] == 2, stats
        assert all(_closed(s) for s in junk)
        # Half-open and slowloris: closed at the first-frame timeout (5 s by default).
        await eventually(lambda: all(_closed(s) for s in half_open + slowloris), 10,
                         "half-open and slowloris connections to be closed")
        drops = (await stack.relay_stats())["counters"]["drops"]
        assert drops.get("tcp-first-timeout", 0) >= 10, drops

        end = trio.current_time()
        for c, n0, base in zip(calls, before, baseline, strict=True):
            assert c.failed is None, c.failed
            rate = (c.received - n0) / (end - start)
            # The same rate as in the quiet window, give or take the machine's load.
            assert rate >= 0.7 * base, (c.sid, rate, base)
            gaps = [b - a for a, b in zip(c.rx_times, c.rx_times[1:], strict=False)
                    if a >= start]
            assert max(gaps) < 0.5, (c.sid, max(gaps))
        for s in [*junk, *half_open, *slowloris, silent, *flood]:
            s.close()
        nursery.cancel_scope.cancel()
