"""What the transceiver sent to a relay worker that died is sent again through its successor
(issue 41 item 2).

The bug: 8 aiortc calls through a default ``appliance up`` (no Redis), the relay worker
holding the public port SIGKILLed: one call in eight, run after run, went silent for
~320 ms while the others' longest gap was 50-80 ms. Traced per flow (the client's first
packet after the kill at the successor, the vouch that re-seeded its route, the echo's
return): the route was back in 25-65 ms every time, but the echo of the client's last
packets before the kill, and frames paced just after it, had gone to the dead worker's
internal address — 1-3 packets per call per kill — and aiortc's audio jitter buffer (16
packets) waits for a missing sequence number until 16 later ones have arrived: one hole,
~320 ms of silence, then a burst. The bench's own client plays what arrives and never
showed it.

Now a flow keeps what it sent since it last heard from its relay, and the newest few before
(call.py ``Flow``: a relay heard from may still hold them), and a
move to another relay sends that again through the new one first (the vouch query,
transceiver/vouch.py, or the first datagram through the new relay, here). On the virtual
network of ``call_pair.py``: a call whose relay dies right after forwarding a packet loses
its echo to the dead relay and gets it back through the successor, so the client sees no
hole; a move with the old relay alive costs only copies the client's SRTP replay check
drops."""

from __future__ import annotations

from transceiver.call_pair import RELAY, CallPair
from transceiver.test_call import connected, echoes, start_media

from appliance.transceiver.call import CONFIRM_LAG, UNCONFIRMED, Transmit

SUCCESSOR = ("10.0.0.2", 4001)  # the dead worker's successor (another internal port)


def _sequences(pair: CallPair) -> list[int]:
    """The echoes' RTP sequence numbers in arrival order, unwrapped: the stream starts at a
    random number and may pass 65535 during the test (RFC 3550 §3)."""
    out: list[int] = []
    for e in echoes(pair):
        seq = e.packet.sequence
        if out:
            last = out[-1]
            seq += last - (last & 0xFFFF)
            if seq < last - 0x8000:
                seq += 0x10000
            elif seq > last + 0x8000:
                seq -= 0x10000
        out.append(seq)
    return out


def _holes(seqs: list[int]) -> int:
    got = sorted(set(seqs))
    return sum(b - a - 1 for a, b in zip(got, got[1:], strict=False))


def test_what_was_sent_into_a_dead_relay_comes_back_through_its_successor() -> None:
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    start_media(pair)
    pair.run_for(0.5)
    # The worker dies: the packet it forwarded just before is still on its way to the
    # server, and the echo of it goes to the dead worker's address.
    pair.dead.add(RELAY)
    before = pair.server.packets_in
    assert pair.run_until(lambda: pair.server.packets_in > before, within=0.1)
    assert len(pair.lost_to_dead) == 1
    flow = pair.server.media_flow
    assert flow is not None and list(flow.unconfirmed)[-1] == pair.lost_to_dead[0]
    # The successor forwards the client's next packets (the vouch path, the other way in,
    # is tests/transceiver/test_vouch.py).
    pair.relay = SUCCESSOR
    pair.run_for(0.3)
    pair.tick = None
    pair.run_for(0.1)
    seqs = _sequences(pair)
    assert len(seqs) >= 35
    assert _holes(seqs) == 0, "the echo sent into the dead relay is a hole"
    # Heard through it since: the newest few echoes stay kept, no more.
    assert flow.relay == SUCCESSOR and len(flow.unconfirmed) == CONFIRM_LAG + 1
    # The newest few sent before the death, which did arrive, come again: dropped as replays.
    assert len(seqs) == len(set(seqs))
    assert pair.client.srtp is not None
    assert 0 < pair.client.srtp.counters.replayed <= CONFIRM_LAG


def test_a_move_with_the_old_relay_alive_costs_only_copies_the_client_drops() -> None:
    """An ``SO_REUSEPORT`` reshuffle moves a client to another worker while the old one
    lives: what was sent through it arrived, and its copies fail the client's replay
    check (RFC 3711 §3.3.2) instead of playing twice."""
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    start_media(pair)
    pair.run_for(0.5)
    flow = pair.server.media_flow
    assert flow is not None
    # The server has echoed the last packet it got: one sent since it was last heard from,
    # and the newest CONFIRM_LAG before (a relay heard from may still hold them).
    assert len(flow.unconfirmed) == CONFIRM_LAG + 1
    pair.relay = SUCCESSOR
    pair.run_for(0.3)
    pair.tick = None
    pair.run_for(0.1)
    seqs = _sequences(pair)
    assert len(seqs) == len(set(seqs)) and _holes(seqs) == 0
    assert pair.client.srtp is not None
    assert 0 < pair.client.srtp.counters.replayed <= CONFIRM_LAG + 1


def test_what_a_flow_keeps_is_bounded() -> None:
    """A flow that hears nothing back (a one-way stream, a client gone quiet) keeps at most
    :data:`UNCONFIRMED` datagrams, the newest."""
    pair = CallPair()
    assert pair.run_until(lambda: connected(pair), within=1.0)
    flow = pair.server.media_flow
    assert flow is not None
    for i in range(UNCONFIRMED + 5):
        pair.server._out.append(Transmit(f"p{i}".encode(), flow))
    while pair.server.poll_output() is not None:
        pass
    assert list(flow.unconfirmed) == [f"p{i}".encode() for i in range(5, UNCONFIRMED + 5)]
    assert flow.move(SUCCESSOR) == [f"p{i}".encode() for i in range(5, UNCONFIRMED + 5)]
    assert not flow.unconfirmed and flow.relay == SUCCESSOR
