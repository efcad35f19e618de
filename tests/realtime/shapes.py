"""Every server event the appliance sends, checked against the GA shapes.

``REQUIRED``: each GA server event's non-optional fields, from openai-python
``src/openai/types/realtime/`` (the union in ``realtime_server_event.py``, 46 types).
Nested objects are checked as ``@openai/agents-realtime``'s zod schemas parse them
(``openaiRealtimeEvents.ts``): there, fields of content parts and usage are
``.optional()`` but not ``.nullable()`` — a ``null`` would fail its parse — so they are
absent or of their type, never null."""

from __future__ import annotations

from typing import Any

from appliance.realtime.protocol import SERVER_EVENTS, Support

REQUIRED: dict[str, tuple[str, ...]] = {
    "conversation.created": ("conversation", "event_id"),
    "conversation.item.added": ("event_id", "item"),
    "conversation.item.created": ("event_id", "item"),
    "conversation.item.deleted": ("event_id", "item_id"),
    "conversation.item.done": ("event_id", "item"),
    "conversation.item.input_audio_transcription.completed": (
        "content_index", "event_id", "item_id", "transcript", "usage"),
    "conversation.item.input_audio_transcription.delta": ("event_id", "item_id"),
    "conversation.item.input_audio_transcription.failed": (
        "content_index", "error", "event_id", "item_id"),
    "conversation.item.input_audio_transcription.segment": (
        "content_index", "end", "event_id", "id", "item_id", "speaker", "start", "text"),
    "conversation.item.retrieved": ("event_id", "item"),
    "conversation.item.truncated": ("audio_end_ms", "content_index", "event_id", "item_id"),
    "error": ("error", "event_id"),
    "input_audio_buffer.cleared": ("event_id",),
    "input_audio_buffer.committed": ("event_id", "item_id"),
    "input_audio_buffer.dtmf_event_received": ("event", "received_at"),
    "input_audio_buffer.speech_started": ("audio_start_ms", "event_id", "item_id"),
    "input_audio_buffer.speech_stopped": ("audio_end_ms", "event_id", "item_id"),
    "input_audio_buffer.timeout_triggered": (
        "audio_end_ms", "audio_start_ms", "event_id", "item_id"),
    "mcp_list_tools.completed": ("event_id", "item_id"),
    "mcp_list_tools.failed": ("event_id", "item_id"),
    "mcp_list_tools.in_progress": ("event_id", "item_id"),
    "output_audio_buffer.cleared": ("event_id", "response_id"),
    "output_audio_buffer.started": ("event_id", "response_id"),
    "output_audio_buffer.stopped": ("event_id", "response_id"),
    "rate_limits.updated": ("event_id", "rate_limits"),
    "response.content_part.added": (
        "content_index", "event_id", "item_id", "output_index", "part", "response_id"),
    "response.content_part.done": (
        "content_index", "event_id", "item_id", "output_index", "part", "response_id"),
    "response.created": ("event_id", "response"),
    "response.done": ("event_id", "response"),
    "response.function_call_arguments.delta": (
        "call_id", "delta", "event_id", "item_id", "output_index", "response_id"),
    "response.function_call_arguments.done": (
        "arguments", "call_id", "event_id", "item_id", "name", "output_index", "response_id"),
    "response.mcp_call.completed": ("event_id", "item_id", "output_index"),
    "response.mcp_call.failed": ("event_id", "item_id", "output_index"),
    "response.mcp_call.in_progress": ("event_id", "item_id", "output_index"),
    "response.mcp_call_arguments.delta": (
        "delta", "event_id", "item_id", "output_index", "response_id"),
    "response.mcp_call_arguments.done": (
        "arguments", "event_id", "item_id", "output_index", "response_id"),
    "response.output_audio.delta": (
        "content_index", "delta", "event_id", "item_id", "output_index", "response_id"),
    "response.output_audio.done": (
        "content_index", "event_id", "item_id", "output_index", "response_id"),
    "response.output_audio_transcript.delta": (
        "content_index", "delta", "event_id", "item_id", "output_index", "response_id"),
    "response.output_audio_transcript.done": (
        "content_index", "event_id", "item_id", "output_index", "response_id", "transcript"),
    "response.output_item.added": ("event_id", "item", "output_index", "response_id"),
    "response.output_item.done": ("event_id", "item", "output_index", "response_id"),
    "response.output_text.delta": (
        "content_index", "delta", "event_id", "item_id", "output_index", "response_id"),
    "response.output_text.done": (
        "content_index", "event_id", "item_id", "output_index", "response_id", "text"),
    "session.created": ("event_id", "session"),
    "session.updated": ("event_id", "session"),
}

_STR = {"event_id", "item_id", "response_id", "delta", "transcript", "text", "previous_item_id"}
_INT = {"audio_start_ms", "audio_end_ms", "content_index", "output_index"}
_ITEM_STATUS = {"completed", "incomplete", "in_progress"}
_PARTS = {"user": {"input_text", "input_audio", "input_image"},
          "assistant": {"output_text", "output_audio"}, "system": {"input_text"}}


def _no_null(obj: dict[str, Any], where: str, *keys: str) -> None:
    for k in keys:
        assert obj.get(k, "") is not None, f"{where}.{k} is null (zod: optional, not nullable)"


def check_item(item: dict[str, Any], where: str = "item") -> None:
    assert isinstance(item.get("id"), str), where
    assert item.get("object") == "realtime.item", where
    assert item.get("status") in _ITEM_STATUS, where
    if item["type"] == "message":
        role = item["role"]
        assert isinstance(item["content"], list), where
        for i, part in enumerate(item["content"]):
            assert part["type"] in _PARTS[role], f"{where}.content[{i}]"
            _no_null(part, f"{where}.content[{i}]", "id", "type")
            for k in ("audio", "text", "transcript"):
                assert part.get(k) is None or isinstance(part[k], str), f"{where}.{k}"
    else:
        assert item["type"] in ("function_call", "function_call_output"), where


def check_response(r: dict[str, Any]) -> None:
    assert r["object"] == "realtime.response" and isinstance(r["id"], str)
    assert r["status"] in ("completed", "cancelled", "failed", "incomplete", "in_progress")
    assert r["output_modalities"] in (["audio"], ["text"])
    for i, item in enumerate(r["output"]):
        check_item(item, f"response.output[{i}]")
    if r["usage"] is not None:
        usage = r["usage"]
        for k in ("total_tokens", "input_tokens", "output_tokens"):
            assert isinstance(usage[k], int), k
        for k in ("input_token_details", "output_token_details"):
            assert all(isinstance(v, int | dict) for v in usage[k].values()), k
    if r["status"] != "in_progress":
        assert r["usage"] is not None


def check_session(s: dict[str, Any]) -> None:
    assert (s["type"], s["object"]) == ("realtime", "realtime.session")
    assert isinstance(s["id"], str) and s["output_modalities"] in (["audio"], ["text"])
    td = s["audio"]["input"]["turn_detection"]
    assert td is None or td["type"] in ("server_vad", "semantic_vad")


def check_event(e: dict[str, Any]) -> None:
    kind = e["type"]
    assert kind in SERVER_EVENTS, kind
    assert SERVER_EVENTS[kind][0] is not Support.NEVER, f"{kind} is listed as never sent"
    missing = [k for k in REQUIRED[kind] if k not in e]
    assert not missing, f"{kind} lacks {missing}"
    assert e["event_id"].startswith("event_")
    for k, v in e.items():
        if k in _STR:
            assert isinstance(v, str) or (k == "previous_item_id" and v is None), (kind, k)
        elif k in _INT:
            assert isinstance(v, int) and not isinstance(v, bool) and v >= 0, (kind, k)
    if "item" in e:
        check_item(e["item"])
    if "response" in e:
        check_response(e["response"])
    if "session" in e:
        check_session(e["session"])
    if "part" in e:
        assert e["part"]["type"] in ("audio", "text")
        _no_null(e["part"], "part", "audio", "text", "transcript")
    if kind == "error":
        err = e["error"]
        assert isinstance(err["type"], str) and isinstance(err["message"], str)
    if kind == "rate_limits.updated":
        for rl in e["rate_limits"]:
            assert rl["name"] in ("requests", "tokens")
            _no_null(rl, "rate_limits", "limit", "remaining", "reset_seconds")
