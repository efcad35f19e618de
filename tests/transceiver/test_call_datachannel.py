"""Data channels on whole calls on a virtual clock (call_pair.py): a real ClientPeer with
its ``sctp`` slot and a real ServerCall with a DataChannelEndpoint in its slot — the same
sans-IO SCTP core on both sides, over real DTLS — through a simulated network.

The data-only call (an offer with only an ``m=application`` section, RFC 8841 without
audio) is the point: it connects without SRTP, carries channels, and the server sends no
RTP or RTCP on it."""

from __future__ import annotations

import pytest
from transceiver.call_pair import CallPair, Netem

from appliance.client.peer import ChannelEvent
from appliance.client.peer import Connected as ClientConnected
from appliance.proto.mux import Kind, classify
from appliance.proto.sctp import datachannel as dc
from appliance.transceiver.call import CallState, Connected


def echo_pair(**kw: object) -> CallPair:
    """A pair whose server echoes every channel message back on its channel."""
    pair = CallPair(datachannel=True, **kw)  # type: ignore[arg-type]

    def echo(now: float, ev: object) -> None:
        if isinstance(ev, dc.ChannelMessage):
            assert pair.server_channels is not None
            pair.server_channels.send(now, ev.channel_id, ev.data)

    pair.on_server_channel = echo
    return pair


def client_messages(pair: CallPair) -> list[bytes | str]:
    return [e.event.data for e in pair.client_events
            if isinstance(e, ChannelEvent) and isinstance(e.event, dc.ChannelMessage)]


def opened(pair: CallPair, cid: int) -> bool:
    return any(isinstance(e, ChannelEvent) and isinstance(e.event, dc.ChannelOpened)
               and e.event.channel_id == cid for e in pair.client_events)


def count_kinds(pair: CallPair) -> dict[Kind, int]:
    """What the server sent, by RFC 7983 kind (a drop hook that drops nothing)."""
    seen: dict[Kind, int] = {}

    def look(direction: str, data: bytes) -> bool:
        if direction == "s2c":
            kind = classify(data)
            seen[kind] = seen.get(kind, 0) + 1
        return False

    pair.drop = look
    return seen


def test_data_only_call_connects_without_srtp_and_echoes_messages() -> None:
    pair = echo_pair(audio=False)
    sent_kinds = count_kinds(pair)
    assert pair.answer.plan is None and pair.answer.application is not None
    cid = pair.client.open_channel(pair.now, "chat")
    # RFC 8832 §6: the DTLS client takes even stream ids; the transceiver answered actpass
    # with active, so it is the client and ours (the DTLS server) are odd.
    assert pair.answer.dtls_client and cid % 2 == 1
    assert pair.run_until(lambda: opened(pair, cid), within=5.0)
    assert pair.server.state is CallState.CONNECTED
    assert pair.server.srtp is None and pair.server.srtp_profile is None
    assert pair.client.srtp is None
    server_connected = [e for e in pair.server_events if isinstance(e, Connected)]
    assert server_connected and server_connected[0].srtp_profile is None
    client_connected = [e for e in pair.client_events if isinstance(e, ClientConnected)]
    assert client_connected and client_connected[0].srtp_profile is None
    messages: list[bytes | str] = ["", "hello", b"", b"\x00\x01", b"x" * 65536, "é" * 1000]
    for m in messages:
        pair.client.send_message(pair.now, cid, m)
    assert pair.run_until(lambda: len(client_messages(pair)) == len(messages), within=10.0)
    assert client_messages(pair) == messages
    # The endpoint's events come out of the call unwrapped.
    assert any(isinstance(e, dc.ChannelMessage) for e in pair.server_events)
    # No RTP/RTCP ever left the server: no stream, no reports (nothing keyed to send them).
    pair.run_for(20.0)
    assert Kind.RTP not in sent_kinds and Kind.RTCP not in sent_kinds
    assert sent_kinds[Kind.DTLS] > 0
    assert pair.server.state is CallState.CONNECTED


@pytest.mark.parametrize("seed", range(3))
def test_data_only_call_on_a_terrible_network(seed: int) -> None:
    """Regression (seed 0): both sides send INIT; the server's COOKIE-ACK is lost while
    the established client already sends DATA. The server, still COOKIE-ECHOED, dropped
    the DATA but armed its delayed-SACK timer, which _flush could never serve: its
    poll_timeout stayed in the past and the shell spun (the virtual clock stopped)."""
    pair = echo_pair(audio=False, seed=seed,
                     net=Netem(delay=0.02, jitter=0.01, loss=0.1, duplicate=0.05, reorder=0.1))
    cid = pair.client.open_channel(pair.now, "chat")
    assert pair.run_until(lambda: opened(pair, cid), within=30.0)
    messages = [f"m{i}" for i in range(50)]
    for m in messages:
        pair.client.send_message(pair.now, cid, m)
    assert pair.run_until(lambda: len(client_messages(pair)) == len(messages), within=60.0)
    assert client_messages(pair) == messages  # reliable and ordered despite the network


def test_audio_and_data_channel_on_one_call() -> None:
    pair = echo_pair(audio=True)
    assert pair.answer.plan is not None and pair.answer.application is not None
    cid = pair.client.open_channel(pair.now, "events", ordered=False)
    assert pair.run_until(lambda: opened(pair, cid), within=5.0)
    assert pair.client.srtp is not None and pair.server.srtp is not None
    pair.client.send_message(pair.now, cid, "ping")
    assert pair.run_until(lambda: client_messages(pair) == ["ping"], within=5.0)


def test_client_refuses_a_message_over_the_answers_max_message_size() -> None:
    """RFC 8841 §6.1: never send more than the peer said it takes; a clear error, no drop."""
    pair = echo_pair(audio=False)
    cid = pair.client.open_channel(pair.now, "big")
    assert pair.run_until(lambda: opened(pair, cid), within=5.0)
    assert pair.client.peer_max_message_size == 262144
    with pytest.raises(Exception, match="max-message-size"):
        pair.client.send_message(pair.now, cid, bytes(262145))
    pair.client.send_message(pair.now, cid, bytes(262144))
    assert pair.run_until(lambda: len(client_messages(pair)) == 1, within=10.0)


def _first_server_message_after_connected(server_false_start: bool) -> float:
    """A pre-negotiated channel (``?dcid=``) whose first message the transceiver queues the
    moment it opens: seconds from the client's DTLS completion to that message, 50 ms RTT.
    The client peer is the DTLS server (we answer active) and DTLS 1.2 is negotiated."""
    pair = CallPair(datachannel=True, audio=False, net=Netem(delay=0.025),
                    versions=frozenset({"1.2"}), server_false_start=server_false_start)
    assert pair.server_channels is not None and pair.answer.dtls_client
    server = pair.server_channels
    server.open_channel(pair.now, "oai-events", negotiated=True, id=0)
    pair.client.open_channel(pair.now, "oai-events", negotiated=True, id=0)

    def first(now: float, ev: object) -> None:
        if isinstance(ev, dc.ChannelOpened):
            server.send(now, ev.channel_id, "session.created")

    pair.on_server_channel = first
    assert pair.run_until(lambda: bool(client_messages(pair)), within=5.0)
    assert client_messages(pair) == ["session.created"]
    connected = next(e for e in pair.client_events if isinstance(e, ClientConnected))
    got = next(e for e in pair.client_events if isinstance(e, ChannelEvent)
               and isinstance(e.event, dc.ChannelMessage))
    kinds = [type(e).__name__ for e in pair.server_events]
    if server_false_start:
        # RFC 7918: our INIT goes behind our Finished, before the client's Finished makes
        # the call Connected.
        assert kinds.index("SendReady") < kinds.index("Connected")
    else:
        assert "SendReady" not in kinds
    return got.at - connected.setup  # the answer was accepted at 0.0


def test_false_start_puts_the_first_server_message_one_rtt_after_connected() -> None:
    """DTLS 1.2, us the client (docs/sctp.md "Setup latency"): with False Start the INIT
    reaches the client with our Finished and the message rides with our COOKIE ECHO, one
    RTT after the client is connected; without it the INIT waits for the client's Finished
    and the message lands a round trip later."""
    with_fs = _first_server_message_after_connected(True)
    without = _first_server_message_after_connected(False)
    assert with_fs == pytest.approx(0.050, abs=0.006), with_fs
    assert without == pytest.approx(0.100, abs=0.006), without
