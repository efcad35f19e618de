"""GPT-Live's Responses delegation over WebRTC, end to end (issue 42 items 3 and 4): an
``appliance up`` whose ``--llm`` is a local stand-in for the remote LLM
(tests/speech/fake_openai.py: OpenAI's own Responses SSE, each event built and checked with
the SDK's types — a real remote LLM cannot run here), aiortc as the browser, and the
official SDK's ``client.live.create`` with ``delegation: {"type": "responses"}``.

The session's agent delegates every turn (tests/live/delegating_agent.py, named with
``X-Agent``). On the ``oai-events`` channel the browser sees ``session.delegation.created``,
the backend's stream wrapped in ``response.event`` up to ``response.completed`` with a
``function_call`` item; it answers that with ``response.item.create`` and
``response.create`` on the channel, and the second response's text is spoken
(``session.output_transcript.delta``). Every event is checked against the SDK's types for
the data channel. The WebSocket twin of this test, with a chat-completions-only backend too,
is tests/live/test_sdk_responses.py; this one covers the WebRTC shell
(appliance/live/call.py) running the same requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from aiortc import RTCSessionDescription
from e2e.procs import Proc, free_tcp_port, free_udp_port
from e2e.test_realtime_aiortc import Events, oai_caller
from e2e.test_up_http import in_fresh_thread
from live.live_shapes import shape_errors
from live.test_sdk_responses import TOOL
from sdk_clients import sdk

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.interop, pytest.mark.slow]
AGENT = f"realtime:{Path(__file__).parent.parent / 'live' / 'delegating_agent.py'}:Delegating"
SESSION = {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
    "model": "m1", "instructions": "Answer in one sentence.", "tools": [TOOL]}}}
TIMEOUT = 120.0


def write_wav(path: Path) -> None:
    """The caller's microphone: 0.3 s of silence, a 1 s tone (a "turn"), then silence."""
    rate = 48_000
    t = np.arange(rate) / rate
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(int(0.3 * rate) * 2) + tone + bytes(20 * rate * 2))


async def until(events: Events, pred: Callable[[dict[str, Any]], bool], what: str,
                after: int = 0) -> tuple[int, dict[str, Any]]:
    """The first event from index ``after`` on that ``pred`` takes, and its index."""
    def found() -> int | None:
        return next((i for i, e in enumerate(events.got) if i >= after and pred(e)), None)
    try:
        async with asyncio.timeout(60), events.cond:
            await events.cond.wait_for(lambda: found() is not None)
    except TimeoutError:
        errors = [e for e in events.got if e["type"] == "error"]
        raise AssertionError(f"no {what}: got {[e['type'] for e in events.got]}; "
                             f"errors {errors}") from None
    i = found()
    assert i is not None
    return i, events.got[i]


def completed(e: dict[str, Any]) -> bool:
    return e["type"] == "response.event" and e["event"]["type"] == "response.completed"


async def delegated_call(base: str, wav: Path) -> dict[str, Any]:
    pc, player, channel, events = oai_caller(wav)
    await pc.setLocalDescription(await pc.createOffer())
    client = sdk(base + "/v1", max_retries=0)
    made = await asyncio.to_thread(lambda: client.live.create(
        session=SESSION, transport={"type": "webrtc", "sdp": pc.localDescription.sdp},
        extra_headers={"X-Agent": AGENT}))
    await pc.setRemoteDescription(RTCSessionDescription(made.transport.sdp, "answer"))
    out: dict[str, Any] = {"id": made.session.id}
    try:
        out["started"] = await events.wait("session.started", within=30)
        _, out["created"] = await until(
            events, lambda e: e["type"] == "session.delegation.created", "delegation")
        first, _ = await until(events, completed, "the first response.completed")
        out["first"] = [e for e in events.got[: first + 1] if e["type"] == "response.event"]
        [call] = [e["event"]["item"] for e in out["first"]
                  if e["event"]["type"] == "response.output_item.done"
                  and e["event"]["item"]["type"] == "function_call"]
        out["call"] = call
        channel.send(json.dumps({"type": "response.item.create", "event_id": "i1", "item": {
            "type": "function_call_output", "call_id": call["call_id"],
            "output": '{"status": "shipped Monday"}'}}))
        channel.send(json.dumps({"type": "response.create", "event_id": "r1"}))
        second, _ = await until(events, completed, "the second response.completed", first + 1)
        out["second"] = [e for e in events.got[first + 1 : second + 1]
                         if e["type"] == "response.event"]
        await until(events, lambda e: "on Monday." in "".join(
            x["delta"] for x in events.got if x["type"] == "session.output_transcript.delta"),
            "the answer spoken")
        channel.send(json.dumps({"type": "session.close", "event_id": "bye"}))
        out["closed"] = await events.wait("session.closed", within=30)
        out["events"] = list(events.got)
    finally:
        await pc.close()
        player.audio.stop()
    return out


async def test_a_webrtc_session_delegates_to_the_responses_backend(tmp_path: Path) -> None:
    from speech.fake_openai import KEY, fake_openai

    wav = tmp_path / "mic.wav"
    write_wav(wav)
    async with fake_openai() as api:
        api.tool_calls.append([{"name": "get_order", "arguments": '{"id": "42"}'}])
        api.replies.append("Order 42 shipped on Monday.")
        http, udp = free_tcp_port(), free_udp_port()
        args = ["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                "--public-address", "127.0.0.1", "--state-dir", str(tmp_path / "state"),
                "--transceivers", "1"]
        env = {"APPLIANCE_LLM_URL": api.base_url, "APPLIANCE_LLM_KEY": KEY,
               "APPLIANCE_LLM_KEY_FILE": "", "OPENAI_API_KEY": ""}
        proc = await trio.to_thread.run_sync(
            lambda: Proc(args, "appliance ready", timeout=TIMEOUT, env=env))
        try:
            with trio.fail_after(TIMEOUT):  # a hang guard; every wait inside is an event
                out = await trio.to_thread.run_sync(lambda: in_fresh_thread(
                    lambda: asyncio.run(delegated_call(f"http://127.0.0.1:{http}", wav)),
                    timeout=TIMEOUT))
        finally:
            rc = await trio.to_thread.run_sync(proc.stop)
    assert rc == 0, "".join(proc.stderr)[-3000:]
    for e in out["events"]:
        assert not shape_errors(e, data_channel=True), (e, shape_errors(e, data_channel=True))
    assert out["started"]["session"]["delegation"]["type"] == "responses"
    d = out["created"]["delegation"]
    assert d["target"] == "responses" and d["id"].startswith("item_")
    assert {e["delegation_id"] for e in out["first"] + out["second"]} == {d["id"]}
    kinds = [e["event"]["type"] for e in out["first"]]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert (out["call"]["name"], out["call"]["arguments"]) == ("get_order", '{"id": "42"}')
    assert "".join(e["event"]["delta"] for e in out["second"]
                   if e["event"]["type"] == "response.output_text.delta") == \
        "Order 42 shipped on Monday."
    assert out["closed"]["reason"] == "close_requested"
    # What the stand-in LLM was asked, by the WebRTC session's shell: its Responses API.
    first, second = api.responses_requests
    assert (first["model"], first["instructions"], first["tools"]) == (
        "m1", "Answer in one sentence.", [TOOL])
    assert "the order status" in first["input"][-1]["content"]
    assert any(i.get("type") == "function_call_output" and i["call_id"] == out["call"]["call_id"]
               for i in second["input"])
    assert api.chat_requests == []
    assert os.environ.get("APPLIANCE_LLM_URL") != api.base_url  # only the child had it
