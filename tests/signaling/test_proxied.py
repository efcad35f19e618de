"""signaling/proxied.py: the real client behind the relays' HTTPS splice, and the trust edge
(issue 40 item 0). End to end from another host: tests/security/test_api_trust.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.proxy import DGRAM, STREAM, ProxyError, encode_header
from appliance.signaling.proxied import (
    CLIENT_IS_LOCAL,
    MAX_HEADER,
    RealClients,
    TrustEdge,
    judged_client,
    read_proxy_header,
)


async def _read(data: bytes, chunk: int = 7) -> tuple[tuple[str, int], bytes]:
    send, recv = trio.testing.memory_stream_one_way_pair()
    for i in range(0, len(data), chunk):
        await send.send_all(data[i : i + chunk])
    await send.aclose()
    return await read_proxy_header(recv)


async def test_the_header_names_the_client_and_the_rest_is_kept() -> None:
    head = encode_header(("198.51.100.7", 50123), ("10.0.0.1", 443), transport=STREAM)
    client, rest = await _read(head + b"\x16\x03\x01hello")
    assert client == ("198.51.100.7", 50123) and rest == b"\x16\x03\x01hello"
    head6 = encode_header(("2001:db8::7", 9), ("2001:db8::1", 443), transport=STREAM)
    assert (await _read(head6, chunk=1))[0] == ("2001:db8::7", 9)


@pytest.mark.parametrize("data", [
    b"",  # closed before a byte
    b"\x16\x03\x01\x00\x05hello-no-header",  # TLS straight away: an old relay
    encode_header(("198.51.100.7", 1), ("10.0.0.1", 443), transport=DGRAM),  # not a stream
    encode_header(("198.51.100.7", 1), ("10.0.0.1", 443), transport=STREAM)[:20],  # cut
])
async def test_anything_but_a_stream_header_is_refused(data: bytes) -> None:
    with pytest.raises(ProxyError):
        await _read(data)


async def test_a_header_longer_than_the_bound_is_refused_before_it_is_read() -> None:
    head = bytearray(encode_header(("198.51.100.7", 1), ("10.0.0.1", 443), transport=STREAM))
    head[14:16] = (MAX_HEADER).to_bytes(2, "big")  # claims more than the bound allows
    send, recv = trio.testing.memory_stream_one_way_pair()
    await send.send_all(bytes(head[:16]))  # the rest never comes: refused on the length
    with pytest.raises(ProxyError):
        await read_proxy_header(recv)


@given(st.binary(max_size=600))
def test_read_raises_only_its_own_error(data: bytes) -> None:
    async def main() -> None:
        try:
            await _read(data, chunk=13)
        except ProxyError:
            pass

    trio.run(main)


def test_a_loopback_claim_is_believed_only_over_a_loopback_hop() -> None:
    assert judged_client(("127.0.0.1", 5), ("127.0.0.1", 9)) == ("127.0.0.1", 5)
    assert judged_client(("198.51.100.7", 5), ("127.0.0.1", 9)) == ("198.51.100.7", 5)
    # A relay elsewhere (or anyone reaching a non-loopback --relay-https) claiming "local":
    assert judged_client(("127.0.0.1", 5), ("10.0.0.2", 9)) == ("10.0.0.2", 9)
    assert judged_client(("::1", 5), ("10.0.0.2", 9)) == ("10.0.0.2", 9)


async def _edge(scope: dict[str, Any], clients: RealClients) -> tuple[Any, bool]:
    seen: list[tuple[Any, bool]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((scope.get("client"), CLIENT_IS_LOCAL.get()))

    await TrustEdge(app, clients)(scope, None, None)
    assert CLIENT_IS_LOCAL.get() is False  # reset after the request
    return seen[0]


async def test_the_edge_judges_each_request_by_its_real_client() -> None:
    clients = RealClients()
    http = {"type": "http", "headers": []}
    assert await _edge({**http, "client": ("127.0.0.1", 4000)}, clients) == (
        ("127.0.0.1", 4000), True)
    assert await _edge({**http, "client": ("10.0.0.9", 4000)}, clients) == (
        ("10.0.0.9", 4000), False)
    # A connection the relay spliced in: its loopback hop is replaced by the real client.
    clients.bind(("127.0.0.1", 4001), ("198.51.100.7", 50123))
    assert await _edge({**http, "client": ("127.0.0.1", 4001)}, clients) == (
        ("198.51.100.7", 50123), False)
    assert await _edge({"type": "websocket", "headers": [], "client": ("127.0.0.1", 4001)},
                       clients) == (("198.51.100.7", 50123), False)
    clients.unbind(("127.0.0.1", 4001))
    assert len(clients) == 0
    # A proxy on this host that forwarded the request: not local.
    fwd = {"type": "http", "client": ("127.0.0.1", 4002),
           "headers": [(b"x-forwarded-for", b"203.0.113.9")]}
    assert (await _edge(fwd, clients))[1] is False
    fwd["headers"] = [(b"forwarded", b"for=203.0.113.9")]
    assert (await _edge(fwd, clients))[1] is False
    # In process (the ASGI test client): no address at all.
    assert (await _edge({**http}, clients))[1] is True


def test_outside_a_request_nothing_is_local() -> None:
    assert CLIENT_IS_LOCAL.get() is False
