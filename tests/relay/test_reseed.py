"""Flow vouching, relay side (appliance.relay.reseed, issue 20), without sockets: a
client's media makes the relay *ask*; only an authentic answer from the transceiver's
configured address, to a pending question, installs a flow."""

from __future__ import annotations

from relay.support import DTLS, RTP, SECRET, check, ufrag

from appliance.proto.proxy.vouch import Kind, Vouch, derive_key, encode, parse_untrusted
from appliance.relay.core import TURN_HOP, CoreConfig, Flow, RelayCore, Route
from appliance.relay.reseed import FlowVouching

PUBLIC = ("198.51.100.1", 3478)
T = {0: ("127.0.0.1", 4000), 1: ("127.0.0.1", 4001)}
CLIENT = ("203.0.113.9", 40000)
KEY = derive_key(SECRET)


def setup(**kw: object) -> tuple[RelayCore, FlowVouching]:
    core = RelayCore(CoreConfig(secrets=(SECRET,), transceivers=T, vouch=True, **kw))  # type: ignore[arg-type]
    return core, FlowVouching(core, [SECRET])


def ask(core: RelayCore, v: FlowVouching, now: float = 0.0) -> list[tuple[Vouch, tuple[str, int]]]:
    assert core.handle_datagram(now, CLIENT, RTP, PUBLIC) is None
    out = v.queries(now, core.poll_lookups(now))
    return [(parse_untrusted(d, [KEY]), addr) for d, addr in out]


def answer(q: Vouch, ident: int = 1, **kw: object) -> bytes:
    fields = {"kind": Kind.VOUCH, "client": q.client, "public": q.public, "transceiver": ident,
              "nonce": q.nonce, **kw}
    return encode(Vouch(**fields), KEY)  # type: ignore[arg-type]


def test_media_from_an_unknown_client_asks_every_transceiver_once() -> None:
    core, v = setup()
    assert core.no_flow_first == bytes(256)  # nothing is dropped unasked
    sent = ask(core, v)
    assert sorted(addr for _, addr in sent) == sorted(T.values())
    assert {m.kind for m, _ in sent} == {Kind.QUERY}
    assert {(m.client, m.public) for m, _ in sent} == {(CLIENT, PUBLIC)}
    assert {m.transceiver for m, addr in sent} == {0, 1}
    assert len({m.nonce for m, _ in sent}) == 1
    # More media meanwhile is not asked about again (the core's negative cache).
    assert core.handle_datagram(0.01, CLIENT, DTLS, PUBLIC) is None
    assert core.poll_lookups(0.01) == []
    assert core.counters.drops == {"vouch-pending": 2}
    assert core.counters.vouch_queries == 2


def test_an_authentic_answer_installs_the_flow() -> None:
    core, v = setup()
    q, _ = ask(core, v)[0]
    flow = v.handle_datagram(0.01, answer(q), T[1])
    assert isinstance(flow, Flow) and flow.route == Route("t", 1) and flow.dest == T[1]
    assert flow.answered and core.counters.flows_vouched == 1
    assert core.handle_datagram(0.02, CLIENT, RTP, PUBLIC) is flow  # media flows now
    # The same answer again (a replay) is refused: the question was answered.
    assert v.handle_datagram(0.03, answer(q), T[1]) is None
    assert core.counters.drops["vouch-unexpected"] == 1


def test_forged_misdirected_late_and_unasked_answers_are_refused() -> None:
    core, v = setup()
    q, _ = ask(core, v)[0]
    forged = bytearray(answer(q))
    forged[-1] ^= 1
    assert v.handle_datagram(0.01, bytes(forged), T[1]) is None
    assert v.handle_datagram(0.01, answer(q), ("127.0.0.1", 9999)) is None  # not T[1]'s address
    assert v.handle_datagram(0.01, answer(q, ident=0), T[1]) is None  # T0 speaking from T1's
    assert v.handle_datagram(0.01, answer(q, kind=Kind.QUERY), T[1]) is None
    assert v.handle_datagram(0.01, answer(q, nonce=b"guessed!"), T[1]) is None
    assert v.handle_datagram(0.01, answer(q, client=("203.0.113.9", 1)), T[1]) is None
    assert v.handle_datagram(0.01, answer(q, public=("198.51.100.1", 1)), T[1]) is None
    assert v.handle_datagram(1.0, answer(q), T[1]) is None  # past the query's TTL
    assert not core.flows
    drops = core.counters.drops
    assert drops["vouch-mac"] == 1 and drops["vouch-source"] == 3
    assert drops["vouch-unexpected"] == 4


def test_a_client_cannot_create_a_flow_with_a_vouch_of_its_own() -> None:
    """The public drain never hands datagrams to the vouch handler; through the core, a
    vouch-shaped datagram from a client is just unknown media (asked about, no flow)."""
    core, v = setup()
    q = Vouch(Kind.VOUCH, CLIENT, PUBLIC, 1, b"12345678")
    assert core.handle_datagram(0.0, CLIENT, encode(q, KEY), PUBLIC) is None
    assert not core.flows


def test_an_upstream_relays_datagram_is_not_vouched_for() -> None:
    """Any host on the internal network may pose as an upstream relay: a transceiver's
    answer must not point a client's return traffic at it."""
    core, v = setup()
    assert core.handle_datagram(0.0, CLIENT, RTP, PUBLIC, ("10.0.0.9", 3479)) is None
    assert core.poll_lookups(0.0) == []
    assert core.counters.drops == {"no-flow": 1}


def test_the_query_budget_bounds_a_flood() -> None:
    core, _ = setup(new_flow_rate=1e6, new_flow_burst=1e6)
    v = FlowVouching(core, [SECRET], query_rate=10.0, query_burst=5.0)
    for i in range(50):
        core.handle_datagram(0.0, ("203.0.113.9", 1000 + i), RTP, PUBLIC)
    sent = v.queries(0.0, core.poll_lookups(0.0))
    assert len(sent) == 5 * len(T)
    assert core.counters.drops["vouch-budget"] == 45


def test_a_stun_check_still_makes_its_own_flow() -> None:
    core, v = setup()
    flow = core.handle_datagram(0.0, CLIENT, check(ufrag(transceiver=0)), PUBLIC)
    assert isinstance(flow, Flow) and core.poll_lookups(0.0) == []


# -- issue 32: the first packet of a moved flow ---------------------------------------------


def test_media_from_a_recreated_turn_allocation_is_vouched_for() -> None:
    """Issue 40 item 2: after a worker kill the successor re-creates a TURN allocation from
    the cache (turn_store.py), but not the flow of its relayed address to the transceiver;
    the client's next media through the allocation (hop TURN_HOP, source the relayed
    address: the relay's own IP, so no per-source bucket) makes the worker ask, is held, and
    goes out once the transceiver vouches — before, it was dropped (no-flow) until the
    client's next consent check."""
    core, v = setup(new_flow_rate=1.0, new_flow_burst=1.0)
    relayed = ("198.51.100.1", 50000)
    for n in range(3):  # three allocations' relayed addresses: one IP, never rate-limited
        assert core.handle_datagram(0.0, (relayed[0], relayed[1] + n), RTP, PUBLIC,
                                    TURN_HOP) is None
    wanted = core.poll_lookups(0.0)
    assert [(c, u) for c, _, u in wanted] == [((relayed[0], relayed[1] + n), TURN_HOP)
                                              for n in range(3)]
    q = parse_untrusted(v.queries(0.0, wanted)[0][0], [KEY])
    flow = v.handle_datagram(0.01, answer(q, ident=0), T[0])
    assert isinstance(flow, Flow) and flow.upstream is TURN_HOP
    assert core.poll_released() == [(flow, bytes(RTP))]
    assert "rate-limited" not in core.counters.drops


def test_first_packets_of_a_moved_flow_are_forwarded_once_vouched() -> None:
    """Bug (issue 32, relay failover): the datagram that made a worker ask about a client
    it had no flow for was dropped, and so was everything until the answer came — every
    flow a worker restart moved lost its first packet(s), one 20 ms frame per call and
    event at best. Now they are held and go out, in order and framed like any forwarded
    datagram, the moment an authentic answer installs the flow."""
    core, v = setup()
    q, _ = ask(core, v)[0]  # RTP #1 asked
    assert core.handle_datagram(0.005, CLIENT, DTLS, PUBLIC) is None  # #2 while waiting
    assert core.poll_released() == []  # nothing goes anywhere before the answer
    flow = v.handle_datagram(0.01, answer(q), T[1])
    assert isinstance(flow, Flow)
    released = core.poll_released()
    assert [(f, d) for f, d in released] == [(flow, bytes(RTP)), (flow, bytes(DTLS))]
    assert core.counters.packets_held == 2 and core.counters.held_released == 2
    assert core.poll_released() == []  # each is released once


def test_held_datagrams_are_bounded_and_expire_unanswered() -> None:
    """Holding is no way to make the relay store or forward anything: a few datagrams per
    client, for ``held_ttl``, and only an authentic answer releases them."""
    core, v = setup(max_held_per_client=2, held_ttl=0.2)
    q, _ = ask(core, v)[0]
    for i in range(5):
        core.handle_datagram(0.001 * (i + 1), CLIENT, RTP, PUBLIC)
    assert core.counters.packets_held == 2  # the first and one more
    forged = bytearray(answer(q))
    forged[-1] ^= 1
    assert v.handle_datagram(0.01, bytes(forged), T[1]) is None
    assert core.poll_released() == []
    core.sweep(0.3)  # past held_ttl: the hold is gone
    flow = v.handle_datagram(0.3, answer(q), T[1])  # a late answer (within QUERY_TTL)
    assert isinstance(flow, Flow)  # installs the flow, but releases nothing stale
    assert core.poll_released() == [] and core.counters.held_released == 0


def test_a_stun_check_that_makes_the_flow_discards_the_hold() -> None:
    core, v = setup()
    ask(core, v)
    res = core.handle_datagram(0.01, CLIENT, check(ufrag(transceiver=1)), PUBLIC)
    assert isinstance(res, Flow)
    assert core.poll_released() == []
    assert core.counters.held_released == 0


def test_an_adopted_tcp_clients_flow_is_vouched_for_as_a_tcp_flow() -> None:
    """Issue 40 item 2: an ICE-TCP connection adopted from the keeper after a worker kill
    has no flow in the successor; its first frame makes the worker ask. The question names
    the client as a TCP one (STREAM family, parsed back as a StreamAddr, so the transceiver
    finds its TCP flow, not a UDP one of the same ip:port), and the flow the answer installs
    is a TCP flow: STREAM header, its returns framed onto the connection (the TCP sink)."""
    from appliance.proto.proxy import STREAM, StreamAddr, parse_transport_untrusted
    from appliance.relay.core import Transport

    core, v = setup()
    tcp = StreamAddr(CLIENT)
    assert core.handle_datagram(0.0, tcp, RTP, PUBLIC, transport=Transport.TCP) is None
    out = v.queries(0.0, core.poll_lookups(0.0))
    q = parse_untrusted(out[0][0], [KEY])
    assert type(q.client) is StreamAddr and q.client == tcp
    flow = v.handle_datagram(0.01, answer(q), T[1])
    assert isinstance(flow, Flow) and flow.client == tcp and flow.transport is Transport.TCP
    assert parse_transport_untrusted(flow.header)[3] == STREAM
    (released,) = core.poll_released()
    assert released == (flow, bytes(RTP))
    assert core.flows.get(CLIENT) is None  # the UDP client of the same ip:port is another
