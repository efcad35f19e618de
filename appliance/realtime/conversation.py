"""The conversation: GA items in order, with their audio, truncation and bounds.

An item is kept as its GA JSON object (``realtime.item``: ``message`` with ``role`` and
``content`` parts, ``function_call``, ``function_call_output``) without audio data, and,
beside it, the audio of its first audio part as 48 kHz mono PCM16 (what an agent needs and
what ``conversation.item.retrieve`` re-encodes). Events show items without audio, as
OpenAI's ``conversation.item.added`` / ``done`` do; ``retrieved`` includes it.

Bounds (a call must not grow without limit): at most :data:`MAX_ITEMS` items — the oldest
is dropped from the context, as OpenAI's ``truncation: "auto"`` drops it — and at most
:data:`MAX_AUDIO_SECONDS` of audio kept over all items (the oldest items' audio goes first;
their JSON stays). Nothing here does I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from .audio import RATE, to_48k
from .protocol import EventError, b64decode_untrusted, check, json_copy, optional, require

MAX_ITEMS = 256
MAX_AUDIO_SECONDS = 60.0
_MAX_AUDIO_BYTES = int(MAX_AUDIO_SECONDS * RATE) * 2

#: Content part types allowed per role (GA: openai-python realtime_conversation_item_*.py).
_PARTS = {
    "user": ("input_text", "input_audio", "input_image"),
    "assistant": ("output_text", "output_audio"),
    "system": ("input_text",),
}


@dataclass(slots=True)
class Item:
    data: dict[str, Any]  # the GA item, audio data left out
    audio: bytes = b""  # the first audio part's audio, 48 kHz mono PCM16
    audio_part: int | None = None  # index of that part in data["content"]

    @property
    def id(self) -> str:
        item_id: str = self.data["id"]
        return item_id

    def text(self) -> str | None:
        """The item's text (text parts joined), or None if it has none."""
        texts = [p.get("text") or "" for p in self.data.get("content", ())
                 if p.get("type") in ("input_text", "output_text")]
        return "".join(texts) if texts else None


@dataclass(slots=True)
class Conversation:
    items: OrderedDict[str, Item] = field(default_factory=OrderedDict)
    audio_bytes: int = 0

    def last_id(self) -> str | None:
        return next(reversed(self.items), None) if self.items else None

    def get(self, item_id: str, event_id: str | None = None) -> Item:
        item = self.items.get(item_id)
        if item is None:
            raise EventError(f"Item with item_id '{item_id[:64]}' not found.",
                             param="item_id", event_id=event_id)
        return item

    def add(self, item: Item, previous_item_id: str | None = None,
            event_id: str | None = None) -> str | None:
        """Insert after ``previous_item_id`` (``"root"``: first; None: last); returns the
        id of the item it now follows."""
        if item.id in self.items:
            raise EventError(f"Item with item_id '{item.id[:64]}' already exists.",
                             param="item.id", event_id=event_id)
        if previous_item_id is None or previous_item_id == self.last_id():
            prev = self.last_id()
            self.items[item.id] = item
        elif previous_item_id == "root":
            prev = None
            self.items[item.id] = item
            self.items.move_to_end(item.id, last=False)
        else:
            if previous_item_id not in self.items:
                raise EventError(f"previous_item_id '{previous_item_id[:64]}' not found.",
                                 param="previous_item_id", event_id=event_id)
            prev = previous_item_id
            rest = []
            seen = False
            for key in list(self.items):
                if seen:
                    rest.append(key)
                if key == previous_item_id:
                    seen = True
            self.items[item.id] = item
            for key in rest:
                self.items.move_to_end(key)
        self.audio_bytes += len(item.audio)
        self._bound(keep=item.id)
        return prev

    def _bound(self, keep: str) -> None:
        while len(self.items) > MAX_ITEMS:
            _, old = self.items.popitem(last=False)
            self.audio_bytes -= len(old.audio)
        for old in self.items.values():
            if self.audio_bytes <= _MAX_AUDIO_BYTES:
                break
            if old.id != keep and old.audio:
                self.audio_bytes -= len(old.audio)
                old.audio = b""

    def set_audio(self, item: Item, audio: bytes) -> None:
        self.audio_bytes += len(audio) - len(item.audio)
        item.audio = audio
        self._bound(keep=item.id)

    def delete(self, item_id: str, event_id: str | None = None) -> None:
        item = self.get(item_id, event_id)
        self.audio_bytes -= len(item.audio)
        del self.items[item_id]

    def last_user(self) -> Item | None:
        for item in reversed(self.items.values()):
            if item.data.get("type") == "message" and item.data.get("role") == "user":
                return item
        return None

    def public(self) -> tuple[dict[str, Any], ...]:
        return tuple(json_copy(i.data) for i in self.items.values())


def truncate(item: Item, content_index: int, audio_end_ms: int,
             event_id: str | None = None) -> None:
    """Cut an assistant item's audio at ``audio_end_ms`` and drop its transcript (OpenAI:
    the context must hold no text the user has not heard)."""
    content = item.data.get("content", [])
    if (item.data.get("role") != "assistant" or content_index >= len(content)
            or content[content_index].get("type") != "output_audio"):
        raise EventError("Only the audio content of an assistant message can be truncated.",
                         param="content_index", event_id=event_id)
    have_ms = len(item.audio) * 1000 // (2 * RATE)
    if audio_end_ms > have_ms:
        raise EventError(f"Audio content of {have_ms}ms is already shorter than "
                         f"{audio_end_ms}ms", param="audio_end_ms", event_id=event_id)
    item.audio = item.audio[: audio_end_ms * RATE // 1000 * 2]
    content[content_index]["transcript"] = None


def item_from_client_untrusted(obj: dict[str, Any], item_id: str, input_format: str,
                               event_id: str | None) -> Item:
    """A client's ``conversation.item.create`` item, checked, as a stored :class:`Item`."""
    eid = event_id
    kind = require(obj, "type", str, where="item.", event_id=eid)
    given_id = optional(obj, "id", str, where="item.", event_id=eid)
    data: dict[str, Any] = {k: json_copy(v) for k, v in obj.items()}
    data.update(id=given_id or item_id, object="realtime.item", status="completed")
    audio = b""
    part_index: int | None = None
    if kind == "message":
        role = require(obj, "role", str, where="item.", event_id=eid)
        if role not in _PARTS:
            raise EventError(f"Invalid value: '{role[:32]}'. Supported values are: 'user', "
                             "'assistant' and 'system'.", param="item.role", event_id=eid)
        content = require(obj, "content", list, where="item.", event_id=eid)
        parts = []
        for i, part in enumerate(content):
            where = f"item.content[{i}]"
            check(part, dict, param=where, event_id=eid)
            ptype = require(part, "type", str, where=f"{where}.", event_id=eid)
            if ptype not in _PARTS[role]:
                raise EventError(f"Invalid value: '{ptype[:32]}'. Supported values for role "
                                 f"'{role}' are: {', '.join(_PARTS[role])}.",
                                 param=f"{where}.type", event_id=eid)
            part = dict(part)
            if ptype in ("input_text", "output_text"):
                require(part, "text", str, where=f"{where}.", event_id=eid)
            elif ptype in ("input_audio", "output_audio"):
                b64 = optional(part, "audio", str, where=f"{where}.", event_id=eid)
                optional(part, "transcript", str, where=f"{where}.", event_id=eid)
                part.setdefault("transcript", None)
                if b64 is not None and part_index is None:
                    raw = b64decode_untrusted(b64, param=f"{where}.audio", event_id=eid)
                    audio = to_48k(raw, input_format)[:_MAX_AUDIO_BYTES]
                    part_index = i
                part.pop("audio", None)
            parts.append(part)
        data["content"] = parts
    elif kind == "function_call":
        require(obj, "name", str, where="item.", event_id=eid)
        require(obj, "arguments", str, where="item.", event_id=eid)
        optional(obj, "call_id", str, where="item.", event_id=eid)
    elif kind == "function_call_output":
        require(obj, "call_id", str, where="item.", event_id=eid)
        require(obj, "output", str, where="item.", event_id=eid)
    else:
        raise EventError(f"Invalid value: '{kind[:32]}'. Supported values are: 'message', "
                         "'function_call' and 'function_call_output'.", param="item.type",
                         event_id=eid)
    return Item(data, audio, part_index)
