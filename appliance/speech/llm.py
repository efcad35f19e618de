"""Who answers the assistant: an OpenAI-compatible chat endpoint, or a built-in responder.

A :class:`Responder` turns the conversation so far into reply text, streamed:
``responder.stream(history)`` is an async generator of text pieces as they arrive, then the
tool calls the model asked for (:class:`ToolCall`, whole); closing it early (``aclosing``)
closes the HTTP response, so the server sees the client go. ``await responder.reply(history,
out)`` is the push form over it (``out(chunk)`` is called synchronously, e.g. a memory
channel's ``send_nowait``): cancelling ``reply`` lands at the socket read and unwinds every
generator of httpx's chain. :class:`SentenceSplitter` (and :func:`sentences`, over an async
iterator) regroups the pieces into sentences, so the assistant can speak the first while
the rest is still coming.

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
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ..proto.sse import SseDecoder, SseError
from .stt import _httpx

Message = dict[str, Any]  # a chat-completions message (role, content, tool_calls, ...)


class LlmError(RuntimeError):
    """The chat endpoint failed (unreachable, an error status, an unreadable stream);
    ``status`` is the HTTP status when the endpoint answered with one other than 200."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


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

    def stream(self, history: list[Message], *, system: str | None = None,
               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None
               ) -> AsyncGenerator[str | ToolCall, None]: ...


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
        await _push(self.stream(history, system=system, tools=tools, tool_choice=tool_choice),
                    out, on_tool_call)

    async def stream(self, history: list[Message], *, system: str | None = None,
                     tools: list[dict[str, Any]] | None = None, tool_choice: Any = None
                     ) -> AsyncGenerator[str | ToolCall, None]:
        """The reply as it arrives: text pieces, then the tool calls (whole, at the end).
        Closing it early (``aclose``, as ``aclosing`` does) closes the HTTP response: the
        server sees the client go."""
        httpx = _httpx()
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
                    aclosing(post_sse(client, self.url, body, api_key=self._api_key,
                                      what="chat endpoint")) as events:
                async for data in events:
                    if data.strip() == "[DONE]":
                        break
                    try:
                        event = json.loads(data)
                    except (ValueError, RecursionError) as exc:
                        raise LlmError("chat stream sent data that is not JSON") from exc
                    _tool_deltas(event, calls)
                    text = _delta_text(event)
                    if text:
                        yield text
        except httpx.HTTPError as exc:
            raise LlmError(f"chat request to {self.url} failed: {exc!r}") from exc
        for index in sorted(calls):
            call = calls[index]
            if call["name"]:
                yield ToolCall(call["id"] or f"call_{index}", call["name"],
                               call["arguments"] or "{}")


async def post_sse(client: Any, url: str, body: dict[str, Any], *, api_key: str | None,
                   what: str) -> AsyncGenerator[str, None]:
    """The one streaming request to an OpenAI-compatible endpoint (the assistant's chat
    completions; GPT-Live's Responses delegation, appliance/live/backend.py, on both its
    endpoints): ``POST url`` with ``body`` as JSON and the key as a Bearer token, then each
    Server-Sent Event's ``data`` as it arrives (appliance/proto/sse.py decodes). Raises
    :class:`LlmError` (with ``status``) for an answer other than 200 and for a stream that
    is not Server-Sent Events; httpx's own errors pass through. Closed early (``aclosing``),
    the response is closed and every generator of httpx's chain unwound (:func:`_unwind`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with client.stream("POST", url, headers=headers, json=body) as resp:
        if resp.status_code != 200:
            detail = (await resp.aread())[:200]
            raise LlmError(f"{what} answered {resp.status_code}: {detail!r}",
                           status=resp.status_code)
        pieces = resp.aiter_bytes()
        decoder = SseDecoder()
        try:
            try:
                async for piece in pieces:
                    decoder.handle_input(piece)
                    while (ev := decoder.poll_event()) is not None:
                        yield ev[1]
                decoder.handle_eof()
            except SseError as exc:
                raise LlmError(f"{what} stream: {exc}") from None
            while (ev := decoder.poll_event()) is not None:
                yield ev[1]
        finally:
            await _unwind(resp, pieces)


async def _unwind(resp: Any, pieces: AsyncIterator[bytes]) -> None:
    """End a response read part-way (closed at a ``yield``: barge-in, an error). Closing
    only the outer generator would leave httpx's and httpcore's nested generators suspended,
    finalised later by the garbage collector (trio warns); closing the response and reading
    on makes the read fail at the socket, an exception that unwinds the whole chain now."""
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + 5.0
        try:
            await resp.aclose()
        finally:
            while True:
                try:
                    await pieces.__anext__()
                except (Exception, trio.Cancelled):  # the end, the read error, the deadline
                    break


async def _push(stream: AsyncGenerator[str | ToolCall, None], out: Callable[[str], None],
                on_tool_call: Callable[[ToolCall], None] | None) -> None:
    """``reply`` over ``stream``: cancelled, the cancellation lands at the socket read and
    unwinds every generator of the chain."""
    async with aclosing(stream) as pieces:
        async for piece in pieces:
            if isinstance(piece, str):
                out(piece)
            elif on_tool_call is not None:
                on_tool_call(piece)


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
        await _push(self.stream(history), out, on_tool_call)

    async def stream(self, history: list[Message], *, system: str | None = None,
                     tools: list[dict[str, Any]] | None = None, tool_choice: Any = None
                     ) -> AsyncGenerator[str | ToolCall, None]:
        heard = next((str(m.get("content") or "") for m in reversed(history)
                      if m.get("role") == "user"), "")
        await trio.lowlevel.checkpoint()
        yield self.answer(heard)


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


class SentenceSplitter:
    """Streamed text in, whole sentences out (sans-IO: :func:`sentences` and the Realtime
    assistant both use it). A sentence shorter than ``min_chars`` waits for the next, so
    "Hi." is not spoken alone with a pause after it; a sentence ends at ``.!?;:`` followed
    by white space, so the last one is known only at :meth:`finish`."""

    def __init__(self, min_chars: int = 12) -> None:
        self.min_chars = min_chars
        self._buf = ""

    def feed(self, chunk: str) -> list[str]:
        """The sentences ``chunk`` completes (often none)."""
        self._buf += chunk
        out: list[str] = []
        while True:
            m = None
            for m in _SENTENCE_END.finditer(self._buf):
                if m.start() >= self.min_chars:
                    break
            else:
                m = None
            if m is None:
                return out
            head, self._buf = self._buf[: m.start()].strip(), self._buf[m.end():]
            if head:
                out.append(head)

    def finish(self) -> list[str]:
        """The text's end: what is left, as the last sentence."""
        tail, self._buf = self._buf.strip(), ""
        return [tail] if tail else []


async def sentences(chunks: AsyncIterator[str], *, min_chars: int = 12
                    ) -> AsyncGenerator[str, None]:
    """Regroup streamed text into sentences (:class:`SentenceSplitter`)."""
    splitter = SentenceSplitter(min_chars)
    async for chunk in chunks:
        for sentence in splitter.feed(chunk):
            yield sentence
    for sentence in splitter.finish():
        yield sentence
