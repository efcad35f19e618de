"""The sideband's stream of the GPT-Live core (appliance/live/connection.py
``poll_observed`` / ``handle_sideband`` / ``replay``), sans-IO, on both transports, and the
``live`` surface of the one sideband point (appliance/realtime/sideband.py). Every event
the sideband gets is checked against the SDK's ``ConnectServerEvent`` (live_shapes.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
from live.live_shapes import shape_errors
from live.test_connection import Core, _turn, zeros
from live.test_media import SPEECH, Rtc

from appliance.live.connection import REFLECT_FRAMES
from appliance.realtime import sideband as sb
from appliance.realtime.audio import pcm48k_to_24k
from appliance.realtime.interface import AudioDelta
from appliance.realtime.machine import StartResponse
from appliance.realtime.sideband import LIVE, SidebandError, SidebandPoint
from appliance.realtime.socket_protocol import EndSession

pytest.importorskip("openai.types.live")


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def observe(rtc: Rtc) -> list[dict[str, Any]]:
    out = []
    while (e := rtc.c.poll_observed()) is not None:
        assert shape_errors(e, sideband=True) == [], e
        out.append(e)
    return out


# -- the WebSocket core ----------------------------------------------------------------------


def test_nothing_is_kept_while_no_sideband_is_attached() -> None:
    core = Core()
    core.start()
    _turn(core)
    assert core.observed == []


def test_the_sideband_sees_every_event_and_the_audio_both_ways() -> None:
    core = Core(observed=True)
    core.start()
    assert kinds(core.observed) == ["session.started"]
    quiet = (np.arange(4800) % 200 - 100).astype("<i2").tobytes()  # under the VAD's bar
    pcm = zeros(0.4) + quiet + zeros(0.2)
    core.audio(pcm, chunk=4800)
    reflected = b"".join(base64.b64decode(e["audio"]) for e in core.observed
                         if e["type"] == "session.input_audio.append")
    assert reflected == pcm  # 24 kHz PCM16 in: reflected as sent
    core.send(type="session.input_audio.mute", event_id="m")
    core.audio(pcm[:4800])  # muted: the agent hears silence, the sideband the audio
    assert base64.b64decode(core.observed[-1]["audio"]) == pcm[:4800]
    core.send(type="session.input_audio.unmute")
    start, _ = _turn(core)
    rid = start.request.response_id
    at = round(max(core.c.output_ms, core.c.input_ms))  # the answer starts here
    core.c.handle_delta(rid, AudioDelta(bytes(9600)))  # 100 ms at 48 kHz
    core.drain()
    [primary] = core.of("session.output_audio.delta")
    assert "start_ms" not in primary  # the primary socket's: the session's format, no span
    [seen] = [e for e in core.observed if e["type"] == "session.output_audio.delta"]
    assert (seen["start_ms"], seen["end_ms"]) == (at, at + 100)
    assert len(base64.b64decode(seen["delta"])) == 4800  # 100 ms of 24 kHz PCM16
    shared = [e for e in core.events if e["type"] != "session.output_audio.delta"]
    assert all(e in core.observed for e in shared)  # everything else, to both


def test_a_sidebands_command_is_the_clients_and_its_errors_are_its_own() -> None:
    core = Core(observed=True)
    core.start()
    core.c.handle_sideband(json.dumps({"type": "session.instructions.append",
                                       "content": "Be brief.", "delegation_id": None,
                                       "event_id": "i1"}))
    core.drain()
    assert core.events[-1]["type"] == "session.instructions.appended"
    assert core.observed[-1] == core.events[-1]
    for bad in ({"type": "session.start", "session": {"model": "m"}, "event_id": "s"},
                {"type": "session.input_audio.append", "audio": "", "event_id": "s"},
                {"type": "transport.dtmf.send", "event": "1", "event_id": "s"}):
        n = len(core.events)
        core.c.handle_sideband(json.dumps(bad))
        core.drain()
        assert len(core.events) == n  # the primary side is told nothing
        err = core.observed[-1]
        assert err["type"] == "error" and err["client_event_id"] == "s", bad
    core.c.handle_sideband(json.dumps({"type": "session.close", "event_id": "bye"}))
    core.drain()
    assert core.events[-1]["type"] == "session.closed" == core.observed[-1]["type"]
    assert core.events[-1]["client_event_id"] == "bye"
    assert EndSession("close_requested") in core.actions


def test_a_lost_socket_tells_the_sideband() -> None:
    core = Core(observed=True)
    core.start()
    core.c.lost()
    core.drain()
    assert core.events[-1]["type"] == "session.started"  # nowhere to send it
    closed = core.observed[-1]
    assert closed["type"] == "session.closed" and closed["reason"] == "connection_lost"


def test_the_replay_is_the_session_as_it_stands() -> None:
    core = Core()
    core.start(instructions="hi")
    replay = core.c.replay()
    assert replay["type"] == "session.started" and "client_event_id" not in replay
    assert replay["session"] == core.events[0]["session"]
    assert shape_errors(replay, sideband=True) == []


# -- the WebRTC core -------------------------------------------------------------------------


def test_webrtc_the_sideband_gets_what_the_channel_may_not_and_before_it_opens() -> None:
    rtc = Rtc(wake_policy={"type": "speech"}, client={"data_channel": {
        "allowed_client_events": [], "allowed_server_events": [{"type": "error"}]}})
    rtc.c.observed = lambda: True
    rtc.frames(REFLECT_FRAMES * 2, speech=True, answer=True)  # wakes it
    seen = observe(rtc)
    assert "session.resumed" in kinds(seen)  # the channel would drop it; not opened yet
    reflected = [base64.b64decode(e["audio"]) for e in seen
                 if e["type"] == "session.input_audio.append"]
    assert reflected == [pcm48k_to_24k(SPEECH * REFLECT_FRAMES)] * 2  # 100 ms pieces
    rtc.open()
    assert rtc.events == []  # allowed_server_events: only errors
    # allowed_client_events binds the channel, not the trusted sideband
    rtc.c.handle_sideband(json.dumps({"type": "session.commentary.append",
                                      "content": "Hello.", "delegation_id": None}))
    rtc.drain()
    assert kinds(observe(rtc)) == ["session.commentary.appended"]
    [start] = [a for a in rtc.actions if isinstance(a, StartResponse)]
    assert rtc.c.handle_delta(start.request.response_id, AudioDelta(SPEECH * 5)) is True
    [audio] = [e for e in observe(rtc) if e["type"] == "session.output_audio.delta"]
    assert audio["end_ms"] - audio["start_ms"] == 100
    rtc.frames(1, speech=False)
    rtc.c.handle_sideband(json.dumps({"type": "session.close"}))
    rtc.drain()
    assert kinds(observe(rtc))[-1] == "session.closed"
    assert EndSession("close_requested") in rtc.actions


# -- the point's live surface ----------------------------------------------------------------


def live_point() -> tuple[SidebandPoint, list[tuple[str, str]]]:
    fed: list[tuple[str, str]] = []
    point = SidebandPoint("live_p", lambda: {}, lambda t, o: fed.append((t, o)),
                          surface=LIVE, replay=lambda: {"type": "session.started"})
    return point, fed


def test_every_live_attachment_may_send_and_none_has_a_role() -> None:
    point, fed = live_point()
    a, replay = point.attach(None, [])
    b, _ = point.attach(None, [])
    assert replay == {"type": "session.started"} and a.controller and b.controller
    for role, locks in (("observer", []), (None, ["tools"])):
        with pytest.raises(SidebandError) as e:
            point.attach(role, locks)
        assert e.value.status == 400
    point.send(b.id, {"type": "session.close"})
    assert fed == [('{"type":"session.close"}', b.id)]
    point.observe({"type": "error"}, "err", b.id)  # to the one that caused it
    point.observe({"type": "error"}, "primary's", None)  # to none
    point.observe({"type": "session.closed"}, "closed", None)  # to all
    assert list(a.queue) == ["closed"] and list(b.queue) == ["err", "closed"]


async def test_each_surface_attaches_only_its_own_sessions() -> None:
    point, _ = live_point()
    rt = SidebandPoint("rtc_q", lambda: {}, lambda t, o: None)
    sb.POINTS.update({"live_p": point, "rtc_q": rt})
    try:
        async def attach(sid: str, **req: Any) -> dict[str, Any]:
            return await sb.handle_op("realtime.attach", {"session_id": sid, **req},
                                      lambda _: "connected")

        refused = await attach("live_p")  # the Realtime sideband asks for a Live session
        assert (refused["status"], refused["code"]) == (409, "not_realtime")
        assert "/v1/live/sessions/live_p/attach" in refused["detail"]
        refused = await attach("rtc_q", surface=LIVE)
        assert (refused["status"], refused["code"]) == (409, "not_live")
        assert (await attach("live_p", surface="sip"))["status"] == 400
        ok = await attach("live_p", surface=LIVE)
        assert ok["ok"] and ok["session_created"] == {"type": "session.started"}
        await sb.handle_op("realtime.detach", {"sideband_id": ok["sideband_id"]},
                           lambda _: None)
    finally:
        sb.POINTS.pop("live_p", None)
        sb.POINTS.pop("rtc_q", None)


async def test_a_live_attach_waits_for_a_session_still_connecting(
        autojump_clock: Any) -> None:
    """Regression scenario: a backend attaches on ``live.transport.connected``, before the
    caller's media connected and the call's shell (its point) exists: the attach waits for
    the point instead of answering 409; a caller who never connects gets a clear 409."""
    import trio
    import trio.testing

    states = {"live_p": "connecting", "live_never": "connecting"}
    point, _ = live_point()
    got: list[dict[str, Any]] = []

    async def attach(sid: str) -> None:
        got.append(await sb.handle_op("realtime.attach", {"session_id": sid,
                                                          "surface": LIVE}, states.get))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(attach, "live_p")
            await trio.testing.wait_all_tasks_blocked()
            assert got == []  # waiting for the media
            states["live_p"] = "connected"
            sb.register(point)
        assert got[0]["ok"] and got[0]["session_created"] == {"type": "session.started"}
        await attach("live_never")
        assert (got[1]["status"], got[1]["code"]) == (409, "session_not_connected")
    finally:
        sb.unregister(point)
        assert "live_p" not in sb.POINTS


# -- a SIP call (phone=True): DTMF both ways --------------------------------------------------


def phone_core(**kw: Any) -> Core:
    core = Core(observed=True, media=True, phone=True, **kw)
    core.c.start({"model": "gpt-live-1", "instructions": "You answer the phone."})
    core.c.handle_open()  # a phone call has no channel to wait for (realtime/agent.py)
    core.drain()
    return core


def test_a_callers_digits_reach_the_sideband_alone() -> None:
    core = phone_core()
    core.c.handle_dtmf("7")
    core.c.handle_dtmf("#")
    core.c.handle_dtmf("x")  # not a DTMF key: nothing (the shell's events are not trusted)
    core.drain()
    got = [e for e in core.observed if e["type"] == "transport.dtmf.received"]
    assert [e["event"] for e in got] == ["7", "#"]
    assert all(e["event_id"].startswith("event_") for e in got)
    assert not core.of("transport.dtmf.received")  # sideband only, never the primary side
    core.c.close("expired")
    core.drain()
    core.c.handle_dtmf("1")  # after the session: nothing
    core.drain()
    assert [e["event"] for e in core.observed if e["type"] == "transport.dtmf.received"] == \
        ["7", "#"]


def test_a_sidebands_dtmf_send_is_an_action_and_acknowledged() -> None:
    from appliance.live.connection import SendDtmf

    core = phone_core()
    core.c.handle_sideband(json.dumps({"type": "transport.dtmf.send", "event": "9",
                                       "event_id": "d1"}))
    core.drain()
    assert core.take(SendDtmf) == [SendDtmf("9")]
    [sent] = [e for e in core.observed if e["type"] == "transport.dtmf.sent"]
    assert sent["event"] == "9" and sent["client_event_id"] == "d1"
    # a key the SDK does not have: an error naming the field, to the sideband, no action
    core.c.handle_sideband(json.dumps({"type": "transport.dtmf.send", "event": "99",
                                       "event_id": "d2"}))
    core.drain()
    err = core.observed[-1]
    assert err["type"] == "error" and err["error"]["param"] == "event"
    assert err["error"]["client_event_id"] == "d2" and core.take(SendDtmf) == []
    assert not core.of("error")  # the primary side never hears a sideband's mistake


@pytest.mark.parametrize("kw", [{}, {"media": True}], ids=["websocket", "webrtc"])
def test_dtmf_send_is_refused_on_a_session_that_is_not_a_phone_call(kw: dict[str, Any]) -> None:
    from appliance.live.connection import SendDtmf

    core = Core(observed=True, **kw)
    if kw:
        core.c.start({"model": "gpt-live-1"})
        core.c.handle_open()
    else:
        core.start()
    core.c.handle_sideband(json.dumps({"type": "transport.dtmf.send", "event": "1",
                                       "event_id": "d"}))
    core.drain()
    err = core.observed[-1]
    assert err["type"] == "error" and err["error"]["code"] == "unsupported_event"
    assert "SIP" in err["error"]["message"] and core.take(SendDtmf) == []
    # and the primary client cannot send it at all: not a ClientEvent of its union
    core.c.handle_input(json.dumps({"type": "transport.dtmf.send", "event": "1"}))
    core.drain()
    assert core.events[-1]["error"]["code"] == "unknown_event"


def test_a_callers_hangup_ends_the_session_as_remote_hangup() -> None:
    core = phone_core()
    core.c.lost("remote_hangup")
    core.drain()
    closed = core.observed[-1]
    assert closed["type"] == "session.closed" and closed["reason"] == "remote_hangup"
