"""The receive loop's PROXY-header parse cache (server.py ``dispatch``): a hit must be exactly
what a fresh parse gives, and a datagram that does not parse is never served from it."""

from __future__ import annotations

import trio

from appliance.netio.sockets import udp_socket
from appliance.proto.proxy import STREAM, encode_header
from appliance.transceiver.server import Transceiver, TransceiverConfig

RELAY = ("10.0.0.2", 4000)
PUBLIC = ("198.51.100.1", 3478)
RTP = bytes([0x80, 111]) + bytes(30)


def _transceiver() -> Transceiver:
    sock = udp_socket(("127.0.0.1", 0), buffer=0, v6only=None)
    return Transceiver(TransceiverConfig(id=1, secrets=(b"k" * 32,)), sock)


async def test_cached_headers_route_like_fresh_parses() -> None:
    tr = _transceiver()
    try:
        now = trio.current_time()
        a = encode_header(("203.0.113.7", 5000), PUBLIC, b"")
        b = encode_header(("203.0.113.8", 5000), PUBLIC, b"")
        for header in (a, a, b, b):
            tr.dispatch(now, memoryview(header + RTP), RELAY)
        assert tr.counters["drop_unknown_flow"] == 4
        assert [c for c, _, _ in tr._proxy_cache.values()] == [
            ("203.0.113.7", 5000), ("203.0.113.8", 5000)]
        # A STREAM header of the same addresses is another key and another flow type.
        s = encode_header(("203.0.113.7", 5000), PUBLIC, b"", STREAM)
        tr.dispatch(now, memoryview(s + RTP), RELAY)
        assert type(tr._proxy_cache[s][0]).__name__ == "StreamAddr"
        # Shorter than the header it announces (a cached header cut short): not a hit.
        tr.dispatch(now, memoryview(a[:-3]), RELAY)
        # Garbage, and too short to have a length field.
        tr.dispatch(now, memoryview(b"\x00" * 40), RELAY)
        tr.dispatch(now, memoryview(b"\x0d\x0a"), RELAY)
        assert tr.counters["drop_proxy"] == 3
        assert len(tr._proxy_cache) == 3
    finally:
        tr.sock.close()
