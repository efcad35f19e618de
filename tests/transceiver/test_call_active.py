"""The transceiver as DTLS client (issue 19 item 2; docs/adr-dtls-active.md), on the sans-IO
pair's virtual clock (call_pair.py): an ``actpass`` offer is answered ``a=setup:active``, the
ServerCall sends its ClientHello right after answering the first authenticated check, and
every flight it sends on its own is paid for by a fresh MESSAGE-INTEGRITY-valid check from
the address it goes to. Both DTLS versions, both roles, loss/reorder/duplication, and the
flood limits: a check that fails MESSAGE-INTEGRITY never makes us send a flight, a replayed
or retransmitted check buys nothing, and one fresh check buys at most one flight."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from transceiver.call_pair import CLIENT, PUBLIC, RELAY, CallPair, Netem

from appliance.client.peer import Connected as ClientConnected
from appliance.client.peer import Failed, RtpReceived
from appliance.proto.dtls import Role, State
from appliance.proto.mux import Kind, classify
from appliance.proto.sdp import Setup
from appliance.proto.stun import binding_request
from appliance.transceiver.call import CallState, Transmit
from appliance.transceiver.flight_budget import OWN_FLIGHT_BURST

CPU_BUDGET = 1.5  # CPU seconds per test (virtual time is free; 1.3 handshakes are not)
BOTH = frozenset({"1.2", "1.3"})
VICTIM = ("192.0.2.66", 40000)


@pytest.fixture(autouse=True)
def _fast() -> Iterator[None]:
    t0 = time.process_time()
    yield
    assert time.process_time() - t0 < CPU_BUDGET


def connected(pair: CallPair) -> bool:
    return (pair.server.state is CallState.CONNECTED
            and any(isinstance(e, ClientConnected) for e in pair.client_events))


def check(pair: CallPair, *, tid: bytes | None = None, password: str | None = None) -> bytes:
    """A connectivity check as the pair's client would send it (its ufrag, the server's
    password unless ``password`` says otherwise)."""
    return binding_request(
        tid or os.urandom(12), username=f"{pair.server_ufrag}:{pair.client.local_ufrag}",
        password=pair.server_pwd if password is None else password, priority=1,
        controlling=1)


def deliver(pair: CallPair, data: bytes, source: tuple[str, int] = CLIENT) -> list[bytes]:
    """Hand ``data`` to the server from ``source`` now; return the DTLS it sent to ``source``."""
    pair.server.handle_input(pair.now, data, (source, PUBLIC, RELAY))
    return _dtls_out(pair, source)


def _dtls_out(pair: CallPair, to: tuple[str, int]) -> list[bytes]:
    out = []
    while (t := pair.server.poll_output()) is not None:
        if not isinstance(t, Transmit):
            continue  # events and the timer: not what this looks at
        payload, flow = t
        if classify(payload) is Kind.DTLS:
            assert flow.client == to, "a flight went to an address nobody asked for"
            out.append(payload)
    return out


def quiet_pair(**kw: object) -> CallPair:
    """A pair whose client never speaks: the test hands the server its datagrams itself."""
    return CallPair(drop=lambda d, data: d == "c2s", **kw)  # type: ignore[arg-type]


# -- roles ------------------------------------------------------------------------------


@pytest.mark.parametrize("versions", [frozenset({"1.2"}), BOTH], ids=["1.2", "1.2+1.3"])
def test_actpass_makes_us_the_client_and_saves_a_round_trip(versions: frozenset[str]) -> None:
    """At 10 ms each way: the first check reaches us at 10 ms and our ClientHello leaves with
    its answer. DTLS 1.2: the client is connected at 40 ms (2 RTT after its check) instead
    of 60 ms when it is the DTLS client and must first see its check answered. DTLS 1.3: the
    client is connected at 40 ms either way (as 1.3 server it waits for our Finished; as
    1.3 client it is done when our flight arrives), but *we* are connected at 30 ms
    instead of 50 ms — our own audio can leave a round trip sooner."""
    pair = CallPair(versions=versions)
    assert pair.answer.setup is Setup.ACTIVE and pair.server.dtls.role is Role.CLIENT
    assert pair.client.dtls_role is Role.SERVER
    first_dtls: list[float] = []
    pair.drop = lambda d, data: (d == "s2c" and classify(data) is Kind.DTLS
                                 and not first_dtls and first_dtls.append(pair.now)) or False
    assert pair.run_until(lambda: connected(pair), within=1.0)
    assert first_dtls == [pytest.approx(0.010)]  # with the first check's answer
    setup = next(e.setup for e in pair.client_events if isinstance(e, ClientConnected))
    v13 = "1.3" in versions
    assert setup == pytest.approx(0.040, abs=0.002)
    assert pair.server.timeline["dtls_done"] == pytest.approx(30.0 if v13 else 50.0, abs=2)
    assert pair.server.dtls.version == ("1.3" if v13 else "1.2")
    assert pair.server.flight_budget is not None and pair.server.flight_budget.sent == 1

    passive = CallPair(versions=versions, offer_setup="active")
    assert passive.answer.setup is Setup.PASSIVE and passive.server.dtls.role is Role.SERVER
    assert passive.server.flight_budget is None
    assert passive.run_until(lambda: connected(passive), within=1.0)
    setup_p = next(e.setup for e in passive.client_events if isinstance(e, ClientConnected))
    assert setup_p == pytest.approx(0.040 if v13 else 0.060, abs=0.002)
    assert passive.server.timeline["dtls_done"] == pytest.approx(50.0, abs=2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("offer_setup", ["actpass", "active"])
@pytest.mark.parametrize("versions", [frozenset({"1.2"}), BOTH], ids=["1.2", "1.3"])
def test_both_roles_both_versions_on_a_terrible_network(
    seed: int, offer_setup: str, versions: frozenset[str]
) -> None:
    """10 % loss, 5 % duplicates, 10 % reordered by 30 ms, 10-30 ms delay: the call comes up
    in either DTLS role and version (retransmissions on our timers, paid for by checks),
    and the passthrough echo flows."""
    net = Netem(delay=0.010, jitter=0.020, loss=0.10, duplicate=0.05, reorder=0.10)
    pair = CallPair(seed=seed, net=net, versions=versions, offer_setup=offer_setup)
    assert pair.server.dtls.role is (Role.CLIENT if offer_setup == "actpass" else Role.SERVER)
    assert pair.run_until(lambda: connected(pair), within=30.0), pair.server_events
    assert pair.server.dtls.version == ("1.3" if "1.3" in versions else "1.2")
    sent = [0]

    def tick(now: float) -> None:
        if pair.client.srtp is not None:
            pair.client.send_rtp(b"\xfc" + bytes(40), (960 * sent[0]) & 0xFFFFFFFF)
            sent[0] += 1

    pair.tick = tick
    pair.run_for(1.0)
    pair.tick = None
    pair.run_for(0.3)
    assert pair.server.packets_in >= 0.7 * sent[0] and pair.server.packets_out > 0


@pytest.mark.parametrize("versions", [frozenset({"1.2"}), BOTH], ids=["1.2", "1.3"])
def test_lost_client_hello_is_resent_after_the_next_check(versions: frozenset[str]) -> None:
    """Our first flight is lost. The DTLS timer fires (1 s) with no check since the flight
    was paid for, so the retransmission is held; the client's next check (every 0.4 s while
    it is the DTLS server) releases it and the call comes up."""
    lost = [0]

    def drop(direction: str, data: bytes) -> bool:
        if direction == "s2c" and classify(data) is Kind.DTLS and lost[0] == 0:
            lost[0] = 1
            return True
        return False

    pair = CallPair(drop=drop, versions=versions)
    assert pair.run_until(lambda: connected(pair), within=5.0)
    budget = pair.server.flight_budget
    assert budget is not None and budget.sent >= 2
    assert pair.server.dtls.counters.retransmissions >= 1
    assert pair.now < 2.0  # 1 s timer, then at most one 0.4 s check interval


def test_our_final_flight_lost_then_retransmitted() -> None:
    """DTLS 1.2 as client: our flight 5 (…Finished) is lost; the peer (DTLS server) waits,
    our timer resends it, paid for by a later check, and both ends connect."""
    dtls_s2c = [0]

    def drop(direction: str, data: bytes) -> bool:
        if direction == "s2c" and classify(data) is Kind.DTLS:
            dtls_s2c[0] += 1
            return dtls_s2c[0] == 2  # 1: ClientHello, 2: our final flight
        return False

    pair = CallPair(drop=drop)
    assert pair.run_until(lambda: connected(pair), within=5.0)
    assert pair.dropped["s2c"] == 1 and pair.server.dtls.counters.retransmissions >= 1


def test_peer_flight_lost_is_retransmitted() -> None:
    """The peer's (DTLS server's) first flight is lost: a retransmission brings it again
    (its own timer, RFC 6347 §4.2.4, or ours released by its next check) and both connect."""
    lost = [0]

    def drop(direction: str, data: bytes) -> bool:
        if direction == "c2s" and classify(data) is Kind.DTLS and lost[0] == 0:
            lost[0] = 1
            return True
        return False

    pair = CallPair(drop=drop)
    assert pair.run_until(lambda: connected(pair), within=5.0)
    assert pair.client.dtls is not None and lost[0] == 1
    assert (pair.server.dtls.counters.retransmissions
            + pair.client.dtls.counters.retransmissions) >= 1


# -- flood limits -----------------------------------------------------------------------


def test_only_a_message_integrity_valid_check_starts_a_flight() -> None:
    """A check with our ufrag but a wrong password (or none) gets a 401 at most, never a
    ClientHello; the first valid check starts the handshake, towards its own source."""
    pair = quiet_pair()
    assert deliver(pair, check(pair, password="x" * 24)) == []
    assert deliver(pair, check(pair, password="")) == []
    assert pair.server.dtls.state is State.CLIENT_IDLE and pair.server.flight_budget is not None
    assert pair.server.flight_budget.sent == 0 and pair.server.state is CallState.NEW
    flight = deliver(pair, check(pair))
    assert flight and all(classify(d) is Kind.DTLS for d in flight)
    assert pair.server.flight_budget.sent == 1


def test_a_spoofed_check_never_sends_a_flight_to_its_victim() -> None:
    """The attacker holds no password: its checks "from" a victim fail MESSAGE-INTEGRITY and
    nothing DTLS reaches the victim, before or after the real client's valid check. A
    valid check captured and replayed "from" the victim (same transaction id) buys nothing
    either."""
    pair = quiet_pair()
    for _ in range(20):
        assert deliver(pair, check(pair, password="y" * 24), VICTIM) == []
    real = check(pair)
    assert deliver(pair, real)  # the real client: our ClientHello
    for _ in range(20):
        assert deliver(pair, check(pair, password="y" * 24), VICTIM) == []
        assert deliver(pair, real, VICTIM) == []  # a replay, from anywhere
    # Our timer fires again and again: no flight to the victim (deliver/_dtls_out assert
    # the destination), and none to the client either without a fresh check of its own.
    for _ in range(4):  # 1, 2, 4, 8 s (the setup timeout, 30 s, is not reached)
        pair.now = max(pair.now, pair.server.poll_timeout() or pair.now)
        pair.server.handle_timeout(pair.now)
        assert _dtls_out(pair, CLIENT) == []
    assert pair.server.state is CallState.CONNECTING
    budget = pair.server.flight_budget
    assert budget is not None and budget.sent == 1 and VICTIM not in budget.credit


def test_one_flight_per_check() -> None:
    """Each fresh valid check buys at most one flight: timer retransmissions without checks
    are held (the newest one kept), a retransmitted check (same transaction id, RFC 8489
    §6.2.1) buys nothing, the next fresh check releases exactly one; and a burst of fresh
    checks at one instant buys at most the per-call ceiling (OWN_FLIGHT_BURST)."""
    pair = quiet_pair()
    first = check(pair)
    assert deliver(pair, first)
    budget = pair.server.flight_budget
    assert budget is not None
    for _ in range(3):  # 1 s, 2 s, 4 s … : each retransmission is held
        pair.now = max(pair.now, pair.server.poll_timeout() or pair.now)
        pair.server.handle_timeout(pair.now)
        assert _dtls_out(pair, CLIENT) == []
    assert budget.held is not None and budget.held_count == 3 and budget.sent == 1
    assert deliver(pair, first) == []  # retransmitted check: same id, no credit
    assert deliver(pair, check(pair))  # fresh: the held flight, once
    assert budget.held is None and budget.sent == 2
    assert deliver(pair, check(pair)) == []  # credit, but nothing to send: kept for later
    pair.now = max(pair.now, pair.server.poll_timeout() or pair.now)
    pair.server.handle_timeout(pair.now)
    assert _dtls_out(pair, CLIENT)  # paid for by that last check
    assert budget.sent == 3

    # The per-call ceiling (a GCRA) under the per-check credit: however many fresh checks
    # arrive at one instant, at most OWN_FLIGHT_BURST flights go out then.
    spent = 0
    for _ in range(50):
        budget.earn(VICTIM, os.urandom(12))
        spent += budget.spend(VICTIM, pair.now)
    assert spent <= OWN_FLIGHT_BURST


# -- 0.5-RTT media from our client as DTLS 1.3 server ------------------------------------


@pytest.mark.parametrize(("versions", "expect_ms"), [(BOTH, 40.0), (frozenset({"1.2"}), 60.0)],
                         ids=["1.3", "1.2"])
def test_half_rtt_media_echoes_one_round_trip_sooner(versions: frozenset[str],
                                                     expect_ms: float) -> None:
    """Our client with ``false_start`` as DTLS 1.3 server keys SRTP once its flight is out
    (RFC 8446 §4.4.4): its first packet rides right behind that flight, so with the
    transceiver starting DTLS the first echo is back 2 RTT after the client's first check
    (40 ms at 10 ms each way) instead of 3. A 1.2 server has no such flight: 3 RTT."""
    pair = CallPair(versions=versions, false_start=True)
    sent: list[float] = []

    def tick(now: float) -> None:
        if pair.client.srtp is not None and not sent:
            pair.client.send_rtp(b"\xfc" + bytes(40), 0, marker=True)
            sent.append(now)

    pair.tick, pair.tick_every = tick, 0.001
    assert pair.run_until(lambda: any(isinstance(e, RtpReceived) for e in pair.client_events),
                          within=1.0)
    echo = next(e.at for e in pair.client_events if isinstance(e, RtpReceived))
    assert echo == pytest.approx(expect_ms / 1000, abs=0.003)
    assert pair.run_until(lambda: connected(pair), within=1.0)  # and the handshake completes


def test_half_rtt_media_with_a_bad_client_certificate_fails_the_call() -> None:
    """The price of 0.5-RTT media: it leaves before the client's certificate is checked. A
    certificate that does not match the SDP fingerprint still ends the handshake."""
    pair = CallPair(versions=BOTH, false_start=True)
    assert pair.client.dtls is not None
    pair.client.dtls.engine._remote_fingerprints = ("sha-256 " + ":".join(["00"] * 32),)  # type: ignore[union-attr]
    pair.run_for(1.0)
    assert pair.server.state is not CallState.CONNECTED
    assert any(isinstance(e, Failed) for e in pair.client_events)
