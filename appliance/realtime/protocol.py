"""OpenAI Realtime (GA) client events: the untrusted JSON parser and the event catalogue.

The ``oai-events`` data channel carries one JSON object per message, each with a
``"type"`` and an optional client ``"event_id"``. :func:`parse_client_event_untrusted`
turns one message into a :class:`ClientEvent` or raises :class:`EventError` — and only
that (STYLE.md rule 5): malformed JSON, a non-object, an unknown type, a missing or
mistyped field all become an ``error`` *event* on the channel (:meth:`EventError.to_event`),
never a dropped channel, exactly as OpenAI answers them.

The names and shapes are the GA API's (``openai-python`` ``types/realtime``,
``@openai/agents-realtime`` ``openaiRealtimeEvents.ts``), not the retired beta ones
(``conversation.item.created``, ``response.audio.delta``, ``response.text.delta``):
:data:`CLIENT_EVENTS` and :data:`SERVER_EVENTS` list every GA event with what the appliance
does with it; docs/realtime.md renders the same table and a test keeps them equal.

Deliberately omitted: the transcription-only session type (``"type": "transcription"``),
MCP, server-side tool execution (function calls go to the client, which runs them), images.
Nothing here does I/O; :mod:`appliance.realtime.machine` is the state machine.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: The largest message either side may send on a data channel (DESIGN.md).
MAX_EVENT_BYTES = 262_144
#: JSON nesting deeper than this is refused before it can exhaust the stack.
MAX_DEPTH = 32


class Support(Enum):
    """What the appliance does with one GA event (the docs table's middle column)."""

    SUPPORTED = "supported"  # handled / emitted as OpenAI does
    PARTIAL = "partial"  # handled, with the difference the note names
    IGNORED = "ignored"  # accepted and acknowledged, no effect
    NEVER = "never sent"  # a server event the appliance never emits
    ERROR = "error"  # a client event answered with an ``error`` event


#: Every GA client event: (support, note).
CLIENT_EVENTS: dict[str, tuple[Support, str]] = {
    "session.update": (Support.SUPPORTED, "-> session.updated; unknown fields kept and echoed, "
                       "invalid ones -> error naming the event_id"),
    "input_audio_buffer.append": (Support.SUPPORTED, "audio/pcm 24 kHz, audio/pcmu, audio/pcma; "
                                  "WebSocket sessions run the server VAD on it"),
    "input_audio_buffer.commit": (Support.SUPPORTED, "-> input_audio_buffer.committed + a user "
                                  "item"),
    "input_audio_buffer.clear": (Support.SUPPORTED, "-> input_audio_buffer.cleared"),
    "conversation.item.create": (Support.PARTIAL, "message items (text, audio); function items "
                                 "stored for the agent (the client runs the tools)"),
    "conversation.item.retrieve": (Support.SUPPORTED, "-> conversation.item.retrieved (audio as "
                                   "24 kHz PCM while it fits one channel message)"),
    "conversation.item.truncate": (Support.SUPPORTED, "-> conversation.item.truncated"),
    "conversation.item.delete": (Support.SUPPORTED, "-> conversation.item.deleted"),
    "response.create": (Support.SUPPORTED, "-> response.created ... response.done"),
    "response.cancel": (Support.SUPPORTED, "-> response.done (cancelled)"),
    "output_audio_buffer.clear": (Support.SUPPORTED, "queued audio dropped at once, item "
                                  "truncated at what was played -> output_audio_buffer.cleared"),
}

#: Every GA server event: (support, note).
SERVER_EVENTS: dict[str, tuple[Support, str]] = {
    "error": (Support.SUPPORTED, "OpenAI's error object, with the client event_id"),
    "session.created": (Support.SUPPORTED, "first event on the channel"),
    "session.updated": (Support.SUPPORTED, ""),
    "conversation.created": (Support.NEVER, "beta-era; GA clients do not need it"),
    "conversation.item.created": (Support.NEVER, "beta name of conversation.item.added"),
    "conversation.item.added": (Support.SUPPORTED, ""),
    "conversation.item.done": (Support.SUPPORTED, ""),
    "conversation.item.retrieved": (Support.SUPPORTED, ""),
    "conversation.item.input_audio_transcription.completed": (
        Support.SUPPORTED, "with audio.input.transcription: the agent's transcribe() or a "
                           "speech engine named by its model (docs/speech.md)"),
    "conversation.item.input_audio_transcription.delta": (
        Support.SUPPORTED, "PocketSphinx streams its hypothesis; Whisper and HTTP: one delta"),
    "conversation.item.input_audio_transcription.segment": (Support.NEVER, "no diarization"),
    "conversation.item.input_audio_transcription.failed": (
        Support.SUPPORTED, "the engine failed (or none is installed)"),
    "conversation.item.truncated": (Support.SUPPORTED, ""),
    "conversation.item.deleted": (Support.SUPPORTED, ""),
    "input_audio_buffer.committed": (Support.SUPPORTED, ""),
    "input_audio_buffer.cleared": (Support.SUPPORTED, ""),
    "input_audio_buffer.speech_started": (Support.SUPPORTED, "energy VAD (Frame.speech)"),
    "input_audio_buffer.speech_stopped": (Support.SUPPORTED, ""),
    "input_audio_buffer.timeout_triggered": (Support.NEVER, "idle_timeout_ms kept, not acted on"),
    "input_audio_buffer.dtmf_event_received": (Support.SUPPORTED, "SIP calls: RFC 4733 or "
                                               "SIP INFO digits"),
    "output_audio_buffer.started": (Support.SUPPORTED, "WebRTC: the response's audio starts "
                                    "(never on a WebSocket, as OpenAI)"),
    "output_audio_buffer.stopped": (Support.SUPPORTED, "WebRTC: its last frame left"),
    "output_audio_buffer.cleared": (Support.SUPPORTED, "on output_audio_buffer.clear and "
                                    "barge-in"),
    "response.created": (Support.SUPPORTED, ""),
    "response.done": (Support.SUPPORTED, "status, status_details and usage (estimated tokens)"),
    "response.output_item.added": (Support.SUPPORTED, ""),
    "response.output_item.done": (Support.SUPPORTED, ""),
    "response.content_part.added": (Support.SUPPORTED, ""),
    "response.content_part.done": (Support.SUPPORTED, ""),
    "response.output_text.delta": (Support.SUPPORTED, "output_modalities [\"text\"]"),
    "response.output_text.done": (Support.SUPPORTED, ""),
    "response.output_audio_transcript.delta": (Support.SUPPORTED, ""),
    "response.output_audio_transcript.done": (Support.SUPPORTED, ""),
    "response.output_audio.delta": (Support.PARTIAL, "WebSocket sessions only (WebRTC: the "
                                    "audio is on the media track, as OpenAI does)"),
    "response.output_audio.done": (Support.SUPPORTED, ""),
    "response.function_call_arguments.delta": (Support.PARTIAL, "when the agent yields a "
                                               "FunctionCall: the arguments in one delta"),
    "response.function_call_arguments.done": (Support.SUPPORTED, ""),
    "response.mcp_call_arguments.delta": (Support.NEVER, "no MCP"),
    "response.mcp_call_arguments.done": (Support.NEVER, "no MCP"),
    "response.mcp_call.in_progress": (Support.NEVER, "no MCP"),
    "response.mcp_call.completed": (Support.NEVER, "no MCP"),
    "response.mcp_call.failed": (Support.NEVER, "no MCP"),
    "mcp_list_tools.in_progress": (Support.NEVER, "no MCP"),
    "mcp_list_tools.completed": (Support.NEVER, "no MCP"),
    "mcp_list_tools.failed": (Support.NEVER, "no MCP"),
    "rate_limits.updated": (Support.PARTIAL, "constant values, after each response.created"),
}


class EventError(Exception):
    """A client event the appliance cannot act on, as OpenAI's error object.

    ``code`` and ``param`` follow OpenAI's (``invalid_value``, ``missing_required_parameter``,
    ``unknown_parameter``…); ``event_id`` is the offending client event's, when it had one.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_value",
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id = event_id
        self.type = type

    def error_object(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code, "message": self.message,
                "param": self.param, "event_id": self.event_id}

    def to_event(self, event_id: str) -> dict[str, Any]:
        """The ``error`` server event (``event_id`` is the server's own id)."""
        return {"type": "error", "event_id": event_id, "error": self.error_object()}


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """One validated client event. ``data`` is the whole JSON object (type included)."""

    type: str
    event_id: str | None
    data: dict[str, Any]


def _depth_ok(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Iterative depth check (a recursive one is what the limit protects against)."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return True


def _reject_constant(name: str) -> Any:
    # JSON has no NaN or Infinity (RFC 8259 §6); Python's json accepts them by default.
    raise ValueError(f"{name} is not JSON")


def loads_untrusted(data: str | bytes, *, limit: int = MAX_EVENT_BYTES) -> Any:
    """Strict JSON (RFC 8259) with a size (``limit`` bytes: a data channel's message by
    default) and depth bound; raises only :class:`EventError`."""
    if len(data) > limit:
        raise EventError(f"event of {len(data)} bytes exceeds {limit}",
                         code="invalid_json")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        # The depth is checked on the parsed value, but CPython's decoder recurses per
        # nesting level: a cheap bracket count first keeps a 100 KB "[[[[…" away from it.
        if text.count("[") + text.count("{") > 20_000:
            raise ValueError("too many nested values")
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise EventError(f"We could not parse the JSON body of your request: {exc}",
                         code="invalid_json") from None
    if not _depth_ok(obj):
        raise EventError("the event is nested too deeply", code="invalid_json")
    return obj


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, scalars): ~10x ``copy.deepcopy``, which
    the machine would otherwise spend most of a turn in (a memo per node)."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    return value


# -- field checks ------------------------------------------------------------------------

def require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *,
            where: str = "", event_id: str | None = None) -> Any:
    """``obj[key]``, which must exist and be of ``kind`` (bool is never an int here)."""
    param = f"{where}{key}"
    if key not in obj:
        raise EventError(f"Missing required parameter: '{param}'.",
                         code="missing_required_parameter", param=param, event_id=event_id)
    return check(obj[key], kind, param=param, event_id=event_id)


def optional(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *,
             where: str = "", event_id: str | None = None) -> Any:
    """``obj.get(key)``: absent or ``None`` gives ``None``, otherwise it must be ``kind``."""
    value = obj.get(key)
    if value is None:
        return None
    return check(value, kind, param=f"{where}{key}", event_id=event_id)


def check(value: Any, kind: type | tuple[type, ...], *, param: str,
          event_id: str | None = None) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    elif float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True  # JSON numbers: an integer is a valid float
    else:
        ok = isinstance(value, kinds)
    if not ok:
        names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
        raise EventError(f"Invalid type for '{param}': expected {names}, but got "
                         f"{_json_name(value)}.", code="invalid_type", param=param,
                         event_id=event_id)
    return value


def nonneg_int(obj: dict[str, Any], key: str, *, event_id: str | None) -> int:
    value: int = require(obj, key, int, event_id=event_id)
    if value < 0:
        raise EventError(f"Invalid '{key}': integer below minimum value. Expected a value >= 0,"
                         f" but got {value} instead.", code="integer_below_min_value",
                         param=key, event_id=event_id)
    return value


_JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", float: "a number",
                                bool: "a boolean", dict: "an object", list: "an array",
                                type(None): "null"}


def _json_name(value: Any) -> str:
    for kind, name in _JSON_NAMES.items():
        if type(value) is kind:
            return name
    return type(value).__name__


def b64decode_untrusted(text: str, *, param: str, event_id: str | None) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(f"Invalid '{param}': not valid base64.", param=param,
                         event_id=event_id) from None


# -- the parser --------------------------------------------------------------------------

def _validate(kind: str, obj: dict[str, Any], eid: str | None) -> None:
    """The per-type field checks that need no state (the machine checks the rest)."""
    if kind == "session.update":
        require(obj, "session", dict, event_id=eid)
    elif kind == "input_audio_buffer.append":
        require(obj, "audio", str, event_id=eid)
    elif kind == "conversation.item.create":
        require(obj, "item", dict, event_id=eid)
        optional(obj, "previous_item_id", str, event_id=eid)
    elif kind in ("conversation.item.retrieve", "conversation.item.delete"):
        require(obj, "item_id", str, event_id=eid)
    elif kind == "conversation.item.truncate":
        require(obj, "item_id", str, event_id=eid)
        nonneg_int(obj, "content_index", event_id=eid)
        nonneg_int(obj, "audio_end_ms", event_id=eid)
    elif kind == "response.create":
        optional(obj, "response", dict, event_id=eid)
    elif kind == "response.cancel":
        optional(obj, "response_id", str, event_id=eid)


def parse_client_event_untrusted(data: str | bytes) -> ClientEvent:
    """One channel message -> :class:`ClientEvent`; raises only :class:`EventError`."""
    obj = loads_untrusted(data)
    if not isinstance(obj, dict):
        raise EventError(f"Invalid type for event: expected an object, but got "
                         f"{_json_name(obj)}.", code="invalid_type")
    raw_id = obj.get("event_id")
    event_id = raw_id if isinstance(raw_id, str) else None
    if raw_id is not None and event_id is None:
        raise EventError("Invalid type for 'event_id': expected a string.",
                         code="invalid_type", param="event_id")
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise EventError("Missing required parameter: 'type'.",
                         code="missing_required_parameter", param="type", event_id=event_id)
    if kind not in CLIENT_EVENTS:
        supported = ", ".join(f"'{k}'" for k in CLIENT_EVENTS)
        raise EventError(f"Invalid value: '{kind[:64]}'. Supported values are: {supported}.",
                         param="type", event_id=event_id)
    _validate(kind, obj, event_id)
    return ClientEvent(kind, event_id, obj)
