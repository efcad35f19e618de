"""The relay's STUN budget per server ufrag (issue 9, the ICE password-guessing storm):
STUN from flows their transceiver has not answered spends a GCRA budget per verified server
ufrag; established flows never do. Time is an argument (a fake clock)."""

from __future__ import annotations

from relay.support import DTLS, RTP, SECRET, check, ufrag

from appliance.relay.core import CoreConfig, Flow, RelayCore

PUBLIC = ("198.51.100.1", 3478)
T = {0: ("127.0.0.1", 4000)}
SUCCESS = b"\x01\x01\x00\x00\x21\x12\xa4\x42" + b"\x00" * 12  # Binding success header
ERROR = b"\x01\x11\x00\x00\x21\x12\xa4\x42" + b"\x00" * 12  # Binding error (a 401)


def core(**kw: object) -> RelayCore:
    cfg: dict[str, object] = {"secrets": (SECRET,), "transceivers": T,
                              "stun_budget_rate": 10.0, "stun_budget_burst": 5.0,
                              "new_flow_rate": 1000.0, "new_flow_burst": 1000.0}
    cfg.update(kw)
    return RelayCore(CoreConfig(**cfg))  # type: ignore[arg-type]


def src(i: int) -> tuple[str, int]:
    return (f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 20000 + i % 40000)


def test_storm_from_many_addresses_gets_the_ufrag_budget_only() -> None:
    """A wrong-password storm with one session's valid ufrag from 10 000 source addresses:
    only burst + rate x t guesses reach the transceiver, whatever the number of sources,
    and no flow is made for a dropped one."""
    r = core()
    victim = ufrag()
    passed = 0
    now = 0.0
    for i in range(10_000):
        now = i * 0.0002  # 5 000 guesses/s for 2 s
        if isinstance(r.handle_datagram(now, src(i), check(victim), PUBLIC), Flow):
            passed += 1
    assert passed <= 5 + 10 * now + 1, passed
    assert passed >= 5 + 10 * now - 2, passed
    assert r.counters.drops["stun-budget"] == 10_000 - passed
    assert len(r.flows) == passed
    # Another session's checks are unaffected by the storm on this one.
    assert isinstance(r.handle_datagram(now, src(99_999), check(ufrag()), PUBLIC), Flow)


def test_budget_refills_at_its_rate() -> None:
    r = core()
    u = ufrag()
    got = [r.handle_datagram(0.0, src(i), check(u), PUBLIC) for i in range(7)]
    assert [isinstance(g, Flow) for g in got] == [True] * 5 + [False] * 2
    assert r.handle_datagram(0.05, src(10), check(u), PUBLIC) is None  # half a unit
    assert isinstance(r.handle_datagram(0.1, src(11), check(u), PUBLIC), Flow)
    assert r.handle_datagram(0.1, src(12), check(u), PUBLIC) is None


def test_unanswered_flow_is_budgeted_answered_flow_never() -> None:
    """Repeated checks from one unanswered flow spend the budget; once its transceiver
    sends a Binding success (not a 401), that flow's checks always pass, even while a
    storm keeps the ufrag over budget."""
    r = core()
    u = ufrag()
    victim = src(1)
    flow = r.handle_datagram(0.0, victim, check(u), PUBLIC)
    assert isinstance(flow, Flow) and not flow.answered
    r.note_answer(flow, ERROR)  # a 401: not established
    assert not flow.answered
    for i in range(4):
        assert r.handle_datagram(0.0, victim, check(u), PUBLIC) is flow, i
    assert r.handle_datagram(0.0, victim, check(u), PUBLIC) is None  # over budget
    r.note_answer(flow, SUCCESS)
    assert flow.answered and r.counters.flows_answered == 1
    for i in range(1000):  # the storm from elsewhere holds the ufrag over budget
        r.handle_datagram(0.001 * i, src(100 + i), check(u), PUBLIC)
        assert r.handle_datagram(0.001 * i, victim, check(u), PUBLIC) is flow
    # Media never goes through the budget.
    assert r.handle_datagram(1.0, victim, RTP, PUBLIC) is flow


def test_dtls_or_srtp_return_traffic_establishes_a_flow() -> None:
    r = core()
    flow = r.handle_datagram(0.0, src(1), check(ufrag()), PUBLIC)
    assert isinstance(flow, Flow)
    r.note_answer(flow, DTLS)
    assert flow.answered


def test_established_flow_switching_ufrag_is_budgeted_again() -> None:
    """An attacker with an established call of its own cannot guess another session's
    password from that flow without the budget: a new ufrag on a flow is not established."""
    r = core()
    own, other = ufrag(), ufrag()
    flow = r.handle_datagram(0.0, src(1), check(own), PUBLIC)
    assert isinstance(flow, Flow)
    r.note_answer(flow, SUCCESS)
    passed = sum(isinstance(r.handle_datagram(0.0, src(1), check(other), PUBLIC), Flow)
                 for _ in range(50))
    assert passed == 5 and not flow.answered and flow.ufrag == other.encode()


def test_over_budget_guess_skips_the_mac_check() -> None:
    r = core()
    u = ufrag()
    for i in range(5):
        r.handle_datagram(0.0, src(i), check(u), PUBLIC)
    real = r.codec
    calls = 0

    class Counting:
        def decode_untrusted(self, b: bytes) -> object:
            nonlocal calls
            calls += 1
            return real.decode_untrusted(b)

    r.codec = Counting()  # type: ignore[assignment]
    for i in range(100):
        assert r.handle_datagram(0.0, src(1000 + i), check(u), PUBLIC) is None
    assert calls == 0


def test_forged_ufrags_never_enter_the_table_and_it_stays_bounded() -> None:
    from appliance.proto.ufrag import UfragCodec

    forged = UfragCodec(b"not-the-secret-0123456789abcdefgh")
    r = core(max_budget_ufrags=8)
    for i in range(100):
        r.handle_datagram(0.0, src(i), check(forged.mint(cluster=0, transceiver=0)), PUBLIC)
    assert not r.stun_tat
    for i in range(100):
        r.handle_datagram(0.0, src(i), check(ufrag()), PUBLIC)
        assert len(r.stun_tat) <= 8
    r.sweep(10.0)  # every entry has refilled
    assert not r.stun_tat


def test_flow_recovered_from_redis_is_established() -> None:
    r = core(redis=True)
    u = ufrag()
    for i in range(10):  # the ufrag is over budget
        r.handle_datagram(0.0, src(100 + i), check(u), PUBLIC)
    r.handle_datagram(0.0, src(1), RTP, PUBLIC)
    (c, pub, up), = r.poll_lookups(0.0)
    flow = r.handle_lookup(0.0, c, pub, up, "t0")
    assert isinstance(flow, Flow) and flow.answered
    assert r.handle_datagram(0.0, src(1), check(u), PUBLIC) is flow  # adopts the ufrag
    assert flow.answered and flow.ufrag == u.encode()
    assert r.handle_datagram(0.0, src(1), check(u), PUBLIC) is flow


def test_dtls_handshake_records_spend_a_per_flow_budget() -> None:
    """A ClientHello flood from a flow the attacker authenticated (a session of its own):
    handshake records (content type 22) beyond the flow's budget are dropped as
    dtls-budget; other DTLS records and RTP are not budgeted, and other flows are not
    affected."""
    from appliance.relay.core import SLOW_FIRST

    assert SLOW_FIRST[22] and SLOW_FIRST[0] and not SLOW_FIRST[23] and not SLOW_FIRST[0x80]
    r = core(dtls_budget_rate=5.0, dtls_budget_burst=20.0)
    flood = r.handle_datagram(0.0, src(1), check(ufrag()), PUBLIC)
    other = r.handle_datagram(0.0, src(2), check(ufrag()), PUBLIC)
    assert isinstance(flood, Flow) and isinstance(other, Flow)
    hello = b"\x16\xfe\xfd" + b"\x00" * 40
    passed = sum(r.handle_datagram(i * 0.001, src(1), hello, PUBLIC) is flood for i in range(2000))
    assert 20 + 9 <= passed <= 20 + 10  # the burst, then 5/s over 2 s
    assert r.counters.drops["dtls-budget"] == 2000 - passed
    appdata = b"\x17\xfe\xfd" + b"\x00" * 40
    assert r.handle_datagram(2.0, src(1), appdata, PUBLIC) is flood
    assert r.handle_datagram(2.0, src(1), RTP, PUBLIC) is flood
    assert all(r.handle_datagram(2.0, src(2), hello, PUBLIC) is other for _ in range(20))


def test_stun_from_unknown_addresses_past_the_worker_rate_is_dropped_unparsed() -> None:
    """A spoofed STUN flood (random or forged ufrags, any source) costs a USERNAME parse and
    a MAC check each; past the worker-wide rate for unknown addresses it is dropped before
    either (stun-overload). Known flows' STUN and media never spend that budget, and a new
    client gets through once the flood stops."""
    from appliance.proto.ufrag import UfragCodec

    forged = UfragCodec(b"not-the-secret-0123456789abcdefgh")
    r = core(unknown_stun_rate=100.0, unknown_stun_burst=10.0)
    u = ufrag()
    live = r.handle_datagram(0.0, src(0), check(u), PUBLIC)
    assert isinstance(live, Flow)
    r.note_answer(live, SUCCESS)
    junk = check(forged.mint(cluster=0, transceiver=0))
    for i in range(1, 1001):  # 1000 spoofed first packets within 0.1 s
        assert r.handle_datagram(i * 1e-4, src(i), junk, PUBLIC) is None
        assert r.handle_datagram(i * 1e-4, src(0), check(u), PUBLIC) is live
    drops = r.counters.drops
    # the burst (one went to the live flow) + 100/s over 0.1 s
    assert 9 + 9 <= drops["ufrag-bad-mac"] <= 9 + 10
    assert drops["stun-overload"] == 1000 - drops["ufrag-bad-mac"]
    assert isinstance(r.handle_datagram(1.0, src(5000), check(ufrag()), PUBLIC), Flow)
