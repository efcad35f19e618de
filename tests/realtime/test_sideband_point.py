"""The transceiver's half of the sideband (appliance/realtime/sideband.py) on its own: who
becomes controller, what each side sees, locks, bounded queues, and the control ops."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.realtime import sideband as sb
from appliance.realtime.sideband import SidebandError, SidebandPoint


class Call:
    """A point over a fake machine: fed events are recorded, publish is driven by hand."""

    def __init__(self) -> None:
        self.session: dict[str, Any] = {"instructions": "hi", "tools": []}
        self.fed: list[tuple[str, str]] = []
        self.point = SidebandPoint("rtc_x", lambda: dict(self.session),
                                   lambda text, origin: self.fed.append((text, origin)))

    def publish(self, event: dict[str, Any], origin: str | None = None) -> str | None:
        return self.point.publish(event, json.dumps(event), origin)


def kinds(att: sb.Attachment) -> list[str]:
    return [json.loads(t)["type"] for t in att.queue]


def test_first_is_controller_then_observers() -> None:
    c = Call()
    ctl, created = c.point.attach(None, ["tools"])
    assert ctl.controller and created["type"] == "session.created"
    assert created["session"] == c.session
    obs, _ = c.point.attach(None, [])
    assert not obs.controller
    with pytest.raises(SidebandError) as e:
        c.point.attach("controller", [])
    assert e.value.status == 409
    with pytest.raises(SidebandError):
        c.point.attach("observer", ["instructions"])  # only the controller locks
    with pytest.raises(SidebandError):
        c.point.attach(None, ["type"])  # not lockable
    c.point.detach(ctl.id)
    again, _ = c.point.attach("controller", [])
    assert again.controller
    assert c.point.locks == {"tools"}  # locks outlive the controller that set them


def test_observer_cannot_send_and_controller_feeds_the_machine() -> None:
    c = Call()
    ctl, _ = c.point.attach(None, [])
    obs, _ = c.point.attach(None, [])
    c.point.send(obs.id, {"type": "response.create", "event_id": "e1"})
    assert c.fed == []
    err = json.loads(obs.queue[-1])
    assert err["type"] == "error" and err["error"]["code"] == "sideband_observer"
    assert err["error"]["event_id"] == "e1"
    c.point.send(ctl.id, {"type": "response.create"})
    assert c.fed == [('{"type":"response.create"}', ctl.id)]


def test_errors_go_to_the_side_that_asked() -> None:
    c = Call()
    a, _ = c.point.attach(None, [])
    b, _ = c.point.attach(None, [])
    assert c.publish({"type": "error"}, origin=a.id) is None
    assert kinds(a) == ["error"] and kinds(b) == []
    assert c.publish({"type": "error"}, origin=None) is not None  # the browser's own
    assert kinds(a) == ["error"]
    assert c.publish({"type": "response.created"}) is not None
    assert kinds(a) == ["error", "response.created"] and kinds(b) == ["response.created"]


def test_locked_fields_refuse_a_browser_update_that_changes_them() -> None:
    c = Call()
    c.point.attach(None, ["instructions", "tools"])
    upd = {"type": "session.update", "event_id": "u1",
           "session": {"type": "realtime", "instructions": "pwned"}}
    err = c.point.refuse_untrusted(json.dumps(upd), None)
    assert err is not None and err.code == "session_field_locked"
    assert err.param == "session.instructions" and err.event_id == "u1"
    same = {"type": "session.update", "session": {"instructions": "hi", "voice": "x"}}
    assert c.point.refuse_untrusted(json.dumps(same), None) is None  # unchanged: allowed
    assert c.point.refuse_untrusted(json.dumps(upd), "sb_ctl") is None  # a sideband may
    assert c.point.refuse_untrusted(b"\xff not json", None) is None  # the machine answers
    assert c.point.refuse_untrusted("[" * 100_000, None) is None  # too deep: the machine's


def test_a_sideband_tools_calls_skip_the_browser() -> None:
    c = Call()
    ctl, _ = c.point.attach(None, [])
    upd = {"type": "session.update", "session": {"tools": [{"type": "function",
                                                            "name": "lookup"}]}}
    c.point.refuse_untrusted(json.dumps(upd), ctl.id)
    c.publish({"type": "session.updated"}, origin=ctl.id)
    assert c.point.tool_owner == {"lookup": ctl.id}
    item = {"id": "item_1", "type": "function_call", "name": "lookup", "call_id": "call_1"}
    assert c.publish({"type": "response.output_item.added", "item": item}) is None
    assert c.publish({"type": "response.function_call_arguments.done",
                      "item_id": "item_1"}) is None
    msg = {"id": "item_0", "type": "message"}
    done = c.publish({"type": "response.done", "response": {"output": [msg, item]}})
    assert done is not None and json.loads(done)["response"]["output"] == [msg]
    assert kinds(ctl)[-1] == "response.done"
    assert len(json.loads(ctl.queue[-1])["response"]["output"]) == 2  # the sideband sees all
    out = {"id": "item_2", "type": "function_call_output", "call_id": "call_1"}
    assert c.publish({"type": "conversation.item.added", "item": out}) is None
    c.point.detach(ctl.id)  # its tools' calls go to everyone again
    item2 = {**item, "id": "item_3", "call_id": "call_2"}
    assert c.publish({"type": "response.output_item.added", "item": item2}) is not None


async def test_a_slow_reader_is_closed_and_the_call_goes_on() -> None:
    c = Call()
    slow, _ = c.point.attach(None, [])
    quick, _ = c.point.attach(None, [])
    for i in range(sb.QUEUE_LIMIT + 1):
        c.publish({"type": "response.output_audio_transcript.delta", "n": i})
        if i % 100 == 0:
            quick.batch()
    assert slow.closed == sb.CLOSED_SLOW and not slow.queue
    assert quick.closed is None
    events, closed = await slow.take(0)
    assert events == [] and closed == sb.CLOSED_SLOW
    assert c.publish({"type": "response.done"}) is not None  # the browser still gets it


async def test_poll_waits_for_an_event_and_reports_the_end() -> None:
    c = Call()
    att, _ = c.point.attach(None, [])
    got: list[Any] = []

    async def poll() -> None:
        got.append(await att.take(30))

    async with trio.open_nursery() as n:
        n.start_soon(poll)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        c.publish({"type": "response.created"})
    assert [json.loads(t)["type"] for t in got[0][0]] == ["response.created"]
    c.publish({"type": "response.done"})
    c.point.close()
    events, closed = await att.take(30)
    assert len(events) == 1 and closed == sb.CLOSED_ENDED  # the last events, then the end
    assert await att.take(30) == ([], sb.CLOSED_ENDED)
    with pytest.raises(SidebandError) as e:
        c.point.attach(None, [])
    assert e.value.status == 410


async def test_control_ops() -> None:
    c = Call()
    sb.POINTS["rtc_x"] = c.point
    states = {"rtc_x": "connected", "rtc_old": "ended", "sess_echo": "connected"}
    try:
        async def op(name: str, **req: Any) -> dict[str, Any]:
            return await sb.handle_op(name, {"op": name, **req}, states.get)

        assert (await op("realtime.attach", session_id="nope"))["status"] == 404
        assert (await op("realtime.attach", session_id="rtc_old"))["status"] == 410
        assert (await op("realtime.attach", session_id="sess_echo"))["status"] == 409
        bad = await op("realtime.attach", session_id="rtc_x", locks="tools")
        assert bad["status"] == 400
        ok = await op("realtime.attach", session_id="rtc_x", locks=["tools"])
        assert ok["ok"] and ok["controller"] and ok["locks"] == ["tools"]
        sid = ok["sideband_id"]
        assert ok["session_created"]["session"]["instructions"] == "hi"
        assert (await op("realtime.send", sideband_id=sid, events=[{"type": "x"}]))["ok"]
        assert c.fed == [('{"type":"x"}', sid)]
        c.publish({"type": "response.created"})
        polled = await op("realtime.poll", sideband_id=sid, wait=5)
        assert len(polled["events"]) == 1 and polled["closed"] is None
        assert (await op("realtime.detach", sideband_id=sid))["ok"]
        assert c.point.controller is None
        assert (await op("realtime.poll", sideband_id=sid))["closed"] == sb.CLOSED_DETACHED
        assert (await op("realtime.send", sideband_id=sid, events=[]))["status"] == 404
    finally:
        sb.POINTS.pop("rtc_x", None)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=64),
    JSONISH.map(json.dumps),
    st.dictionaries(st.sampled_from(["type", "session", "event_id"]),
                    st.one_of(st.just("session.update"), JSONISH), max_size=3).map(json.dumps),
    st.fixed_dictionaries({"type": st.just("session.update"), "session": st.dictionaries(
        st.sampled_from(sorted(sb.LOCKABLE) + ["voice"]), JSONISH, max_size=4)}).map(json.dumps),
))
def test_refuse_untrusted_never_raises(data: str | bytes) -> None:
    c = Call()
    c.point.attach(None, ["tools", "instructions"])
    for origin in (None, "sb_x"):
        err = c.point.refuse_untrusted(data, origin)
        assert err is None or (origin is None and err.code == "session_field_locked")
