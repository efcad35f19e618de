"""SctpAssociation on the virtual network: setup, data of every size, loss/duplication/
reordering, partial reliability, stream reset, shutdown, abort, failure, hostile input."""

from __future__ import annotations

import random

import pytest
from proto.sctp.sctp_pair import NOW, Network, Pair

from appliance.proto.sctp import (
    BufferedAmountLow,
    CloseCause,
    MessageTooLargeError,
    SctpAssociation,
    SctpUsageError,
    SendBufferFullError,
    State,
    StreamClosedError,
    StreamsReset,
)
from appliance.proto.sctp import chunks as c

SIZES = [1, 16 * 1024, 64 * 1024, 256 * 1024]
BAD_NETWORK = Network(loss=0.05, duplicate=0.05, reorder=0.1, delay=0.01, jitter=0.01, seed=7)


def payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def test_setup_client_connects() -> None:
    p = Pair()
    p.connect()
    assert p.a.state is State.ESTABLISHED and p.b.state is State.ESTABLISHED
    ev = p.events["b"][0]
    assert ev.partial_reliability and ev.stream_reset and ev.max_outbound_streams == 65535


def test_setup_both_connect_collision() -> None:
    """RFC 9260 §5.2.1: both sides send INIT at once (what browsers do, RFC 8841 §9.3)."""
    p = Pair(both_connect=True)
    p.connect()
    assert p.connected("a") and p.connected("b")
    assert p.a.my_tag == p.b.peer_tag and p.b.my_tag == p.a.peer_tag
    p.a.send(p.now, 0, 51, b"x")
    p.run(2)
    assert [m.data for m in p.messages("b")] == [b"x"]


@pytest.mark.parametrize("seed", range(4))
def test_setup_survives_a_bad_network(seed: int) -> None:
    net = Network(loss=0.3, duplicate=0.2, reorder=0.3, seed=seed)
    p = Pair(net, both_connect=bool(seed % 2))
    p.connect(120)
    assert p.connected("a") and p.connected("b")


def test_server_keeps_no_state_before_cookie_echo() -> None:
    """RFC 9260 §5.1.3: INIT is answered from the signed cookie alone."""
    p = Pair()
    p.a.connect(p.now)
    init = p.a.poll_transmit()
    assert init is not None
    for _ in range(3):
        p.b.handle_input(p.now, init)
    assert p.b.state is State.CLOSED and p.b.receiver is None
    acks = [p.b.poll_transmit() for _ in range(3)]
    assert all(acks) and p.b.poll_transmit() is None


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("network", [None, BAD_NETWORK], ids=["clean", "lossy"])
def test_message_sizes_both_ways(size: int, network: Network | None) -> None:
    p = Pair(Network(**{k: getattr(network, k) for k in ("loss", "duplicate", "reorder",
                                                        "delay", "jitter", "seed")})
             if network else None)
    p.connect()
    a_msg, b_msg = payload(size, 1), payload(size, 2)
    p.a.send(p.now, 1, 53, a_msg)
    p.b.send(p.now, 1, 53, b_msg)
    p.run(120, until=lambda: p.messages("a") and p.messages("b"))
    assert [m.data for m in p.messages("b")] == [a_msg]
    assert [m.data for m in p.messages("a")] == [b_msg]


def test_empty_message_is_refused() -> None:
    a = SctpAssociation()
    with pytest.raises(SctpUsageError, match="empty"):
        a.send(NOW, 0, 51, b"")


def test_too_large_send_raises_clear_error() -> None:
    p = Pair()
    p.connect()
    with pytest.raises(MessageTooLargeError, match="262145 bytes exceeds max_message_size"):
        p.a.send(p.now, 0, 53, b"x" * 262145)
    assert isinstance(MessageTooLargeError("x"), SctpUsageError)


def test_too_large_incoming_message_aborts_with_a_reason() -> None:
    """A peer that ignores our max_message_size gets an ABORT, never a silent drop."""
    big = SctpAssociation(rng=random.Random(5), max_message_size=1 << 20)
    p = Pair(a=big)
    p.connect()
    p.a.send(p.now, 0, 53, payload(300_000))
    p.run(30)
    closed_b, closed_a = p.closed("b"), p.closed("a")
    assert closed_b is not None and closed_b.cause is CloseCause.PROTOCOL_ERROR
    assert "max_message_size" in closed_b.reason
    assert closed_a is not None and closed_a.cause is CloseCause.PEER_ABORT
    assert "max_message_size" in closed_a.reason
    assert not p.messages("b")


@pytest.mark.parametrize("network", [None, BAD_NETWORK], ids=["clean", "lossy"])
def test_burst_of_1000_ordered_messages(network: Network | None) -> None:
    p = Pair(Network(loss=0.05, duplicate=0.05, reorder=0.1, delay=0.01, jitter=0.01, seed=9)
             if network else None)
    p.connect()
    msgs = [f"message {i}".encode() * (1 + i % 7) for i in range(1000)]
    for m in msgs:
        p.a.send(p.now, 3, 51, m)
    p.run(300, until=lambda: len(p.messages("b")) == 1000)
    assert [m.data for m in p.messages("b")] == msgs
    if network:
        assert p.a.stats.retransmissions > 0


def test_unordered_messages_may_overtake() -> None:
    """Unordered delivery does not wait for a lost earlier message (RFC 9260 §6.6)."""
    p = Pair(Network(reorder=0.5, delay=0.01, seed=3))
    p.connect()
    for i in range(200):
        p.a.send(p.now, 2, 53, bytes([i]) * 50, ordered=False)
    p.run(60, until=lambda: len(p.messages("b")) == 200)
    got = [m.data[0] for m in p.messages("b")]
    assert sorted(got) == list(range(200))
    assert got != list(range(200)), "the reordering network should reorder unordered data"
    assert all(m.unordered for m in p.messages("b"))


def test_ordered_messages_stay_in_order_under_reordering() -> None:
    p = Pair(Network(reorder=0.5, delay=0.01, seed=3))
    p.connect()
    for i in range(200):
        p.a.send(p.now, 2, 53, bytes([i]) * 50)
    p.run(60, until=lambda: len(p.messages("b")) == 200)
    assert [m.data[0] for m in p.messages("b")] == list(range(200))


@pytest.mark.parametrize("kind", ["rexmit", "lifetime"])
def test_partial_reliability_abandons_under_loss(kind: str) -> None:
    """RFC 3758: lost PR messages are abandoned and FORWARD TSN moves the peer on; later
    reliable data still arrives, in order."""
    p = Pair(Network(loss=0.2, delay=0.02, seed=11))
    p.connect()
    opts = {"max_retransmits": 0} if kind == "rexmit" else {"max_lifetime": 0.01}
    for i in range(300):
        p.a.send(p.now, 4, 53, i.to_bytes(2, "big") * 100, **opts)  # type: ignore[arg-type]
    p.a.send(p.now, 5, 53, b"reliable tail")
    p.run(120, until=lambda: any(m.data == b"reliable tail" for m in p.messages("b")))
    p.run(5)
    pr = [int.from_bytes(m.data[:2], "big") for m in p.messages("b") if m.stream_id == 4]
    assert pr == sorted(pr) and len(set(pr)) == len(pr), "ordered PR data stays in order"
    assert len(pr) < 300, "some messages must have been abandoned under 20% loss"
    assert p.a.stats.abandoned_messages > 0
    assert p.a.sender.cum_ack == p.a.sender.next_tsn - 1, "the peer's cum TSN caught up"


def test_partial_reliability_unordered_large_messages() -> None:
    p = Pair(Network(loss=0.1, delay=0.02, seed=12))
    p.connect()
    for i in range(40):
        p.a.send(p.now, 6, 53, bytes([i]) * 5000, ordered=False, max_retransmits=1)
    p.a.send(p.now, 6, 53, b"end")
    p.run(120, until=lambda: any(m.data == b"end" for m in p.messages("b")))
    for m in p.messages("b"):
        assert m.data == b"end" or (len(m.data) == 5000 and len(set(m.data)) == 1)


@pytest.mark.parametrize("who", ["a", "b"])
def test_stream_reset_each_direction(who: str) -> None:
    p = Pair(BAD_NETWORK_COPY())
    p.connect()
    src, dst = (p.a, p.b) if who == "a" else (p.b, p.a)
    other = "b" if who == "a" else "a"
    for i in range(20):
        src.send(p.now, 7, 51, b"before %d" % i)
    src.reset_streams(p.now, [7])
    with pytest.raises(StreamClosedError):
        src.send(p.now, 7, 51, b"no")
    p.run(60, until=lambda: p.of(who, StreamsReset))
    assert p.of(who, StreamsReset) == [StreamsReset(outgoing=(7,))]
    assert p.of(other, StreamsReset) == [StreamsReset(incoming=(7,))]
    assert [m.data for m in p.messages(other)] == [b"before %d" % i for i in range(20)]
    # After the reset the stream starts again at SSN 0 and works.
    src.send(p.now, 7, 51, b"after")
    p.run(30, until=lambda: p.messages(other)[-1].data == b"after")
    assert p.messages(other)[-1].data == b"after"
    assert dst.state is State.ESTABLISHED


def BAD_NETWORK_COPY() -> Network:  # noqa: N802 - reads like the constant it copies
    return Network(loss=0.05, duplicate=0.05, reorder=0.1, delay=0.01, jitter=0.01, seed=7)


def test_stream_reset_deferred_until_data_arrives() -> None:
    """RFC 6525 §5.2.2: the request overtakes data still in flight; the receiver answers
    "in progress" and performs the reset once the last TSN has arrived."""
    p = Pair(Network(delay=0.01, seed=1))
    p.connect()
    p.a.send(p.now, 1, 51, b"m1")
    data_pkt = p.a.poll_transmit()
    p.a.reset_streams(p.now, [1])
    reset_pkt = p.a.poll_transmit()
    assert data_pkt and reset_pkt
    p.b.handle_input(p.now, reset_pkt)  # request first: TSN of m1 is missing
    assert not [e for e in iter(p.b.poll_event, None) if isinstance(e, StreamsReset)]
    p.b.handle_input(p.now, data_pkt)
    evs = list(iter(p.b.poll_event, None))
    assert [type(e).__name__ for e in evs] == ["MessageReceived", "StreamsReset"]
    p.run(10, until=lambda: p.of("a", StreamsReset))
    assert p.of("a", StreamsReset) == [StreamsReset(outgoing=(1,))]


def test_shutdown_graceful_after_queued_data() -> None:
    p = Pair(BAD_NETWORK_COPY())
    p.connect()
    data = payload(100_000)
    p.a.send(p.now, 0, 53, data)
    p.a.shutdown(p.now)
    with pytest.raises(SctpUsageError):
        p.a.send(p.now, 0, 53, b"late")
    p.run(120, until=lambda: p.closed("a") and p.closed("b"))
    assert [m.data for m in p.messages("b")] == [data]
    ca, cb = p.closed("a"), p.closed("b")
    assert ca and cb and ca.cause is cb.cause is CloseCause.SHUTDOWN
    assert p.a.poll_timeout() is None and p.b.poll_timeout() is None


def test_abort_reaches_the_peer_with_its_reason() -> None:
    p = Pair()
    p.connect()
    p.b.abort(p.now, "agent hung up")
    p.run(5)
    ca, cb = p.closed("a"), p.closed("b")
    assert cb and cb.cause is CloseCause.LOCAL_ABORT
    assert ca and ca.cause is CloseCause.PEER_ABORT and "agent hung up" in ca.reason


def test_peer_that_stops_acking_closes_only_its_association() -> None:
    """RFC 9260 §8.1: too many T3-rtx expiries fail the association with a Closed event."""
    p = Pair()
    p.connect()
    bystander = Pair(seed=50)
    bystander.connect()
    p.blackhole.add("b")
    p.a.send(p.now, 0, 53, b"hello?")
    p.run(600, until=lambda: p.closed("a"))
    closed = p.closed("a")
    assert closed is not None and closed.cause is CloseCause.TIMEOUT
    assert p.a.stats.t3_expiries == 11
    assert bystander.a.state is State.ESTABLISHED
    bystander.a.send(bystander.now, 0, 53, b"still here")
    bystander.run(5)
    assert [m.data for m in bystander.messages("b")] == [b"still here"]


def test_init_without_answer_times_out() -> None:
    p = Pair()
    p.blackhole.add("a")
    p.a.connect(p.now)
    p.run(600, until=lambda: p.closed("a"))
    closed = p.closed("a")
    assert closed is not None and closed.cause is CloseCause.TIMEOUT


def test_tampered_cookie_is_rejected_and_counted() -> None:
    p = Pair()
    p.a.connect(p.now)
    init = p.a.poll_transmit()
    assert init
    p.b.handle_input(p.now, init)
    init_ack = p.b.poll_transmit()
    assert init_ack
    p.a.handle_input(p.now, init_ack)
    echo = p.a.poll_transmit()
    assert echo
    # Flip one bit inside the cookie and fix up the CRC so only the MAC can catch it.
    raw = bytearray(echo)
    raw[12 + 4 + 10] ^= 0x01
    forged = c.serialize_packet(5000, 5000, int.from_bytes(raw[4:8], "big"), bytes(raw[12:]))
    p.b.handle_input(p.now, forged)
    assert p.b.state is State.CLOSED and p.b.stats.drops["bad-cookie"] == 1
    # A stale (but authentic) cookie is refused too.
    p.b.handle_input(p.now + 61, echo)
    assert p.b.stats.drops["stale-cookie"] == 1
    p.b.handle_input(p.now, echo)
    assert p.b.state is State.ESTABLISHED


def test_crc_errors_are_counted_not_raised() -> None:
    p = Pair()
    p.connect()
    p.a.send(p.now, 0, 51, b"hello")
    pkt = bytearray(p.a.poll_transmit() or b"")
    pkt[-1] ^= 0xFF
    p.b.handle_input(p.now, bytes(pkt))
    assert p.b.stats.drops["checksum"] == 1
    assert not p.messages("b")


def test_wrong_tag_and_port_are_dropped() -> None:
    p = Pair()
    p.connect()
    chunk = bytes(c.DataChunk(p.b.receiver.cum + 1, 0, 0, 51, b"x"))  # type: ignore[union-attr]
    p.b.handle_input(p.now, c.serialize_packet(5000, 5000, p.b.my_tag ^ 1, chunk))
    p.b.handle_input(p.now, c.serialize_packet(5001, 5000, p.b.my_tag, chunk))
    assert p.b.stats.drops["vtag"] == 1 and p.b.stats.drops["port"] == 1
    p.b.handle_input(p.now, c.serialize_packet(5000, 5000, p.b.my_tag, chunk))
    assert [e.data for e in iter(p.b.poll_event, None)] == [b"x"]


def test_heartbeat_is_answered_with_its_info() -> None:
    p = Pair()
    p.connect()
    info = c.serialize_params(((c.ParamType.HEARTBEAT_INFO, b"opaque-info"),))
    p.b.handle_input(p.now, c.serialize_packet(5000, 5000, p.b.my_tag,
                                               bytes(c.HeartbeatChunk(info))))
    out = p.b.poll_transmit()
    assert out is not None
    _, chunks = c.parse_packet_untrusted(out)
    assert chunks == [c.HeartbeatAckChunk(info)]


def test_send_buffer_is_capped() -> None:
    p = Pair(max_send_buffer=300_000)
    p.connect()
    p.blackhole.add("a")
    p.a.send(p.now, 0, 53, payload(200_000))
    with pytest.raises(SendBufferFullError):
        p.a.send(p.now, 0, 53, payload(200_000))


def test_receive_window_is_respected_and_capped() -> None:
    """The sender never has more than the peer's a_rwnd in flight; the receiver holds at
    most its max_receive_buffer of out-of-order data."""
    small = SctpAssociation(rng=random.Random(9), max_receive_buffer=64 * 1024)
    p = Pair(Network(loss=0.1, delay=0.02, seed=4), b=small)
    p.connect()
    msgs = [payload(50_000, i) for i in range(10)]
    peak = 0
    for m in msgs:
        p.a.send(p.now, 0, 53, m)

    def watch() -> bool:
        nonlocal peak
        assert p.b.receiver is not None
        peak = max(peak, p.b.receiver.buffered)
        return len(p.messages("b")) == 10

    p.run(300, until=watch)
    assert [m.data for m in p.messages("b")] == msgs
    assert peak <= 64 * 1024 + 1200


def test_buffered_amount_and_low_event() -> None:
    p = Pair()
    p.connect()
    p.a.set_buffered_amount_low_threshold(3, 10_000)
    p.a.send(p.now, 3, 53, payload(100_000))
    assert 0 < p.a.buffered_amount(3) <= 100_000
    p.run(30, until=lambda: p.of("a", BufferedAmountLow))
    assert p.of("a", BufferedAmountLow) == [BufferedAmountLow(3)]
    assert p.a.buffered_amount(3) <= 10_000


def test_rto_tracks_the_path_rtt() -> None:
    p = Pair(Network(delay=0.05))
    p.connect()
    for i in range(50):
        p.a.send(p.now, 0, 53, payload(1000, i))
        p.run(0.3)
    srtt = p.a.sender.rto.srtt
    assert srtt is not None and 0.09 <= srtt <= 0.35  # 100 ms RTT plus delayed SACK


def test_fast_retransmit_recovers_a_single_loss_without_t3() -> None:
    p = Pair(Network(delay=0.01))
    p.connect()
    sent = 0

    original = p.network.arrivals

    def drop_fifth_data(now: float, pkt: bytes) -> list[float]:
        nonlocal sent
        if len(pkt) > 1000:
            sent += 1
            if sent == 5:
                return []
        return original(now, pkt)

    p.network.arrivals = drop_fifth_data  # type: ignore[method-assign]
    data = payload(60_000)
    p.a.send(p.now, 0, 53, data)
    p.run(30, until=lambda: p.messages("b"))
    assert [m.data for m in p.messages("b")] == [data]
    assert p.a.stats.fast_retransmits >= 1 and p.a.stats.t3_expiries == 0


def test_pure_python_crc_path_end_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the optional C extension the table-driven CRC32c carries the association."""
    from appliance.proto.sctp import crc32c

    monkeypatch.setattr(crc32c, "_FAST", None)
    p = Pair()
    p.connect()
    data = payload(20_000)
    p.a.send(p.now, 0, 53, data)
    p.run(10, until=lambda: p.messages("b"))
    assert [m.data for m in p.messages("b")] == [data]
    assert p.b.stats.drops["checksum"] == 0


def test_init_with_unknown_parameters_is_answered() -> None:
    """Browsers add parameters we do not implement (e.g. Zero Checksum Acceptable 0x8001,
    RFC 9653); their type's upper bits say "skip", so the INIT is still answered and the
    INIT ACK does not advertise them."""
    init = c.InitChunk(0x1234, 131072, 65535, 65535, 77, (
        (0x8001, b"\x00\x00\x00\x01"),
        (c.ParamType.SUPPORTED_EXTENSIONS, bytes([130, 192, 64])),
        (c.ParamType.FORWARD_TSN_SUPPORTED, b""),
    ))
    b = SctpAssociation(rng=random.Random(3))
    b.handle_input(NOW, c.serialize_packet(5000, 5000, 0, bytes(init)))
    out = b.poll_transmit()
    assert out is not None
    header, chunks = c.parse_packet_untrusted(out)
    assert header.vtag == 0x1234
    ack = chunks[0]
    assert isinstance(ack, c.InitAckChunk) and ack.cookie is not None
    assert ack.forward_tsn and ack.reconfig
    assert 0x8001 not in {t for t, _ in ack.params} and 64 not in ack.extensions


def test_reset_needs_peer_support() -> None:
    """RFC 6525 is an extension: a peer that did not advertise RE-CONFIG cannot reset."""
    p = Pair()
    p.connect()
    p.a.peer_reconfig = False
    with pytest.raises(SctpUsageError, match="RE-CONFIG"):
        p.a.reset_streams(p.now, [1])


def test_transition_table_reaches_every_state() -> None:
    from appliance.proto.sctp.association import TRANSITIONS

    reached = {State.CLOSED} | set(TRANSITIONS.values())
    assert reached == set(State)


def test_resetting_many_streams_spans_several_requests() -> None:
    """A reset of more streams than fit in one packet goes out as several requests, each
    answered in turn (RFC 6525 §5.1.1: one outstanding request at a time)."""
    p = Pair()
    p.connect()
    ids = list(range(600))
    p.a.reset_streams(p.now, ids)
    p.run(30, until=lambda: sum(len(e.outgoing) for e in p.of("a", StreamsReset)) == 600)
    done = [s for e in p.of("a", StreamsReset) for s in e.outgoing]
    assert sorted(done) == ids and len(p.of("a", StreamsReset)) == 3
    assert sorted(s for e in p.of("b", StreamsReset) for s in e.incoming) == ids


def test_delayed_sack_then_every_second_packet() -> None:
    """RFC 9260 §6.2: one packet of DATA is acknowledged after the delay; the second packet
    triggers a SACK at once."""
    p = Pair()
    p.connect()
    p.a.send(p.now, 0, 53, b"one")
    first = p.a.poll_transmit()
    assert first
    p.b.handle_input(p.now, first)
    assert p.b.poll_transmit() is None
    assert p.b.poll_timeout() == pytest.approx(p.now + 0.2)
    p.a.send(p.now, 0, 53, b"two")
    second = p.a.poll_transmit()
    assert second
    p.b.handle_input(p.now, second)
    sack = p.b.poll_transmit()
    assert sack is not None
    chunks = c.parse_packet_untrusted(sack)[1]
    assert isinstance(chunks[0], c.SackChunk) and chunks[0].cum_tsn == p.a.sender.last_assigned_tsn


def test_connect_after_answering_the_peers_init() -> None:
    """The shell may call connect() just after the browser's INIT was answered (statelessly):
    the COOKIE ECHO that then arrives in COOKIE-WAIT carries the stateless tag and is
    adopted, so setup still takes one round trip more at most and the tags agree."""
    p = Pair(Network(delay=0.01))
    p.a.connect(p.now)
    p.pump()
    p.run(0.015)  # the INIT has reached b, its INIT ACK is on the way back
    p.b.connect(p.now)
    p.run(5, until=lambda: p.connected("a") and p.connected("b"))
    assert p.connected("a") and p.connected("b")
    assert p.a.my_tag == p.b.peer_tag and p.b.my_tag == p.a.peer_tag
    p.b.send(p.now, 0, 51, b"hi")
    p.a.send(p.now, 0, 51, b"ho")
    p.run(5, until=lambda: p.messages("a") and p.messages("b"))
    assert [m.data for m in p.messages("a")] == [b"hi"]
    assert [m.data for m in p.messages("b")] == [b"ho"]


@pytest.mark.parametrize("delay_ms", [0, 3, 8, 12, 15, 18, 25, 40])
def test_late_connect_on_the_passive_side_at_any_moment(delay_ms: int) -> None:
    """Whenever the passive side's own connect() lands during the handshake, both ends
    establish with matching tags and data flows both ways."""
    p = Pair(Network(delay=0.01))
    p.a.connect(p.now)
    p.run(delay_ms / 1000)
    p.b.connect(p.now)
    p.run(10, until=lambda: p.connected("a") and p.connected("b"))
    assert p.a.my_tag == p.b.peer_tag and p.b.my_tag == p.a.peer_tag
    p.b.send(p.now, 0, 51, b"hi")
    p.a.send(p.now, 0, 51, b"ho")
    p.run(10, until=lambda: p.messages("a") and p.messages("b"))
    assert [m.data for m in p.messages("a")] == [b"hi"]
    assert [m.data for m in p.messages("b")] == [b"ho"]


@pytest.mark.parametrize("mtu", [1163, 1161, 1162, 1200])
def test_packets_fit_an_mtu_that_is_not_a_multiple_of_four(mtu: int) -> None:
    """Regression: DATA chunks are padded to 4 bytes, so a payload sized to fill the MTU
    exactly produced a packet 1-3 bytes over it (1164 at mtu 1163, the DTLS 1.2 AES-GCM
    record limit at a 1200-byte datagram) and the transceiver's DTLS refused to send it.
    The pair asserts every packet fits ``mtu``."""
    p = Pair(mtu=mtu)
    p.connect()
    msg = payload(20_000, 3)
    p.a.send(p.now, 1, 53, msg)
    p.a.send(p.now, 1, 53, payload(mtu - 40, 4))
    p.run(30, until=lambda: len(p.messages("b")) == 2)
    assert [m.data for m in p.messages("b")] == [msg, payload(mtu - 40, 4)]
