"""The built-in ``echo`` agent: plays the caller's voice straight back.

Each frame is queued the moment it arrives, so the only buffering is the frame itself. The
pacer sends at exactly real time, so a burst of input (the network or the caller stalled,
then delivered several frames at once) would otherwise sit in the output queue for the rest
of the call as added latency; a frame arriving while more than ``MAX_QUEUED`` seconds are
already queued is dropped instead, which bounds the echo's delay.

The built-in ``echo`` runs as :func:`echo_frame`, a synchronous frame handler called by the
transceiver for each decoded frame (no agent task, no task switch per frame); :func:`echo`
is the same agent written as an ordinary async agent, for ``module:attr`` use and as the
example of the API.

Data-channel messages are echoed too, on the channel they came from, unchanged (text as
text, binary as binary): :func:`echo_channel` is the synchronous handler, and the async
:func:`echo` reads channel events beside its frames.
"""

from __future__ import annotations

import trio

from .channels import ChannelError, ChannelEvent, ChannelMessage
from .context import AgentContext, Frame

MAX_QUEUED = 0.060  # seconds of output queue above which an inbound frame is dropped


async def echo(ctx: AgentContext) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_echo_messages, ctx)
        async for frame in ctx.frames():
            if ctx.queued_seconds > MAX_QUEUED:
                continue
            await ctx.send(frame.pcm)
        nursery.cancel_scope.cancel()


async def _echo_messages(ctx: AgentContext) -> None:
    async for event in ctx.channel_events():
        if isinstance(event, ChannelMessage):
            try:
                await ctx.send_message(event.channel_id, event.data)
            except ChannelError:
                pass  # the channel closed (or the call ended) between the two


def echo_channel(ctx: AgentContext, event: ChannelEvent) -> None:
    """The synchronous channel handler: each message goes straight back where it came from."""
    if isinstance(event, ChannelMessage):
        try:
            ctx.send_message_nowait(event.channel_id, event.data)
        except ChannelError:
            pass  # closed meanwhile: nothing to echo to


def echo_frame(ctx: AgentContext, frame: Frame) -> None:
    """:func:`echo` as a synchronous frame handler (what ``--agent echo`` runs)."""
    if ctx.queued_seconds <= MAX_QUEUED:
        ctx.send_nowait(frame.pcm)
