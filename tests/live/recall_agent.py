"""A RealtimeAgent that keeps every request it gets (``SEEN``, for a test to read) and
answers each with half a second of a 660 Hz tone and the words "Noted." (tests/live/
test_store.py: the recording's R channel, a fork's context)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import numpy as np

from appliance.realtime.interface import AudioDelta, Delta, ResponseRequest, TranscriptDelta

SEEN: list[ResponseRequest] = []


def tone48(seconds: float, hz: float = 660.0) -> bytes:
    t = np.arange(int(48_000 * seconds)) / 48_000
    return (np.sin(2 * math.pi * hz * t) * 8000).astype("<i2").tobytes()


class Recall:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        SEEN.append(request)
        yield TranscriptDelta("Noted.")
        yield AudioDelta(tone48(0.5))
