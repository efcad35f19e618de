"""A small OpenAI-Realtime **WebSocket** server, the one stand-in of the bridge tests (the real
upstream is an external service). It is strict where the bridge could go wrong:

* every client event it receives is checked against :data:`CLIENT_EVENTS`, a table of the
  GA reference's client events (openai-python ``types/realtime/*_event.py``; the GA guide):
  required fields and their types, no unknown fields (the API answers "Unknown parameter"),
  no retired beta spellings (``modalities``, ``input_audio_format``, ``voice`` at the top of
  the session…), ``session.type == "realtime"``, audio formats ``audio/pcm`` at 24000,
  base64 audio of whole PCM16 samples, truncation inside the audio actually sent for an
  assistant item. WebRTC-only events (``output_audio_buffer.clear``) are violations on a
  WebSocket. Anything wrong lands in :attr:`Upstream.violations` (tests assert it is empty)
  and is answered with an ``error`` event, as the API does;
* it answers as the API does: ``session.created`` on connect, ``session.update`` →
  ``session.updated``, a server-VAD turn on the appended audio (``speech_started`` /
  ``speech_stopped`` / ``committed``, the user item) followed by a response with audio
  deltas (a tone, faster than real time as the API sends it), transcript, ``response.done``;
  ``response.create`` after a text item does the same; truncate → ``truncated``.

Run alone: ``python tests/realtime/rt_server.py --port 0`` prints ``listening on ws://…``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    serve_websocket,
)

RATE = 24_000
PCM = {"type": "audio/pcm", "rate": RATE}
OPT = object()  # marker: the field may be absent

# type -> {field: (types, required)}; "event_id" is optional on every client event.
CLIENT_EVENTS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "session.update": {"session": ((dict,), True)},
    "input_audio_buffer.append": {"audio": ((str,), True)},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "conversation.item.create": {"item": ((dict,), True),
                                 "previous_item_id": ((str, type(None)), False)},
    "conversation.item.retrieve": {"item_id": ((str,), True)},
    "conversation.item.truncate": {"item_id": ((str,), True), "content_index": ((int,), True),
                                   "audio_end_ms": ((int,), True)},
    "conversation.item.delete": {"item_id": ((str,), True)},
    "response.create": {"response": ((dict,), False)},
    "response.cancel": {"response_id": ((str,), False)},
}
#: Client events of the WebRTC/SIP surface only: a WebSocket client must not send them.
WEBRTC_ONLY = {"output_audio_buffer.clear"}
#: GA session fields (RealtimeSessionCreateRequest); the beta ones are named for the message.
SESSION_FIELDS = {"type", "audio", "include", "instructions", "max_output_tokens", "model",
                  "output_modalities", "prompt", "tool_choice", "tools", "tracing",
                  "truncation", "reasoning", "parallel_tool_calls"}
BETA_SESSION_FIELDS = {"modalities", "input_audio_format", "output_audio_format", "voice",
                       "turn_detection", "input_audio_transcription", "temperature",
                       "max_response_output_tokens", "input_audio_noise_reduction", "speed"}


def check_client_event(event: Any, sent_audio_ms: dict[str, int]) -> list[str]:
    """Why ``event`` is not a valid GA client event (empty: it is)."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return ["not a JSON object with a string type"]
    kind = event["type"]
    if kind in WEBRTC_ONLY:
        return [f"{kind} is WebRTC/SIP-only, not for a WebSocket"]
    schema = CLIENT_EVENTS.get(kind)
    if schema is None:
        return [f"unknown client event {kind!r}"]
    bad = []
    for name in event.keys() - schema.keys() - {"type", "event_id"}:
        bad.append(f"{kind}: unknown parameter {name!r}")
    if "event_id" in event and not isinstance(event["event_id"], str):
        bad.append(f"{kind}: event_id must be a string")
    for name, (types, required) in schema.items():
        if name not in event:
            if required:
                bad.append(f"{kind}: missing {name!r}")
            continue
        value = event[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            bad.append(f"{kind}: {name!r} has type {type(value).__name__}")
    if bad:
        return bad
    if kind == "session.update":
        bad += _check_session(event["session"])
    elif kind == "input_audio_buffer.append":
        try:
            pcm = base64.b64decode(event["audio"], validate=True)
        except (binascii.Error, ValueError):
            return [f"{kind}: audio is not base64"]
        if len(pcm) % 2 or not pcm:
            bad.append(f"{kind}: {len(pcm)} bytes is not whole PCM16 samples")
    elif kind == "conversation.item.truncate":
        item, ms = event["item_id"], event["audio_end_ms"]
        if item not in sent_audio_ms:
            bad.append(f"{kind}: {item!r} is not an assistant audio item")
        elif not 0 <= ms <= sent_audio_ms[item]:
            bad.append(f"{kind}: audio_end_ms {ms} outside 0..{sent_audio_ms[item]}")
        if event["content_index"] != 0:
            bad.append(f"{kind}: content_index must be 0")
    return bad


def _check_session(session: dict[str, Any]) -> list[str]:
    bad = []
    if session.get("type") != "realtime":
        bad.append(f"session.update: session.type must be 'realtime', got {session.get('type')!r}")
    for name in session.keys() - SESSION_FIELDS:
        what = "a retired beta field" if name in BETA_SESSION_FIELDS else "unknown"
        bad.append(f"session.update: session.{name} is {what}")
    audio = session.get("audio", {})
    if not isinstance(audio, dict):
        return [*bad, "session.update: session.audio must be an object"]
    for way in ("input", "output"):
        fmt = (audio.get(way) or {}).get("format")
        if fmt is not None and fmt != PCM:
            bad.append(f"session.update: audio.{way}.format {fmt!r} is not {PCM}")
    return bad


def tone(seconds: float, freq: float = 1000.0) -> bytes:
    t = np.arange(int(seconds * RATE)) / RATE
    return (np.sin(2 * np.pi * freq * t) * 12_000).astype("<i2").tobytes()


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass
class Upstream:
    """Server state, shared by its connections (tests normally make one)."""

    reply_seconds: float = 1.0  # audio in each response
    delta_ms: int = 100  # audio per response.output_audio.delta
    reply_freq: float = 1000.0
    pace: float = 0.0  # seconds between deltas (0: all at once, faster than real time)
    reject_status: int | None = None  # refuse every handshake with this HTTP status
    refuse_update: bool = False  # answer every session.update with an error
    headers: list[dict[str, str]] = field(default_factory=list)  # each handshake's headers
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    appended: bytearray = field(default_factory=bytearray)  # all input audio, 24 kHz PCM16
    sessions: list[dict[str, Any]] = field(default_factory=list)  # session after each update
    connections: list[WebSocketConnection] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)
    sent_audio_ms: dict[str, int] = field(default_factory=dict)  # item id -> ms sent

    def kinds(self) -> list[str]:
        return [e["type"] for _, e in self.received]

    def _poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, cond: Any) -> None:
        """Until ``cond()`` is true (the test bounds it with its own timeout)."""
        while not cond():
            await self.changed.wait()

    async def handle(self, request: WebSocketRequest) -> None:
        self.headers.append({k.decode().lower(): v.decode() for k, v in request.headers})
        if self.reject_status is not None:
            await request.reject(self.reject_status, body=b'{"error": "no"}')
            return
        ws = await request.accept()
        self.connections.append(ws)
        await Conn(self, ws).run()

    async def disconnect(self, code: int = 1011, reason: str = "going away") -> None:
        for ws in self.connections:
            await ws.aclose(code, reason)


class Conn:
    """One upstream WebSocket session."""

    def __init__(self, up: Upstream, ws: WebSocketConnection) -> None:
        self.up, self.ws = up, ws
        self.session: dict[str, Any] = {
            "type": "realtime", "object": "realtime.session", "id": _id("sess"),
            "model": "x", "output_modalities": ["audio"], "instructions": "",
            "audio": {"input": {"format": dict(PCM), "transcription": None,
                                "noise_reduction": None,
                                "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                                   "prefix_padding_ms": 300,
                                                   "silence_duration_ms": 300,
                                                   "create_response": True,
                                                   "interrupt_response": True}},
                      "output": {"format": dict(PCM), "voice": "alloy", "speed": 1.0}},
        }
        self.speaking = False
        self.silent_ms = 0
        self.buffer_ms = 0
        self.conversation: list[str] = []
        self.active: str | None = None  # the response being generated
        self.cancelled = False

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_message(json.dumps({"event_id": _id("event"), **event}))

    async def run(self) -> None:
        await self.send({"type": "session.created", "session": self.session})
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await self._serve()
            nursery.cancel_scope.cancel()

    async def _serve(self) -> None:
        try:
            while True:
                msg = await self.ws.get_message()
                event = json.loads(msg) if isinstance(msg, str) else None
                self.up.received.append((trio.current_time(), event))
                bad = check_client_event(event, self.up.sent_audio_ms)
                self.up.violations += bad
                self.up._poke()
                if bad:
                    await self.send({"type": "error", "error": {
                        "type": "invalid_request_error", "code": "invalid_event",
                        "message": "; ".join(bad), "param": None,
                        "event_id": event.get("event_id") if isinstance(event, dict) else None}})
                    continue
                assert isinstance(event, dict)
                await getattr(self, "on_" + event["type"].replace(".", "_"))(event)
        except ConnectionClosed:
            return

    # -- client events ---------------------------------------------------------------------

    async def on_session_update(self, event: dict[str, Any]) -> None:
        if self.up.refuse_update:
            await self.send({"type": "error", "error": {
                "type": "invalid_request_error", "code": "unsupported", "param": "session",
                "message": "this server takes no session.update",
                "event_id": event.get("event_id")}})
            return
        new = event["session"]
        for k, v in new.items():
            if k == "audio":
                for way, leg in v.items():
                    self.session["audio"][way].update(leg)
            else:
                self.session[k] = v
        self.up.sessions.append(json.loads(json.dumps(self.session)))
        await self.send({"type": "session.updated", "session": self.session})

    async def on_input_audio_buffer_append(self, event: dict[str, Any]) -> None:
        pcm = base64.b64decode(event["audio"])
        self.up.appended += pcm
        x = np.frombuffer(pcm, "<i2").astype(np.float64)
        loud = float(np.sqrt(np.mean(x * x))) > 800
        ms = len(x) * 1000 // RATE
        self.buffer_ms += ms
        td = self.session["audio"]["input"]["turn_detection"]
        if td is None:
            return
        if loud and not self.speaking:
            self.speaking, self.silent_ms = True, 0
            self.item = _id("item")
            await self.send({"type": "input_audio_buffer.speech_started",
                             "audio_start_ms": self.buffer_ms - ms, "item_id": self.item})
        elif self.speaking:
            self.silent_ms = 0 if loud else self.silent_ms + ms
            if self.silent_ms >= td["silence_duration_ms"]:
                self.speaking = False
                await self.send({"type": "input_audio_buffer.speech_stopped",
                                 "audio_end_ms": self.buffer_ms, "item_id": self.item})
                await self._commit(self.item)
                if td.get("create_response", True):
                    self.nursery.start_soon(self._respond)

    async def _commit(self, item_id: str) -> None:
        prev = self.conversation[-1] if self.conversation else None
        await self.send({"type": "input_audio_buffer.committed", "previous_item_id": prev,
                         "item_id": item_id})
        item = {"id": item_id, "type": "message", "object": "realtime.item",
                "status": "completed", "role": "user",
                "content": [{"type": "input_audio", "transcript": None}]}
        self.conversation.append(item_id)
        await self.send({"type": "conversation.item.added", "previous_item_id": prev,
                         "item": item})
        await self.send({"type": "conversation.item.done", "previous_item_id": prev,
                         "item": item})

    async def on_input_audio_buffer_commit(self, event: dict[str, Any]) -> None:
        await self._commit(_id("item"))

    async def on_input_audio_buffer_clear(self, event: dict[str, Any]) -> None:
        await self.send({"type": "input_audio_buffer.cleared"})

    async def on_conversation_item_create(self, event: dict[str, Any]) -> None:
        item = {"id": _id("item"), "object": "realtime.item", "status": "completed",
                **event["item"]}
        prev = self.conversation[-1] if self.conversation else None
        self.conversation.append(item["id"])
        await self.send({"type": "conversation.item.added", "previous_item_id": prev,
                         "item": item})
        await self.send({"type": "conversation.item.done", "previous_item_id": prev,
                         "item": item})

    async def on_conversation_item_retrieve(self, event: dict[str, Any]) -> None:
        await self.send({"type": "conversation.item.retrieved",
                         "item": {"id": event["item_id"], "type": "message"}})

    async def on_conversation_item_delete(self, event: dict[str, Any]) -> None:
        await self.send({"type": "conversation.item.deleted", "item_id": event["item_id"]})

    async def on_conversation_item_truncate(self, event: dict[str, Any]) -> None:
        await self.send({"type": "conversation.item.truncated", "item_id": event["item_id"],
                         "content_index": 0, "audio_end_ms": event["audio_end_ms"]})

    async def on_response_create(self, event: dict[str, Any]) -> None:
        self.nursery.start_soon(self._respond)

    async def on_response_cancel(self, event: dict[str, Any]) -> None:
        if self.active is not None and not self.cancelled:
            self.cancelled = True  # _respond ends it with status "cancelled"
            return
        await self.send({"type": "error", "error": {
            "type": "invalid_request_error", "code": "response_cancel_not_active",
            "message": "Cancellation failed: no active response found", "param": None,
            "event_id": event.get("event_id")}})

    # -- a response ------------------------------------------------------------------------

    async def _respond(self) -> None:
        if self.active is not None:
            await self.send({"type": "error", "error": {
                "type": "invalid_request_error", "code": "conversation_already_has_active_response",
                "message": "a response is in progress", "param": None, "event_id": None}})
            return
        rid, item_id = _id("resp"), _id("item")
        self.active, self.cancelled = rid, False
        base = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        resp = {"object": "realtime.response", "id": rid, "status": "in_progress",
                "output": [], "usage": None}
        await self.send({"type": "response.created", "response": resp})
        item = {"id": item_id, "type": "message", "object": "realtime.item",
                "status": "in_progress", "role": "assistant", "content": []}
        await self.send({"type": "response.output_item.added", "response_id": rid,
                         "output_index": 0, "item": item})
        await self.send({"type": "conversation.item.added", "item": item})
        await self.send({"type": "response.content_part.added", **base,
                         "part": {"type": "audio", "transcript": ""}})
        pcm = tone(self.up.reply_seconds, self.up.reply_freq)
        step = RATE * self.up.delta_ms // 1000 * 2
        self.up.sent_audio_ms[item_id] = 0
        for i in range(0, len(pcm), step):
            if self.cancelled:
                break
            chunk = pcm[i : i + step]
            await self.send({"type": "response.output_audio.delta", **base,
                             "delta": base64.b64encode(chunk).decode()})
            self.up.sent_audio_ms[item_id] += len(chunk) * 1000 // (2 * RATE)
            if self.up.pace:
                await trio.sleep(self.up.pace)  # a model generating at its own speed
        if self.cancelled:
            self.active = None
            await self.send({"type": "response.done", "response": {
                **resp, "status": "cancelled", "usage": None}})
            return
        transcript = f"(tone, {self.up.reply_seconds:.1f} s)"
        await self.send({"type": "response.output_audio_transcript.delta", **base,
                         "delta": transcript})
        await self.send({"type": "response.output_audio.done", **base})
        await self.send({"type": "response.output_audio_transcript.done", **base,
                         "transcript": transcript})
        part = {"type": "audio", "transcript": transcript}
        await self.send({"type": "response.content_part.done", **base, "part": part})
        done_item = {**item, "status": "completed", "content": [
            {"type": "output_audio", "transcript": transcript}]}
        await self.send({"type": "response.output_item.done", "response_id": rid,
                         "output_index": 0, "item": done_item})
        await self.send({"type": "conversation.item.done", "item": done_item})
        self.conversation.append(item_id)
        self.active = None
        await self.send({"type": "response.done", "response": {
            **resp, "status": "completed", "output": [done_item],
            "usage": {"total_tokens": 10, "input_tokens": 5, "output_tokens": 5}}})


@asynccontextmanager
async def serving(up: Upstream | None = None) -> AsyncIterator[tuple[Upstream, int]]:
    """Serve on 127.0.0.1, an ephemeral port; yields the state and the port."""
    up = up or Upstream()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve_websocket, up.handle, "127.0.0.1", 0, ssl_context=None))
        yield up, server.port
        nursery.cancel_scope.cancel()


async def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    up = Upstream()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve_websocket, up.handle, "127.0.0.1", args.port, ssl_context=None))
        print(f"listening on ws://127.0.0.1:{server.port}/v1/realtime", flush=True)


if __name__ == "__main__":
    trio.run(_main)
