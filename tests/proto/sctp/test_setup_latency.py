"""Setup latency on a fake clock (issue 17): what is queued before the association is up
leaves bundled with our COOKIE ECHO (RFC 9260 §5.1 step D), so the peer has it one round
trip after our INIT reached it instead of two; losing that packet costs a retransmission,
never the message; collisions (§5.2.1) still agree on tags."""

from __future__ import annotations

import random
from typing import Any

from proto.sctp.sctp_pair import NOW, Network, Pair, dc_pair

from appliance.proto.sctp import SctpAssociation, State
from appliance.proto.sctp import chunks as c
from appliance.proto.sctp.datachannel import (
    PPID_DCEP,
    ChannelMessage,
    ChannelOpened,
    ChannelState,
    DataChannelEndpoint,
    carries_channel_message,
)

D = 0.025  # one way: a 50 ms RTT


def recording(pair: Pair, side: Any) -> list[tuple[float, list[c.Chunk]]]:
    """Every packet ``side`` sends from now on, with the pair's clock when it left."""
    sent: list[tuple[float, list[c.Chunk]]] = []
    inner = side.poll_transmit

    def poll() -> bytes | None:
        packet: bytes | None = inner()
        if packet is not None:
            sent.append((pair.now, c.parse_packet_untrusted(packet)[1]))
        return packet

    side.poll_transmit = poll
    return sent


def kinds(chunks: list[c.Chunk]) -> list[str]:
    return [type(ch).__name__ for ch in chunks]


def test_data_queued_before_init_ack_rides_with_the_cookie_echo() -> None:
    p = Pair(Network(delay=D))
    sent = recording(p, p.a)
    p.a.connect(p.now)
    p.a.send(p.now, 0, 51, b"session.created")  # the agent's first message, queued at once
    assert p.a.state is State.COOKIE_WAIT and p.a.buffered_amount(0) == 15
    p.run(5, until=lambda: p.messages("b"))
    # INIT at 0, INIT ACK back at 2D, COOKIE ECHO + DATA at the peer at 3D (was 5D: after
    # the COOKIE ACK at 4D).
    assert round(p.now - NOW, 6) == round(3 * D, 6)
    assert [m.data for m in p.messages("b")] == [b"session.created"]
    assert p.connected("b")
    t, first = sent[1]
    assert kinds(first) == ["CookieEchoChunk", "DataChunk"]  # §5.1: COOKIE ECHO first
    assert round(t - NOW, 6) == round(2 * D, 6)
    # §5.1: nothing else leaves before the COOKIE ACK
    p.run(5, until=lambda: p.connected("a"))
    assert all(t2 >= NOW + 4 * D for t2, _ in sent[2:])
    p.a.send(p.now, 0, 51, b"next")
    p.run(5)
    assert [m.data for m in p.messages("b")] == [b"session.created", b"next"]
    assert p.a.sender.idle and p.a.stats.retransmissions == 0


def test_collision_with_a_later_peer_init_still_bundles_and_agrees() -> None:
    """What Chromium does: both sides send INIT (RFC 8841 §9.3), the browser a few ms
    after ours reached it. Our COOKIE ECHO + DATA establishes the browser (§5.2.1)."""
    p = Pair(Network(delay=D))
    p.a.connect(p.now)
    p.a.send(p.now, 1, 51, b"hello")
    p.pump()
    p.run(D + 0.004)
    p.b.connect(p.now)
    p.run(5, until=lambda: p.messages("b"))
    assert p.now - NOW <= 3 * D + 1e-6
    p.run(5, until=lambda: p.connected("a") and p.connected("b"))
    assert p.a.my_tag == p.b.peer_tag and p.b.my_tag == p.a.peer_tag
    p.a.send(p.now, 1, 51, b"a2")
    p.b.send(p.now, 1, 51, b"b1")
    p.run(5)
    assert [m.data for m in p.messages("b")] == [b"hello", b"a2"]
    assert [m.data for m in p.messages("a")] == [b"b1"]
    # b answered our INIT statelessly before its own connect(), then adopted that tag from
    # our COOKIE ECHO: the INIT ACK to its own INIT names the tag it dropped (§5.2.1 is
    # resolved by the first COOKIE ECHO; docs/sctp.md "Setup").
    assert not p.a.stats.drops and dict(p.b.stats.drops) == {"vtag": 1}


def test_lost_cookie_echo_with_data_is_resent_and_delivered_once() -> None:
    p = Pair(Network(delay=D))
    sent = recording(p, p.a)
    p.a.connect(p.now)
    p.a.send(p.now, 0, 51, b"first")
    p.run(5, until=lambda: p.sent["b"] >= 1)  # the INIT ACK is on its way
    p.blackhole.add("a")
    p.run(5, until=lambda: p.a.state is State.COOKIE_ECHOED)
    p.blackhole.discard("a")
    assert kinds(sent[1][1]) == ["CookieEchoChunk", "DataChunk"]
    p.a.send(p.now, 0, 51, b"second")  # queued behind the first, not sent before COOKIE ACK
    p.run(10, until=lambda: len(p.messages("b")) == 2)
    assert [m.data for m in p.messages("b")] == [b"first", b"second"]
    # T1-cookie resent the COOKIE ECHO alone; T3-rtx the DATA once established.
    assert kinds(sent[2][1]) == ["CookieEchoChunk"]
    assert p.a.stats.retransmissions >= 1 and not p.b.stats.drops.get("data-before-established")
    p.run(5)
    assert len(p.messages("b")) == 2 and p.a.sender.idle


def test_a_large_queued_message_fills_the_cookie_echo_packet_and_follows() -> None:
    p = Pair(Network(delay=D), mtu=1163)
    sent = recording(p, p.a)
    p.a.connect(p.now)
    big = random.Random(3).randbytes(10_000)
    p.a.send(p.now, 0, 53, big)
    p.run(5, until=lambda: p.messages("b"))  # the pair asserts every packet fits the mtu
    assert [m.data for m in p.messages("b")] == [big]
    first = sent[1][1]
    assert kinds(first)[0] == "CookieEchoChunk" and len(first) == 2
    assert isinstance(first[1], c.DataChunk) and first[1].begin and not first[1].end


def test_no_data_means_a_bare_cookie_echo() -> None:
    p = Pair(Network(delay=D))
    sent = recording(p, p.a)
    p.connect()
    assert kinds(sent[1][1]) == ["CookieEchoChunk"]


def test_negotiated_channel_opens_at_connect_and_its_message_is_bundled() -> None:
    p = dc_pair(Network(delay=D))
    a: DataChannelEndpoint = p.a
    b: DataChannelEndpoint = p.b
    cid = a.open_channel(p.now, "oai-events", negotiated=True, id=0)
    b.open_channel(p.now, "oai-events", negotiated=True, id=0)
    assert a.poll_event() is None  # no INIT yet: still connecting
    a.connect(p.now)
    ev = a.poll_event()
    assert isinstance(ev, ChannelOpened) and ev.negotiated and ev.channel_id == cid
    assert a.channel_state(cid) is ChannelState.OPEN
    a.send(p.now, cid, '{"type":"session.created"}')
    b.connect(p.now)
    p.run(5, until=lambda: p.of("b", ChannelMessage))
    assert p.now - NOW <= 3 * D + 1e-6  # was 4D: after the collision's COOKIE ACK
    assert [m.data for m in p.of("b", ChannelMessage)] == ['{"type":"session.created"}']


def test_negotiated_channel_opened_after_connect_is_open_at_once() -> None:
    a = DataChannelEndpoint(dtls_client=True, rng=random.Random(1))
    a.connect(NOW)
    cid = a.open_channel(NOW, "x", negotiated=True, id=4)
    assert isinstance(a.poll_event(), ChannelOpened)
    a.send(NOW, cid, b"queued")
    assert a.association.state is State.COOKIE_WAIT and a.buffered_amount(cid) == 6


def test_dcep_channel_still_waits_for_established_but_its_open_is_bundled() -> None:
    p = dc_pair(Network(delay=D))
    a: DataChannelEndpoint = p.a
    a.connect(p.now)
    cid = a.open_channel(p.now, "chat")
    assert a.channel_state(cid) is ChannelState.CONNECTING
    p.b.connect(p.now)
    p.run(5, until=lambda: p.of("b", ChannelOpened))
    assert p.now - NOW <= 3 * D + 1e-6
    assert [e.label for e in p.of("b", ChannelOpened)] == ["chat"]


def test_passive_association_is_unchanged() -> None:
    """The side that only answers (CLOSED, stateless) never sends COOKIE ECHO: its data
    waits for ESTABLISHED, as before."""
    b = SctpAssociation(rng=random.Random(5))
    assert b.state is State.CLOSED
    b.send(NOW, 0, 51, b"x")
    assert b.poll_transmit() is None


def test_carries_channel_message_finds_the_bundled_first_message() -> None:
    """The transceiver's ``first_channel_message_out`` step: DATA beginning a channel
    message, wherever it sits in the packet; not DCEP, not INIT, not a later fragment."""
    p = Pair(Network(delay=D), mtu=600)
    packets: list[bytes] = []
    inner = p.a.poll_transmit

    def poll() -> bytes | None:
        packet: bytes | None = inner()
        if packet is not None:
            packets.append(packet)
        return packet

    p.a.poll_transmit = poll
    p.a.connect(p.now)
    p.a.send(p.now, 0, PPID_DCEP, b"\x03" + bytes(11))
    p.a.send(p.now, 0, 51, b"y" * 1500)
    p.run(5, until=lambda: len(p.messages("b")) == 2)
    flags = [carries_channel_message(x) for x in packets]
    # INIT, COOKIE ECHO + DCEP + the first fragment, then the later fragments
    assert flags[0] is False and flags[1] is True and not any(flags[2:])
    assert not carries_channel_message(c.serialize_packet(5000, 5000, 1, bytes(
        c.DataChunk(1, 0, 0, PPID_DCEP, b"\x02"))))
