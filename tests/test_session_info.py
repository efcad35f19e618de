"""The one session JSON shape (appliance/session_info.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.session_info import STATES, TIMELINE_STEPS, RelayFlow, SessionInfo

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
}


def test_round_trip_keeps_every_field_and_the_key_order() -> None:
    info = SessionInfo.from_json(FULL)
    assert info.relay_flow == RelayFlow("198.51.100.1:3478", "127.0.0.1:40001")
    out = info.to_json()
    assert out == FULL and list(out) == list(FULL)


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
