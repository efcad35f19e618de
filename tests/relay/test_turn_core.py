"""TURN in the relay's core, without sockets (appliance/relay/turn.py + core.py): TURN
datagrams reach the gate, data for our own media address is routed by its ICE ufrag as a
client at the relayed address (issue 40 item 2: nothing leaves the host), return traffic is
wrapped for the TURN client, and an allocation's end ends its flow."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from proto.turn.turn_client import NOW, SECRET, UNIX, Client, FakePorts, relayed_of
from relay.support import CODEC
from relay.support import SECRET as ROUTING_SECRET

from appliance.proto.proxy import parse_untrusted
from appliance.proto.stun import AttrType, Class, Message, Method, binding_request
from appliance.proto.turn import encode_channel_data
from appliance.relay.core import TURN_HOP, CoreConfig, Flow, RelayCore, Relayed
from appliance.relay.transport import Transport, UdpSink
from appliance.relay.turn import TurnGate, TurnSettings, own_media_map

PUBLIC = ("0.0.0.0", 3478)  # the listen address: a wildcard
MEDIA = ("203.0.113.1", 3478)  # our media address as clients (and TURN peers) know it
CLIENT = ("198.51.100.7", 50000)
T0 = ("127.0.0.1", 4000)


class Ports(FakePorts):
    def __init__(self) -> None:
        super().__init__()
        self.closed: list[tuple[str, int]] = []
        self.sent: list[tuple[tuple[str, int], tuple[str, int], bytes]] = []

    def close(self, relayed: tuple[str, int]) -> None:
        self.closed.append(relayed)

    def send(self, relayed: tuple[str, int], peer: tuple[str, int], data: memoryview) -> None:
        self.sent.append((relayed, peer, bytes(data)))


def _setup(**settings: Any) -> tuple[RelayCore, TurnGate, Ports, UdpSink]:
    core = RelayCore(CoreConfig(secrets=(ROUTING_SECRET,), transceivers={0: T0}))
    sink = UdpSink(PUBLIC, lambda buf, pending: (len(pending), 0, 0))
    core.sinks[(Transport.UDP, PUBLIC)] = sink
    ports = Ports()
    gate = TurnGate(core, TurnSettings(secrets=(SECRET,), **settings),
                    own_media_map([MEDIA], [PUBLIC]), ports, unix_offset=UNIX - NOW)
    return core, gate, ports, sink


def _ask(core: RelayCore, c: Client, method: Method,
         attrs: tuple[tuple[AttrType, object], ...] = ()) -> Message:
    for _ in range(2):  # one 401 round, as a client does
        res = core.handle_datagram(NOW, c.addr, c.request(method, attrs), PUBLIC)  # type: ignore[arg-type]
        assert isinstance(res, bytes)
        msg = c.learn(res)
        if msg.msg_class == Class.SUCCESS:
            return msg
    raise AssertionError(msg.error_code)


def _check() -> bytes:
    uf = CODEC.mint(cluster=0, transceiver=0)
    return binding_request(bytes(12), username=f"{uf}:clnt", password="pw")


def test_own_media_map() -> None:
    assert own_media_map([MEDIA], [PUBLIC]) == {MEDIA: PUBLIC}
    assert own_media_map([], [("127.0.0.1", 5)]) == {("127.0.0.1", 5): ("127.0.0.1", 5)}
    both = own_media_map([("2001:db8::1", 9), ("203.0.113.1", 9)], [("0.0.0.0", 9), ("::", 9)])
    assert both == {("2001:db8::1", 9): ("::", 9), ("203.0.113.1", 9): ("0.0.0.0", 9)}
    with pytest.raises(ValueError, match="not served"):
        own_media_map([("203.0.113.1", 10)], [PUBLIC])


def test_data_for_our_media_address_is_routed_by_its_ufrag_without_leaving_the_host() -> None:
    core, gate, ports, sink = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    relayed = relayed_of(_ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    _ask(core, c, Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                        (AttrType.XOR_PEER_ADDRESS, MEDIA)))
    check = _check()
    data = encode_channel_data(0x4000, check)
    res = core.handle_datagram(NOW, CLIENT, data, PUBLIC)
    # The check inside the ChannelData made a flow for the relayed address, to transceiver 0,
    # through the TURN hop: forward its 4..end slice, framed as from the relayed address.
    assert isinstance(res, Relayed)
    assert (res.offset, res.length) == (4, len(check))
    flow = res.flow
    assert flow.client == relayed and flow.dest == T0 and flow.upstream is TURN_HOP
    client, public, _ = parse_untrusted(flow.header + check)
    assert (client, public) == (relayed, PUBLIC)
    assert core.flows[relayed] is flow and CLIENT not in core.flows
    assert ports.sent == []  # nothing went out of a relayed socket
    # The transceiver's reply goes back as ChannelData: a 4-byte header, the payload in place.
    buf = bytearray(64) + b"reply-bytes"
    gate.back(NOW, flow, memoryview(buf), 64, 11)
    assert sink.pending == [(b"\x40\x00\x00\x0b", 64, 11, CLIENT)]
    counts = core.counters.as_dict()
    assert counts["turn_relayed_in"] == 1 and counts["turn_relayed_out"] == 1


def test_before_a_channel_is_bound_send_and_data_indications_carry_it() -> None:
    core, gate, ports, sink = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    relayed = relayed_of(_ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    _ask(core, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, MEDIA),))
    check = _check()
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, MEDIA), (AttrType.DATA, check)),
                     auth=False, cls=Class.INDICATION)
    res = core.handle_datagram(NOW, CLIENT, send, PUBLIC)
    assert isinstance(res, Relayed)
    assert send[res.offset : res.offset + res.length] == check
    sink.pending.clear()
    gate.back(NOW, res.flow, memoryview(b"pong"), 0, 4)
    ((raw, off, n, dest),) = sink.pending
    assert (off, n, dest) == (0, 0, CLIENT)
    msg = Message.parse_untrusted(raw)
    assert (msg.method, msg.msg_class) == (Method.DATA, Class.INDICATION)
    assert msg.get(AttrType.XOR_PEER_ADDRESS) == MEDIA and msg.get(AttrType.DATA) == b"pong"
    assert relayed in core.flows


def test_a_check_for_an_unknown_ufrag_through_turn_is_dropped_like_a_direct_one() -> None:
    core, _, _, _ = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    _ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    _ask(core, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, MEDIA),))
    forged = binding_request(bytes(12), username="notaufrag0000000:x", password="pw")
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, MEDIA), (AttrType.DATA, forged)),
                     auth=False, cls=Class.INDICATION)
    assert core.handle_datagram(NOW, CLIENT, send, PUBLIC) is None
    assert sum(n for r, n in core.counters.drops.items() if r.startswith("ufrag-")) == 1
    assert len(core.flows) == 0


def test_peers_beyond_our_media_address_go_out_of_the_relayed_socket() -> None:
    core, _, ports, _ = _setup(peers=(ipaddress.ip_network("10.0.0.0/8"),))
    c = Client(addr=CLIENT, local=PUBLIC)
    relayed = relayed_of(_ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    _ask(core, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, ("10.1.2.3", 9)),))
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, ("10.1.2.3", 9)),
                                   (AttrType.DATA, b"hello")), auth=False, cls=Class.INDICATION)
    assert core.handle_datagram(NOW, CLIENT, send, PUBLIC) is None
    assert ports.sent == [(relayed, ("10.1.2.3", 9), b"hello")]


def test_our_ip_on_another_port_is_not_relayed_to() -> None:
    """The permission for our own IP opens only our media port: a Send to 203.0.113.1:22
    (or a local service) is dropped in the core, never sent."""
    core, _, ports, _ = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    _ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    _ask(core, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, MEDIA),))
    send = c.request(Method.SEND, ((AttrType.XOR_PEER_ADDRESS, ("203.0.113.1", 22)),
                                   (AttrType.DATA, b"SSH-2.0")), auth=False, cls=Class.INDICATION)
    assert core.handle_datagram(NOW, CLIENT, send, PUBLIC) is None
    assert core.counters.drops["turn-peer-forbidden"] == 1
    assert ports.sent == [] and not core.flows


def test_the_end_of_an_allocation_ends_its_flow_and_releases_its_socket() -> None:
    core, gate, ports, _ = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    relayed = relayed_of(_ask(core, c, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    _ask(core, c, Method.CHANNEL_BIND, ((AttrType.CHANNEL_NUMBER, 0x4000),
                                        (AttrType.XOR_PEER_ADDRESS, MEDIA)))
    res = core.handle_datagram(NOW, CLIENT, encode_channel_data(0x4000, _check()), PUBLIC)
    assert isinstance(res, Relayed) and relayed in core.flows
    _ask(core, c, Method.REFRESH, ((AttrType.LIFETIME, 0),))
    assert relayed not in core.flows and ports.closed == [relayed]
    # A second allocation expires on the clock instead.
    c2 = Client(addr=("198.51.100.8", 1), local=PUBLIC)
    r2 = relayed_of(_ask(core, c2, Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)))
    assert gate.next_deadline() == NOW + 600
    gate.sweep(NOW + 600)
    assert ports.closed == [relayed, r2] and not gate.server.allocations


def test_turn_datagrams_from_a_client_with_an_ice_flow_still_reach_turn() -> None:
    """Browsers share one socket between the host candidate and the TURN allocation: an
    address with a direct ICE flow sends ChannelData and TURN requests too."""
    core, _, _, _ = _setup()
    c = Client(addr=CLIENT, local=PUBLIC)
    direct = core.handle_datagram(NOW, CLIENT, _check(), PUBLIC)
    assert isinstance(direct, Flow) and direct.upstream is None
    msg = c.learn(core.handle_datagram(  # type: ignore[arg-type]
        NOW, CLIENT, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)), PUBLIC))
    assert msg.error_code is not None and msg.error_code[0] == 401


def test_without_turn_turn_datagrams_are_junk_as_before() -> None:
    core = RelayCore(CoreConfig(secrets=(ROUTING_SECRET,), transceivers={0: T0}))
    c = Client(addr=CLIENT, local=PUBLIC)
    assert core.handle_datagram(NOW, CLIENT, encode_channel_data(0x4000, b"x"), PUBLIC) is None
    assert core.handle_datagram(NOW, CLIENT, c.request(Method.ALLOCATE), PUBLIC) is None
    assert core.counters.drops == {"no-flow": 1, "stun-malformed": 1}
    assert core.no_flow_first[0x40] == 1  # without TURN: dropped unread in the drain
    with_turn, _, _, _ = _setup()
    assert with_turn.no_flow_first[0x40] == 0 and with_turn.no_flow_first[0x80] == 1


def test_turn_stun_from_strangers_spends_the_unknown_stun_budget() -> None:
    core = RelayCore(CoreConfig(secrets=(ROUTING_SECRET,), transceivers={0: T0},
                                unknown_stun_rate=1.0, unknown_stun_burst=2.0))
    core.sinks[(Transport.UDP, PUBLIC)] = UdpSink(PUBLIC, lambda b, p: (0, 0, 0))
    TurnGate(core, TurnSettings(secrets=(SECRET,)), own_media_map([MEDIA], [PUBLIC]),
             Ports(), unix_offset=UNIX - NOW)
    c = Client(addr=CLIENT, local=PUBLIC)
    req = c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),))
    answers = [core.handle_datagram(NOW, (f"198.51.100.{i}", 1), req, PUBLIC) for i in range(5)]
    assert sum(isinstance(a, bytes) for a in answers) == 2
    assert core.counters.drops["stun-overload"] == 3

