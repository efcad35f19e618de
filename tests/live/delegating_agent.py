"""A RealtimeAgent whose "LLM" always delegates: each user turn is answered with a few words
and a call of the Live session's ``delegate`` tool (tests/live/test_sdk_delegation.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from appliance.realtime.interface import Delta, FunctionCall, ResponseRequest, TranscriptDelta


class Delegating:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        tools = [t.get("name") for t in request.session.get("tools") or ()]
        yield TranscriptDelta("Let me find out.")
        if "delegate" in tools:
            yield FunctionCall("delegate", '{"task": "the order status"}')
