"""A test agent for the data-channel e2e test: opens the pre-negotiated channel ``pre``
(id 10, no DCEP: the client opens the same id) before SCTP is even up, and echoes every
message on every channel with a prefix naming the channel, so the test knows it came
from the agent's side of that very channel."""

from __future__ import annotations

from appliance.agents import AgentContext, ChannelMessage


async def agent(ctx: AgentContext) -> None:
    ctx.open_channel("pre", negotiated_id=10)
    async for event in ctx.channel_events():
        if isinstance(event, ChannelMessage):
            data = event.data
            reply = f"{event.label}:{data}" if isinstance(data, str) else data
            await ctx.send_message(event.channel_id, reply)
