"""The client-event parser and the machine under hypothesis: structured JSON events (every
GA type, random fields) as well as the byte-level fuzz target in fuzz/targets.py."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from realtime.support import Harness

from appliance.realtime.interface import AudioDelta, TextDelta
from appliance.realtime.machine import StartResponse
from appliance.realtime.protocol import (
    CLIENT_EVENTS,
    EventError,
    parse_client_event_untrusted,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=12) | st.sampled_from(["audio/pcm", "server_vad", "semantic_vad",
                                              "message", "user", "assistant", "input_text",
                                              "input_audio", "output_audio", "text", "audio",
                                              "item_t00001", "root", "inf", "AAAA"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "session", "item", "item_id", "audio", "content", "role",
                         "text", "response", "instructions", "output_modalities",
                         "turn_detection", "input", "output", "format", "voice",
                         "content_index", "audio_end_ms", "previous_item_id", "event_id",
                         "response_id", "x"]), inner, max_size=6),
    max_leaves=20)

events = st.builds(lambda t, body: {**body, "type": t},
                   st.sampled_from([*CLIENT_EVENTS, "bogus"]),
                   st.dictionaries(st.sampled_from(["session", "item", "item_id", "audio",
                                                    "response", "content_index",
                                                    "audio_end_ms", "event_id",
                                                    "response_id", "previous_item_id"]),
                                   json_values, max_size=5))


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=8), st.lists(st.booleans(), max_size=30))
def test_machine_answers_any_events_and_never_raises(evs: list[dict[str, Any]],
                                                     speech: list[bool]) -> None:
    h = Harness()
    h.m.handle_open()
    for i, ev in enumerate(evs):
        raw = json.dumps(ev)
        try:
            parse_client_event_untrusted(raw)
            message = "parsed"
        except EventError as exc:
            message = exc.to_event("event_x")["error"]["message"]
        assert message
        before = len(h.events)
        h.m.handle_message(raw)
        h.drain()
        for s in speech[i::4]:
            h.frames(bytes(1920), s)
        for a in list(h.actions):
            if isinstance(a, StartResponse):
                h.delta(a.request.response_id, AudioDelta(bytes(1920)))
                h.delta(a.request.response_id, TextDelta("x"))
                h.m.handle_response_end(a.request.response_id)
                h.drain()
        h.actions.clear()
        assert len(h.events) >= before  # every message is answered or silently applied


@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_parser_raises_only_its_error(data: bytes) -> None:
    try:
        parse_client_event_untrusted(data)
    except EventError:
        pass


def test_every_ga_client_event_is_listed() -> None:
    # openai-python types/realtime/realtime_client_event.py: the GA union, 11 members.
    assert set(CLIENT_EVENTS) == {
        "conversation.item.create", "conversation.item.delete", "conversation.item.retrieve",
        "conversation.item.truncate", "input_audio_buffer.append", "input_audio_buffer.clear",
        "output_audio_buffer.clear", "input_audio_buffer.commit", "response.cancel",
        "response.create", "session.update"}


def test_the_docs_table_is_the_code_table() -> None:
    import re
    from pathlib import Path

    from appliance.realtime.protocol import SERVER_EVENTS

    page = (Path(__file__).resolve().parents[2] / "docs" / "realtime.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| ([a-z ]+) \|", page, re.M))
    want = {k: v[0].value for k, v in {**CLIENT_EVENTS, **SERVER_EVENTS}.items()}
    assert rows == want


def test_every_ga_server_event_is_listed() -> None:
    from realtime.shapes import REQUIRED

    from appliance.realtime.protocol import SERVER_EVENTS

    assert set(SERVER_EVENTS) == set(REQUIRED)  # the 46 of openai-python's union
