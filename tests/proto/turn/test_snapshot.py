"""An allocation exported to the flow cache and imported by the worker that takes over
(issue 40 item 2: a TURN call survives a relay-worker kill), without sockets, on a fake
clock: the imported allocation relays the client's next ChannelData with no new Allocate;
a corrupt, expired, forbidden or colliding record is dropped and counted, never raised."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from proto.turn.turn_client import (
    NOW,
    OWN,
    SECRET,
    UNIX,
    Client,
    allocate,
    drain,
    exchange,
    peer_data,
    relayed_of,
    server,
    transmits,
)

from appliance.proto.stun import AttrType, Method
from appliance.proto.turn import (
    TurnError,
    encode_channel_data,
    parse_record_untrusted,
)
from appliance.proto.turn.server import AllocationMissing, TurnServer


def _bound() -> tuple[TurnServer, Client, tuple[str, int], bytes]:
    """A server with one allocation that has channel 0x4001 to our own media address;
    returns the record its change queue holds last."""
    srv, _ = server()
    c = Client()
    relayed = relayed_of(allocate(srv, c))  # type: ignore[arg-type]
    bind = exchange(srv, c, Method.CHANNEL_BIND,
                    ((AttrType.CHANNEL_NUMBER, 0x4001), (AttrType.XOR_PEER_ADDRESS, OWN)))
    assert bind is not None and bind.error_code is None
    drain(srv)
    changes = srv.poll_changes()
    assert [r for r, _, _ in changes] == [relayed]
    record = changes[0][1]
    assert record is not None
    return srv, c, relayed, record


def test_a_record_carries_no_secret_and_uses_unix_time() -> None:
    srv, c, relayed, record = _bound()
    assert SECRET not in record and c.password.encode() not in record
    obj = json.loads(record)
    assert obj["u"] == c.username and obj["r"] == list(relayed)
    assert obj["e"] == UNIX + 600  # the default lifetime, in Unix time
    assert obj["ch"] == [[0x4001, OWN[0], OWN[1], UNIX + 600]]
    assert srv.poll_changes() == []  # drained


def test_the_next_channel_data_is_relayed_by_a_new_server_without_allocate() -> None:
    """The scenario of the issue: the worker holding the allocation is killed; its
    successor (another process: another monotonic clock, so another unix_offset) imports
    the record and relays the client's next ChannelData, and answers its next Refresh."""
    _, c, relayed, record = _bound()
    srv2, ports2 = server()
    later = 5_000.0  # the new process's clock: same Unix instant + 30 s
    srv2.unix_offset = UNIX + 30 - later
    assert srv2.import_allocation(later, record)
    assert ports2.bound == [(1, relayed)]  # the relayed address was claimed back, exactly
    drain(srv2)
    srv2.handle_input(later, encode_channel_data(0x4001, b"media"), c.addr, c.local)
    (pd,) = peer_data(drain(srv2))
    assert pd.relayed == relayed and pd.peer == OWN and bytes(pd.data) == b"media"
    # The return path uses the channel too, and expiry was carried over (600 - 30 s left).
    fast = srv2.channel_header(later, relayed, OWN, 6)
    assert fast is not None and fast[1] == encode_channel_data(0x4001, b"answer")[:4]
    assert srv2.poll_timeout() == later + 570
    # The client's next Refresh is authenticated afresh (key from the REST secret).
    msg = exchange(srv2, c, Method.REFRESH, ((AttrType.LIFETIME, 600),), now=later)
    assert msg is not None and msg.error_code is None
    assert srv2.counters.counts["turn_allocations_imported"] == 1
    assert [r for r, rec, _ in srv2.poll_changes() if rec is not None] == [relayed]


def test_changes_follow_refresh_permission_and_expiry() -> None:
    srv, c, relayed, _ = _bound()
    exchange(srv, c, Method.CREATE_PERMISSION, ((AttrType.XOR_PEER_ADDRESS, OWN),))
    assert [r for r, rec, _ in srv.poll_changes() if rec] == [relayed]
    exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 1200),))
    (change,) = srv.poll_changes()
    assert change[1] is not None and json.loads(change[1])["e"] == UNIX + 1200
    srv.handle_timeout(NOW + 1200)
    assert srv.poll_changes() == [(relayed, None, 0.0)]  # ended: the shell deletes it


def test_bad_records_are_dropped_and_counted() -> None:
    _, _, relayed, record = _bound()
    obj = json.loads(record)
    cases = {
        b"not json": "turn-import-corrupt",
        json.dumps({**obj, "v": 2}).encode(): "turn-import-corrupt",
        json.dumps({**obj, "r": ["192.0.2.1", 70000]}).encode(): "turn-import-corrupt",
        json.dumps({**obj, "f": 2}).encode(): "turn-import-corrupt",
        json.dumps({**obj, "e": UNIX - 1}).encode(): "turn-import-expired",
        json.dumps({**obj, "e": UNIX + 10**6}).encode(): "turn-import-corrupt",
        json.dumps({**obj, "p": {"203.0.113.9": UNIX + 100}}).encode(): "turn-import-forbidden",
        json.dumps({**obj, "ch": [[0x4001, "192.0.2.1", 9, UNIX + 9]]}).encode():
            "turn-import-forbidden",
    }
    for data, reason in cases.items():
        srv2, _ = server()
        assert not srv2.import_allocation(NOW, data)
        assert srv2.counters.drops == {reason: 1}, data
        assert srv2.allocations == {}
    # Twice: the second collides; and a relayed port someone else holds now.
    srv2, ports2 = server()
    assert srv2.import_allocation(NOW, record)
    assert not srv2.import_allocation(NOW, record)
    assert srv2.counters.drops == {"turn-import-exists": 1}
    srv3, ports3 = server()
    ports3.full = True
    assert not srv3.import_allocation(NOW, record)
    assert srv3.counters.drops == {"turn-import-port-taken": 1}


def test_stream_allocations_are_never_cached() -> None:
    srv, _ = server()
    c = Client()
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),),
                                    auth=False), c.addr, c.local, stream=True)
    c.learn(transmits(drain(srv))[0].data)
    srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),)),
                     c.addr, c.local, stream=True)
    drain(srv)
    assert len(srv.allocations) == 1 and srv.poll_changes() == []
    assert srv.poll_kept_changes() == []  # not kept: nobody holds its connection


class _Tcp(tuple[str, int]):
    """A client address of another type than the record's plain tuple (the shell's
    StreamAddr): the imported allocation must be keyed by the object the shell gives."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is _Tcp and tuple.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("tcp", *self))


def _stream_allocation() -> tuple[TurnServer, Client, _Tcp]:
    srv, _ = server()
    c = Client()
    tcp = _Tcp(c.addr)
    for auth in (False, True):
        srv.handle_input(NOW, c.request(Method.ALLOCATE, ((AttrType.REQUESTED_TRANSPORT, 17),),
                                        auth=auth), tcp, c.local, stream=True)
        c.learn(transmits(drain(srv))[0].data)
    return srv, c, tcp


def test_a_kept_tcp_allocation_follows_its_connection_to_a_new_server() -> None:
    """Issue 40 item 2, TURN/TCP: the connection is handed to the keeper with its
    allocation's record (keep), changes follow (poll_kept_changes), and the worker that
    adopts the connection after a kill re-creates the allocation under the connection's
    client object, kept, padded on the stream; a TCP record without a connection, or a UDP
    record with one, is refused."""
    srv, c, tcp = _stream_allocation()
    record = srv.keep(tcp, c.local)
    assert record is not None and json.loads(record)["s"] == 1
    assert srv.keep(c.addr, c.local) is None  # the plain tuple is another (UDP) client
    srv.handle_input(NOW, c.request(Method.CHANNEL_BIND, (
        (AttrType.CHANNEL_NUMBER, 0x4001), (AttrType.XOR_PEER_ADDRESS, OWN))), tcp, c.local,
        stream=True)
    (answer,) = transmits(drain(srv))
    assert answer.dest is tcp and c.learn(answer.data).error_code is None
    ((who, local, changed),) = srv.poll_kept_changes()
    assert who == tcp and local == c.local and changed is not None
    assert srv.poll_changes() == []  # never through the cache
    srv2, ports2 = server()
    assert not srv2.import_allocation(NOW, changed)  # no connection: refused
    assert srv2.counters.drops == {"turn-import-stream": 1} and not ports2.bound
    srv3, _ = server()
    assert srv3.import_allocation(NOW + 1, changed, client=tcp)
    (alloc,) = srv3.allocations.values()
    assert alloc.client is tcp and alloc.stream and alloc.kept
    drain(srv3)
    srv3.from_peer(NOW + 1, alloc.relayed, OWN, b"abcde")
    (tx,) = transmits(drain(srv3))
    assert tx.dest is tcp and tx.data == encode_channel_data(0x4001, b"abcde", pad=True)
    srv3.close(NOW + 2, tcp, c.local)  # the connection ended: so does the record
    drain(srv3)
    assert srv3.poll_kept_changes() == [(tcp, c.local, None)]
    _, _, _, udp_record = _bound()
    srv4, _ = server()
    assert not srv4.import_allocation(NOW, udp_record, client=tcp)
    assert srv4.counters.drops == {"turn-import-stream": 1}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=5),
    max_leaves=20)


@given(st.one_of(st.binary(max_size=400), _json.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.sampled_from(["v", "c", "l", "r", "f", "u", "t", "e", "p",
                                                  "ch"]), _json)
                 .map(lambda d: json.dumps({"v": 1, **d}).encode())))
def test_the_record_decoder_raises_only_turn_error(data: bytes) -> None:
    for n in (len(data), *range(min(len(data), 16))):
        try:
            parse_record_untrusted(data[:n])
        except TurnError:
            pass
    srv, _ = server()
    srv.import_allocation(NOW, data)  # never raises
    assert len(srv.allocations) <= 1


@given(st.data())
def test_mutated_real_records_never_raise(data: st.DataObject) -> None:
    _, _, _, record = _bound()
    obj = json.loads(record)
    key = data.draw(st.sampled_from(sorted(obj)))
    obj[key] = data.draw(_json)
    srv, _ = server()
    srv.import_allocation(NOW, json.dumps(obj).encode())


# -- a client moved to another live worker (AllocationMissing, import moved=True) ------------


class _HeldPorts:
    """Ports of a worker whose relayed addresses are all held by another live worker:
    ``claim`` always fails, ``adopt`` records the identity (RelaySockets.adopt)."""

    def __init__(self) -> None:
        self.adopted: list[tuple[str, int]] = []

    def bind(self, family: int, client: tuple[str, int], even: bool = False) -> None:
        return None

    def claim(self, relayed: tuple[str, int]) -> bool:
        return False

    def adopt(self, relayed: tuple[str, int]) -> bool:
        self.adopted.append(relayed)
        return True


def _missing(out: list[object]) -> list[AllocationMissing]:
    return [o for o in out if isinstance(o, AllocationMissing)]


def _made_up_sources(srv: TurnServer, n: int, *, now: float = NOW, base: int = 40000) -> int:
    """ChannelData from ``n`` made-up 5-tuples; how many of them were asked about."""
    cd = encode_channel_data(0x4001, b"x")
    for port in range(n):
        srv.handle_input(now, cd, ("198.51.100.9", base + port), ("192.0.2.1", 3478))
    return len(_missing(drain(srv)))


def test_a_moved_clients_channel_data_asks_once_and_flows_after_the_import() -> None:
    """The SO_REUSEPORT reshuffle: the client's next ChannelData reaches a worker that never
    had its allocation. That worker asks once (not per datagram), drops the data while it
    waits, imports the record as moved — the relayed socket still held by the client's old
    worker, so the address is adopted — and relays the next ChannelData."""
    _, c, relayed, record = _bound()
    ports = _HeldPorts()
    srv2 = TurnServer(server()[0].config, ports, unix_offset=UNIX - NOW)
    srv2.look_up_misses = True
    cd = encode_channel_data(0x4001, b"media")
    srv2.handle_input(NOW, cd, c.addr, c.local)
    assert _missing(drain(srv2)) == [AllocationMissing(c.addr, c.local)]
    for _ in range(5):  # more media while the lookup is in flight: no second question
        srv2.handle_input(NOW + 0.01, cd, c.addr, c.local)
        assert drain(srv2) == []
    assert srv2.counters.drops["turn-lookup-pending"] == 6
    assert "turn-no-allocation" not in srv2.counters.drops
    # A restart's import (not moved) refuses a taken port; a moved one adopts it.
    assert not srv2.import_allocation(NOW + 0.02, record)
    assert srv2.counters.drops["turn-import-port-taken"] == 1
    assert srv2.import_allocation(NOW + 0.02, record, moved=True)
    srv2.looked_up(NOW + 0.02, c.addr, c.local)
    assert ports.adopted == [relayed]
    assert srv2.counters.counts["turn_allocations_adopted"] == 1
    out = drain(srv2)
    assert not peer_data(out) and not _missing(out)
    srv2.handle_input(NOW + 0.03, cd, c.addr, c.local)
    (pd,) = peer_data(drain(srv2))
    assert pd.relayed == relayed and pd.peer == OWN and bytes(pd.data) == b"media"
    # This worker keeps it now: written under its own name at the next poll.
    assert [r for r, rec, _ in srv2.poll_changes() if rec is not None] == [relayed]


def test_a_request_waits_for_the_lookup_then_gets_437_if_nothing_was_found() -> None:
    """A Refresh from a moved client is not refused with 437 while the lookup is in flight
    (437 would end the allocation in the client's eyes): it is left unanswered and the
    client retransmits. Found nowhere: 437, and no new question for ``absent_for``."""
    srv, _ = server()
    srv.look_up_misses = True
    c = Client()
    # Authenticate first (a server with no allocation still answers the 401 round).
    refresh = exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 600),))
    assert refresh is None  # unanswered: the lookup is in flight
    assert srv.counters.counts["turn_lookups"] == 1
    srv.looked_up(NOW, c.addr, c.local)
    again = exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 600),), now=NOW + 0.5)
    assert again is not None and again.error_code is not None and again.error_code[0] == 437
    assert srv.counters.counts["turn_lookups"] == 1  # absent: not asked about again
    later = exchange(srv, c, Method.REFRESH, ((AttrType.LIFETIME, 600),),
                     now=NOW + 0.5 + srv.config.absent_for)
    assert later is None and srv.counters.counts["turn_lookups"] == 2


def test_an_unanswered_lookup_is_given_up_and_lookups_are_bounded() -> None:
    """A shell that never answers costs nothing lasting: after ``lookup_wait`` the 5-tuple
    is treated as found nowhere. A flood of made-up sources holds at most ``max_lookups``
    questions in flight; the rest are dropped and counted as before."""
    srv, _ = server(max_lookups=4)
    srv.look_up_misses = True
    assert _made_up_sources(srv, 10) == 4
    assert srv.counters.drops["turn-lookup-overflow"] == 6
    assert srv.counters.drops["turn-no-allocation"] == 6
    assert _made_up_sources(srv, 1, now=NOW + srv.config.lookup_wait) == 0
    assert srv.counters.drops["turn-no-allocation"] == 7  # given up: absent now


def test_no_question_without_a_shell_that_answers_nor_for_stream_clients() -> None:
    srv, _ = server()
    c = Client()
    srv.handle_input(NOW, encode_channel_data(0x4001, b"x"), c.addr, c.local)
    assert drain(srv) == [] and srv.counters.drops["turn-no-allocation"] == 1
    srv.look_up_misses = True
    srv.handle_input(NOW, encode_channel_data(0x4001, b"x"), c.addr, c.local, stream=True)
    assert drain(srv) == [] and srv.counters.drops["turn-no-allocation"] == 2


def test_new_lookups_are_rate_limited() -> None:
    """Beyond the burst, a flood of new 5-tuples is asked about at the rate, not per datagram
    (each lookup reads every worker's records)."""
    srv, _ = server(lookup_rate=10.0, lookup_burst=3.0)
    srv.look_up_misses = True
    assert _made_up_sources(srv, 5) == 3
    assert srv.counters.drops["turn-lookup-rate"] == 2
    # a tenth of a second later: one more
    assert _made_up_sources(srv, 1, now=NOW + 0.1, base=41000) == 1
