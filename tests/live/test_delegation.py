"""GPT-Live client delegation (issue 42 item 3) in the core (appliance/live/connection.py),
sans-IO: the agent's part played by hand — its LLM calling the session's ``delegate`` tool
is a ``FunctionCall`` delta. ``session.delegation.created`` (metadata, ``offset_ms``), the
call answered in the agent's conversation, the automatic acknowledgement after
``acknowledgement_delay_ms`` of timeline unless a commentary or thinking append comes first,
and the application's result as an append naming the delegation. Every event is checked
against the SDK's types (the Core helper)."""

from __future__ import annotations

from live.test_connection import Core, _turn, zeros

from appliance.live.config import DELEGATE_TOOL
from appliance.live.connection import ACKNOWLEDGEMENT, SAY
from appliance.realtime.interface import FunctionCall, TranscriptDelta
from appliance.realtime.machine import StartResponse


def delegate(core: Core) -> dict[str, object]:
    """A user turn answered by a call of the delegate tool; returns the delegation event."""
    start, _ = _turn(core)
    rid = start.request.response_id
    assert DELEGATE_TOOL in [t["name"] for t in start.request.session["tools"]]
    core.c.handle_delta(rid, TranscriptDelta("Let me see."))
    core.c.handle_delta(rid, FunctionCall(DELEGATE_TOOL, '{"task": "order status"}', "call_1"))
    core.c.handle_response_end(rid)
    [created] = [e for e in core.drain() if e["type"] == "session.delegation.created"]
    return created


def said(core: Core) -> list[str]:
    return [a.request.extra[SAY] for a in core.take(StartResponse) if SAY in a.request.extra]


def test_the_delegate_call_is_a_client_delegation_acknowledged_at_once() -> None:
    core = Core()
    core.start(delegation={"type": "client"})
    created = delegate(core)
    d = created["delegation"]
    assert isinstance(d, dict) and d["target"] == "client" and d["type"] == "delegation"
    assert str(d["id"]).startswith("item_")
    assert created["offset_ms"] == core.c.input_ms == 2400  # where the turn was answered
    # The agent's conversation: the call is answered, never left open for the LLM.
    items = list(core.c.machine.conversation.items.values())
    call = next(i for i in items if i.data["type"] == "function_call")
    out = next(i for i in items if i.data["type"] == "function_call_output")
    assert out.data["call_id"] == call.data["call_id"] == "call_1"
    assert str(d["id"]) in out.data["output"]
    # acknowledgement_delay_ms defaults to 0: the acknowledgement is the next thing said.
    assert said(core) == [ACKNOWLEDGEMENT]


def test_the_acknowledgement_waits_its_delay_on_the_timeline() -> None:
    core = Core()
    core.start(delegation={"type": "client", "acknowledgement_delay_ms": 500})
    delegate(core)
    assert said(core) == []
    core.audio(zeros(0.48))
    assert said(core) == []
    core.audio(zeros(0.02))  # 500 ms of timeline after the delegation
    assert said(core) == [ACKNOWLEDGEMENT]


def test_a_thinking_append_cancels_the_pending_acknowledgement() -> None:
    core = Core()
    core.start(delegation={"type": "client", "acknowledgement_delay_ms": 300})
    d = delegate(core)["delegation"]
    assert isinstance(d, dict)
    [ack] = core.send(type="session.thinking.append", event_id="t1", content="Looking it up.",
                      delegation_id=d["id"])
    assert ack["type"] == "session.thinking.appended" and ack["client_event_id"] == "t1"
    core.audio(zeros(1.0))
    assert said(core) == []  # cancelled: never said
    [ack] = core.send(type="session.commentary.append", content="It shipped on Monday.",
                      delegation_id=d["id"])
    assert ack["type"] == "session.commentary.appended"
    assert said(core) == ["It shipped on Monday."]  # the result, spoken


def test_an_instructions_append_does_not_cancel_it() -> None:
    core = Core()
    core.start(delegation={"type": "client", "acknowledgement_delay_ms": 100})
    delegate(core)
    core.send(type="session.instructions.append", content="Be formal.", delegation_id=None)
    core.audio(zeros(0.1))
    assert said(core) == [ACKNOWLEDGEMENT]


def test_an_unknown_delegation_id_is_still_refused() -> None:
    core = Core()
    core.start(delegation={"type": "client"})
    delegate(core)
    [err] = core.send(type="session.commentary.append", content="x", delegation_id="item_no")
    assert err["error"]["param"] == "delegation_id"


def test_without_client_delegation_named_there_is_no_tool_and_no_delegation() -> None:
    """Regression guard: a session that does not name client delegation gives its agent no
    tool (an LLM backend without tool support would refuse every answer), and a call of a
    tool named delegate is not a delegation."""
    core = Core()
    core.start()
    start, _ = _turn(core)
    assert start.request.session["tools"] == []
    rid = start.request.response_id
    core.c.handle_delta(rid, FunctionCall(DELEGATE_TOOL, "{}", "call_3"))
    core.c.handle_response_end(rid)
    assert [e for e in core.drain() if e["type"] == "session.delegation.created"] == []
    assert said(core) == []


def test_another_tool_is_not_a_delegation() -> None:
    core = Core()
    core.start(delegation={"type": "client"})
    start, _ = _turn(core)
    rid = start.request.response_id
    core.c.handle_delta(rid, FunctionCall("lookup", "{}", "call_9"))
    core.c.handle_response_end(rid)
    assert [e for e in core.drain() if e["type"] == "session.delegation.created"] == []
    assert said(core) == []
