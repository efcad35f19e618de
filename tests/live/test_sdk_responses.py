"""GPT-Live's Responses delegation (issue 42 item 3) driven by the official SDK over the
WebSocket against a signaling server whose ``--llm`` is a local server standing in for the
remote LLM (tests/speech/fake_openai.py: OpenAI's own Responses SSE and chat-completions
SSE, each event built and checked with the SDK's types) — once as a backend with
``/v1/responses``, once as a chat-completions-only one (404 there), whose stream the
appliance synthesises. An agent that delegates (tests/live/delegating_agent.py, picked with
``X-Agent``) hears a turn and calls its ``delegate`` tool; the SDK reads
``session.delegation.created`` (target ``responses``, the backend's ``response_id``), the
backend's stream as ``response.event``, answers a function call with
``conn.response.item.create`` + ``conn.response.create``, and hears the final text spoken.
Every frame is checked against the SDK's ``ServerEvent`` types (Recorder), every nested
event against its ``ResponseStreamEvent`` model."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import trio
from live.test_responses import check
from live.test_sdk import FRAME, TIMEOUT, Recorder, client, first_of, start_server
from live.test_sdk_delegation import tone24

openai = pytest.importorskip("openai")
AGENT = "realtime:live.delegating_agent:Delegating"
TOOL = {"type": "function", "name": "get_order", "description": "An order's status by id.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                       "required": ["id"]}}
SESSION = {"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
    "model": "m1", "instructions": "Answer in one sentence.", "tools": [TOOL]}}}


def completed(e: Any) -> bool:
    return e.type == "response.event" and e.event["type"] == "response.completed"


def spoken_until(rec: Recorder, text: str) -> str:
    said = ""
    while text not in said:
        said += first_of(rec, "session.output_transcript.delta").delta
    return said


def responses_loop(url: str, *, round_trip: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with client(url).live.connect(extra_headers={"X-Agent": AGENT}) as conn:
        rec = Recorder(conn)
        conn.session.start(session=SESSION, event_id="s1")
        started = rec.next()
        assert started.type == "session.started", started
        out["started"] = started
        pcm = bytes(9600) + tone24(1.0) + bytes(72_000)  # 0.2 s, a 1 s "turn", 1.5 s
        for i in range(0, len(pcm), FRAME):
            conn.session.input_audio.append(audio=base64.b64encode(pcm[i : i + FRAME]).decode())
        out["created"] = first_of(rec, "session.delegation.created")
        out["first"] = [e for e in rec.until(completed) if e.type == "response.event"]
        if round_trip:
            [call] = [e.event["item"] for e in out["first"]
                      if e.event["type"] == "response.output_item.done"
                      and e.event["item"]["type"] == "function_call"]
            out["call"] = call
            conn.response.item.create(item={"type": "function_call_output",
                                            "call_id": call["call_id"],
                                            "output": '{"status": "shipped Monday"}'},
                                      event_id="i1")
            conn.response.create(event_id="r1")
            out["second"] = [e for e in rec.until(completed) if e.type == "response.event"]
        out["said"] = spoken_until(rec, "on Monday.")
        conn.session.close()
        out["closed"] = first_of(rec, "session.closed")
    return out


@pytest.mark.parametrize("has_responses", [True, False], ids=["responses", "chat-only"])
async def test_the_sdk_hears_a_responses_delegation(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, has_responses: bool) -> None:
    from speech.fake_openai import KEY, fake_openai

    async with fake_openai() as api:
        api.has_responses = has_responses
        api.replies.append("It shipped on Monday.")
        monkeypatch.setenv("APPLIANCE_LLM_URL", api.base_url)
        monkeypatch.setenv("APPLIANCE_LLM_KEY", KEY)
        monkeypatch.delenv("APPLIANCE_LLM_KEY_FILE", raising=False)
        url, _ = await start_server(nursery)
        with trio.fail_after(TIMEOUT):
            out = await trio.to_thread.run_sync(
                lambda: responses_loop(url, round_trip=False))
    assert out["started"].session.delegation.type == "responses"
    d = out["created"].delegation
    assert (d.target, d.type) == ("responses", "delegation") and d.id.startswith("item_")
    first = out["first"]
    assert d.response_id == first[0].event["response"]["id"]
    assert {e.delegation_id for e in first} == {d.id}
    for e in first:
        check(e.event)
    kinds = [e.event["type"] for e in first]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert "".join(e.event["delta"] for e in first
                   if e.event["type"] == "response.output_text.delta") == "It shipped on Monday."
    assert first[-1].event["response"]["usage"]["total_tokens"] > 0
    assert first[-1].event["response"]["output"] == []  # the snapshot rule
    # What the stand-in LLM was asked: the backend prompt, the tool, the task.
    if has_responses:
        [req] = api.responses_requests
        assert api.chat_requests == []
        assert (req["model"], req["instructions"], req["stream"]) == (
            "m1", "Answer in one sentence.", True)
        assert req["tools"] == [TOOL]
        assert "the order status" in req["input"][-1]["content"]
    else:
        [req] = api.chat_requests
        assert req["messages"][0] == {"role": "system", "content": "Answer in one sentence."}
        assert req["tools"][0]["function"]["name"] == "get_order"
        assert "the order status" in req["messages"][-1]["content"]
    # The final text is spoken in the voice conversation.
    assert out["said"].endswith(" It shipped on Monday.")
    assert out["closed"].reason == "close_requested"


@pytest.mark.parametrize("has_responses", [True, False], ids=["responses", "chat-only"])
async def test_a_function_call_round_trip(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch,
                                          has_responses: bool) -> None:
    from speech.fake_openai import KEY, fake_openai

    async with fake_openai() as api:
        api.has_responses = has_responses
        api.tool_calls.append([{"name": "get_order", "arguments": '{"id": "42"}'}])
        api.replies.append("Order 42 shipped on Monday.")
        monkeypatch.setenv("APPLIANCE_LLM_URL", api.base_url)
        monkeypatch.setenv("APPLIANCE_LLM_KEY", KEY)
        url, _ = await start_server(nursery)
        with trio.fail_after(TIMEOUT):
            out = await trio.to_thread.run_sync(lambda: responses_loop(url, round_trip=True))
    call = out["call"]
    assert (call["name"], call["arguments"]) == ("get_order", '{"id": "42"}')
    second = out["second"]
    d = out["created"].delegation
    assert {e.delegation_id for e in second} == {d.id}
    assert {e.client_event_id for e in second} == {"r1"}
    for e in second:
        check(e.event)
    # The second request carries the call and the client's output, in order.
    if has_responses:
        items = api.responses_requests[1]["input"]
        assert [i.get("type") for i in items[-2:]] == ["function_call", "function_call_output"]
        assert items[-1]["output"] == '{"status": "shipped Monday"}'
    else:
        messages = api.chat_requests[1]["messages"]
        assert messages[-2]["tool_calls"][0]["id"] == call["call_id"]
        assert messages[-1] == {"role": "tool", "tool_call_id": call["call_id"],
                                "content": '{"status": "shipped Monday"}'}
    assert out["said"].endswith(" Order 42 shipped on Monday.")


def refusals(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with client(url).live.connect() as conn:
        rec = Recorder(conn)
        hosted = {**SESSION["delegation"]["responses"],  # type: ignore[index]
                  "tools": [TOOL, {"type": "web_search"}]}
        conn.session.start(session={"model": "gpt-live-1", "delegation": {
            "type": "responses", "responses": hosted}}, event_id="s1")
        out["hosted"] = rec.next()
        conn.session.start(session={"model": "gpt-live-1", "delegation": {"type": "client"}},
                           event_id="s2")
        out["started"] = rec.next()
        conn.response.create(event_id="r")
        out["create"] = rec.next()
        conn.session.close()
        first_of(rec, "session.closed")
    return out


async def test_hosted_tools_and_response_create_under_client_delegation_are_refused(
        nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_LLM_URL", "http://127.0.0.1:9/v1")  # never called
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(refusals, url)
    hosted = out["hosted"]
    assert hosted.type == "error" and hosted.client_event_id == "s1"
    assert hosted.error.param == "session.delegation.responses.tools[1].type"
    assert "'web_search'" in hosted.error.message
    assert out["started"].type == "session.started"
    create = out["create"]
    assert create.type == "error" and create.client_event_id == "r"
    assert create.error.message == "response.create requires Responses delegation."
