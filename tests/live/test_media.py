"""The GPT-Live core on WebRTC (appliance/live/connection.py, ``media=True``), sans-IO and
clockless (the track's frames are its clock: 20 ms each): the session started by the HTTP
request, the caller's audio as the track's 20 ms frames, events held until ``oai-events`` opens and filtered by ``client.data_channel``,
``wake_policy`` / ``idle_timeout_s`` pausing and waking inference. Every event it sends is
checked against the SDK's types for the data channel (``ServerEvent`` plus
``ConnectServerEvent``'s ``session.paused`` / ``resumed``: live_shapes.py)."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from live.live_shapes import shape_errors

from appliance.live.connection import WAKE_HOLD_FRAMES, LiveConnection, LiveEvent, State
from appliance.live.schema import LiveError
from appliance.realtime.interface import AudioDelta
from appliance.realtime.machine import StartResponse
from appliance.realtime.socket_protocol import EndSession

pytest.importorskip("openai.types.live")
FRAME = 1920  # 20 ms of 48 kHz PCM16


def tone_frame() -> bytes:
    t = np.arange(960) / 48_000
    return (np.sin(2 * math.pi * 440 * t) * 8000).astype("<i2").tobytes()


SPEECH, QUIET = tone_frame(), bytes(FRAME)


class Rtc:
    """One WebRTC LiveConnection on a fake clock, and everything it said."""

    def __init__(self, **session: Any) -> None:
        n = itertools.count()
        self.c = LiveConnection(session_id="live_rtc1", ids=lambda p: f"{p}_{next(n)}",
                                wall_clock=lambda: 1_000.5, media=True)
        self.c.start({"model": "gpt-live-1", **session})
        self.events: list[dict[str, Any]] = []
        self.actions: list[object] = []

    def drain(self) -> list[dict[str, Any]]:
        new = []
        while (out := self.c.poll_output()) is not None:
            if isinstance(out, LiveEvent):
                assert shape_errors(out.event, data_channel=True) == [], out.event
                new.append(out.event)
            else:
                self.actions.append(out)
        self.events += new
        return new

    def open(self) -> list[dict[str, Any]]:
        self.c.handle_open()
        return self.drain()

    def send(self, **event: Any) -> list[dict[str, Any]]:
        self.c.handle_input(json.dumps(event))
        return self.drain()

    def frames(self, n: int, *, speech: bool, answer: bool = False) -> list[dict[str, Any]]:
        """``answer``: the agent's part, played at once — every response the turn engine
        asks for ends (and has played out) on the frame that asked."""
        out = []
        for _ in range(n):
            self.c.handle_frame(SPEECH if speech else QUIET, speech)
            out += self.drain()
            while answer and (starts := [a for a in self.actions
                                         if isinstance(a, StartResponse)]):
                for a in starts:
                    self.actions.remove(a)
                    self.c.handle_response_end(a.request.response_id)
                    self.c.handle_output_drained(a.request.response_id)
                out += self.drain()
        return out


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_the_request_starts_it_and_the_channel_opening_says_so() -> None:
    rtc = Rtc(instructions="be brief")
    assert rtc.c.state is State.ACTIVE
    assert rtc.drain() == []  # no channel yet: held
    rtc.frames(10, speech=False)
    [started] = rtc.open()
    session = started["session"]
    assert session["id"] == "live_rtc1" and session["status"] == "active"
    assert session["instructions"] == "be brief"
    assert session["audio"] == {"output": {"voice": "marin"}}  # WebRTC negotiates the codec
    assert "client_event_id" not in started


def test_a_second_start_is_refused_on_the_channel_and_by_the_core() -> None:
    rtc = Rtc()
    rtc.open()
    [err] = rtc.send(type="session.start", event_id="s2", session={"model": "gpt-live-1"})
    assert err["error"]["code"] == "session_already_started"
    assert "POST /v1/live/sessions" in err["error"]["message"]
    assert err["client_event_id"] == "s2"
    with pytest.raises(LiveError):
        rtc.c.start({"model": "gpt-live-1"})


def test_audio_is_the_track_not_appends() -> None:
    rtc = Rtc()
    rtc.open()
    [err] = rtc.send(type="session.input_audio.append", audio="AAAA", event_id="a1")
    assert err["error"]["code"] == "unsupported_event" and err["error"]["param"] == "type"
    rtc.frames(50, speech=False)
    assert rtc.c.input_ms == 1000  # the track's frames are the timeline


@pytest.mark.parametrize("bad", [
    {"audio": {"format": {"type": "audio/pcm", "rate": 24000}}},
    {"idle_timeout_s": 5},
    {"wake_policy": {"type": "speech", "vad_threshold": 1.5}},
    {"wake_policy": {"type": "noise"}},
    {"idle_timeout_s": 0, "wake_policy": {"type": "speech"}},
])
def test_a_media_config_is_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(LiveError) as info:
        Rtc(**bad)
    assert info.value.param is not None and info.value.param.startswith("session.")


def test_allowed_client_events_refuse_what_is_not_listed() -> None:
    rtc = Rtc(client={"data_channel": {"allowed_client_events": ["session.close"]}})
    [_, info] = rtc.open()
    assert info["type"] == "info" and info["code"] == "data_channel_permissions"
    assert "Client events: session.close." in info["message"]
    [err] = rtc.send(type="session.input_audio.mute", event_id="m1")
    assert err["error"]["code"] == "client_event_not_allowed"
    assert err["error"]["param"] == "type" and err["client_event_id"] == "m1"
    assert not rtc.c.muted  # refused before it acted
    closed = rtc.send(type="session.close")
    assert kinds(closed) == ["session.closed"]


def test_an_empty_list_allows_no_command() -> None:
    rtc = Rtc(client={"data_channel": {"allowed_client_events": []}})
    rtc.open()
    [err] = rtc.send(type="session.close", event_id="c")
    assert err["error"]["code"] == "client_event_not_allowed"
    assert rtc.c.state is State.ACTIVE


def test_allowed_server_events_drop_what_is_not_listed() -> None:
    rtc = Rtc(client={"data_channel": {
        "allowed_server_events": [{"type": "session.closed"}, {"type": "error"}]}})
    assert rtc.open() == []  # not session.started, not even the info
    assert rtc.send(type="session.input_audio.mute", event_id="m") == []
    assert rtc.c.muted  # done, just not told
    [err] = rtc.send(type="no.such.event")
    assert err["type"] == "error"
    assert kinds(rtc.send(type="session.close")) == ["session.closed"]


def test_all_and_all_say_so() -> None:
    rtc = Rtc(client={"data_channel": {"allowed_client_events": "all",
                                       "allowed_server_events": "all"}})
    [_, info] = rtc.open()
    assert info["message"].endswith("Client events: all. Server events: all.")


def test_the_wake_policy_holds_inference_until_speech_then_delivers_that_speech() -> None:
    """Regression scenario: the frames that woke the session must reach the turn engine as
    they were, not as the silence a paused agent hears (the first word would be lost)."""
    rtc = Rtc(wake_policy={"type": "speech", "vad_threshold": 0.5})
    rtc.open()
    rtc.frames(100, speech=False)  # 2 s: asleep, the agent hears silence
    assert rtc.c.machine._audio_ms == (100 - WAKE_HOLD_FRAMES) * 20  # the rest held back
    assert not rtc.c.machine.in_speech
    woke = rtc.frames(5, speech=True)
    assert kinds(woke) == ["session.resumed"]
    assert rtc.c.machine._audio_ms == 105 * 20 == rtc.c.input_ms  # every frame, once
    assert rtc.c.machine.in_speech  # the waking speech opened a turn


def test_idle_pauses_and_speech_resumes_with_the_usage_split() -> None:
    rtc = Rtc(wake_policy={"type": "speech"}, idle_timeout_s=2)
    rtc.open()
    rtc.frames(50, speech=False)  # 1 s asleep before the first word
    rtc.frames(5, speech=True)  # the last word at 1.1 s of track
    assert rtc.frames(98, speech=False, answer=True) == []  # 1.96 s of quiet: awake
    assert kinds(rtc.frames(2, speech=False)) == ["session.paused"]  # 2 s: paused
    rtc.frames(200, speech=False)  # 4 s paused: nothing wakes it
    assert rtc.c.gate is not None and not rtc.c.gate.awake
    assert kinds(rtc.frames(5, speech=True)) == ["session.resumed"]
    [closed] = rtc.send(type="session.close")
    usage = closed["usage"]
    assert usage["active_seconds"] + usage["paused_seconds"] == usage["seconds"]
    assert usage["paused_seconds"] >= 5  # 1 s before the wake, 4 s paused
    assert EndSession("close_requested") in rtc.actions


def test_muted_speech_wakes_nothing() -> None:
    rtc = Rtc(wake_policy={"type": "speech"})
    rtc.open()
    rtc.send(type="session.input_audio.mute")
    assert "session.resumed" not in kinds(rtc.frames(20, speech=True))
    rtc.send(type="session.input_audio.unmute")
    assert "session.resumed" in kinds(rtc.frames(5, speech=True))


def test_a_commentary_waits_for_the_wake() -> None:
    rtc = Rtc(wake_policy={"type": "speech"})
    rtc.open()
    rtc.send(type="session.commentary.append", content="The order shipped.",
             delegation_id=None)
    assert not [a for a in rtc.actions if isinstance(a, StartResponse)]
    rtc.frames(5, speech=True)
    assert [a for a in rtc.actions if isinstance(a, StartResponse)]


def test_the_answer_goes_on_the_track_not_in_events() -> None:
    rtc = Rtc()
    rtc.open()
    rtc.send(type="session.commentary.append", content="Hello there.", delegation_id=None)
    [start] = [a for a in rtc.actions if isinstance(a, StartResponse)]
    rid = start.request.response_id
    assert rtc.c.handle_delta(rid, AudioDelta(SPEECH * 50)) is True  # queue it: 1 s
    rtc.drain()
    assert "session.output_audio.delta" not in kinds(rtc.events)
    assert rtc.c.output_ms == pytest.approx(1000)
    assert rtc.c.handle_delta("resp_other", AudioDelta(SPEECH)) is False


def test_the_core_is_silent_after_the_call_is_gone() -> None:
    rtc = Rtc(wake_policy={"type": "speech"}, idle_timeout_s=1)
    rtc.open()
    rtc.c.lost()
    assert rtc.frames(10, speech=True) == []
    assert rtc.c.input_ms == 0


def test_an_answer_keeps_the_session_awake() -> None:
    """The agent speaking is activity: a session never pauses under its own answer."""
    rtc = Rtc(wake_policy={"type": "speech"}, idle_timeout_s=1)
    rtc.open()
    rtc.frames(5, speech=True)
    rtc.send(type="session.commentary.append", content="A long answer.", delegation_id=None)
    assert [a for a in rtc.actions if isinstance(a, StartResponse)]
    assert rtc.frames(150, speech=False) == []  # 3 s of quiet while it answers
    assert rtc.c.gate is not None and rtc.c.gate.awake
