"""Parrot: records what you say until ~600 ms of silence, then says it back.

Turn taking and barge-in in one page: speaking while the parrot talks stops it at once
(interrupt()) and starts a new recording.

    appliance transceiver --secret-file secret --agent examples/parrot.py:Parrot
"""

from __future__ import annotations

from collections import deque

import trio

from appliance.agents import AgentContext, Frame

SILENCE_FRAMES = 30  # 600 ms of frames without speech ends an utterance
PREROLL_FRAMES = 5  # keep 100 ms before the VAD fired: onsets are quiet
MAX_FRAMES = 50 * 30  # never record more than 30 s


class Parrot:
    """One instance per session."""

    def __init__(self) -> None:
        self.preroll: deque[Frame] = deque(maxlen=PREROLL_FRAMES)
        self.utterance: list[Frame] = []
        self.silent = 0
        self.playback: trio.CancelScope | None = None

    async def run(self, ctx: AgentContext) -> None:
        async with trio.open_nursery() as nursery:
            async for frame in ctx.frames():
                if frame.speech and self.playback is not None:
                    self.stop(ctx)  # barge-in: the caller talks over us
                if self.utterance:
                    self.utterance.append(frame)
                    self.silent = 0 if frame.speech else self.silent + 1
                    if self.silent >= SILENCE_FRAMES or len(self.utterance) >= MAX_FRAMES:
                        speech = self.utterance[: len(self.utterance) - self.silent]
                        self.utterance = []
                        self.playback = trio.CancelScope()
                        self.turn(ctx, "speaking")
                        nursery.start_soon(self.play, ctx, b"".join(f.pcm for f in speech),
                                           self.playback)
                elif frame.speech:
                    self.utterance = [*self.preroll, frame]
                    self.silent = 0
                else:
                    self.preroll.append(frame)
            nursery.cancel_scope.cancel()

    async def play(self, ctx: AgentContext, pcm: bytes, scope: trio.CancelScope) -> None:
        with scope:
            await ctx.send(pcm)  # returns once queued; waits while the 2 s queue is full
            await ctx.drained()
        if self.playback is scope:
            self.playback = None
            self.turn(ctx, "listening")

    def stop(self, ctx: AgentContext) -> None:
        ctx.interrupt()  # drops the queued audio, and the unsent rest of send()
        if self.playback is not None:
            self.playback.cancel()
            self.playback = None
            self.turn(ctx, "listening")

    def turn(self, ctx: AgentContext, state: str) -> None:
        """The turn changed hands ("speaking": the parrot talks, "listening": the caller
        may). A hook for subclasses (examples/chatty_parrot.py announces it)."""
