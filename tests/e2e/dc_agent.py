"""A test agent for the data-channel e2e tests: opens the pre-negotiated channel ``pre``
(id 10, no DCEP: the client opens the same id) before SCTP is even up, and echoes every
message on every channel with a prefix naming the channel, so the test knows it came
from the agent's side of that very channel. The text message ``close-me`` is not echoed:
the agent closes the channel it came on instead (a close from the server's side, RFC 8831
§6.7: our outgoing stream reset, which the browser answers with its own). The caller's
audio is echoed too (as the built-in echo does), so a test can see media flow beside
the channels."""

from __future__ import annotations

import trio

from appliance.agents import AgentContext, ChannelMessage
from appliance.agents.echo import MAX_QUEUED

CLOSE_ME = "close-me"


async def agent(ctx: AgentContext) -> None:
    ctx.open_channel("pre", negotiated_id=10)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo_frames, ctx)
        await _channels(ctx)
        nursery.cancel_scope.cancel()


async def echo_frames(ctx: AgentContext) -> None:
    async for frame in ctx.frames():
        if ctx.queued_seconds <= MAX_QUEUED:
            await ctx.send(frame.pcm)


async def _channels(ctx: AgentContext) -> None:
    async for event in ctx.channel_events():
        if isinstance(event, ChannelMessage):
            data = event.data
            if data == CLOSE_ME:
                ctx.close_channel(event.channel_id)
                continue
            reply = f"{event.label}:{data}" if isinstance(data, str) else data
            await ctx.send_message(event.channel_id, reply)
