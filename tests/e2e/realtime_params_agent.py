"""A test agent for the per-call parameters plumbing (issue 17, TEAM.md contract): it reports
``ctx.params`` on the ``oai-events`` channel, which it opens itself as pre-negotiated when
``params["realtime"]["dcid"]`` is set (RFC 8832 §6: no DCEP, the client opens the same id)
and otherwise waits for the client's DCEP channel of that label. The report is sent once
the channel is open, then again for every message received (so a test can also check the
channel carries traffic both ways). The caller's audio is echoed back, so media flows too."""

from __future__ import annotations

import json

import trio

from appliance.agents import AgentContext, ChannelMessage, ChannelOpened
from appliance.agents.echo import MAX_QUEUED

LABEL = "oai-events"


async def agent(ctx: AgentContext) -> None:
    realtime = ctx.params.get("realtime") or {}
    if realtime.get("dcid") is not None:
        ctx.open_channel(LABEL, negotiated_id=int(realtime["dcid"]))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_echo_frames, ctx)
        await _report(ctx)
        nursery.cancel_scope.cancel()


def _report_text(ctx: AgentContext, channel_id: int, negotiated: bool) -> str:
    return json.dumps({"type": "params", "session_id": ctx.session_id, "params": ctx.params,
                       "channel": {"id": channel_id, "negotiated": negotiated}})


async def _report(ctx: AgentContext) -> None:
    async for event in ctx.channel_events():
        if isinstance(event, ChannelOpened) and event.channel.label == LABEL:
            await ctx.send_message(event.channel.id,
                                   _report_text(ctx, event.channel.id, event.channel.negotiated))
        elif isinstance(event, ChannelMessage) and event.label == LABEL:
            info = ctx.channels.get(event.channel_id)
            await ctx.send_message(event.channel_id, _report_text(
                ctx, event.channel_id, bool(info and info.negotiated)))


async def _echo_frames(ctx: AgentContext) -> None:
    async for frame in ctx.frames():
        if ctx.queued_seconds <= MAX_QUEUED:
            await ctx.send(frame.pcm)
