"""The built-in echo realtime agent (``--agent realtime``): each user turn's audio played
back with a transcript such as ``"(echo, 1.4 s)"``; a text turn answered with its text.

Tools, deterministically (so a client's tool loop can be tested without a model): a user
text turn ``call tool NAME {json}`` (the JSON optional, default ``{}``) whose NAME is a
``function`` tool the session declares yields a :class:`FunctionCall` of NAME with that
JSON; the response after the tool's ``function_call_output`` answers
``"tool NAME returned: OUTPUT"``. An undeclared NAME is answered with a text saying so.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from .interface import (
    AudioDelta,
    Delta,
    FunctionCall,
    ResponseRequest,
    TextDelta,
    TranscriptDelta,
)

CHUNK_BYTES = 9_600  # 100 ms at 48 kHz: the granularity at which a cancel takes effect
TOOL_TRIGGER = re.compile(r"^\s*call tool ([A-Za-z0-9_.-]{1,64})\s*(\{.*\})?\s*$", re.S)


def _tool_output(conversation: tuple[dict[str, Any], ...]) -> dict[str, Any] | None:
    """The function_call_output after the latest user message, if any (with its call)."""
    calls = {c.get("call_id"): c for c in conversation if c.get("type") == "function_call"}
    for item in reversed(conversation):
        if item.get("type") == "function_call_output":
            call = calls.get(item.get("call_id"))
            return {"name": call.get("name") if call else None, "output": item.get("output")}
        if item.get("type") == "message" and item.get("role") == "user":
            return None
    return None


def _declared(session: dict[str, Any], name: str) -> bool:
    return any(isinstance(t, dict) and t.get("name") == name
               and t.get("type", "function") == "function" for t in session.get("tools") or ())


class EchoRealtime:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        done = _tool_output(request.conversation)
        if done is not None:
            yield TextDelta(f"tool {done['name']} returned: {done['output']}")
            return
        turn = request.turn
        if turn is None:
            return
        if turn.text is not None and not turn.audio:
            m = TOOL_TRIGGER.match(turn.text)
            if m is not None:
                name, args = m.group(1), m.group(2) or "{}"
                try:
                    json.loads(args)
                except ValueError:
                    yield TextDelta(f"the arguments for {name} are not JSON")
                    return
                if _declared(request.session, name):
                    yield FunctionCall(name, args)
                else:
                    yield TextDelta(f"no tool {name} is declared")
                return
            yield TextDelta(turn.text)
            return
        yield TranscriptDelta(f"(echo, {turn.seconds:.1f} s)")
        for i in range(0, len(turn.audio), CHUNK_BYTES):
            yield AudioDelta(turn.audio[i : i + CHUNK_BYTES])
