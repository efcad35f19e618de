"""Data channels over the WebSocket agent protocol, against an in-test agent server."""

from __future__ import annotations

import base64
import json
from typing import Any

import trio
from agents.test_channels import CHAT, MemoryPort
from agents.test_ws import Call, accept, agent_server
from trio_websocket import ConnectionClosed, WebSocketConnection

from appliance.agents import ChannelMessage, ChannelOpened


async def next_of(ws: WebSocketConnection, kind: str) -> dict[str, Any]:
    while True:
        msg = await ws.get_message()
        if isinstance(msg, str) and (event := json.loads(msg))["type"] == kind:
            return dict(event)


async def test_channel_events_and_operations_both_ways() -> None:
    call = Call()
    port = MemoryPort()
    call.host.channels.port = port
    got: dict[str, Any] = {}

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        got["opened"] = await next_of(ws, "channel.opened")
        got["text"] = await next_of(ws, "channel.message")
        got["binary"] = await next_of(ws, "channel.message")
        await ws.send_message(json.dumps({"type": "channel.send", "channel": "chat",
                                          "text": "pong"}))
        await ws.send_message(json.dumps({"type": "channel.send", "channel": 0,
                                          "binary": base64.b64encode(b"\x00\xff").decode()}))
        await ws.send_message(json.dumps({"type": "channel.open", "label": "tools",
                                          "ordered": False, "max_retransmits": 0}))
        got["mine"] = await next_of(ws, "channel.opened")
        await ws.send_message(json.dumps({"type": "channel.send", "channel": "nope",
                                          "text": "x"}))
        got["error"] = await next_of(ws, "channel.error")
        await ws.send_message(json.dumps({"type": "channel.close", "channel": "tools"}))
        await ws.send_message(json.dumps({"type": "session.end", "reason": "bye"}))
        await ws.get_message()

    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        nursery.start_soon(call.run, url)
        call.host.channels.push(ChannelOpened(CHAT))
        call.host.channels.push(ChannelMessage(0, "chat", "ping"))
        call.host.channels.push(ChannelMessage(0, "chat", b"\x01\x02"))
        await call.ended.wait()
    assert got["opened"]["channel"] == CHAT.to_json()
    assert got["text"] == {"type": "channel.message", "id": 0, "label": "chat", "text": "ping"}
    assert base64.b64decode(got["binary"]["binary"]) == b"\x01\x02"
    assert got["mine"]["channel"]["label"] == "tools"
    assert got["mine"]["channel"]["ordered"] is False
    assert got["error"]["channel"] == "nope" and "no open data channel" in got["error"]["message"]
    assert port.sent == [(0, "pong"), (0, b"\x00\xff")]
    assert port.closed == [got["mine"]["channel"]["id"]]
    assert call.host.end_reason == "agent: bye"  # a failed channel op did not end the call


async def test_malformed_channel_send_is_a_protocol_error() -> None:
    call = Call()
    call.host.channels.port = MemoryPort()

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        await ws.send_message(json.dumps({"type": "channel.send", "channel": 0,
                                          "text": "a", "binary": "YQ=="}))
        try:
            await ws.get_message()
        except ConnectionClosed as exc:
            got["code"] = exc.reason.code

    got: dict[str, Any] = {}
    async with agent_server(agent) as url:
        await call.run(url)
    assert got["code"] == 1002
    assert call.host.end_reason is not None
    assert "exactly one of 'text' or 'binary'" in call.host.end_reason
