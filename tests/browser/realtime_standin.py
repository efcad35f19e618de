"""A deliberately minimal stand-in for the ``realtime`` agent (rtevents' event state
machine), written against the TEAM.md contract so the client tests of
tests/browser/test_realtime_clients.py could be run before that agent was merged::

    APPLIANCE_TEST_REALTIME_AGENT=tests/browser/realtime_standin.py:agent pytest tests/browser/test_realtime_clients.py

The committed tests target the real ``realtime`` agent (the default); nothing uses this file
unless that variable names it. It speaks only the GA events those tests look at: on open
``session.created``; ``session.update`` -> ``session.updated``; a server-VAD turn
(``input_audio_buffer.speech_started`` / ``speech_stopped`` / ``committed``) answered by a
response that plays the turn's audio back (``response.created``,
``output_audio_buffer.started`` / ``stopped``, ``response.done``); and barge-in
(``output_audio_buffer.clear`` -> ``output_audio_buffer.cleared`` and
``conversation.item.truncated`` at what was played). Anything else gets an ``error``.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import trio

from appliance.agents import AgentContext, ChannelMessage, ChannelOpened
from appliance.agents.vad import EnergyVad

LABEL = "oai-events"


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class StandIn:
    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        rt = ctx.params.get("realtime") or {}
        self.session: dict[str, Any] = {"type": "realtime", "object": "realtime.session",
                                        "id": _id("sess"), **(rt.get("session") or {})}
        self.dcid = rt.get("dcid")
        self.channel: int | None = None
        self.turn: list[bytes] = []
        self.speaking = False
        self.playing: tuple[str, str, float, int] | None = None  # resp id, item id, t0, ms
        self.play_scope: trio.CancelScope | None = None

    async def send(self, event: dict[str, Any]) -> None:
        if self.channel is not None:
            await self.ctx.send_message(self.channel, json.dumps({"event_id": _id("event"), **event}))

    async def run(self) -> None:
        if self.dcid is not None:
            self.ctx.open_channel(LABEL, negotiated_id=int(self.dcid))
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.listen)
            async for event in self.ctx.channel_events():
                if isinstance(event, ChannelOpened) and event.channel.label == LABEL:
                    self.channel = event.channel.id
                    await self.send({"type": "session.created", "session": self.session})
                elif isinstance(event, ChannelMessage) and event.channel_id == self.channel:
                    await self.client_event(event.data)
            nursery.cancel_scope.cancel()

    async def client_event(self, data: str | bytes) -> None:
        try:
            ev = json.loads(data)
            kind = ev["type"]
        except (ValueError, KeyError, TypeError):
            await self.send({"type": "error", "error": {"type": "invalid_request_error",
                                                        "message": "not an event"}})
            return
        if kind == "session.update":
            self.session.update(ev.get("session") or {})
            await self.send({"type": "session.updated", "session": self.session})
        elif kind == "output_audio_buffer.clear":
            await self.barge_in()
        elif kind == "response.cancel":
            pass  # the clear that follows does the work
        elif kind == "conversation.item.retrieve":  # the SDK asks after a truncation
            await self.send({"type": "conversation.item.retrieved", "item": {
                "id": ev.get("item_id"), "object": "realtime.item", "type": "message",
                "role": "assistant", "status": "incomplete", "content": []}})
        else:
            await self.send({"type": "error", "error": {
                "type": "invalid_request_error", "code": "unsupported_event",
                "message": f"{kind} is not supported by the stand-in",
                "event_id": ev.get("event_id")}})

    async def listen(self) -> None:
        vad = EnergyVad()
        async for frame in self.ctx.frames():
            speech = vad.update(frame.pcm)
            if speech and not self.speaking and self.channel is not None:
                self.speaking, self.turn = True, []
                await self.send({"type": "input_audio_buffer.speech_started",
                                 "audio_start_ms": 0, "item_id": _id("item")})
            if self.speaking:
                self.turn.append(frame.pcm)
                if not speech:  # EnergyVad's hangover: 200 ms of silence ended the turn
                    self.speaking = False
                    await self.end_turn()

    async def end_turn(self) -> None:
        item = _id("item")
        await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 0,
                         "item_id": item})
        await self.send({"type": "input_audio_buffer.committed", "item_id": item,
                         "previous_item_id": None})
        pcm = b"".join(self.turn)
        resp, out_item = _id("resp"), _id("item")
        await self.send({"type": "response.created", "response": {
            "id": resp, "object": "realtime.response", "status": "in_progress", "output": []}})
        self.nursery.start_soon(self.play, resp, out_item, pcm)

    async def play(self, resp: str, item: str, pcm: bytes) -> None:
        ms = len(pcm) // 96  # 48 kHz mono PCM16: 96 bytes a millisecond
        self.playing = (resp, item, trio.current_time(), ms)
        await self.send({"type": "output_audio_buffer.started", "response_id": resp})
        with trio.CancelScope() as scope:
            self.play_scope = scope
            await self.ctx.send(pcm)
            await self.ctx.drained()
            await trio.sleep(0.1)  # the last frame leaves the pacer, then it is "played"
        if scope.cancelled_caught:
            return
        self.playing = None
        await self.send({"type": "output_audio_buffer.stopped", "response_id": resp})
        await self.send({"type": "response.done", "response": {
            "id": resp, "object": "realtime.response", "status": "completed",
            "output": [{"id": item, "type": "message", "role": "assistant"}],
            "usage": {"total_tokens": 0, "input_tokens": 0, "output_tokens": 0}}})

    async def barge_in(self) -> None:
        if self.playing is None:
            await self.send({"type": "output_audio_buffer.cleared", "response_id": None})
            return
        resp, item, t0, ms = self.playing
        self.playing = None
        if self.play_scope is not None:
            self.play_scope.cancel()
        self.ctx.interrupt()
        played = min(ms, int((trio.current_time() - t0) * 1000))
        await self.send({"type": "output_audio_buffer.cleared", "response_id": resp})
        await self.send({"type": "conversation.item.truncated", "item_id": item,
                         "content_index": 0, "audio_end_ms": played})
        await self.send({"type": "response.done", "response": {
            "id": resp, "object": "realtime.response", "status": "cancelled", "output": []}})


async def agent(ctx: AgentContext) -> None:
    await StandIn(ctx).run()
