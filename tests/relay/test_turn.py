"""TURN over UDP on a real relay worker (both I/O paths): a client allocates on the media
port, its ICE check reaches the owning transceiver from the relayed address without a
datagram to ourselves (issue 40 item 2), the transceiver's answers come back wrapped; a peer
inside --turn-peer is reached through the relayed socket, and nothing else is."""

from __future__ import annotations

import ipaddress
import socket
import time

import pytest
import trio
from proto.turn.turn_client import SECRET, Client, relayed_of
from relay.conftest import StartRelay
from relay.support import (
    OPEN_SOCKETS,
    check,
    eventually,
    open_client,
    open_transceiver,
    ufrag,
)
from relay.support import Client as UdpClient

from appliance.proto.framing import encode_frame
from appliance.proto.stun import AttrType, Class, Message, Method
from appliance.proto.turn import (
    StreamFramer,
    encode_channel_data,
    mint_rest_credential,
    parse_channel_data_untrusted,
)
from appliance.relay import RelayHandle
from appliance.relay.turn import TurnSettings

pytestmark = pytest.mark.usefixtures("close_sockets")


async def _ask(sock: UdpClient, c: Client, method: Method,
               attrs: tuple[tuple[AttrType, object], ...] = ()) -> Message:
    for _ in range(2):  # one 401 round, as a client does
        await sock.send(c.request(method, attrs))  # type: ignore[arg-type]
        data, _ = await sock.recv()
        msg = c.learn(data)
        if msg.msg_class == Class.SUCCESS:
            return msg
    raise AssertionError(msg.error_code)


def _client(sock: UdpClient, relay: RelayHandle) -> Client:
    # A credential valid for an hour of real time: the relay checks its expiry on the wall
    # clock (the unit tests use a fake one).
    cred = mint_rest_credential(SECRET, "sess", int(time.time()) + 3600)
    return Client(addr=sock.address, local=relay.public[0], username=cred.username,
                  password=cred.password)


def _tcp_client() -> Client:
    cred = mint_rest_credential(SECRET, "sess", int(time.time()) + 3600)
    return Client(username=cred.username, password=cred.password)


async def _allocated(relay: RelayHandle) -> tuple[UdpClient, Client, tuple[str, int]]:
    sock = await open_client(relay.public[0])
    c = _client(sock, relay)
    msg = await _ask(sock, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    relayed = relayed_of(msg)
    assert relayed[0] == "127.0.0.1" and relayed != relay.public[0]
    assert msg.xor_mapped_address == sock.address
    return sock, c, relayed


async def test_turn_call_reaches_its_transceiver_without_leaving_the_host(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address}, turn=TurnSettings(secrets=(SECRET,)))
    own = relay.public[0]
    sock, c, relayed = await _allocated(relay)

    # Before a channel: Send indication in, Data indication back.
    await _ask(sock, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, own),))
    first = check(ufrag())
    await sock.send(c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, own),
                                            (AttrType.DATA, first)),
                              auth=False, cls=Class.INDICATION))
    await eventually(lambda: len(t.got) == 1)
    got = t.got[0]
    # The transceiver sees a client at the relayed address, on our public address.
    assert (got.client, got.public, got.payload) == (relayed, own, first)
    data, src = await sock.recv()  # the fake transceiver's echo, as a Data indication
    assert src == own
    msg = Message.parse_untrusted(data)
    assert (msg.method, msg.msg_class) == (Method.DATA, Class.INDICATION)
    assert msg.get(AttrType.XOR_PEER_ADDRESS) == own and msg.get(AttrType.DATA) == first

    # With a channel: ChannelData both ways; media (not STUN) follows the flow table.
    await _ask(sock, c, Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4001),
                                              (AttrType.XOR_PEER_ADDRESS, own)))
    media = b"\x80\x6f" + bytes(range(100))
    await sock.send(encode_channel_data(0x4001, media))
    data, _ = await sock.recv()
    assert parse_channel_data_untrusted(data) == (0x4001, len(media))
    assert data[4:] == media
    assert t.got[-1].client == relayed and t.got[-1].payload == media
    counters = relay.stats()["counters"]
    assert counters["turn_relayed_in"] == 2 and counters["turn_relayed_out"] == 2
    assert counters.get("turn_peer_sends", 0) == 0  # nothing went through a socket
    assert relay.core.flows[relayed].upstream == ("turn", 0)

    # Deleting the allocation ends the flow of its relayed address.
    await _ask(sock, c, Method.REFRESH, ((AttrType.LIFETIME, 0),))
    assert relayed not in relay.core.flows
    assert relay.stats()["counters"]["turn_allocations_deleted"] == 1


async def _peer() -> trio.socket.SocketType:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    OPEN_SOCKETS.append(sock)
    await sock.bind(("127.0.0.1", 0))
    return sock


async def test_a_turn_peer_network_is_reached_through_the_relayed_socket(
        nursery: trio.Nursery, start_relay: StartRelay) -> None:
    relay = await start_relay(turn=TurnSettings(
        secrets=(SECRET,), peers=(ipaddress.ip_network("127.0.0.1/32"),)))
    peer = await _peer()
    paddr = peer.getsockname()
    sock, c, relayed = await _allocated(relay)
    await _ask(sock, c, Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                              (AttrType.XOR_PEER_ADDRESS, paddr)))
    await sock.send(encode_channel_data(0x4000, b"to the peer"))
    with trio.fail_after(5):
        data, src = await peer.recvfrom(2048)
    assert data == b"to the peer" and (src[0], src[1]) == relayed
    await peer.sendto(b"from the peer", relayed)
    data, _ = await sock.recv()
    assert data == encode_channel_data(0x4000, b"from the peer")
    assert relay.stats()["counters"]["turn_peer_sends"] == 1


async def test_nobody_else_is_relayed_to(nursery: trio.Nursery,
                                         start_relay: StartRelay) -> None:
    """No --turn-peer: a local service on our own IP is not reachable through the relay,
    even with a permission for the IP (our media port is the only one)."""
    relay = await start_relay(turn=TurnSettings(secrets=(SECRET,)))
    service = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    OPEN_SOCKETS.append(service)  # type: ignore[arg-type]
    service.bind(("127.0.0.1", 0))
    service.setblocking(False)
    sock, c, _ = await _allocated(relay)
    await _ask(sock, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, relay.public[0]),))
    await sock.send(c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, service.getsockname()),
                                            (AttrType.DATA, b"FLUSHALL\r\n")),
                              auth=False, cls=Class.INDICATION))
    await eventually(lambda: relay.stats()["counters"]["drops"].get("turn-peer-forbidden") == 1)
    # Had it been relayed, the loopback datagram would be queued by now (sendto on loopback
    # delivers before it returns, and it would have happened before the count).
    with pytest.raises(BlockingIOError):
        service.recv(2048)


async def test_turn_is_off_unless_configured(nursery: trio.Nursery,
                                             start_relay: StartRelay) -> None:
    relay = await start_relay()
    sock = await open_client(relay.public[0])
    c = _client(sock, relay)
    await sock.send(c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    # Junk like any malformed first packet: no answer, counted.
    await eventually(lambda: relay.stats()["counters"]["drops"].get("stun-malformed") == 1)
    assert "turn_requests" not in relay.stats()["counters"]


class TurnTcp:
    """A TURN-over-TCP client connection: STUN and padded ChannelData back to back, no
    RFC 4571 prefix (RFC 8656 §12.5)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.framer = StreamFramer()

    @property
    def address(self) -> tuple[str, int]:
        name = self.stream.socket.getsockname()
        return (name[0], name[1])

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def recv(self, within: float = 5.0) -> bytes:
        with trio.fail_after(within):
            while (msg := self.framer.poll_output()) is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError("relay closed the connection")
                self.framer.handle_input(data)
        return msg


async def test_turn_over_tcp_on_the_ice_tcp_port(nursery: trio.Nursery,
                                                 start_relay: StartRelay) -> None:
    """A TURN client over TCP (the media port's TCP listener) relays UDP to our media
    address in-process; what comes back is padded ChannelData without RFC 4571 prefixes; the
    allocation ends with the connection. An ICE-TCP connection on the same port still works."""
    t = await open_transceiver(nursery)
    relay = await start_relay(transceivers={0: t.address}, tcp=(("127.0.0.1", 0),),
                              turn=TurnSettings(secrets=(SECRET,)))
    own = relay.public[0]  # the UDP media address: what the answer's candidate names
    stream = await trio.open_tcp_stream(*relay.tcp[0])
    OPEN_SOCKETS.append(stream.socket)
    conn = TurnTcp(stream)
    c = _tcp_client()

    async def ask(method: Method, attrs: tuple[tuple[AttrType, object], ...] = ()) -> Message:
        for _ in range(2):
            await conn.send(c.request(method, attrs))  # type: ignore[arg-type]
            msg = c.learn(await conn.recv())
            if msg.msg_class == Class.SUCCESS:
                return msg
        raise AssertionError(msg.error_code)

    relayed = relayed_of(await ask(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    await ask(Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                    (AttrType.XOR_PEER_ADDRESS, own)))
    first = check(ufrag())  # 4-byte padding follows it on the stream when needed
    await conn.send(encode_channel_data(0x4000, first, pad=True))
    got = await conn.recv()  # the echo
    assert got == encode_channel_data(0x4000, first)
    assert (t.got[-1].client, t.got[-1].public, t.got[-1].payload) == (relayed, own, first)
    odd = b"\x80\x6f" + bytes(101)  # 103 bytes: one byte of padding each way
    await conn.send(encode_channel_data(0x4000, odd, pad=True))
    assert await conn.recv() == encode_channel_data(0x4000, odd)
    assert relay.stats()["counters"]["tcp_established"] == 1

    await stream.aclose()
    await eventually(lambda: relay.stats()["counters"].get("turn_allocations_closed") == 1)
    assert relayed not in relay.core.flows

    # ICE-TCP (RFC 4571 frames) on the same listener is told apart and unaffected.
    ice = await trio.open_tcp_stream(*relay.tcp[0])
    OPEN_SOCKETS.append(ice.socket)
    await ice.send_all(encode_frame(check(ufrag())))
    await eventually(lambda: len(t.got) == 3)
    assert t.got[-1].public == relay.tcp[0]  # arrived as ICE-TCP
