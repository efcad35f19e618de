"""The public socket's early drops: the kernel filter (Linux) and the loop's own checks."""

from __future__ import annotations

import socket
import sys

import pytest
import trio
from relay.conftest import StartRelay
from relay.support import RTP, check, eventually, open_client, open_transceiver, ufrag

from appliance.relay.filter import MAX_DATAGRAM, attach_public_filter

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_ATTACH_FILTER")

ACCEPTED = [b"", b"\x00\x01", b"\x03", b"\x14\xfe", b"\x3f", b"\x80\x60", b"\xbf",
            b"\x80" + bytes(MAX_DATAGRAM - 1)]
DROPPED = [b"\x04", b"\x13", b"\x40", b"\x7f", b"\xc0", b"\xff",
           b"\x80" + bytes(MAX_DATAGRAM), b"\x00" * 60_000]


@linux
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_kernel_filter_keeps_only_our_protocols_up_to_the_size_limit(family: int) -> None:
    host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    with socket.socket(family, socket.SOCK_DGRAM) as rx, \
            socket.socket(family, socket.SOCK_DGRAM) as tx:
        assert attach_public_filter(rx)
        rx.bind((host, 0))
        rx.settimeout(0.5)
        for data in DROPPED + ACCEPTED:  # in order: each accepted datagram is a barrier
            tx.sendto(data, rx.getsockname())
        got = [rx.recv(65536) for _ in ACCEPTED]
        assert got == ACCEPTED  # nothing from DROPPED came in between


@linux
def test_kernel_filter_with_turn_also_keeps_channel_data() -> None:
    """With TURN on, ChannelData (first byte 0x40-0x7F, channels 0x4000-0x7FFF) passes too;
    everything else is filtered as before."""
    accepted = [*ACCEPTED, b"\x40\x00\x00\x00", b"\x4f", b"\x7f\xff"]
    dropped = [d for d in DROPPED if d[:1] not in (b"\x40", b"\x7f")]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        assert attach_public_filter(rx, turn=True)
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(0.5)
        for data in dropped + accepted:  # in order: each accepted datagram is a barrier
            tx.sendto(data, rx.getsockname())
        assert [rx.recv(65536) for _ in accepted] == accepted


@pytest.mark.usefixtures("close_sockets")
async def test_loop_drops_junk_from_unknown_flows_and_reports_buffers(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    stats = relay.stats()
    for granted in stats["sockets"].values():
        assert granted["rcvbuf"] > 0 and granted["sndbuf"] > 0
    c = await open_client(relay.public[0])
    for _ in range(5):
        await c.send(RTP)  # passes the filter (RTP first byte), no flow: asked about
    marker = check(ufrag())
    await c.send(marker)
    await eventually(lambda: marker in t.payloads())
    # No flow: the transceivers are asked (relay/reseed.py); the fake one never vouches.
    assert relay.stats()["counters"]["drops"] == {"vouch-pending": 5}
    assert len(t.queries) == 1  # one question per client, not per datagram
    assert relay.core.counters.flows_created == 1
    await c.send(RTP)  # now the flow exists: forwarded
    await eventually(lambda: RTP in t.payloads())
