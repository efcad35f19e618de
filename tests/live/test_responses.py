"""GPT-Live's Responses delegation (issue 42 item 3), sans-IO: the translation
(appliance/live/responses.py — the config check, the request and its chat-completions form,
the Responses events synthesised from a chat stream, checked against the
SDK's ``ResponseStreamEvent`` union), the chunk parsers fuzzed with hypothesis,
and the core's delegations (connection.py) with the backend's part played by hand."""

from __future__ import annotations

import itertools
import json
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live.test_connection import Core, _turn

from appliance.live.config import DELEGATE_TOOL
from appliance.live.connection import ACKNOWLEDGEMENT, SAY, AskBackend, LiveConnection
from appliance.live.responses import (
    ChatSynth,
    Outcome,
    ResponsesError,
    chat_body,
    check_config_untrusted,
    chunk_untrusted,
    event_untrusted,
    request_body,
    snapshot,
)
from appliance.live.schema import LiveError
from appliance.realtime.interface import FunctionCall
from appliance.realtime.machine import StartResponse

responses_types = pytest.importorskip("openai.types.responses")
pydantic = pytest.importorskip("pydantic")

def _by_type() -> dict[str, Any]:
    union = typing.get_args(responses_types.ResponseStreamEvent)[0]
    return {typing.get_args(cls.model_fields["type"].annotation)[0]: cls
            for cls in typing.get_args(union)}


BY_TYPE = _by_type()


def check(event: dict[str, Any]) -> None:
    """One event against the SDK's model of its type (strict: no field it lacks)."""
    model = BY_TYPE[event["type"]].model_validate(event)
    assert not model.model_extra, (event["type"], model.model_extra)

TOOL = {"type": "function", "name": "get_order", "description": "An order by id.",
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}
CONFIG = {"model": "m1", "instructions": "Answer briefly.", "tools": [TOOL],
          "tool_choice": "auto", "parallel_tool_calls": False, "max_output_tokens": 200,
          "reasoning": {"effort": "low"}}


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.sampled_from(
                           ["type", "choices", "delta", "content", "tool_calls", "index",
                            "id", "function", "name", "arguments", "usage"]), inner,
                           max_size=5), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=64), JSONISH.map(json.dumps)))
def test_fuzz_the_data_parsers_raise_only_their_error(data: str) -> None:
    for parse in (event_untrusted, chunk_untrusted):
        try:
            assert isinstance(parse(data), dict)
        except ResponsesError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.lists(JSONISH, max_size=8))
def test_fuzz_the_synthesis_takes_any_chunks(chunks: list[Any]) -> None:
    """A chat stream's chunks are the network's: any JSON object goes in, and what comes
    out is still OpenAI's Responses stream."""
    synth = ChatSynth({"model": "m", "input": []}, _ids(), 1)
    synth.start()
    try:
        for chunk in chunks:
            if isinstance(chunk, dict):
                synth.handle_chunk(chunk)
        synth.finish()
    except ResponsesError:
        return
    while (ev := synth.poll_event()) is not None:
        check(ev)


# -- the config and the request ------------------------------------------------------------


def test_function_tools_pass_and_hosted_tools_are_refused_by_name() -> None:
    assert check_config_untrusted(dict(CONFIG), "r")["tools"] == [TOOL]
    for tool in ({"type": "web_search"}, {"type": "mcp", "server_label": "x"},
                 {"type": "code_interpreter"}, {"type": "shell"}):
        with pytest.raises(LiveError) as info:
            check_config_untrusted({"model": "m", "tools": [TOOL, tool]}, "s.responses")
        assert info.value.param == "s.responses.tools[1].type"
        assert f"'{tool['type']}'" in info.value.message
    with pytest.raises(LiveError) as info:
        check_config_untrusted({"model": "m", "tool_choice": {
            "type": "allowed_tools", "tools": [{"type": "web_search"}]}}, "r")
    assert info.value.param == "r.tool_choice.tools[0].type"


def test_the_request_and_its_chat_completions_form() -> None:
    items = [{"type": "message", "role": "user", "content": "Where is order 42?"},
             {"type": "message", "role": "developer", "content": "The task: order 42"},
             {"type": "function_call", "call_id": "c1", "name": "get_order",
              "arguments": '{"id":"42"}'},
             {"type": "function_call", "call_id": "c2", "name": "get_order",
              "arguments": '{"id":"43"}'},
             {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
             {"type": "function_call_output", "call_id": "c2",
              "output": [{"type": "input_text", "text": "pending"}]}]
    body = request_body(CONFIG, items)
    assert body == {**CONFIG, "input": items, "stream": True}
    chat = chat_body(body)
    assert chat["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Where is order 42?"},
        {"role": "system", "content": "The task: order 42"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_order",
                                                          "arguments": '{"id":"42"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_order",
                                                          "arguments": '{"id":"43"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "shipped"},
        {"role": "tool", "tool_call_id": "c2", "content": "pending"}]
    assert chat["tools"] == [{"type": "function", "function": {
        k: TOOL[k] for k in ("name", "description", "parameters")}}]
    assert (chat["tool_choice"], chat["parallel_tool_calls"], chat["max_tokens"],
            chat["reasoning_effort"], chat["stream"]) == ("auto", False, 200, "low", True)
    assert chat["stream_options"] == {"include_usage": True}


# -- chat completions -> Responses events ----------------------------------------------------


def _ids() -> Any:
    n = itertools.count()
    return lambda prefix: f"{prefix}_{next(n)}"


def synthesise(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    synth = ChatSynth(request_body(CONFIG, []), _ids(), 1_700_000_000)
    synth.start()
    for chunk in chunks:
        synth.handle_chunk(chunk)
    synth.finish()
    out = []
    while (ev := synth.poll_event()) is not None:
        check(ev)  # OpenAI's shape, field by field
        out.append(ev)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def delta(**d: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]}


def test_a_text_answer_is_the_responses_stream_of_one_message() -> None:
    out = synthesise([delta(role="assistant", content=""), delta(content="It shipped "),
                      delta(content="on Monday."),
                      {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                                "total_tokens": 13}}])
    assert [e["type"] for e in out] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert out[6]["text"] == "It shipped on Monday."
    done = out[-1]["response"]
    assert done["status"] == "completed" and done["id"] == out[0]["response"]["id"]
    assert done["usage"]["input_tokens"] == 9 and done["usage"]["total_tokens"] == 13
    outcome = Outcome()
    for ev in out:
        outcome.handle_event(ev)
    assert (outcome.text(), outcome.calls(), outcome.status) == (
        "It shipped on Monday.", [], "completed")


def test_tool_calls_are_function_call_items_with_their_argument_deltas() -> None:
    out = synthesise([
        delta(content="Checking."),
        delta(tool_calls=[{"index": 0, "id": "call_a", "type": "function",
                           "function": {"name": "get_order", "arguments": ""}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"id":'}}]),
        delta(tool_calls=[{"index": 1, "id": "call_b", "function": {
            "name": "get_order", "arguments": '{"id":"43"}'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '"42"}'}}])])
    args = [e for e in out if e["type"] == "response.function_call_arguments.done"]
    assert [a["arguments"] for a in args] == ['{"id":"42"}', '{"id":"43"}']
    outcome = Outcome()
    for ev in out:
        outcome.handle_event(ev)
    calls = outcome.calls()
    assert [(c["call_id"], c["arguments"]) for c in calls] == [
        ("call_a", '{"id":"42"}'), ("call_b", '{"id":"43"}')]
    assert outcome.text() == "Checking."
    assert [i["output_index"] for i in out if i["type"] == "response.output_item.done"] == [
        0, 1, 2]


def test_a_lifecycle_snapshot_omits_input_and_clears_the_rest() -> None:
    ev = {"type": "response.completed", "sequence_number": 3, "response": {
        "id": "resp_1", "input": [1], "instructions": "x", "tools": [TOOL], "output": [2],
        "usage": {"total_tokens": 1}}}
    assert snapshot(ev)["response"] == {"id": "resp_1", "instructions": None, "tools": [],
                                        "output": [], "usage": {"total_tokens": 1}}
    delta_ev = {"type": "response.output_text.delta", "delta": "x"}
    assert snapshot(delta_ev) is delta_ev


# -- the core ------------------------------------------------------------------------------


def spoken(core: Core) -> list[str]:
    """Everything the agent is asked to say, each answer finished so the next can start."""
    out: list[str] = []
    while starts := core.take(StartResponse):
        for start in starts:
            if SAY in start.request.extra:
                out.append(start.request.extra[SAY])
            core.c.handle_response_end(start.request.response_id)
        core.drain()
    return out


def responses_core(**cfg: Any) -> Core:
    core = Core(backend=True)
    core.start(delegation={"type": "responses", "responses": {**CONFIG, **cfg}})
    return core


def feed(core: Core, did: str | None, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for ev in events:
        core.c.handle_backend_event(did, ev)
    core.c.handle_backend_end(did)
    return core.drain()


def test_without_an_llm_responses_delegation_says_what_to_configure() -> None:
    core = Core()
    [err] = core.send(type="session.start", session={"model": "gpt-live-1", "delegation": {
        "type": "responses", "responses": {"model": "m"}}})
    assert err["error"]["param"] == "session.delegation.type"
    assert "--llm" in err["error"]["message"]


def test_response_commands_need_responses_delegation() -> None:
    core = Core(backend=True)
    core.start(delegation={"type": "client"})
    for kind, extra in (("response.create", {}),
                        ("response.item.create", {"item": {"type": "message", "role": "user",
                                                           "content": "x"}})):
        [err] = core.send(type=kind, event_id="r", **extra)
        assert err["error"]["message"] == f"{kind} requires Responses delegation."
        assert err["client_event_id"] == "r"
    assert core.take(AskBackend) == []


def test_a_delegation_asks_the_backend_and_its_answer_is_spoken() -> None:
    core = responses_core()
    core.c.machine.handle_message(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Where is my order?"}]}}))
    assert core.drain() == []
    delegate_events(core)
    [ask] = core.take(AskBackend)
    did = ask.delegation_id
    assert ask.body["model"] == "m1" and ask.body["tools"] == [TOOL]
    assert ask.body["input"][0] == {"type": "message", "role": "user",
                                    "content": "Where is my order?"}
    assert ask.body["input"][-1]["role"] == "developer"
    assert "order status" in ask.body["input"][-1]["content"]
    stream = synthesise([delta(content="It shipped on Monday.")])
    out = feed(core, did, stream)
    [announced] = [e for e in out if e["type"] == "session.delegation.created"]
    assert announced["delegation"] == {"id": did, "type": "delegation", "target": "responses",
                                       "response_id": stream[0]["response"]["id"]}
    wrapped = [e for e in out if e["type"] == "response.event"]
    assert [w["event"]["type"] for w in wrapped] == [e["type"] for e in stream]
    assert {w["delegation_id"] for w in wrapped} == {did}
    assert wrapped[-1]["event"]["response"]["output"] == []  # the snapshot rule
    assert out.index(announced) < out.index(wrapped[0])
    assert spoken(core) == [ACKNOWLEDGEMENT, "It shipped on Monday."]
    [err] = core.send(type="session.commentary.append", content="x", delegation_id=did)
    assert err["error"]["param"] == "delegation_id"  # the backend answers, not the client


def delegate_events(core: Core) -> None:
    """The agent's LLM calls the delegate tool; under Responses delegation nothing is
    announced until the backend's first event (it carries the response id)."""
    start, _ = _turn(core)
    rid = start.request.response_id
    core.c.handle_delta(rid, FunctionCall(DELEGATE_TOOL, '{"task": "order status"}', "call_1"))
    core.c.handle_response_end(rid)
    assert [e for e in core.drain() if e["type"] == "session.delegation.created"] == []


def test_function_calls_wait_for_the_clients_outputs_and_response_create() -> None:
    core = responses_core()
    delegate_events(core)
    [ask] = core.take(AskBackend)
    did = ask.delegation_id
    feed(core, did, synthesise([delta(tool_calls=[{"index": 0, "id": "call_x", "function": {
        "name": "get_order", "arguments": '{"id":"42"}'}}])]))
    assert core.take(AskBackend) == []  # waiting for the client
    assert core.send(type="response.item.create", event_id="i", item={
        "type": "function_call_output", "call_id": "call_x", "output": "shipped"}) == []
    assert core.send(type="response.create", event_id="go") == []
    [again] = core.take(AskBackend)
    assert again.delegation_id == did
    kinds = [i.get("type") for i in again.body["input"]]
    assert kinds[-3:] == ["message", "function_call", "function_call_output"]
    [busy] = core.send(type="response.create", event_id="twice")
    assert busy["error"]["code"] == "conversation_already_has_active_response"
    out = feed(core, did, synthesise([delta(content="Order 42 shipped.")]))
    assert {e["client_event_id"] for e in out if e["type"] == "response.event"} == {"go"}
    assert [e for e in out if e["type"] == "session.delegation.created"] == []  # said once
    assert spoken(core)[-1] == "Order 42 shipped."


def test_the_completed_event_frees_the_backend_before_its_stream_closes() -> None:
    """A client answers the function call as soon as it reads ``response.completed``; the
    shell's end of that HTTP stream may come later (a loaded box: the WebRTC test saw
    ``conversation_already_has_active_response`` 6 runs in 10 beside a CPU hog). The
    terminal event ends the response; the stream's late end is for a finished stream and
    does not end the next one, asked under the same delegation."""
    core = responses_core()
    delegate_events(core)
    [ask] = core.take(AskBackend)
    did = ask.delegation_id
    for ev in synthesise([delta(tool_calls=[{"index": 0, "id": "call_x", "function": {
            "name": "get_order", "arguments": '{"id":"42"}'}}])]):
        core.c.handle_backend_event(did, ev, ask.stream)
    core.drain()
    core.send(type="response.item.create", event_id="i", item={
        "type": "function_call_output", "call_id": "call_x", "output": "shipped"})
    assert core.send(type="response.create", event_id="go") == []  # not busy
    [again] = core.take(AskBackend)
    assert again.delegation_id == did and again.stream != ask.stream
    core.c.handle_backend_end(did, None, ask.stream)  # the first stream's late end
    assert core.drain() == []
    [busy] = core.send(type="response.create", event_id="twice")  # the second still runs
    assert busy["error"]["code"] == "conversation_already_has_active_response"
    for ev in synthesise([delta(content="Order 42 shipped.")]):
        core.c.handle_backend_event(did, ev, again.stream)
    core.c.handle_backend_end(did, None, again.stream)
    core.drain()
    assert spoken(core)[-1] == "Order 42 shipped."


def test_a_failed_backend_ends_the_stream_with_an_error_event() -> None:
    core = responses_core()
    delegate_events(core)
    [ask] = core.take(AskBackend)
    core.c.handle_backend_end(ask.delegation_id, "backend answered 500: b'boom'")
    out = core.drain()
    assert [e["type"] for e in out] == ["session.delegation.created", "response.event"]
    assert out[1]["event"]["code"] == "backend_error"
    assert "response_id" not in out[0]["delegation"]


def test_updates_merge_the_backend_settings_and_check_them() -> None:
    core = responses_core()
    [updated] = core.send(type="session.update", session={"delegation": {
        "type": "responses", "responses": {"instructions": "Be terse."}}})
    assert updated["session"]["delegation"]["responses"]["instructions"] == "Be terse."
    assert updated["session"]["delegation"]["responses"]["model"] == "m1"
    [err] = core.send(type="session.update", session={"delegation": {
        "type": "responses", "responses": {"tools": [{"type": "web_search"}]}}})
    assert err["error"]["param"] == "session.delegation.responses.tools[0].type"


def test_a_data_channel_selects_response_events_by_their_nested_type() -> None:
    """``allowed_server_events: [{type: "response.event", response_event: …}]`` (WebRTC):
    only the nested types listed reach the channel."""
    n = itertools.count()
    c = LiveConnection(session_id="live_rtc1", ids=lambda p: f"{p}_{next(n)}",
                       wall_clock=lambda: 1.0, media=True, backend=True)
    c.start({"model": "gpt-live-1", "delegation": {"type": "responses", "responses": {
        "model": "m"}}, "client": {"data_channel": {"allowed_server_events": [
            {"type": "response.event", "response_event": "response.output_text.delta"}]}}})
    c.handle_open()
    c.handle_input(json.dumps({"type": "response.create"}))
    asks = []
    while (out := c.poll_output()) is not None:
        if isinstance(out, AskBackend):
            asks.append(out)
    [ask] = asks
    for ev in synthesise([delta(content="Hi.")]):
        c.handle_backend_event(ask.delegation_id, ev)
    got = []
    while (event := c.poll_event()) is not None:
        got.append(event)
    assert [(e["type"], e["event"]["type"]) for e in got] == [
        ("response.event", "response.output_text.delta")]
