"""The one session JSON shape (appliance/session_info.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.session_info import (
    MAX_TURNS,
    STATES,
    TIMELINE_STEPS,
    TURN_EXTRAS,
    TURN_MARKS,
    RelayFlow,
    SessionInfo,
    turn_line,
)

FULL: dict[str, Any] = {
    "id": "s1", "state": "connected", "end_reason": None, "transceiver": 2, "agent": "echo",
    "client_address": "203.0.113.7:53211",
    "relay_flow": {"public": "198.51.100.1:3478", "relay": "127.0.0.1:40001"},
    "codec": "opus/48000/2", "srtp_profile": "AEAD_AES_128_GCM",
    "cipher_suite": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "created_at": 1764460800.123,
    "ended_at": None, "packets_in": 10, "packets_out": 9, "bytes_in": 1000, "bytes_out": 900,
    "rtt_ms": 12.3, "jitter_ms": 1.25, "loss": 0.01,
    "timeline": dict(zip(TIMELINE_STEPS, (0.0, 0.4, 10.0, 11.0, 20.5, None, None), strict=True)),
    "datachannels": {"sctp": "connected", "open": [{"id": 1, "label": "chat"}],
                     "messages_in": 3, "bytes_in": 12, "messages_out": 3, "bytes_out": 12,
                     "messages_dropped": 0},
    "media": {"in": ["level-in"], "out": ["level-out"],
              "levels": {"in": {"rms_dbfs": -30.0, "peak_dbfs": -12.0}}, "recorder": None,
              "stages": {}, "stage_failures": 0, "failed": {}, "unavailable": {}},
    "transcript": [{"who": "user", "text": "what time is it", "at": 1764460801.5},
                   {"who": "agent", "text": "It is 9:41.", "at": 1764460802.25}],
    "turns": [{"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0,
               "transcript_ms": 2.1, "stt_ms": 2.0, "first_token_ms": -60.3,
               "first_audio_ms": 31.0, "first_sent_ms": 31.2}],
    "kind": "webrtc",
}


def test_round_trip_keeps_every_field_and_the_key_order() -> None:
    info = SessionInfo.from_json(FULL)
    assert info.relay_flow == RelayFlow("198.51.100.1:3478", "127.0.0.1:40001")
    out = info.to_json()
    assert out == FULL and list(out) == list(FULL)


def test_kind_is_webrtc_or_phone_and_an_old_object_without_it_is_webrtc() -> None:
    """A phone call's session object says so (issue 39 item 2); one written before
    ``kind`` existed reads as WebRTC; anything else is refused, naming the field."""
    assert SessionInfo.from_json({**FULL, "kind": "phone"}).to_json()["kind"] == "phone"
    old = {k: v for k, v in FULL.items() if k != "kind"}
    assert SessionInfo.from_json(old).kind == "webrtc"
    with pytest.raises(ValueError, match="kind"):
        SessionInfo.from_json({**FULL, "kind": "pigeon"})


def test_placeholder_is_a_new_session_with_nothing_known() -> None:
    out = SessionInfo.placeholder("s2", 1, 5.0, agent="echo").to_json()
    assert out["state"] == "new" and out["client_address"] is None
    assert out["packets_in"] == 0 and out["timeline"] == {} and out["agent"] == "echo"
    assert set(out) == set(FULL)


def test_missing_optional_fields_take_defaults_and_unknown_keys_are_ignored() -> None:
    info = SessionInfo.from_json({"id": "x", "transceiver": 0, "created_at": 1, "new": 1})
    assert info.state == "new" and info.created_at == 1.0 and info.relay_flow is None


@pytest.mark.parametrize(("key", "value"), [
    ("id", None), ("transceiver", "0"), ("transceiver", True), ("state", "weird"),
    ("created_at", None), ("rtt_ms", "1"), ("relay_flow", []), ("relay_flow", {"public": 1}),
    ("timeline", {"x": "1"}), ("timeline", []), ("packets_in", 1.5), ("agent", 3),
    ("datachannels", []), ("datachannels", "open"), ("media", []), ("media", 1),
    ("transcript", {}), ("transcript", [{"who": "bot", "text": "x", "at": 1}]),
    ("transcript", [{"who": "user", "text": 5, "at": 1}]),
    ("turns", {}), ("turns", [{"turn": 0}]), ("turns", [{"turn": "1"}]), ("turns", [3]),
])
def test_wrong_types_raise_value_error_naming_the_field(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key.split("_")[0]):
        SessionInfo.from_json({**FULL, key: value})


@given(st.dictionaries(st.sampled_from(sorted(FULL)), st.none() | st.booleans() | st.integers()
                       | st.floats() | st.text() | st.lists(st.integers())
                       | st.dictionaries(st.text(), st.integers())))
def test_from_json_raises_only_value_error(obj: dict[str, Any]) -> None:
    try:
        info = SessionInfo.from_json({**FULL, **obj})
    except ValueError:
        return
    assert info.state in STATES


def test_a_turn_line_keeps_the_waterfall_and_nothing_else() -> None:
    """An agent's ``turn.metrics`` event (any agent: ``ws://`` ones too) becomes the session
    object's line: the turn number and every mark as ms or null, nothing else."""
    event = {"type": "turn.metrics", "turn": 3, "speech_start_ms": -1500, "speech_end_ms":
             -500.04, "transcript_ms": 0.0, "stt_ms": 1.26, "first_token_ms": float("nan"),
             "first_audio_ms": "40", "first_queued_ms": 41.0, "first_sent_ms": 1e12,
             "html": "<b>"}
    assert turn_line(event) == {
        "turn": 3, "speech_start_ms": -1500.0, "speech_end_ms": -500.0, "transcript_ms": 0.0,
        "first_token_ms": None, "first_audio_ms": None, "first_sent_ms": None, "stt_ms": 1.3}
    assert list(turn_line(event) or {}) == ["turn", *TURN_MARKS, *TURN_EXTRAS]
    for bad in ({}, {"turn": 0}, {"turn": True}, {"turn": 1.0}, {"turn": "2"}):
        assert turn_line(bad) is None


def test_a_session_object_carries_the_newest_turns() -> None:
    lines = [{"turn": n, "first_sent_ms": float(n)} for n in range(1, MAX_TURNS + 6)]
    info = SessionInfo.from_json({**FULL, "turns": lines})
    assert info.turns is not None and len(info.turns) == MAX_TURNS
    assert [t["turn"] for t in info.turns] == list(range(6, MAX_TURNS + 6))
    assert info.turns[0]["speech_end_ms"] is None  # a mark the agent did not report
