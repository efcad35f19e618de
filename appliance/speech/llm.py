"""Who answers the assistant: an OpenAI-compatible chat endpoint, or a built-in responder.

A :class:`Responder` turns the conversation so far into reply text, streamed as chunks:
``await responder.reply(history, out)`` calls ``out(chunk)`` (synchronously: a memory
channel's ``send_nowait``) as text arrives. Push, not an async generator: an httpx stream
left half-read by a consumer that stops early (barge-in) leaves httpx's nested generators
unfinalised, while cancelling ``reply`` itself ends them at the socket read.
:func:`sentences` regroups the chunks into sentences, so the assistant can speak the first
while the rest is still coming.

* :class:`ChatCompletions`: ``POST {base_url}/chat/completions`` with ``stream: true``
  (Server-Sent Events, ``data: {...}`` lines, ``data: [DONE]``), reading
  ``choices[0].delta.content``. Works with OpenAI, Ollama (``http://host:11434/v1``),
  llama.cpp's server, vLLM, LocalAI. Tools (``tools=``, chat-completions' format) are
  passed on; a tool call in the stream (``delta.tool_calls``, assembled by ``index``) is
  handed to ``on_tool_call`` as a :class:`ToolCall`, never executed here: the Realtime
  assistant turns it into a ``function_call`` item for the client to run.
* :class:`BuiltinResponder` (offline default): not a language model, and it says so. It
  repeats what it heard, tells the time, and explains how to plug in a model.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from .stt import _httpx

Message = dict[str, Any]  # a chat-completions message (role, content, tool_calls, ...)


class LlmError(RuntimeError):
    """The chat endpoint failed (unreachable, an error status, an unreadable stream)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function the model asked for: ``arguments`` is its JSON text, as streamed."""

    call_id: str
    name: str
    arguments: str


class Responder(Protocol):
    name: str

    async def reply(self, history: list[Message], out: Callable[[str], None], *,
                    system: str | None = None, tools: list[dict[str, Any]] | None = None,
                    tool_choice: Any = None,
                    on_tool_call: Callable[[ToolCall], None] | None = None) -> None: ...


SYSTEM_PROMPT = ("You are a voice assistant on a phone call. Answer in one to three short "
                 "spoken sentences, no lists, no markdown.")


class ChatCompletions:
    name = "chat-completions"

    def __init__(self, base_url: str, *, model: str = "gpt-4o-mini", api_key: str | None = None,
                 system: str = SYSTEM_PROMPT, timeout: float = 60.0) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self._api_key, self.system, self.timeout = model, api_key, system, timeout
        _httpx()

    def __repr__(self) -> str:  # never the key
        return f"ChatCompletions({self.url!r}, model={self.model!r})"

    async def reply(self, history: list[Message], out: Callable[[str], None], *,
                    system: str | None = None, tools: list[dict[str, Any]] | None = None,
                    tool_choice: Any = None,
                    on_tool_call: Callable[[ToolCall], None] | None = None) -> None:
        httpx = _httpx()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        body: dict[str, Any] = {
            "model": self.model, "stream": True,
            "messages": [{"role": "system", "content": system or self.system}, *history],
        }
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        calls: dict[int, dict[str, str]] = {}
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client, \
                    client.stream("POST", self.url, headers=headers, json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread())[:200]
                    raise LlmError(f"chat endpoint answered {resp.status_code}: {detail!r}")
                done = False
                async for line in resp.aiter_lines():  # read to the end: see the docstring
                    if done or not line.startswith("data:"):
                        continue  # comments, event:, id:, blank separators
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    try:
                        event = json.loads(data)
                    except json.JSONDecodeError as exc:
                        raise LlmError("chat stream sent a line that is not JSON") from exc
                    text = _delta_text(event)
                    if text:
                        out(text)
                    _tool_deltas(event, calls)
        except httpx.HTTPError as exc:
            raise LlmError(f"chat request to {self.url} failed: {exc!r}") from exc
        for index in sorted(calls):
            call = calls[index]
            if call["name"] and on_tool_call is not None:
                on_tool_call(ToolCall(call["id"] or f"call_{index}", call["name"],
                                      call["arguments"] or "{}"))


MAX_TOOL_CALLS = 16
MAX_ARGUMENTS = 65_536


def _tool_deltas(event: Any, calls: dict[int, dict[str, str]]) -> None:
    """Fold one chunk's ``delta.tool_calls`` into ``calls`` (by ``index``; the id and name
    come in the first piece, the arguments in pieces)."""
    try:
        pieces = event["choices"][0]["delta"]["tool_calls"]
    except (KeyError, IndexError, TypeError):
        return
    if not isinstance(pieces, list):
        return
    for piece in pieces:
        if not isinstance(piece, dict) or not isinstance(piece.get("index"), int):
            continue
        index = piece["index"]
        if index not in calls and len(calls) >= MAX_TOOL_CALLS:
            raise LlmError("chat stream asked for too many tool calls")
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        if isinstance(piece.get("id"), str):
            call["id"] = piece["id"]
        fn = piece.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                call["name"] += fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["arguments"] += fn["arguments"]
                if len(call["arguments"]) > MAX_ARGUMENTS:
                    raise LlmError("chat stream sent tool arguments over 64 KiB")


def _delta_text(event: Any) -> str:
    if not isinstance(event, dict):
        return ""
    if isinstance(event.get("error"), dict):
        raise LlmError(f"chat stream error: {str(event['error'].get('message'))[:200]}")
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta")
    if not isinstance(delta, dict):
        return ""
    content = delta.get("content")
    return content if isinstance(content, str) else ""


class BuiltinResponder:
    """The offline answerer: honest, small, and useful enough to test a voice loop."""

    name = "builtin"

    def __init__(self, clock: Callable[[], _dt.datetime] | None = None) -> None:
        self._clock = clock or (lambda: _dt.datetime.now().astimezone())

    def answer(self, heard: str) -> str:
        words = set(re.findall(r"[a-z']+", heard.lower()))
        if not words:
            return "I did not catch that. Could you say it again?"
        if "time" in words or ({"what", "hour"} <= words):
            now = self._clock()
            return f"It is {now.strftime('%H:%M').lstrip('0') or '0'}."
        if "date" in words or "today" in words or "day" in words:
            return f"Today is {self._clock().strftime('%A, %B %d')}."
        if words & {"help", "model", "who", "what", "how"} and words & {
                "you", "are", "model", "help", "work", "plug"}:
            return ("I am the appliance's built-in responder, not a language model. "
                    "I repeat what I hear and tell the time. To talk with a real model, "
                    "start the assistant with an llm address, for example "
                    "assistant question mark llm equals your server's v1 address.")
        return f"You said: {heard}. I am a simple built-in responder; plug in a model for real answers."

    async def reply(self, history: list[Message], out: Callable[[str], None], *,
                    system: str | None = None, tools: list[dict[str, Any]] | None = None,
                    tool_choice: Any = None,
                    on_tool_call: Callable[[ToolCall], None] | None = None) -> None:
        """Answers the last user message; ``system`` and tools are ignored (no model)."""
        heard = next((str(m.get("content") or "") for m in reversed(history)
                      if m.get("role") == "user"), "")
        await trio.lowlevel.checkpoint()
        out(self.answer(heard))


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


async def sentences(chunks: AsyncIterator[str], *, min_chars: int = 12
                    ) -> AsyncGenerator[str, None]:
    """Regroup streamed text into sentences (a sentence shorter than ``min_chars`` waits
    for the next, so "Hi." is not spoken alone with a pause after it)."""
    buf = ""
    async for chunk in chunks:
        buf += chunk
        while True:
            m = None
            for m in _SENTENCE_END.finditer(buf):
                if m.start() >= min_chars:
                    break
            else:
                m = None
            if m is None:
                break
            head, buf = buf[: m.start()].strip(), buf[m.end():]
            if head:
                yield head
    if buf.strip():
        yield buf.strip()
