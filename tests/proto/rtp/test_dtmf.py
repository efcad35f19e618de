"""RFC 4733 telephone-events (appliance/proto/rtp/dtmf.py): codec, the sender's packet
sequence, the receiver's one-press-per-digit rule under loss, duplication and reordering,
and fuzzing (only RtpError escapes the parser; the receiver never raises)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp import RtpError
from appliance.proto.rtp.dtmf import (
    LOST_END_TIMEOUT,
    DigitPress,
    DtmfPacket,
    DtmfReceiver,
    DtmfSender,
    TelephoneEvent,
    digit_for,
    event_for,
)


def test_codec_round_trip_and_wire_layout() -> None:
    ev = TelephoneEvent(event=11, end=True, volume=10, duration=1600)
    assert bytes(ev) == bytes([11, 0x80 | 10, 0x06, 0x40])
    assert TelephoneEvent.parse_untrusted(bytes(ev)) == ev
    # The R bit is ignored; trailing bytes (e.g. padding to a word) are ignored.
    assert TelephoneEvent.parse_untrusted(bytes([5, 0x40 | 7, 0, 160]) + b"xx") == \
        TelephoneEvent(5, False, 7, 160)
    with pytest.raises(RtpError):
        TelephoneEvent.parse_untrusted(b"\x01\x02\x03")
    with pytest.raises(LocalProtocolError):
        TelephoneEvent(1, False, 64, 0)


def test_digit_table() -> None:
    assert [event_for(d) for d in "0123456789*#ABCD!"] == list(range(17))
    assert event_for("a") == 12 and digit_for(11) == "#" and digit_for(16) == "!"
    assert digit_for(40) is None
    for bad in ("", "E", "12", " "):
        with pytest.raises(LocalProtocolError):
            event_for(bad)


def _drain(sender: DtmfSender, until: float) -> list[DtmfPacket]:
    out: list[DtmfPacket] = []
    while True:
        while (p := sender.poll_output()) is not None:
            out.append(p)
        t = sender.poll_timeout()
        if t is None or t > until:
            return out
        sender.handle_timeout(t)


def test_sender_sequence() -> None:
    """Marker on the first packet, one update per 50 ms, the end three times."""
    s = DtmfSender(8000, interval=0.05)
    start = s.send(10.0, "7", 0.2, timestamp_at=1000)
    assert start == 10.0
    pkts = _drain(s, 20.0)
    evs = [TelephoneEvent.parse_untrusted(p.payload) for p in pkts]
    assert [p.marker for p in pkts] == [True, False, False, False, False, False]
    assert [e.duration for e in evs] == [400, 800, 1200, 1600, 1600, 1600]
    assert [e.end for e in evs] == [False, False, False, True, True, True]
    assert {e.event for e in evs} == {7} and {p.timestamp for p in pkts} == {1000}
    assert [p.at for p in pkts] == pytest.approx([10.0, 10.05, 10.1, 10.15, 10.2, 10.25])
    assert not s.busy


def test_sender_queues_digits_and_derives_timestamps() -> None:
    s = DtmfSender(8000, interval=0.02, gap=0.05)
    s.send(0.0, "1", 0.04, timestamp_at=0)
    second = s.send(0.0, "2", 0.04, timestamp_at=0)
    # Digit 1: packets at 0, 0.02 (end x3 at 0.02, 0.04, 0.06); then a 50 ms gap.
    assert second == pytest.approx(0.11)
    pkts = _drain(s, 10.0)
    stamps = sorted({p.timestamp for p in pkts})
    assert stamps == [0, round(0.11 * 8000)]
    assert sum(p.marker for p in pkts) == 2
    # A press shorter than one interval is one packet: start and end together.
    s.send(5.0, "#", 0.01, timestamp_at=0)
    short = _drain(s, 10.0)
    assert [p.marker for p in short] == [True, False, False]
    assert all(TelephoneEvent.parse_untrusted(p.payload).end for p in short)
    with pytest.raises(LocalProtocolError):
        s.send(0.0, "1", 0.0, 0)
    with pytest.raises(LocalProtocolError):
        DtmfSender(interval=0)


def _feed(rx: DtmfReceiver, pkts: list[DtmfPacket], now: float | None = None) -> None:
    for p in pkts:
        rx.handle_input(p.at if now is None else now, p.payload, p.timestamp)


def _presses(rx: DtmfReceiver) -> list[DigitPress]:
    out = []
    while (p := rx.poll_output()) is not None:
        out.append(p)
    return out


def _digit_packets(digits: str, duration: float = 0.12) -> list[DtmfPacket]:
    s = DtmfSender(8000, interval=0.05)
    for d in digits:
        s.send(0.0, d, duration, timestamp_at=123_456)
    return _drain(s, 100.0)


def test_receiver_one_press_per_digit_despite_three_ends() -> None:
    rx = DtmfReceiver(8000)
    _feed(rx, _digit_packets("15#"))
    assert [(p.digit, p.duration, p.ended) for p in _presses(rx)] == [
        ("1", 0.12, True), ("5", 0.12, True), ("#", 0.12, True)]
    assert rx.poll_timeout() is None


def test_receiver_lost_ends_reported_by_next_event_or_timeout() -> None:
    pkts = _digit_packets("12")
    no_ends = [p for p in pkts if not TelephoneEvent.parse_untrusted(p.payload).end]
    rx = DtmfReceiver(8000)
    _feed(rx, no_ends)
    first = _presses(rx)
    assert [(p.digit, p.ended) for p in first] == [("1", False)]
    assert first[0].duration == pytest.approx(0.1)  # the longest update seen
    t = rx.poll_timeout()
    assert t is not None and t == pytest.approx(no_ends[-1].at + LOST_END_TIMEOUT)
    rx.handle_timeout(t - 0.01)
    assert _presses(rx) == []
    rx.handle_timeout(t)
    assert [(p.digit, p.ended) for p in _presses(rx)] == [("2", False)]


def test_receiver_stragglers_never_make_a_second_press() -> None:
    pkts = _digit_packets("9")
    rx = DtmfReceiver(8000)
    _feed(rx, pkts[:4])  # up to the first end
    _feed(rx, pkts[1:])  # late updates and the retransmitted ends
    assert [p.digit for p in _presses(rx)] == ["9"]


@pytest.mark.parametrize("seed", range(20))
def test_receiver_under_loss_duplication_and_reordering(seed: int) -> None:
    """A seeded terrible network: every digit whose packets partly arrive is reported
    exactly once, in order, and nothing else is reported."""
    rng = random.Random(seed)
    digits = "".join(rng.choice("0123456789*#ABCD") for _ in range(6))
    sent = _digit_packets(digits)
    received: list[DtmfPacket] = []
    for p in sent:
        if rng.random() < 0.2:
            continue
        received.append(p)
        if rng.random() < 0.2:
            received.append(p)
    # Reorder only within an event (a jitter of less than the 100 ms inter-digit spacing).
    for i in range(len(received) - 1):
        if received[i].timestamp == received[i + 1].timestamp and rng.random() < 0.3:
            received[i], received[i + 1] = received[i + 1], received[i]
    rx = DtmfReceiver(8000)
    _feed(rx, received)
    rx.handle_timeout(1000.0)
    got = [p.digit for p in _presses(rx)]
    arrived = []
    for p in received:
        d = digit_for(TelephoneEvent.parse_untrusted(p.payload).event)
        if not arrived or arrived[-1][1] != p.timestamp:
            arrived.append((d, p.timestamp))
    assert got == [d for d, _ in arrived]


def test_receiver_counts_garbage_and_ignores_older_events() -> None:
    rx = DtmfReceiver(8000)
    rx.handle_input(0.0, b"\x01", 5)
    assert rx.dropped == 1
    rx.handle_input(0.0, bytes(TelephoneEvent(3, True, 10, 800)), 10_000)
    rx.handle_input(0.1, bytes(TelephoneEvent(4, True, 10, 800)), 5_000)  # older: ignored
    assert [p.digit for p in _presses(rx)] == ["3"]
    # Timestamps wrap: 2^32 - 100 is before 50.
    rx = DtmfReceiver(8000)
    rx.handle_input(0.2, bytes(TelephoneEvent(6, True, 10, 800)), (1 << 32) - 100)
    rx.handle_input(0.3, bytes(TelephoneEvent(7, True, 10, 800)), 50)
    assert [p.digit for p in _presses(rx)] == ["6", "7"]


@given(st.binary(max_size=16))
def test_fuzz_parse(data: bytes) -> None:
    try:
        ev = TelephoneEvent.parse_untrusted(data)
    except RtpError:
        assert len(data) < 4
        return
    assert bytes(ev)[0] == data[0] and bytes(ev)[2:] == data[2:4]


@given(st.lists(st.tuples(st.floats(0, 100), st.binary(max_size=8),
                          st.integers(0, 0xFFFFFFFF)), max_size=40))
def test_fuzz_receiver(inputs: list[tuple[float, bytes, int]]) -> None:
    rx = DtmfReceiver(8000)
    now = 0.0
    for dt, data, ts in inputs:
        now += dt
        rx.handle_input(now, data, ts)
        t = rx.poll_timeout()
        if t is not None and t <= now:
            rx.handle_timeout(now)
    rx.handle_timeout(now + 10)
    presses = _presses(rx)
    assert rx.poll_timeout() is None
    # Each press is reported once, in event order: timestamps strictly increase (mod 2^32).
    for a, b in zip(presses, presses[1:], strict=False):
        assert 0 < (b.timestamp - a.timestamp) & 0xFFFFFFFF < 1 << 31
