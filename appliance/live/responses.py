"""GPT-Live's **Responses delegation** (issue 42 item 3), the pure half: the server acts as
a Responses API client when the voice agent delegates. Sans-IO: no sockets, no clock, no
trio; the shell (backend.py) moves the bytes.

What lives here::

    check_config_untrusted(value, path)   the session's ``delegation.responses``
                                          (ResponsesDelegationConfig): function tools only;
                                          a hosted tool (web_search, file_search, mcp, …)
                                          or a hosted tool_choice is an error naming it
    request_body(cfg, input)              the ``POST /responses`` body (stream: true)
    chat_body(body)                       the same request for a chat-completions-only
                                          backend (``POST /chat/completions``)
    event_untrusted(data)                 one SSE ``data`` as a JSON object with a type
    chunk_untrusted(data)                 one chat-completions chunk as a JSON object
    ChatSynth                             chat-completion chunks in, the Responses stream
                                          events a Responses backend would have sent out
                                          (response.created, output_item.added/done,
                                          output_text.delta/done, function_call_arguments.
                                          delta/done, response.completed with usage)
    Outcome                               folds either stream: the response id, the
                                          output items, the final text, the function calls
    snapshot(event)                       a lifecycle event as ``response.event`` carries
                                          it: no input, instructions, tools or output

The stream's bytes are Server-Sent Events, read by appliance/proto/sse.py (the one SSE
decoder, which the assistant's chat client reads with too). Every parser of network bytes
here (:func:`event_untrusted`,
:func:`chunk_untrusted`, :meth:`ChatSynth.handle_chunk`) raises only :class:`ResponsesError` (STYLE.md rule 5;
fuzzed in tests/live/test_responses.py).

Deliberately omitted: hosted tools (OpenAI runs them; refused at ``session.start``),
``custom`` / ``shell`` / ``apply_patch`` tools; a chat backend gets no ``service_tier``,
``text`` or ``reasoning.summary`` (chat completions has no such fields; ``reasoning.effort``
goes as ``reasoning_effort``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .schema import (
    AnyJson,
    Arr,
    Bool,
    Const,
    Int,
    LiveError,
    Obj,
    Str,
    optional,
    required,
    validate_untrusted,
)

MAX_TOOLS = 128
MAX_TEXT = 1 << 20  # the text and arguments a synthesised response may collect
MAX_ITEMS = 64  # output items of one response

_REASONING = Obj({
    "effort": optional(Str(choices=("none", "minimal", "low", "medium", "high", "xhigh")),
                       nullable=True),
    "summary": optional(Str(choices=("concise", "detailed", "auto")), nullable=True)})
_TEXT = Obj({"verbosity": optional(Str(choices=("low", "medium", "high")), nullable=True)})
_TIERS = ("auto", "default", "fast_tier_temp_pilot", "flex", "priority", "ultrafast")
_FIELDS = {
    "instructions": optional(Str(), nullable=True),
    "max_output_tokens": optional(Int(lo=16), nullable=True),
    "parallel_tool_calls": optional(Bool(), nullable=True),
    "reasoning": optional(_REASONING, nullable=True),
    "service_tier": optional(Str(choices=_TIERS), nullable=True),
    "text": optional(_TEXT, nullable=True),
    "tool_choice": optional(AnyJson(), nullable=True),
    "tools": optional(Arr(AnyJson(), max_items=MAX_TOOLS), nullable=True),
}
#: ``ResponsesDelegationConfig`` (``session.start``) and its update variant (all optional).
CONFIG = Obj({"model": required(Str(max_len=256)), **_FIELDS})
UPDATE = Obj({"model": optional(Str(max_len=256)), **_FIELDS})
FUNCTION_TOOL = Obj({
    "type": required(Const("function")), "name": required(Str(max_len=128)),
    "description": optional(Str(), nullable=True),
    "parameters": optional(AnyJson(), nullable=True),
    "strict": optional(Bool(), nullable=True)})
_CHOICE_WORDS = ("auto", "none", "required")


class ResponsesError(Exception):
    """The Responses backend's bytes or events could not be read (the one error the
    parsers here raise)."""


def _hosted(kind: str, param: str) -> LiveError:
    return LiveError(f"The hosted tool '{kind[:64]}' runs on OpenAI's servers: this "
                     "appliance serves function tools only under Responses delegation "
                     "(docs/live.md).", code="unsupported_value", param=param)


def check_config_untrusted(value: Any, path: str, *, update: bool = False) -> dict[str, Any]:
    """``delegation.responses`` checked (``path`` names it in errors): raises
    :class:`LiveError` for a bad shape and for every hosted tool or tool choice."""
    cfg: dict[str, Any] = validate_untrusted(UPDATE if update else CONFIG, value, path)
    tools = cfg.get("tools") or []
    for i, tool in enumerate(tools):
        where = f"{path}.tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            raise LiveError(f"Missing required parameter: '{where}.type'.",
                            code="missing_required_parameter", param=f"{where}.type")
        if kind != "function":
            raise _hosted(kind, f"{where}.type")
        tools[i] = validate_untrusted(FUNCTION_TOOL, tool, where)
    choice = cfg.get("tool_choice")
    if choice is not None:
        _check_choice(choice, f"{path}.tool_choice")
    return cfg


def _check_choice(choice: Any, where: str) -> None:
    if isinstance(choice, str):
        if choice not in _CHOICE_WORDS:
            raise LiveError(f"Invalid value for '{where}': '{choice[:64]}'. Supported "
                            "values are: 'auto', 'none', 'required'.", param=where)
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "function":
        validate_untrusted(Obj({"type": required(Const("function")),
                                "name": required(Str(max_len=128))}), choice, where)
    elif kind == "allowed_tools":
        validate_untrusted(Obj({"type": required(Const("allowed_tools")),
                                "mode": optional(Str(choices=_CHOICE_WORDS), nullable=True),
                                "tools": required(Arr(AnyJson(), max_items=MAX_TOOLS))}),
                           choice, where)
        for i, tool in enumerate(choice["tools"]):
            _check_choice(tool, f"{where}.tools[{i}]")
    elif isinstance(kind, str):
        raise _hosted(kind, f"{where}.type")
    else:
        raise LiveError(f"Invalid type for '{where}': expected a string or an object "
                        "with a type.", code="invalid_type", param=where)


# -- the request -------------------------------------------------------------------------------

#: Fields of the delegation config passed to ``POST /responses`` as they are.
_PASSED = ("instructions", "tools", "tool_choice", "parallel_tool_calls",
           "max_output_tokens", "reasoning", "text", "service_tier")


def message(role: str, text: str) -> dict[str, Any]:
    """An ``EasyInputMessage``: the form of every context item the server writes."""
    return {"type": "message", "role": role, "content": text}


def context(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The voice conversation (config.py ``history()`` items) as Responses input."""
    return [message(item["role"], item["content"][0]["text"]) for item in history]


def request_body(cfg: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """``POST {llm}/responses``: the delegation's model and settings, ``items`` as input."""
    body: dict[str, Any] = {"model": cfg["model"], "input": list(items), "stream": True}
    for key in _PASSED:
        if cfg.get(key) is not None and cfg.get(key) != []:
            body[key] = cfg[key]
    return body


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request ``body`` as a streaming chat-completions request: instructions
    → a system message, messages by role (developer → system), ``function_call`` items →
    an assistant message's ``tool_calls``, ``function_call_output`` → ``tool`` messages,
    function tools → ``tools[].function``."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": _text_of(item.get("output"))})
        # other items (reasoning, a hosted tool's call) have no chat-completions form
    out: dict[str, Any] = {"model": body["model"], "messages": messages, "stream": True,
                           "stream_options": {"include_usage": True}}
    tools = [{"type": "function", "function": {
        k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}}
        for t in body.get("tools") or ()]
    if tools:
        out["tools"] = tools
        if body.get("parallel_tool_calls") is not None:
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
        choice = body.get("tool_choice")
        if isinstance(choice, str):
            out["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") == "function":
            out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif isinstance(choice, dict):  # allowed_tools: its mode
            out["tool_choice"] = choice.get("mode") or "auto"
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        out["reasoning_effort"] = effort
    return out


def event_untrusted(data: str) -> dict[str, Any]:
    """One event's ``data``: a JSON object with a string ``type``."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise ResponsesError("event stream data is not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
        raise ResponsesError("event stream data is not an event object")
    return obj


def chunk_untrusted(data: str) -> dict[str, Any]:
    """One chat-completions chunk's ``data``: a JSON object (it has no ``type``)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise ResponsesError("chat stream data is not JSON") from None
    if not isinstance(obj, dict):
        raise ResponsesError("chat stream data is not an object")
    return obj


# -- chat completions -> Responses events ------------------------------------------------------

_LIFECYCLE = ("response.created", "response.in_progress", "response.completed",
              "response.failed", "response.incomplete", "response.queued")


def snapshot(event: dict[str, Any]) -> dict[str, Any]:
    """What ``response.event`` carries: a lifecycle event's response without input and
    with instructions, tools and output cleared (GPT-Live's rule: "consume granular output
    events for the generated content")."""
    response = event.get("response")
    if event.get("type") not in _LIFECYCLE or not isinstance(response, dict):
        return event
    slim = {k: v for k, v in response.items() if k != "input"}
    slim.update(instructions=None, tools=[], output=[])
    return {**event, "response": slim}


class ChatSynth:
    """The Responses stream a chat-completions answer stands for. ``start()`` once, then
    ``handle_chunk(obj)`` per chunk (a parsed SSE ``data``), then ``finish()`` (or
    ``fail(message)``); ``poll_event()`` drains. ``ids(prefix)`` makes item and response
    ids, ``created_at`` is Unix seconds (the shell's clock)."""

    def __init__(self, body: dict[str, Any], ids: Callable[[str], str], created_at: int) -> None:
        self._body = body
        self._ids = ids
        self._seq = 0
        self._out: list[dict[str, Any]] = []
        self.id = ids("resp")
        self._created_at = created_at
        self._items: list[dict[str, Any]] = []  # output items, in order
        self._text: dict[str, Any] | None = None  # the open message item
        self._calls: dict[int, dict[str, Any]] = {}  # chat index -> open function_call item
        self._usage: dict[str, Any] | None = None
        self._size = 0

    def poll_event(self) -> dict[str, Any] | None:
        return self._out.pop(0) if self._out else None

    def _emit(self, kind: str, **fields: Any) -> None:
        self._out.append({"type": kind, "sequence_number": self._seq, **fields})
        self._seq += 1

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        b = self._body
        return {"id": self.id, "object": "response", "created_at": self._created_at,
                "status": status, "model": b["model"], "output": [
                    item for item in self._items if item.get("status") == "completed"],
                "instructions": b.get("instructions"), "tools": b.get("tools") or [],
                "tool_choice": b.get("tool_choice") or "auto",
                "parallel_tool_calls": b.get("parallel_tool_calls", True),
                "max_output_tokens": b.get("max_output_tokens"), "error": None,
                "incomplete_details": None, "metadata": {}, "temperature": None,
                "top_p": None, **extra}

    def start(self) -> None:
        self._emit("response.created", response=self._response("in_progress"))
        self._emit("response.in_progress", response=self._response("in_progress"))

    def _grow(self, n: int) -> None:
        self._size += n
        if self._size > MAX_TEXT:
            raise ResponsesError("chat stream longer than 1 MiB")

    def _add(self, item: dict[str, Any]) -> int:
        if len(self._items) >= MAX_ITEMS:
            raise ResponsesError("chat stream asked for too many output items")
        self._items.append(item)
        index = len(self._items) - 1
        self._emit("response.output_item.added", output_index=index, item=dict(item))
        return index

    def handle_chunk(self, chunk: dict[str, Any]) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return  # the usage chunk, a keep-alive
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return
        text = delta.get("content")
        if isinstance(text, str) and text:
            self._grow(len(text))
            self._text_delta(text)
        calls = delta.get("tool_calls")
        for piece in calls if isinstance(calls, list) else ():
            if isinstance(piece, dict) and isinstance(piece.get("index"), int):
                self._call_delta(piece)

    def _text_delta(self, text: str) -> None:
        item = self._text
        if item is None:
            item = {"id": self._ids("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}
            self._text = item
            index = self._add(item)
            item["_text"], item["_at"] = "", index
            self._emit("response.content_part.added", item_id=item["id"], output_index=index,
                       content_index=0, part={"type": "output_text", "text": "",
                                              "annotations": []})
        item["_text"] += text
        self._emit("response.output_text.delta", item_id=item["id"],
                   output_index=item["_at"], content_index=0, delta=text, logprobs=[])

    def _call_delta(self, piece: dict[str, Any]) -> None:
        raw = piece.get("function")
        fn: dict[str, Any] = raw if isinstance(raw, dict) else {}
        call = self._calls.get(piece["index"])
        if call is None:
            self._close_text()  # the text came first; the calls follow it
            name = fn.get("name") if isinstance(fn.get("name"), str) else ""
            cid = piece.get("id") if isinstance(piece.get("id"), str) else self._ids("call")
            call = {"id": self._ids("fc"), "type": "function_call", "call_id": cid,
                    "name": name, "arguments": "", "status": "in_progress"}
            self._calls[piece["index"]] = call
            call["_at"] = self._add({k: v for k, v in call.items()})
        elif isinstance(fn.get("name"), str):  # a name split across pieces (rare)
            call["name"] += fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._grow(len(args))
            call["arguments"] += args
            self._emit("response.function_call_arguments.delta", item_id=call["id"],
                       output_index=call["_at"], delta=args)

    def _close_text(self) -> None:
        item, self._text = self._text, None
        if item is None:
            return
        text, index = item.pop("_text"), item.pop("_at")
        part = {"type": "output_text", "text": text, "annotations": []}
        self._emit("response.output_text.done", item_id=item["id"], output_index=index,
                   content_index=0, text=text, logprobs=[])
        self._emit("response.content_part.done", item_id=item["id"], output_index=index,
                   content_index=0, part=part)
        item.update(status="completed", content=[part])
        self._items[index] = item
        self._emit("response.output_item.done", output_index=index, item=dict(item))

    def finish(self) -> None:
        """The chat stream ended: every open item is done, then ``response.completed``."""
        self._close_text()
        for call in self._calls.values():
            index = call.pop("_at")
            self._emit("response.function_call_arguments.done", item_id=call["id"],
                       output_index=index, arguments=call["arguments"])
            call["status"] = "completed"
            self._items[index] = call
            self._emit("response.output_item.done", output_index=index, item=dict(call))
        self._calls = {}
        self._emit("response.completed", response=self._response(
            "completed", usage=_usage(self._usage)))

    def fail(self, message: str) -> None:
        self._emit("response.failed", response=self._response(
            "failed", error={"code": "server_error", "message": message}))


def _usage(chat: dict[str, Any] | None) -> dict[str, Any]:
    """Chat-completions ``usage`` in the Responses shape (zeros when the backend sent none)."""
    chat = chat or {}

    def count(key: str) -> int:
        value = chat.get(key)
        return value if isinstance(value, int) and value >= 0 else 0

    def detail(key: str, name: str) -> int:
        d = chat.get(key)
        value = d.get(name) if isinstance(d, dict) else None
        return value if isinstance(value, int) and value >= 0 else 0

    i, o = count("prompt_tokens"), count("completion_tokens")
    return {"input_tokens": i, "output_tokens": o, "total_tokens": count("total_tokens") or i + o,
            "input_tokens_details": {
                "cached_tokens": detail("prompt_tokens_details", "cached_tokens"),
                "cache_write_tokens": detail("prompt_tokens_details", "cache_write_tokens")},
            "output_tokens_details": {"reasoning_tokens": detail("completion_tokens_details",
                                                                 "reasoning_tokens")}}


# -- the fold ----------------------------------------------------------------------------------

TERMINAL = ("response.completed", "response.failed", "response.incomplete")


class Outcome:
    """What one backend response came to, from its stream events (either backend's): the
    response id, the finished output items, whether it ended, and how."""

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.items: list[dict[str, Any]] = []
        self.status: str | None = None  # completed, failed, incomplete; None: not ended
        self.error: str | None = None

    def handle_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        response = event.get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            self.response_id = self.response_id or response["id"]
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            if len(self.items) < MAX_ITEMS:
                self.items.append(event["item"])
        elif kind in TERMINAL:
            self.status = str(kind).rpartition(".")[2]
            err = response.get("error") if isinstance(response, dict) else None
            if isinstance(err, dict) and isinstance(err.get("message"), str):
                self.error = err["message"]
        elif kind == "error":
            self.status = "failed"
            self.error = str(event.get("message") or "the backend failed")

    def calls(self) -> list[dict[str, Any]]:
        """The function calls the client is to run (their outputs come back with
        ``response.item.create``)."""
        return [i for i in self.items if i.get("type") == "function_call"]

    def text(self) -> str:
        """The final answer's text: every assistant message's ``output_text``."""
        return " ".join(
            p["text"].strip() for i in self.items if i.get("type") == "message"
            for p in i.get("content") or () if isinstance(p, dict)
            and p.get("type") == "output_text" and isinstance(p.get("text"), str)
            and p["text"].strip())
