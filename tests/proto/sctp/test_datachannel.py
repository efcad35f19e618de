"""DataChannelEndpoint: DCEP both ways, negotiated channels, every message kind, parity,
closing from either side, limits."""

from __future__ import annotations

import pytest
from proto.sctp.sctp_pair import Network, Pair, dc_pair

from appliance.proto.sctp import Closed, Connected, SctpError, SctpUsageError
from appliance.proto.sctp.datachannel import (
    ChannelBufferedAmountLow,
    ChannelClosed,
    ChannelMessage,
    ChannelOpened,
    ChannelState,
    DataChannelOpen,
)

LOSSY = dict(loss=0.05, duplicate=0.05, reorder=0.1, delay=0.01, jitter=0.01)


def opened(p: Pair, name: str) -> list[ChannelOpened]:
    return p.of(name, ChannelOpened)


def messages(p: Pair, name: str, cid: int | None = None) -> list[bytes | str]:
    return [e.data for e in p.of(name, ChannelMessage) if cid is None or e.channel_id == cid]


def connected_pair(seed: int = 1, lossy: bool = False) -> Pair:
    p = dc_pair(Network(seed=seed, **LOSSY) if lossy else None, seed=seed)  # type: ignore[arg-type]
    p.connect(60)
    assert p.of("a", Connected) and p.of("b", Connected)
    return p


@pytest.mark.parametrize("lossy", [False, True], ids=["clean", "lossy"])
def test_dcep_channels_opened_both_ways(lossy: bool) -> None:
    p = connected_pair(lossy=lossy)
    ca = p.a.open_channel(p.now, "from-client", protocol="chat")
    cb = p.b.open_channel(p.now, "from-server")
    assert ca % 2 == 0 and cb % 2 == 1, "RFC 8832 §6: DTLS client even, server odd"
    p.run(30, until=lambda: len(opened(p, "a")) == 2 and len(opened(p, "b")) == 2)
    remote_b = [o for o in opened(p, "b") if not o.locally_initiated]
    assert remote_b == [ChannelOpened(ca, "from-client", "chat", True, None, None, False, False)]
    remote_a = [o for o in opened(p, "a") if not o.locally_initiated]
    assert [o.label for o in remote_a] == ["from-server"]
    for cid in (ca, cb):
        p.a.send(p.now, cid, f"a on {cid}")
        p.b.send(p.now, cid, f"b on {cid}".encode())
    p.run(30, until=lambda: len(messages(p, "a")) == 2 and len(messages(p, "b")) == 2)
    assert sorted(messages(p, "b"), key=str) == [f"a on {ca}", f"a on {cb}"]
    assert sorted(messages(p, "a"), key=str) == [f"b on {ca}".encode(), f"b on {cb}".encode()]


def test_channel_opened_before_connect_opens_on_connect() -> None:
    p = dc_pair()
    cid = p.a.open_channel(p.now, "early")
    assert p.a.channel_state(cid) is ChannelState.CONNECTING
    p.connect()
    p.run(5, until=lambda: opened(p, "b"))
    assert [o.label for o in opened(p, "a")] == ["early"]
    assert [o.label for o in opened(p, "b")] == ["early"]


def test_message_kinds_and_sizes() -> None:
    p = connected_pair()
    cid = p.a.open_channel(p.now, "kinds")
    p.run(5, until=lambda: opened(p, "b"))
    sent: list[bytes | str] = ["", b"", "x", b"y", "é" * 8000, b"\0" * (16 * 1024),
                               bytes(range(256)) * 256, b"z" * (256 * 1024), "\0"]
    for m in sent:
        p.a.send(p.now, cid, m)
    p.run(60, until=lambda: len(messages(p, "b")) == len(sent))
    got = messages(p, "b")
    assert got == sent
    assert [type(g) for g in got] == [type(s) for s in sent]


def test_empty_messages_use_ppid_56_and_57() -> None:
    p = connected_pair()
    cid = p.a.open_channel(p.now, "e")
    p.run(5, until=lambda: opened(p, "b"))
    assoc = p.a.association
    before = assoc.sender.next_tsn
    p.a.send(p.now, cid, "")
    p.a.send(p.now, cid, b"")
    ppids = [item.msg.ppid for t, item in assoc.sender.inflight.items() if t >= before]
    datas = [item.msg.data for t, item in assoc.sender.inflight.items() if t >= before]
    assert ppids == [56, 57] and datas == [b"\0", b"\0"]


def test_negotiated_channels_need_no_dcep() -> None:
    p = connected_pair()
    p.a.open_channel(p.now, "neg", negotiated=True, id=42)
    p.b.open_channel(p.now, "neg", negotiated=True, id=42)
    p.a.send(p.now, 42, "hello")
    p.b.send(p.now, 42, "world")
    p.run(5, until=lambda: messages(p, "a") and messages(p, "b"))
    assert messages(p, "b") == ["hello"] and messages(p, "a") == ["world"]
    # No DCEP OPEN went out: the peer saw no remote-opened channel.
    assert all(o.locally_initiated and o.negotiated for o in opened(p, "a") + opened(p, "b"))


def test_unordered_and_partially_reliable_channels() -> None:
    p = dc_pair(Network(loss=0.2, delay=0.02, seed=5))
    p.connect(60)
    u = p.a.open_channel(p.now, "u", ordered=False, max_retransmits=0)
    t = p.a.open_channel(p.now, "t", max_packet_lifetime=50)
    r = p.a.open_channel(p.now, "r")
    p.run(30, until=lambda: len(opened(p, "b")) == 3)
    by_label = {o.label: o for o in opened(p, "b")}
    assert not by_label["u"].ordered and by_label["u"].max_retransmits == 0
    assert by_label["t"].max_packet_lifetime == 50 and by_label["t"].ordered
    for i in range(200):
        p.a.send(p.now, u, b"u%03d" % i)
        p.a.send(p.now, t, b"t%03d" % i)
    p.a.send(p.now, r, "done")
    p.run(120, until=lambda: "done" in messages(p, "b", r))
    p.run(5)
    got_u, got_t = messages(p, "b", u), messages(p, "b", t)
    assert len(got_u) < 200 and len(got_t) < 200, "20% loss must abandon some messages"
    assert got_t == sorted(got_t), "partially reliable ordered data stays in order"
    assert messages(p, "b", r) == ["done"]


@pytest.mark.parametrize("closer", ["a", "b"])
def test_close_from_either_side(closer: str) -> None:
    """RFC 8831 §6.7: the closer resets its stream; the other side answers with its own reset
    (Chrome needs both), and both report ChannelClosed; the id can then be reused."""
    p = connected_pair(lossy=True)
    cid = p.a.open_channel(p.now, "closing")
    p.run(30, until=lambda: opened(p, "b"))
    p.b.send(p.now, cid, "last words")
    ep = p.a if closer == "a" else p.b
    ep.close_channel(p.now, cid)
    assert ep.channel_state(cid) is ChannelState.CLOSING
    p.run(60, until=lambda: p.of("a", ChannelClosed) and p.of("b", ChannelClosed))
    assert p.of("a", ChannelClosed) == [ChannelClosed(cid)]
    assert p.of("b", ChannelClosed) == [ChannelClosed(cid)]
    assert p.a.channel_state(cid) is ChannelState.CLOSED
    assert p.b.channel_state(cid) is ChannelState.CLOSED
    with pytest.raises(SctpUsageError):
        p.a.send(p.now, cid, "gone")
    again = p.a.open_channel(p.now, "reused")
    assert again == cid
    p.a.send(p.now, again, "fresh")
    p.run(30, until=lambda: "fresh" in messages(p, "b"))
    assert "fresh" in messages(p, "b")


def test_association_close_closes_every_channel() -> None:
    p = connected_pair()
    ids = [p.a.open_channel(p.now, str(i)) for i in range(3)]
    p.run(5, until=lambda: len(opened(p, "b")) == 3)
    p.a.shutdown(p.now)
    p.run(30, until=lambda: p.of("b", Closed))
    assert sorted(e.channel_id for e in p.of("b", ChannelClosed)) == ids
    assert isinstance(p.events["b"][-1], Closed)


def test_max_channels_refuses_extra_dcep_opens() -> None:
    p = dc_pair()
    p.b.max_channels = 2
    p.connect()
    for i in range(3):
        p.a.open_channel(p.now, str(i))
    p.run(30)
    assert len(opened(p, "b")) == 2
    assert p.b.stats["drops_too_many_channels"] == 1
    assert len(p.of("a", ChannelClosed)) == 1, "the refused channel is closed on the opener"


def test_buffered_amount_low_per_channel() -> None:
    p = connected_pair()
    cid = p.a.open_channel(p.now, "bulk")
    p.a.set_buffered_amount_low_threshold(cid, 1000)
    p.a.send(p.now, cid, b"x" * 200_000)
    assert p.a.buffered_amount(cid) > 1000
    p.run(30, until=lambda: p.of("a", ChannelBufferedAmountLow))
    assert p.of("a", ChannelBufferedAmountLow) == [ChannelBufferedAmountLow(cid)]


def test_open_message_codec_round_trip() -> None:
    msg = DataChannelOpen(0x81, 256, 3, "läbel", "proto")
    assert DataChannelOpen.parse_untrusted(bytes(msg)) == msg
    raw = bytes(msg)
    for n in range(len(raw)):
        with pytest.raises(SctpError):
            DataChannelOpen.parse_untrusted(raw[:n])


def test_usage_errors() -> None:
    p = connected_pair()
    with pytest.raises(SctpUsageError):
        p.a.open_channel(p.now, "x", max_retransmits=1, max_packet_lifetime=1)
    with pytest.raises(SctpUsageError):
        p.a.open_channel(p.now, "x", negotiated=True)
    p.a.open_channel(p.now, "x", negotiated=True, id=5)
    with pytest.raises(SctpUsageError):
        p.a.open_channel(p.now, "y", negotiated=True, id=5)
