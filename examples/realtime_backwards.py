"""A RealtimeAgent: answers each spoken turn with it played backwards, and text reversed.

    appliance up --agent realtime:examples/realtime_backwards.py:Backwards

then point an OpenAI Realtime client at the appliance (docs/realtime.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from appliance.realtime.interface import AudioDelta, Delta, ResponseRequest, TranscriptDelta


class Backwards:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        turn = request.turn
        if turn is None:
            return
        if turn.text is not None and not turn.audio:
            yield TranscriptDelta(turn.text[::-1])  # a text turn: its text, reversed
            return
        yield TranscriptDelta(f"(backwards, {turn.seconds:.1f} s)")
        samples = np.frombuffer(turn.audio, "<i2")[::-1]
        for i in range(0, len(samples), 4800):  # 100 ms a piece: a cancel cuts quickly
            yield AudioDelta(samples[i : i + 4800].tobytes())
