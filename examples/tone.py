"""Tone: answers with a 660 Hz tone while you speak, and stops the moment you stop.

Shows the "speech likely" flag and interrupt():

    appliance transceiver --secret-file secret --agent examples/tone.py:tone
"""

from __future__ import annotations

import numpy as np

from appliance.agents import FRAME_SAMPLES, SAMPLE_RATE, AgentContext

FREQ = 660.0
AMPLITUDE = 8000


async def tone(ctx: AgentContext) -> None:
    phase = 0  # in samples, so consecutive frames join without clicks
    async for frame in ctx.frames():
        if frame.speech:
            t = (np.arange(FRAME_SAMPLES) + phase) / SAMPLE_RATE
            phase += FRAME_SAMPLES
            pcm = (np.sin(2 * np.pi * FREQ * t) * AMPLITUDE).astype("<i2").tobytes()
            await ctx.send(pcm)
        elif ctx.queued_seconds:
            ctx.interrupt()  # you stopped talking: so do we
