"""The built-in echo realtime agent (``--agent realtime``): each user turn's audio played
back with a transcript such as ``"(echo, 1.4 s)"``; a text turn answered with its text."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .interface import AudioDelta, Delta, ResponseRequest, TextDelta, TranscriptDelta

CHUNK_BYTES = 9_600  # 100 ms at 48 kHz: the granularity at which a cancel takes effect


class EchoRealtime:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        turn = request.turn
        if turn is None:
            return
        if turn.text is not None and not turn.audio:
            yield TextDelta(turn.text)
            return
        yield TranscriptDelta(f"(echo, {turn.seconds:.1f} s)")
        for i in range(0, len(turn.audio), CHUNK_BYTES):
            yield AudioDelta(turn.audio[i : i + CHUNK_BYTES])
