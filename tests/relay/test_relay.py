"""The relay worker over real loopback sockets, with fake transceivers speaking PROXY v2.

Ordering trick used instead of sleeps: the relay drains its public socket in arrival order,
so once a "barrier" datagram sent *after* some junk has reached a transceiver, the junk has
been processed (and counted) too.
"""

from __future__ import annotations

import aioice.stun as astun
import pytest
import trio
from relay.conftest import StartRelay
from relay.support import (
    DTLS,
    RTP,
    FakeTransceiver,
    check,
    eventually,
    open_client,
    open_transceiver,
    stun_request,
    ufrag,
)

from appliance.control import control_request
from appliance.proto.proxy import TLV_RELAY_ID, encode_header
from appliance.proto.ufrag import UfragCodec

pytestmark = pytest.mark.usefixtures("close_sockets")


async def _barrier(
    relay_public: tuple[str, int], t: FakeTransceiver, k: int = 0, cluster: int = 0
) -> None:
    """Send a valid check from a fresh client and wait until ``t`` has it."""
    c = await open_client(relay_public)
    marker = check(ufrag(transceiver=k, cluster=cluster))
    await c.send(marker)
    await eventually(lambda: marker in t.payloads())
    c.close()


async def test_routes_first_packet_by_ufrag_and_returns_traffic(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    ts = [await open_transceiver(nursery) for _ in range(3)]
    relay = await start_relay(transceivers={k: t.address for k, t in enumerate(ts)})
    public = relay.public[0]
    clients = [await open_client(public) for _ in range(6)]
    for i, c in enumerate(clients):
        await c.send(check(ufrag(transceiver=i % 3)))
        # Every STUN request is echoed back by the fake transceiver: the client sees it
        # coming from the relay's public address.
        data, src = await c.recv()
        assert src == public
        assert data.startswith(b"\x00\x01")
        await c.send(DTLS)
        await c.send(RTP + bytes([i]))
        assert (await c.recv())[0] == DTLS
        assert (await c.recv())[0] == RTP + bytes([i])
    for k, t in enumerate(ts):
        mine = [c.address for i, c in enumerate(clients) if i % 3 == k]
        assert {r.client for r in t.got} == set(mine)
        assert all(r.public == public for r in t.got)
        assert all(r.src == relay.internal for r in t.got)
        # Every frame carries the relay id TLV.
        assert all(any(kind == TLV_RELAY_ID for kind, _ in r.tlvs) for r in t.got)
        assert len(t.got) == 3 * len(mine)
    stats = relay.stats()
    assert stats["flows"] == 6
    counters = stats["counters"]
    assert counters["flows_created"] == 6
    # 18 from clients + 18 returns; out: 18 to transceivers + 18 to clients.
    assert counters["packets_in"] == 36
    assert counters["packets_out"] == 36
    assert counters["drops"] == {}
    for c in clients:
        c.close()


async def test_forged_malformed_and_unknown_first_packets_are_dropped(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address}, cluster=0)
    c = await open_client(relay.public[0])
    forged = UfragCodec(b"another-secret-entirely-0123456789").mint(cluster=0, transceiver=0)
    junk = [
        check(forged),  # MAC does not verify
        check("not-a-routing-hint"),  # malformed
        check(ufrag()[:-1] + "!"),  # not ICE characters
        check(ufrag(transceiver=7)),  # valid MAC, transceiver not configured
        check(ufrag(cluster=9)),  # valid MAC, no next hop for cluster 9
        RTP,  # media before any STUN
        DTLS,
        b"",  # empty datagram
        b"\x00\x01\x00\x08" + b"\x00" * 20,  # STUN-looking garbage
        stun_request("no-colon-in-username"),  # malformed ufrag
    ]
    for data in junk:
        await c.send(data)
    await _barrier(relay.public[0], t)
    assert len(t.got) == 1  # only the barrier
    drops = relay.stats()["counters"]["drops"]
    assert drops == {
        "ufrag-bad-mac": 1,
        "ufrag-malformed": 3,
        "unknown-transceiver": 1,
        "unknown-cluster": 1,
        # media from an unknown flow: the transceivers are asked (reseed.py); this fake one
        # never vouches. The empty datagram is not even asked about.
        "vouch-pending": 2,
        "no-flow": 1,
        "stun-malformed": 1,
    }
    # Nothing was answered either.
    with trio.move_on_after(0.05):
        await c.recv()
        pytest.fail("the relay answered a dropped packet")
    assert relay.stats()["flows"] == 1


async def test_plain_binding_is_answered_and_never_amplified(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    c = await open_client(relay.public[0])
    for req in (stun_request(), stun_request(software=b"x" * 700)):
        await c.send(req)
        data, src = await c.recv()
        assert src == relay.public[0]
        resp = astun.parse_message(data)
        assert resp.message_class == astun.Class.RESPONSE
        assert resp.transaction_id == req[8:20]
        assert resp.attributes["XOR-MAPPED-ADDRESS"] == c.address
        assert len(data) <= max(len(req), 20) + 32
        assert len(data) == 40  # fixed size, whatever the request carried
    # A Binding *response* or indication from an unknown flow is not answered.
    ind = bytearray(stun_request())
    ind[1] = 0x11  # Binding indication
    await c.send(bytes(ind))
    await _barrier(relay.public[0], t)
    with trio.move_on_after(0.05):
        await c.recv()
        pytest.fail("the relay answered something other than a plain Binding request")
    stats = relay.stats()["counters"]
    assert stats["stun_answered"] == 2
    assert stats["drops"] == {"stun-malformed": 1}
    assert len(t.got) == 1  # only the barrier reached the transceiver


async def test_ipv6_listen_address(nursery: trio.Nursery, start_relay: StartRelay) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(
        listen=(("127.0.0.1", 0), ("::1", 0)), transceivers={0: t.address}
    )
    v6 = relay.public[1]
    c = await open_client(v6, host="::1")
    await c.send(check(ufrag()))
    await c.recv()
    await c.send(RTP)
    assert (await c.recv()) == (RTP, v6)
    assert {r.client for r in t.got} == {c.address}
    assert {r.public for r in t.got} == {v6}


async def test_new_valid_ufrag_reroutes_the_flow(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t0, t1 = await open_transceiver(nursery), await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t0.address, 1: t1.address})
    c = await open_client(relay.public[0])
    first = ufrag(transceiver=0)
    await c.send(check(first))
    await c.recv()
    await c.send(check(first))  # consent check, same session: no re-route
    await c.recv()
    await c.send(RTP)
    await c.recv()
    # ICE restart onto another transceiver: the flow follows the new ufrag.
    await c.send(check(ufrag(transceiver=1)))
    await c.recv()
    await c.send(DTLS)
    await c.recv()
    assert t0.payloads()[2] == RTP and len(t0.got) == 3
    assert t1.payloads()[1] == DTLS and len(t1.got) == 2
    # A forged ufrag on a live flow does not move it.
    forged = UfragCodec(b"another-secret-entirely-0123456789").mint(cluster=0, transceiver=0)
    await c.send(check(forged))
    await c.send(RTP)
    assert (await c.recv())[0] == RTP
    assert len(t1.got) == 3 and len(t0.got) == 3
    counters = relay.stats()["counters"]
    assert counters["reroutes"] == 1
    assert counters["flows_created"] == 1
    assert counters["drops"] == {"ufrag-bad-mac": 1}


async def test_idle_flows_expire(
    nursery: trio.Nursery, start_relay: StartRelay, autojump_clock: trio.testing.MockClock
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address}, flow_timeout=30.0)
    idle = await open_client(relay.public[0])
    busy = await open_client(relay.public[0])
    for c in (idle, busy):
        await c.send(check(ufrag()))
        await c.recv()
    # The busy client keeps sending (every 10 s of virtual time); the idle one stops.
    for _ in range(4):
        await trio.sleep(10)
        await busy.send(RTP)
        await busy.recv()
    await trio.sleep(2)  # past 30 s + a sweep tick for the idle flow
    assert relay.stats()["flows"] == 1
    assert relay.core.counters.flows_expired == 1
    await idle.send(RTP)
    await _barrier(relay.public[0], t)
    assert relay.stats()["counters"]["drops"] == {"vouch-pending": 1}  # asked, not vouched
    assert RTP not in [r.payload for r in t.got if r.client == idle.address]


async def test_cap_evicts_the_stalest_flow(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address}, max_flows=3)
    cs = [await open_client(relay.public[0]) for _ in range(4)]
    for c in cs[:3]:
        await c.send(check(ufrag()))
        await c.recv()
    await cs[0].send(RTP)  # client 0 is now fresher than client 1
    await cs[0].recv()
    await cs[3].send(check(ufrag()))
    await cs[3].recv()
    assert relay.core.counters.flows_evicted == 1
    assert set(relay.core.flows) == {cs[0].address, cs[2].address, cs[3].address}
    await cs[1].send(RTP)
    await cs[0].send(RTP)
    assert (await cs[0].recv())[0] == RTP
    assert relay.stats()["counters"]["drops"] == {"vouch-pending": 1}  # asked, not vouched


async def test_new_flows_are_rate_limited_per_source(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(
        transceivers={0: t.address}, new_flow_rate=0.001, new_flow_burst=3.0
    )
    cs = [await open_client(relay.public[0]) for _ in range(5)]
    for c in cs:
        await c.send(check(ufrag()))
    # Another source address is not limited by 127.0.0.1's spending.
    other = await open_client(relay.public[0], host="127.0.0.2")
    await other.send(check(ufrag()))
    await eventually(lambda: other.address in {r.client for r in t.got})
    assert relay.stats()["flows"] == 4
    assert relay.stats()["counters"]["drops"] == {"rate-limited": 2}
    # Reflexive answers spend the same tokens: no reflection flood from one source.
    await cs[0].send(stun_request())
    await other.send(RTP)
    await eventually(lambda: RTP in t.payloads())
    assert relay.stats()["counters"]["drops"] == {"rate-limited": 3}


async def test_internal_socket_rejects_bad_frames(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    c = await open_client(relay.public[0])
    await c.send(check(ufrag()))
    await c.recv()
    # Not a transceiver: a stranger on the internal socket cannot use it to send media to
    # a client (it is treated as an upstream relay, whose first packet must be STUN).
    stranger = await open_client(relay.internal)
    await stranger.send(encode_header(c.address, relay.public[0]) + RTP)
    await stranger.send(b"garbage, not a PROXY header")
    # A transceiver naming a public address this relay does not have.
    await t.sock.sendto(encode_header(c.address, ("127.0.0.1", 1)) + RTP, relay.internal)
    await t.sock.sendto(encode_header(c.address, relay.public[0]) + DTLS, relay.internal)
    assert (await c.recv())[0] == DTLS
    assert relay.stats()["counters"]["drops"] == {
        "no-flow": 1, "proxy-malformed": 1, "return-unknown-public": 1,
    }


async def test_cached_proxy_headers_are_still_checked(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """Return traffic's parsed PROXY headers are cached by their first 28 bytes: repeats
    are forwarded, and a truncated copy of a cached header (whose first bytes match) is
    still dropped as malformed."""
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    c = await open_client(relay.public[0])
    header = encode_header(c.address, relay.public[0])
    for i in range(3):  # a parse, then cache hits
        await t.sock.sendto(header + RTP + bytes([i]), relay.internal)
        assert await c.recv() == (RTP + bytes([i]), relay.public[0])
    await t.sock.sendto(header[:27], relay.internal)  # shorter than the cache key
    await t.sock.sendto(header[:16], relay.internal)  # no address block
    await t.sock.sendto(header + DTLS, relay.internal)
    assert (await c.recv())[0] == DTLS
    assert relay.stats()["counters"]["drops"] == {"proxy-malformed": 2}


async def test_return_traffic_needs_no_flow(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """Any worker can send any flow's return traffic: the header names the client."""
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address})
    c = await open_client(relay.public[0])
    await t.sock.sendto(encode_header(c.address, relay.public[0]) + RTP, relay.internal)
    assert await c.recv() == (RTP, relay.public[0])


async def test_next_hop_chain_keeps_the_client_address(
    nursery: trio.Nursery, start_relay: StartRelay
) -> None:
    """global relay (cluster 0) -> regional relay (cluster 1) -> transceiver 2 of cluster 1,
    and back along the same hops."""
    t = await open_transceiver(nursery)
    regional = await start_relay(cluster=1, transceivers={2: t.address}, relay_id="regional")
    glob = await start_relay(cluster=0, next_hops={1: regional.internal}, relay_id="global")
    c = await open_client(glob.public[0])
    await c.send(check(ufrag(cluster=1, transceiver=2)))
    data, src = await c.recv()
    assert src == glob.public[0] and data.startswith(b"\x00\x01")
    for payload in (DTLS, RTP):
        await c.send(payload)
        assert await c.recv() == (payload, glob.public[0])
    assert [r.payload for r in t.got][1:] == [DTLS, RTP]
    for r in t.got:
        assert r.client == c.address
        assert r.public == glob.public[0]  # the address the client really sent to
        assert r.src == regional.internal
        assert (TLV_RELAY_ID, b"regional") in r.tlvs
    assert glob.stats()["counters"]["drops"] == {}
    assert regional.stats()["counters"]["drops"] == {}
    assert glob.core.flows[c.address].dest == regional.internal
    assert regional.core.flows[c.address].upstream == glob.internal
    # A foreign ufrag the regional relay has no route for is dropped there.
    await c.send(check(ufrag(cluster=1, transceiver=5)))
    await _barrier(glob.public[0], t, k=2, cluster=1)
    assert regional.stats()["counters"]["drops"] == {"unknown-transceiver": 1}


async def test_control_channel_serves_stats(
    nursery: trio.Nursery, start_relay: StartRelay, tmp_path: object
) -> None:
    t = await open_transceiver(nursery)
    path = f"{tmp_path}/relay.sock"
    relay = await start_relay(transceivers={0: t.address}, control=path, worker=3)
    c = await open_client(relay.public[0])
    await c.send(check(ufrag()))
    await c.recv()
    resp = await control_request(path, {"op": "stats"})
    assert resp["ok"] is True
    assert resp["worker"] == 3
    assert resp["flows"] == 1
    assert resp["counters"]["flows_created"] == 1
    assert resp["counters"]["packets_in"] == 2
    bad = await control_request(path, {"op": "nope"})
    assert bad["ok"] is False and bad["status"] == 400
