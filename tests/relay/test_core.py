"""RelayCore without sockets: time is an argument, datagrams are bytes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from relay.support import DTLS, RTP, SECRET, check, stun_request, ufrag

from appliance.proto.proxy import parse_untrusted, tlvs_untrusted
from appliance.relay.core import Address, CoreConfig, Flow, RelayCore, Route, TokenBuckets

PUBLIC = ("198.51.100.1", 3478)
T = {0: ("127.0.0.1", 4000), 1: ("127.0.0.1", 4001)}


def core(**kw: object) -> RelayCore:
    cfg: dict[str, object] = {"secrets": (SECRET,), "transceivers": T}
    cfg.update(kw)
    return RelayCore(CoreConfig(**cfg))  # type: ignore[arg-type]


def client(i: int) -> tuple[str, int]:
    return (f"203.0.113.{i % 250}", 10000 + i)


def test_first_packet_creates_a_flow_with_a_prebuilt_header() -> None:
    r = core(relay_id="r1")
    flow = r.handle_datagram(0.0, client(1), check(ufrag(transceiver=1)), PUBLIC)
    assert isinstance(flow, Flow)
    assert flow.dest == T[1] and flow.route == Route("t", 1)
    src, dst, off = parse_untrusted(flow.header)
    assert (src, dst, off) == (client(1), PUBLIC, len(flow.header))
    assert tlvs_untrusted(flow.header) == [(0xE0, b"r1")]
    assert r.handle_datagram(0.5, client(1), RTP, PUBLIC) is flow
    assert flow.last_seen == 0.5 and next(reversed(r.flows)) == client(1)


def test_idle_expiry_is_exact_and_keeps_busy_flows() -> None:
    r = core(flow_timeout=30.0)
    for i in range(3):
        r.handle_datagram(float(i), client(i), check(ufrag()), PUBLIC)
    r.handle_datagram(20.0, client(0), RTP, PUBLIC)
    r.sweep(30.9)
    assert set(r.flows) == {client(0), client(1), client(2)}
    r.sweep(31.0)  # client 1 was last seen at 1.0
    assert set(r.flows) == {client(0), client(2)}
    r.sweep(49.9)
    assert set(r.flows) == {client(0)}
    assert r.next_deadline() == 50.0
    r.sweep(50.0)
    assert not r.flows and r.next_deadline() is None
    assert r.counters.flows_expired == 3


def test_cap_evicts_least_recently_used() -> None:
    r = core(max_flows=2)
    r.handle_datagram(0.0, client(0), check(ufrag()), PUBLIC)
    r.handle_datagram(1.0, client(1), check(ufrag()), PUBLIC)
    r.handle_datagram(2.0, client(0), DTLS, PUBLIC)
    r.handle_datagram(3.0, client(2), check(ufrag()), PUBLIC)
    assert set(r.flows) == {client(0), client(2)}
    assert r.counters.flows_evicted == 1


def test_token_bucket_refills_at_rate() -> None:
    b = TokenBuckets(rate=2.0, burst=2.0, cap=10)
    assert b.allow("a", 0.0) and b.allow("a", 0.0)
    assert not b.allow("a", 0.0)
    assert not b.allow("a", 0.25)  # half a token
    assert b.allow("a", 0.5)
    assert b.allow("b", 0.5)
    b.sweep(1.4)
    assert len(b) == 2
    b.sweep(10.0)
    assert len(b) == 0


def test_reroute_and_same_transceiver_restart() -> None:
    r = core()
    flow = r.handle_datagram(0.0, client(0), check(ufrag(transceiver=0)), PUBLIC)
    assert isinstance(flow, Flow)
    again = r.handle_datagram(1.0, client(0), check(ufrag(transceiver=0)), PUBLIC)
    assert again is flow and r.counters.reroutes == 0  # new session, same transceiver
    r.handle_datagram(2.0, client(0), check(ufrag(transceiver=1)), PUBLIC)
    assert flow.dest == T[1] and r.counters.reroutes == 1


def test_redis_writes_and_lookups() -> None:
    r = core(redis=True, negative_ttl=1.0)
    r.handle_datagram(0.0, client(0), check(ufrag(transceiver=1)), PUBLIC)
    assert r.poll_writes(0.0) == [(client(0), "t1")]
    assert r.poll_writes(0.1) == []
    # A non-STUN datagram of an unknown flow asks Redis once, not at packet rate.
    assert r.handle_datagram(0.2, client(5), RTP, PUBLIC) is None
    assert r.handle_datagram(0.2, client(5), RTP, PUBLIC) is None
    assert r.lookups_pending
    assert r.poll_lookups(0.2) == [(client(5), PUBLIC, None)]
    assert r.handle_datagram(0.3, client(5), RTP, PUBLIC) is None
    assert r.poll_lookups(0.3) == []
    flow = r.handle_lookup(0.4, client(5), PUBLIC, None, "t0")
    assert flow is not None and flow.dest == T[0] and flow.ufrag == b""
    assert r.handle_datagram(0.5, client(5), RTP, PUBLIC) is flow
    # A recovered flow is written back at once (full TTL; the next restart finds it).
    assert r.poll_writes(0.5) == [(client(5), "t0")]
    # Redis cannot add a route this relay does not have.
    assert r.handle_lookup(0.5, client(6), PUBLIC, None, "t9") is None
    assert r.handle_lookup(0.5, client(7), PUBLIC, None, "garbage") is None
    assert r.handle_lookup(0.5, client(8), PUBLIC, None, None) is None
    assert r.counters.drops["redis-bad-route"] == 2
    assert r.counters.drops["redis-miss"] == 1
    assert r.counters.flows_recovered == 1
    # Live flows get their TTL refreshed; idle ones do not.
    r.sweep(20.0)
    assert r.poll_writes(20.0) == []
    r.handle_datagram(25.0, client(5), RTP, PUBLIC)
    r.sweep(25.0)
    assert r.poll_writes(25.0) == [(client(5), "t0")]


def test_recovered_flow_hopping_between_workers_keeps_its_redis_entry() -> None:
    """Rolling restart: a flow recovered by one worker moves on (its worker restarts)
    before that worker's periodic TTL refresh; each recovery must write the entry back, or
    the entry only lives as long as the first worker's last write (docs/reliability.md)."""
    store: dict[Address, tuple[str, float]] = {}  # a Redis with TTLs
    ttl = 30.0

    def write(r: RelayCore, now: float) -> None:
        for c, v in r.poll_writes(now):
            store[c] = (v, now + ttl)

    def get(c: Address, now: float) -> str | None:
        v = store.get(c)
        return v[0] if v is not None and v[1] > now else None

    a = core(redis=True)
    a.handle_datagram(0.0, client(0), check(ufrag(transceiver=1)), PUBLIC)
    write(a, 0.0)
    now = 0.0
    for _ in range(6):  # six restarts, 8 s apart (< flow_timeout / 3): no periodic refresh
        now += 8.0
        b = core(redis=True)  # the worker the client hashes to now
        assert b.handle_datagram(now, client(0), RTP, PUBLIC) is None
        [(c, pub, up)] = b.poll_lookups(now)
        flow = b.handle_lookup(now, c, pub, up, get(c, now))
        assert flow is not None and str(flow.route) == "t1", now
        write(b, now)
        b.sweep(now + 1.0)


def test_redis_miss_is_retried_after_negative_ttl_without_a_sweep() -> None:
    r = core(redis=True, negative_ttl=1.0)
    assert r.handle_datagram(0.0, client(5), RTP, PUBLIC) is None
    assert r.poll_lookups(0.0) == [(client(5), PUBLIC, None)]
    assert r.handle_lookup(0.0, client(5), PUBLIC, None, None) is None  # a miss
    r.handle_datagram(0.5, client(5), RTP, PUBLIC)
    assert r.poll_lookups(0.5) == []  # negatively cached
    r.handle_datagram(1.0, client(5), RTP, PUBLIC)
    assert r.poll_lookups(1.0) == [(client(5), PUBLIC, None)]  # asked again, no sweep ran


def test_route_text_round_trip() -> None:
    for route in (Route("t", 0), Route("c", 65535)):
        assert Route.parse(str(route)) == route
    for bad in ("", "t", "x1", "t-1", "t1a"):
        assert Route.parse(bad) is None


# -- bounded memory under arbitrary input --------------------------------------------------

_ufrags = [ufrag(transceiver=k) for k in range(3)] + [ufrag(cluster=4)]
_payloads = st.one_of(
    st.sampled_from([check(u) for u in _ufrags]),
    st.sampled_from([RTP, DTLS, stun_request(), b"", b"\x00\x01"]),
    st.binary(max_size=64),
)
_events = st.lists(
    st.tuples(
        st.integers(0, 5000),  # client index: far more clients than the caps
        st.integers(0, 40),  # source IP index (several clients share an IP)
        st.floats(0.0, 5.0),  # time advance
        _payloads,
        st.booleans(),  # upstream or direct
        st.booleans(),  # run a sweep / a redis poll afterwards
    ),
    max_size=300,
)


@given(_events)
def test_state_stays_bounded(events: list[tuple[int, int, float, bytes, bool, bool]]) -> None:
    r = core(max_flows=16, max_sources=8, new_flow_rate=5.0, new_flow_burst=3.0,
             redis=True, max_pending_lookups=4, flow_timeout=3.0)
    now = 0.0
    for port, ip, dt, payload, via_upstream, tick in events:
        now += dt
        src = (f"10.0.0.{ip}", 1024 + port)
        upstream = ("127.0.0.1", 7000) if via_upstream else None
        out = r.handle_datagram(now, src, payload, PUBLIC, upstream)
        if isinstance(out, bytes):
            assert len(out) <= len(payload) + 32  # never amplifies
        if tick:
            r.sweep(now)
            for c, pub, up in r.poll_lookups(now):
                r.handle_lookup(now, c, pub, up, "t1" if port % 2 else None)
            r.poll_writes(now)
        assert len(r.flows) <= 16
        assert len(r.buckets) <= 8
        assert len(r._lookups) <= 4
        assert len(r._asked) <= 16
        assert len(r._dirty) <= 16
        assert all(f.dest in T.values() for f in r.flows.values())
