"""A local server speaking OpenAI's wire formats for the three endpoints the speech engines
use. A real Whisper / TTS / LLM server cannot be installed on this machine (no model
weights may be downloaded), so the answers are built from the official ``openai`` SDK's
own types (``Transcription``, ``ChatCompletionChunk``) and the tests also read them back
with the SDK's client: the format is OpenAI's, not ours.

* ``POST /v1/audio/transcriptions`` (multipart: ``file``, ``model``, ``response_format``):
  answers ``{"text": ...}`` with the text the test queued in :attr:`FakeOpenAI.transcripts`;
  records the upload;
* ``POST /v1/audio/speech`` (JSON): streams raw 24 kHz PCM16 (``response_format: pcm``), a
  1 kHz tone of 40 ms per input character, in odd-sized chunks;
* ``POST /v1/chat/completions`` with ``stream: true``: SSE ``data:`` chunks of the queued
  reply, a few characters each, then ``data: [DONE]``; or, when the test queued one in
  :attr:`FakeOpenAI.tool_calls`, ``delta.tool_calls`` chunks (id and name first, the
  arguments in pieces) and ``finish_reason: "tool_calls"``. With :attr:`FakeOpenAI.release`
  set, the stream pauses before the reply's last chunk until the test sets it, and notes
  the client's disconnect (``http.disconnect``) while paused.
* ``POST /v1/responses`` with ``stream: true`` (the Responses API, for GPT-Live's Responses
  delegation): ``event:`` / ``data:`` pairs as OpenAI sends them, each event validated by the
  SDK's ``ResponseStreamEvent`` union — ``response.created``, the queued reply as a message
  item (``output_text.delta`` pieces) or the queued tool calls as ``function_call`` items
  (``function_call_arguments.delta`` pieces), ``response.completed`` with usage. With
  :attr:`FakeOpenAI.has_responses` False it answers 404, as a chat-completions-only server
  (Ollama, llama.cpp) does; the chat stream then also sends a ``usage`` chunk when asked
  (``stream_options.include_usage``).

A missing or wrong ``Authorization: Bearer`` gets OpenAI's 401 error body.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from openai.types.audio import Transcription
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

KEY = "sk-test-not-a-real-key"


@dataclass
class Upload:
    fields: dict[str, str]
    filename: str
    content_type: str
    data: bytes


@dataclass
class FakeOpenAI:
    transcripts: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    tool_calls: list[list[dict[str, str]]] = field(default_factory=list)  # [{name, arguments}]
    uploads: list[Upload] = field(default_factory=list)
    speech_requests: list[dict[str, Any]] = field(default_factory=list)
    chat_requests: list[dict[str, Any]] = field(default_factory=list)
    responses_requests: list[dict[str, Any]] = field(default_factory=list)
    has_responses: bool = True  # False: /v1/responses is a 404 (a chat-only server)
    base_url: str = ""
    # Set by a test: the chat stream stops before its last content chunk, sets ``held`` and
    # waits for ``release`` (or the client's disconnect, which sets ``disconnected``).
    release: trio.Event | None = None
    held: trio.Event = field(default_factory=trio.Event)
    disconnected: trio.Event = field(default_factory=trio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("authorization") != f"Bearer {KEY}":
            await self._json(send, 401, {"error": {
                "message": "Incorrect API key provided.", "type": "invalid_request_error",
                "param": None, "code": "invalid_api_key"}})
            return
        path = scope["path"]
        if path == "/v1/audio/transcriptions":
            await self._transcribe(send, headers, body)
        elif path == "/v1/audio/speech":
            await self._speech(send, json.loads(body))
        elif path == "/v1/chat/completions":
            await self._chat(send, receive, json.loads(body))
        elif path == "/v1/responses" and self.has_responses:
            await self._responses(send, json.loads(body))
        else:
            await self._json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error", "param": None, "code": None}})

    async def _json(self, send: Any, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    async def _transcribe(self, send: Any, headers: dict[str, str], body: bytes) -> None:
        msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {headers['content-type']}\r\n\r\n".encode() + body)
        fields: dict[str, str] = {}
        upload = None
        for part in msg.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if part.get_filename():
                upload = Upload({}, part.get_filename(), part.get_content_type(), payload)
            else:
                fields[str(name)] = payload.decode()
        if upload is None or "model" not in fields:
            await self._json(send, 400, {"error": {"message": "file and model are required", "type": "invalid_request_error", "param": None, "code": None}})
            return
        upload.fields = fields
        self.uploads.append(upload)
        text = self.transcripts.pop(0) if self.transcripts else ""
        await self._json(send, 200, Transcription(text=text).model_dump(exclude_none=True))

    async def _speech(self, send: Any, req: dict[str, Any]) -> None:
        self.speech_requests.append(req)
        if req.get("response_format") != "pcm":
            await self._json(send, 400, {"error": {"message": "this fake speaks pcm only", "type": "invalid_request_error", "param": "response_format", "code": None}})
            return
        n = round(24_000 * 0.04 * len(req["input"]))
        tone = (8000 * np.sin(2 * np.pi * 1000 * np.arange(n) / 24_000)).astype("<i2").tobytes()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        for i in range(0, len(tone), 4801):  # odd sizes: samples split across chunks
            await send({"type": "http.response.body", "body": tone[i : i + 4801],
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _hold(self, receive: Any) -> bool:
        """Wait for :attr:`release`; False if the client went away first."""
        assert self.release is not None
        release = self.release
        self.held.set()
        gone = False
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                nonlocal gone
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone = True
                self.disconnected.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await release.wait()
            nursery.cancel_scope.cancel()
        return not gone

    async def _chat(self, send: Any, receive: Any, req: dict[str, Any]) -> None:
        self.chat_requests.append(req)
        calls = self.tool_calls.pop(0) if self.tool_calls else None
        reply = "" if calls else (self.replies.pop(0) if self.replies else "OK.")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        created = int(time.time())
        pieces = [reply[i : i + 7] for i in range(0, len(reply), 7)]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": p} for p in pieces]
        for n, call in enumerate(calls or ()):
            args = call["arguments"]
            deltas.append({"tool_calls": [{"index": n, "id": f"call_fake{n}", "type": "function",
                                           "function": {"name": call["name"], "arguments": ""}}]})
            deltas += [{"tool_calls": [{"index": n, "function": {"arguments": args[i : i + 5]}}]}
                       for i in range(0, len(args), 5)]
        for i, delta in enumerate(deltas):
            if self.release is not None and pieces and i == len(pieces) and not (
                    await self._hold(receive)):
                return  # deltas[len(pieces)] is the last content chunk
            chunk = ChatCompletionChunk.model_validate({
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created,
                "model": req.get("model", "?"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
            await send({"type": "http.response.body", "more_body": True,
                        "body": f"data: {chunk.model_dump_json(exclude_none=True)}\n\n".encode()})
            if i == 1:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n",
                            "more_body": True})
        last = ChatCompletionChunk.model_validate({
            "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created,
            "model": req.get("model", "?"),
            "choices": [{"index": 0, "delta": {},
                         "finish_reason": "tool_calls" if calls else "stop"}]})
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"data: {last.model_dump_json(exclude_none=True)}\n\n".encode()})
        if (req.get("stream_options") or {}).get("include_usage"):
            usage = ChatCompletionChunk.model_validate({
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": created,
                "model": req.get("model", "?"), "choices": [],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}})
            await send({"type": "http.response.body", "more_body": True, "body":
                        f"data: {usage.model_dump_json(exclude_none=True)}\n\n".encode()})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def _responses(self, send: Any, req: dict[str, Any]) -> None:
        self.responses_requests.append(req)
        calls = self.tool_calls.pop(0) if self.tool_calls else None
        reply = "" if calls else (self.replies.pop(0) if self.replies else "OK.")
        events: list[dict[str, Any]] = []
        response = {"id": f"resp_fake{len(self.responses_requests)}", "object": "response",
                    "created_at": int(time.time()), "model": req["model"],
                    "status": "in_progress", "output": [],
                    "instructions": req.get("instructions"), "tools": req.get("tools", []),
                    "tool_choice": req.get("tool_choice", "auto"),
                    "parallel_tool_calls": req.get("parallel_tool_calls", True)}

        def add(kind: str, **fields: Any) -> None:
            events.append({"type": kind, "sequence_number": len(events), **fields})

        add("response.created", response=dict(response))
        output: list[dict[str, Any]] = []
        if reply:
            item: dict[str, Any] = {"id": "msg_fake", "type": "message", "role": "assistant",
                                    "status": "in_progress", "content": []}
            add("response.output_item.added", output_index=0, item=dict(item))
            part = {"type": "output_text", "text": "", "annotations": []}
            add("response.content_part.added", item_id="msg_fake", output_index=0,
                content_index=0, part=part)
            for i in range(0, len(reply), 7):
                add("response.output_text.delta", item_id="msg_fake", output_index=0,
                    content_index=0, delta=reply[i : i + 7], logprobs=[])
            add("response.output_text.done", item_id="msg_fake", output_index=0,
                content_index=0, text=reply, logprobs=[])
            part = {**part, "text": reply}
            add("response.content_part.done", item_id="msg_fake", output_index=0,
                content_index=0, part=part)
            item.update(status="completed", content=[part])
            add("response.output_item.done", output_index=0, item=item)
            output.append(item)
        for n, call in enumerate(calls or ()):
            item = {"id": f"fc_fake{n}", "type": "function_call", "call_id": f"call_fake{n}",
                    "name": call["name"], "arguments": "", "status": "in_progress"}
            add("response.output_item.added", output_index=n, item=dict(item))
            args = call["arguments"]
            for i in range(0, len(args), 5):
                add("response.function_call_arguments.delta", item_id=item["id"],
                    output_index=n, delta=args[i : i + 5])
            add("response.function_call_arguments.done", item_id=item["id"], output_index=n,
                arguments=args)
            item.update(status="completed", arguments=args)
            add("response.output_item.done", output_index=n, item=item)
            output.append(item)
        add("response.completed", response={**response, "status": "completed", "output": output,
                                            "usage": {"input_tokens": 12, "output_tokens": 5,
                                                      "total_tokens": 17,
                                                      "input_tokens_details": {"cached_tokens": 0,
                                                                               "cache_write_tokens": 0},
                                                      "output_tokens_details": {
                                                          "reasoning_tokens": 0}}})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for event in events:
            model = _STREAM_EVENT.validate_python(event)  # OpenAI's shape, or the test fails
            data = f"event: {event['type']}\ndata: {model.model_dump_json(exclude_none=True)}\n\n"
            await send({"type": "http.response.body", "body": data.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})


_STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


@asynccontextmanager
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """The fake on a free loopback port; ``app.base_url`` is its ``…/v1``."""
    app = FakeOpenAI()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn owns (and closes) it now
    config.accesslog = None
    config.errorlog = None
    app.base_url = f"http://127.0.0.1:{port}/v1"
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(_serve, app, config, shutdown)
        try:
            yield app
        finally:
            shutdown.set()


async def _serve(app: FakeOpenAI, config: Config, shutdown: trio.Event,
                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    await serve(app, config, shutdown_trigger=shutdown.wait, task_status=task_status)  # type: ignore[arg-type]
