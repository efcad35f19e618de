"""Chatty parrot: the parrot (examples/parrot.py) that also talks over a data channel.

Open a channel labelled ``chat`` or ``events`` beside the audio (the demo page's "chat"
does) and the parrot

* announces every turn on it as JSON text, ``{"type": "turn", "state": "listening"}`` when
  the channel opens and whenever the caller has the floor again, ``"speaking"`` when it
  starts playing an utterance back (a barge-in sends ``"listening"`` at once);
* answers every typed message: text ``hello`` gets back ``Polly says: hello``.

    appliance up --agent examples/chatty_parrot.py:ChattyParrot
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from appliance.agents import AgentContext, ChannelError, ChannelMessage, ChannelOpened

sys.path.insert(0, str(Path(__file__).resolve().parent))  # loaded by path: find parrot.py
from parrot import Parrot  # noqa: E402

#: Channels the turn events go to (whichever of them the caller opened).
LABELS = ("chat", "events")


class ChattyParrot(Parrot):
    """One instance per session."""

    async def run(self, ctx: AgentContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.chat, ctx)
            await super().run(ctx)
            nursery.cancel_scope.cancel()

    async def chat(self, ctx: AgentContext) -> None:
        async for event in ctx.channel_events():
            if isinstance(event, ChannelOpened) and event.channel.label in LABELS:
                state = "speaking" if self.playback is not None else "listening"
                self.say(ctx, event.channel.id, {"type": "turn", "state": state})
            elif isinstance(event, ChannelMessage) and isinstance(event.data, str):
                try:
                    await ctx.send_message(event.channel_id, f"Polly says: {event.data}")
                except ChannelError:
                    pass  # the channel closed under us

    def turn(self, ctx: AgentContext, state: str) -> None:
        for info in list(ctx.channels.values()):
            if info.label in LABELS:
                self.say(ctx, info.id, {"type": "turn", "state": state})

    def say(self, ctx: AgentContext, channel_id: int, event: dict[str, str]) -> None:
        try:
            ctx.send_message_nowait(channel_id, json.dumps(event))
        except ChannelError:
            pass  # closed, or the association went away: a turn event is not worth more
