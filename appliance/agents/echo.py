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
"""

from __future__ import annotations

from .context import AgentContext, Frame

MAX_QUEUED = 0.060  # seconds of output queue above which an inbound frame is dropped


async def echo(ctx: AgentContext) -> None:
    async for frame in ctx.frames():
        if ctx.queued_seconds > MAX_QUEUED:
            continue
        await ctx.send(frame.pcm)


def echo_frame(ctx: AgentContext, frame: Frame) -> None:
    """:func:`echo` as a synchronous frame handler (what ``--agent echo`` runs)."""
    if ctx.queued_seconds <= MAX_QUEUED:
        ctx.send_nowait(frame.pcm)
