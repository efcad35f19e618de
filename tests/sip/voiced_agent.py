"""A Realtime agent with a voice of its own for the Live SIP tests: it answers no turn,
and speaks a commentary (appliance/live/agent.py ``say``) as its text and 300 ms of a
440 Hz tone, so a sideband sees ``session.output_transcript.delta`` and
``session.output_audio.delta`` with their timeline span. Loaded as
``realtime:path/voiced_agent.py:VoicedAgent``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from appliance.realtime.interface import AudioDelta, Delta, ResponseRequest, TranscriptDelta

TONE = (8000 * np.sin(2 * np.pi * 440 * np.arange(48_000 * 3 // 10) / 48_000)).astype("<i2")


class VoicedAgent:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        return
        yield  # an async generator that says nothing: no turn of the caller is answered

    async def say(self, text: str) -> AsyncIterator[Delta]:
        yield TranscriptDelta(text)
        yield AudioDelta(TONE.tobytes())
