"""Structure-aware fuzzing of the GPT-Live parser and core with hypothesis (the byte-level
target is ``live`` in fuzz/targets.py, run by tests/fuzz/test_deep.py): JSON objects built
from the real event types and field names with values of every JSON type, so the schema
walk meets wrong types, nulls, unknown and missing fields at every depth. The parser may
raise only ``LiveError``; the core never raises and answers every message with events the
SDK's types accept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from appliance.live import config
from appliance.live.connection import LiveConnection
from appliance.live.protocol import EVENT_FIELDS, SIDEBAND_FIELDS, parse_client_event_untrusted
from appliance.live.schema import LiveError

pytest.importorskip("openai.types.live")
from live.live_shapes import shape_errors  # noqa: E402

NAMES = sorted({*config.SESSION_CONFIG.fields, *config.AUDIO.fields, "format", "output",
                "voice", "type", "rate", "data_channel", "allowed_client_events",
                "allowed_server_events", "acknowledgement_delay_ms", "role", "content",
                "text", "id", "status", "responses", "decisions", "delegation_id", "audio", "session", "event_id", "item", "item_id",
                "event"})
WORDS = ["client", "responses", "audio/pcm", "audio/pcmu", "developer", "user", "assistant",
         "input_text", "output_text", "marin", "all", "message", "gpt-live-1", "", "7", "#"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.sampled_from([16000, 24000, 8000, 0, -1]),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(WORDS), st.text(max_size=12))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(NAMES), inner, max_size=5)), max_leaves=30)


@st.composite
def events(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*EVENT_FIELDS, *SIDEBAND_FIELDS,
                                 "session.input_audio.commit", 7]))
    body: dict[str, Any] = draw(st.dictionaries(st.sampled_from(NAMES), JSON, max_size=4))
    if kind == "session.start" and draw(st.booleans()):
        body["session"] = {"model": "m", **draw(st.dictionaries(
            st.sampled_from(NAMES), JSON, max_size=4))}
    return {"type": kind, **body}


@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), min_size=1, max_size=6))
def test_the_parser_and_the_core_take_any_event(batch: list[dict[str, Any]]) -> None:
    n = iter(range(10**6))
    core = LiveConnection(session_id="live_f", ids=lambda p: f"{p}_{next(n)}",
                          wall_clock=lambda: 0.0, vad=lambda frame: False)
    core.handle_input(json.dumps({"type": "session.start", "session": {"model": "m"}}))
    for event in batch:
        text = json.dumps(event)
        try:
            parse_client_event_untrusted(text)
        except LiveError:
            pass
        before = len(core.machine.conversation.items)
        core.handle_input(text)
        answered = 0
        while (out := core.poll_event()) is not None:
            assert shape_errors(out) == [], out
            answered += 1
        while core.poll_action() is not None:
            pass
        # Every command but an audio append is answered, and an error changes nothing.
        if event["type"] != "session.input_audio.append" and core.state.value == "active":
            assert answered or len(core.machine.conversation.items) > before


@settings(max_examples=300, deadline=None, database=None)
@given(JSON)
def test_the_config_takes_any_json(value: Any) -> None:
    params = []
    for candidate in (value, {"model": "m", "audio": value}, {"model": "m", "input": value},
                      {"model": "m", "client": value}, {"model": "m", "delegation": value}):
        try:
            config.resolve_untrusted(candidate)
        except LiveError as exc:
            params.append(exc.param)
    assert all(p is None or p.startswith("session") for p in params)


MEDIA_NAMES = sorted({*NAMES, "idle_timeout_s", "wake_policy", "vad_threshold", "speech"})
MEDIA_CONFIGS = st.sampled_from([
    {}, {"wake_policy": {"type": "speech"}},
    {"wake_policy": {"type": "speech", "vad_threshold": 0.0}, "idle_timeout_s": 1},
    {"client": {"data_channel": {"allowed_client_events": [],
                                 "allowed_server_events": [{"type": "error"}]}}},
    {"client": {"data_channel": {"allowed_client_events": ["session.close", "session.update"]}},
     "wake_policy": {"type": "speech", "vad_threshold": 1}, "idle_timeout_s": 1},
])


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(MEDIA_CONFIGS, st.dictionaries(st.sampled_from(MEDIA_NAMES), JSON,
                                                max_size=5)),
       st.lists(st.tuples(events(), st.booleans()), min_size=1, max_size=6))
def test_the_webrtc_core_takes_any_config_and_event(session: dict[str, Any],
                                                    batch: list[tuple[dict[str, Any], bool]]
                                                    ) -> None:
    """WebRTC (``media=True``): a config from the POST may be refused only with LiveError;
    a started core takes any channel event and speech or silence frames, and every event
    it lets out on the channel is in the SDK's data channel union."""
    n = iter(range(10**6))
    core = LiveConnection(session_id="live_f", ids=lambda p: f"{p}_{next(n)}",
                          wall_clock=lambda: 0.0, media=True)
    try:
        core.start({"model": "m", **session})
    except LiveError:
        return
    core.handle_open()
    frame = (b"\x00\x20" * 960)
    for event, speech in batch:
        core.handle_input(json.dumps(event))
        for _ in range(10):
            core.handle_frame(frame if speech else bytes(1920), speech)
        while (out := core.poll_event()) is not None:
            assert shape_errors(out, data_channel=True) == [], out
        while core.poll_action() is not None:
            pass


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(events(), st.binary(max_size=64)), min_size=1,
                max_size=6), st.booleans())
def test_the_sideband_entry_takes_any_message(batch: list[Any], phone: bool) -> None:
    """``handle_sideband`` (a sideband's commands) never raises; what it answers, on either
    stream, the SDK's types accept, and the primary side never sees its errors — on a
    WebSocket session and on a SIP call's (``phone``: ``transport.dtmf.send`` is served)."""
    n = iter(range(10**6))
    core = LiveConnection(session_id="live_f", ids=lambda p: f"{p}_{next(n)}",
                          wall_clock=lambda: 0.0, vad=lambda frame: False, media=phone,
                          phone=phone)
    core.observed = lambda: True
    if phone:
        core.start({"model": "m"})
        core.handle_open()
    else:
        core.handle_input(json.dumps({"type": "session.start", "session": {"model": "m"}}))
    for message in batch:
        core.handle_sideband(message if isinstance(message, bytes) else json.dumps(message))
        while (out := core.poll_event()) is not None:
            assert shape_errors(out) == [] and out["type"] != "error", out
        while (seen := core.poll_observed()) is not None:
            assert shape_errors(seen, sideband=True) == [], seen
        while core.poll_action() is not None:
            pass


STORED = {"id": "live_x", "session": {"model": "m", "store": True},
          "conversation": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}


@settings(max_examples=300, deadline=None, database=None)
@given(JSON, st.booleans())
def test_a_forks_overrides_raise_only_live_errors(overrides: Any, media: bool) -> None:
    """A fork's ``session.start`` (or WebRTC fork ``session``) overrides, any JSON: a
    config that resolves, or a LiveError naming a param (issue 42 item 7)."""
    param = "resolved"
    try:
        given_cfg = config.fork_untrusted(STORED, overrides, media=media)
        config.resolve_untrusted(given_cfg, media=media)
    except LiveError as exc:
        param = exc.param or ""
    assert param
