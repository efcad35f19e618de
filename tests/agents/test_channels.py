"""Agents and data channels: typed events in, messages out, bounded both ways."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from appliance.agents import (
    AgentContext,
    AgentHost,
    AgentIdentity,
    ChannelClosed,
    ChannelError,
    ChannelInfo,
    ChannelMessage,
    ChannelOpened,
)
from appliance.agents.channels import MAX_MESSAGE_BYTES, ChannelHub
from appliance.agents.echo import echo, echo_channel


class MemoryPort:
    """The transceiver side of the seam, in memory: records what the agent sends and lets a
    test set each channel's unacknowledged byte count."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str | bytes]] = []
        self.buffered: dict[int, int] = {}
        self.closed: list[int] = []
        self.next_id = 1  # the DTLS server opens odd stream ids (RFC 8832 §6)

    def send(self, channel_id: int, data: str | bytes) -> None:
        self.sent.append((channel_id, data))
        self.buffered[channel_id] = self.buffered.get(channel_id, 0) + len(data)

    def open(self, label: str, *, protocol: str, ordered: bool, max_retransmits: int | None,
             max_packet_lifetime_ms: int | None, negotiated_id: int | None) -> ChannelInfo:
        cid = negotiated_id if negotiated_id is not None else self.next_id
        self.next_id += 2
        return ChannelInfo(cid, label, protocol, ordered, max_retransmits,
                           max_packet_lifetime_ms, negotiated_id is not None)

    def close(self, channel_id: int) -> None:
        self.closed.append(channel_id)

    def buffered_amount(self, channel_id: int) -> int:
        return self.buffered.get(channel_id, 0)


def make(**kw: int) -> tuple[AgentHost, AgentContext, MemoryPort]:
    host = AgentHost()
    host.channels = ChannelHub(**kw)
    port = MemoryPort()
    host.channels.port = port
    return host, AgentContext(host, AgentIdentity("test", "s1")), port


CHAT = ChannelInfo(0, "chat")


async def test_events_arrive_in_order_and_track_open_channels() -> None:
    host, ctx, _ = make()
    host.channels.push(ChannelOpened(CHAT))
    host.channels.push(ChannelMessage(0, "chat", "hi"))
    host.channels.push(ChannelMessage(0, "chat", b"\x00\x01"))
    host.channels.push(ChannelMessage(0, "chat", ""))
    assert ctx.channels == {0: CHAT}
    host.channels.push(ChannelClosed(0, "chat"))
    assert ctx.channels == {}
    host.close("done")
    got = [e async for e in ctx.channel_events()]
    assert got == [ChannelOpened(CHAT), ChannelMessage(0, "chat", "hi"),
                   ChannelMessage(0, "chat", b"\x00\x01"), ChannelMessage(0, "chat", ""),
                   ChannelClosed(0, "chat")]
    stats = host.channels.stats()
    assert (stats["messages_in"], stats["bytes_in"], stats["messages_dropped"]) == (3, 4, 0)


async def test_an_agent_that_does_not_read_loses_the_oldest_messages_only() -> None:
    """Bounded by count and by bytes; opened/closed events are never dropped."""
    host, ctx, _ = make(max_events=8, max_inbound_bytes=1000)
    host.channels.push(ChannelOpened(CHAT))
    for i in range(20):
        host.channels.push(ChannelMessage(0, "chat", f"{i:03d}"))
    for _ in range(3):
        host.channels.push(ChannelMessage(0, "chat", bytes(400)))  # bytes bound too
    host.close("done")
    got = [e async for e in ctx.channel_events()]
    assert got[0] == ChannelOpened(CHAT)
    msgs = [e.data for e in got if isinstance(e, ChannelMessage)]
    assert msgs == [bytes(400), bytes(400)]  # 3 x 400 > 1000: the first of them went too
    assert host.channels.messages_dropped == 21


async def test_send_by_id_or_label_and_counts() -> None:
    host, ctx, port = make()
    host.channels.push(ChannelOpened(CHAT))
    await ctx.send_message("chat", "hello")
    await ctx.send_message(0, b"\xff")
    assert port.sent == [(0, "hello"), (0, b"\xff")]
    assert (host.channels.messages_out, host.channels.bytes_out) == (2, 6)
    assert ctx.buffered_amount("chat") == 6


async def test_send_waits_while_the_channel_is_over_its_high_water_mark(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, ctx, port = make(high_water=100)
    host.channels.push(ChannelOpened(CHAT))
    done = trio.Event()

    async def sender() -> None:
        await ctx.send_message(0, b"x" * 150)  # queued at once, then over the mark
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(1)
        assert port.sent == [(0, b"x" * 150)] and not done.is_set()
        port.buffered[0] = 120
        host.channels.buffered_low(0)  # still above: keeps waiting
        await trio.sleep(1)
        assert not done.is_set()
        port.buffered[0] = 40
        host.channels.buffered_low(0)
        await done.wait()


async def test_a_waiting_sender_learns_the_call_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, ctx, _ = make(high_water=10)
    host.channels.push(ChannelOpened(CHAT))
    async with trio.open_nursery() as nursery:

        async def sender() -> None:
            with pytest.raises(ChannelError, match="ended"):
                await ctx.send_message(0, b"x" * 50)

        nursery.start_soon(sender)
        await trio.sleep(1)
        host.close("hangup")


async def test_errors_name_the_problem() -> None:
    host, ctx, _ = make()
    with pytest.raises(ChannelError, match="no open data channel 'nope'"):
        await ctx.send_message("nope", "x")
    host.channels.push(ChannelOpened(CHAT))
    with pytest.raises(ChannelError, match="exceeds"):
        await ctx.send_message(0, b"x" * (MAX_MESSAGE_BYTES + 1))
    with pytest.raises(TypeError):
        ctx.send_message_nowait(0, 42)  # type: ignore[arg-type]
    with pytest.raises(ChannelError, match="exclusive"):
        ctx.open_channel("x", max_retransmits=1, max_packet_lifetime_ms=5)
    no_port = AgentHost()
    nctx = AgentContext(no_port, AgentIdentity("t", "s"))
    no_port.channels.push(ChannelOpened(CHAT))
    with pytest.raises(ChannelError, match="no data channels"):
        nctx.send_message_nowait(0, "x")


async def test_open_and_close_go_through_the_port() -> None:
    _, ctx, port = make()
    info = ctx.open_channel("events", ordered=False, max_retransmits=0)
    assert info == ChannelInfo(1, "events", "", False, 0, None, False)
    assert ctx.channels[1] == info
    pre = ctx.open_channel("oai-events", negotiated_id=4)
    assert pre.negotiated and pre.id == 4
    ctx.close_channel("events")
    assert port.closed == [1]


async def test_echo_agent_echoes_messages_on_their_channel() -> None:
    host, ctx, port = make()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo, ctx)
        host.channels.push(ChannelOpened(CHAT))
        host.channels.push(ChannelMessage(0, "chat", "ping"))
        host.channels.push(ChannelMessage(0, "chat", b""))
        while len(port.sent) < 2:
            await trio.testing.wait_all_tasks_blocked()
        host.close("done")
    assert port.sent == [(0, "ping"), (0, b"")]


def test_echo_channel_handler_is_synchronous() -> None:
    host, ctx, port = make()
    host.channels.push(ChannelOpened(CHAT))
    echo_channel(ctx, ChannelMessage(0, "chat", "x"))
    echo_channel(ctx, ChannelMessage(9, "gone", "y"))  # closed meanwhile: ignored
    echo_channel(ctx, ChannelOpened(CHAT))  # not a message: nothing sent
    assert port.sent == [(0, "x")]
