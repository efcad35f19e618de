"""GPT-Live client events and session config, sans-IO: the untrusted parser's answers
(strict: an unknown field is an ``error`` naming its ``param``), the config's defaults,
immutability and refusals, and the schema compared field by field with the official SDK's
``types/live/*_param.py`` TypedDicts (the SDK wins where the research notes disagree)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
import typing_extensions

from appliance.live import config, protocol
from appliance.live.events import DATA_CHANNEL_EVENTS, SERVER_EVENTS
from appliance.live.protocol import CLIENT_EVENTS, EVENT_FIELDS, parse_client_event_untrusted
from appliance.live.schema import AnyJson, Arr, Field, LiveError, Obj, OneOf, Tagged

live_types = pytest.importorskip("openai.types.live")


def parse(**event: Any) -> protocol.ClientEvent:
    return parse_client_event_untrusted(json.dumps(event))


def refused(data: str | bytes) -> LiveError:
    with pytest.raises(LiveError) as info:
        parse_client_event_untrusted(data)
    return info.value


# -- the parser --------------------------------------------------------------------------


def test_every_served_event_parses_as_the_sdk_sends_it() -> None:
    for event in (
        {"type": "session.start", "session": {"model": "gpt-live-1"}, "event_id": "s1"},
        {"type": "session.update", "session": {"delegation": {"type": "client"}}},
        {"type": "session.close"},
        {"type": "session.input_audio.append", "audio": "AAAA"},
        {"type": "session.input_audio.mute", "event_id": None},
        {"type": "session.input_audio.unmute"},
        {"type": "session.instructions.append", "content": "x", "delegation_id": None},
        {"type": "session.thinking.append", "content": "x", "delegation_id": None},
        {"type": "session.commentary.append", "content": "x", "delegation_id": "d1"},
    ):
        ev = parse_client_event_untrusted(json.dumps(event))
        assert ev.type == event["type"] and ev.event_id == event.get("event_id")
        assert set(ev.data) == set(event) - {"type", "event_id"}


@pytest.mark.parametrize(("event", "code", "param"), [
    ({"type": "session.close", "reason": "x"}, "unknown_parameter", "reason"),
    ({"type": "session.input_audio.append"}, "missing_required_parameter", "audio"),
    ({"type": "session.input_audio.append", "audio": 3}, "invalid_type", "audio"),
    ({"type": "session.commentary.append", "content": "x"}, "missing_required_parameter",
     "delegation_id"),
    ({"type": "session.thinking.append", "content": ["x"], "delegation_id": None},
     "invalid_type", "content"),
    ({"type": "session.input_audio.commit"}, "unknown_event", "type"),
    ({"type": "input_audio_buffer.append", "audio": ""}, "unknown_event", "type"),
    ({"event_id": "e"}, "missing_required_parameter", "type"),
    ({"type": "session.close", "event_id": 7}, "invalid_type", "event_id"),
    ({"type": "response.item.create"}, "missing_required_parameter", "item"),
    ({"type": "session.output_audio.fixture.play", "audio": ""}, "unsupported_event", "type"),
    ({"type": "decision.create"}, "missing_required_parameter", "event_id"),
    ({"type": "decision.create", "event_id": "d"}, "unsupported_event", "type"),
    ({"type": "decision.item.delete", "item_id": "i", "x": 1}, "unknown_parameter", "x"),
])
def test_refusals_name_the_code_and_param(event: dict[str, Any], code: str,
                                          param: str) -> None:
    err = refused(json.dumps(event))
    assert (err.code, err.param) == (code, param)
    if isinstance(event.get("event_id"), str):
        assert err.client_event_id == event["event_id"]


def test_response_commands_parse_for_the_core_to_judge() -> None:
    """Served under Responses delegation, so the parser lets them by; the core refuses them
    in any other session (tests/live/test_responses.py)."""
    ev = parse_client_event_untrusted(json.dumps({"type": "response.item.create", "item": {
        "type": "function_call_output", "call_id": "c", "output": "x"}, "event_id": "i"}))
    assert (ev.type, ev.event_id, ev.data["item"]["call_id"]) == ("response.item.create", "i",
                                                                  "c")


def test_an_unknown_type_lists_the_supported_ones() -> None:
    err = refused(json.dumps({"type": "conversation.item.create", "item": {}}))
    assert all(f"'{kind}'" in err.message for kind in EVENT_FIELDS)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"null", b'"x"', b"\xff\xfe",
                                  b'{"type": NaN}', b"[" * 30_000,
                                  b"x" * (protocol.MAX_EVENT_BYTES + 1)])
def test_garbage_is_one_error(data: bytes) -> None:
    err = refused(data)
    assert err.code in ("invalid_json", "invalid_type")


# -- the session config ------------------------------------------------------------------


def test_defaults_are_resolved() -> None:
    cfg = config.resolve_untrusted({"model": "gpt-live-1"})
    assert cfg == {"model": "gpt-live-1", "input": [], "store": False,
                   "audio": {"format": {"type": "audio/pcm", "rate": 24000},
                             "output": {"voice": "marin"}},
                   "delegation": {"type": "client"}}
    res = config.resource(cfg, session_id="live_1", expires_at=7)
    assert res["id"] == "live_1" and res["status"] == "active" and res["expires_at"] == 7


@pytest.mark.parametrize(("session", "code", "param"), [
    ({}, "missing_required_parameter", "session.model"),
    ({"model": "m", "voice": "marin"}, "unknown_parameter", "session.voice"),
    ({"model": "m", "turn_detection": None}, "unknown_parameter", "session.turn_detection"),
    ({"model": "m", "audio": {"input": {}}}, "unknown_parameter", "session.audio.input"),
    ({"model": "m", "audio": {"format": {"type": "audio/pcm", "rate": 48000}}},
     "invalid_value", "session.audio.format.rate"),
    ({"model": "m", "audio": {"format": {"type": "audio/pcm"}}},
     "missing_required_parameter", "session.audio.format.rate"),
    ({"model": "m", "audio": {"format": {"type": "audio/pcmu", "rate": 16000}}},
     "invalid_value", "session.audio.format.rate"),
    ({"model": "m", "audio": {"format": {"type": "audio/opus", "rate": 48000}}},
     "invalid_value", "session.audio.format.type"),
    ({"model": "m", "audio": {"output": {"voice": "nobody"}}}, "invalid_value",
     "session.audio.output.voice"),
    ({"model": "m", "audio": {"output": {"voice": {"name": "x"}}}}, "unknown_parameter",
     "session.audio.output.voice.name"),
    ({"model": "m", "input": [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]},
     "invalid_value", "session.input[0].content"),
    ({"model": "m", "input": [{"role": "system", "content": [{"text": "a"}]}]},
     "invalid_value", "session.input[0].role"),
    ({"model": "m", "input": [{"role": "assistant", "content": [
        {"type": "input_text", "text": "a"}]}]}, "invalid_value",
     "session.input[0].content[0].type"),
    ({"model": "m", "delegation": {"type": "responses", "responses": {
        "model": "x", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}}},
     "unsupported_value", "session.delegation.responses.tools[1].type"),
    ({"model": "m", "delegation": {"type": "responses", "responses": {
        "model": "x", "tool_choice": {"type": "file_search"}}}},
     "unsupported_value", "session.delegation.responses.tool_choice.type"),
    ({"model": "m", "delegation": {"type": "responses", "responses": {
        "model": "x", "tools": [{"type": "function", "name": "f", "x": 1}]}}},
     "unknown_parameter", "session.delegation.responses.tools[0].x"),
    ({"model": "m", "delegation": {"type": "responses", "responses": {
        "model": "x", "max_output_tokens": 8}}},
     "integer_below_min_value", "session.delegation.responses.max_output_tokens"),
    ({"model": "m", "delegation": {"type": "responses", "responses": {}}},
     "missing_required_parameter", "session.delegation.responses.model"),
    ({"model": "m", "delegation": {"type": "decisions", "decisions": {}}},
     "unsupported_value", "session.delegation.type"),
    ({"model": "m", "delegation": {"type": "client", "extra": 1}}, "unknown_parameter",
     "session.delegation.extra"),
    ({"model": "m", "triggers": [{"type": "decisions"}]}, "unsupported_value",
     "session.triggers"),
    ({"model": "m", "client": {"data_channel": {"allowed_client_events": ["Bad Type"]}}},
     "invalid_value", "session.client.data_channel.allowed_client_events[0]"),
    ({"model": "m", "store": "yes"}, "invalid_type", "session.store"),
    ({"model": "m", "audio": {"format": {"type": None, "rate": 8000}}}, "invalid_type",
     "session.audio.format.type"),
    ({"model": "m", "audio": {"format": {"rate": 8000}}}, "missing_required_parameter",
     "session.audio.format.type"),
    ({"model": ""}, "invalid_value", "session.model"),
])
def test_bad_configs_name_the_param(session: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(LiveError) as info:
        config.resolve_untrusted(session)
    assert (info.value.code, info.value.param) == (code, param)


def test_a_full_config_is_kept_as_given() -> None:
    given = {"model": "gpt-live-1.1", "instructions": "Be brief.",
             "audio": {"format": {"type": "audio/pcma", "rate": 8000},
                       "output": {"voice": {"id": "voice_123"}}},
             "client": {"data_channel": {"allowed_client_events": "all",
                                         "allowed_server_events": [
                                             {"type": "response.event",
                                              "response_event": "response.done"}]}},
             "delegation": {"type": "client", "acknowledgement_delay_ms": 250},
             "input": [{"type": "message", "role": "developer", "id": None,
                        "content": [{"type": "input_text", "text": "hi"}]},
                       {"role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "hello"}]}],
             "safety_identifier": "user-1", "store": True, "triggers": []}
    assert config.resolve_untrusted(given) == given
    items = config.realtime_items(given)
    assert [(i["role"], i["content"][0]["type"]) for i in items] == [
        ("system", "input_text"), ("assistant", "output_text")]


def test_update_takes_delegation_and_nothing_startup_only() -> None:
    cfg = config.resolve_untrusted({"model": "m"})
    out = config.apply_update_untrusted(cfg, {"delegation": {
        "type": "client", "acknowledgement_delay_ms": 100}, "triggers": []})
    assert out["delegation"] == {"type": "client", "acknowledgement_delay_ms": 100}
    for key, value in (("model", "x"), ("instructions", "x"), ("audio", {}), ("input", []),
                       ("store", True), ("client", {}), ("safety_identifier", "u")):
        with pytest.raises(LiveError) as info:
            config.apply_update_untrusted(cfg, {key: value})
        assert (info.value.code, info.value.param) == ("immutable_field_update",
                                                       f"session.{key}")
    with pytest.raises(LiveError) as info:
        config.apply_update_untrusted(cfg, {"delegation": {"type": "responses"}})
    assert info.value.param == "session.delegation.type"
    with pytest.raises(LiveError) as info:
        config.apply_update_untrusted(cfg, {"voice": "ash"})
    assert info.value.code == "unknown_parameter"


def test_limits_in_tokens() -> None:
    with pytest.raises(LiveError) as info:
        config.resolve_untrusted({"model": "m", "instructions": "x" * (4 * 16_384 + 4)})
    assert info.value.param == "session.instructions"
    item = {"role": "user", "content": [{"text": "x" * 40_000}]}
    with pytest.raises(LiveError) as info:
        config.resolve_untrusted({"model": "m", "input": [item]})
    assert info.value.param == "session.input"
    with pytest.raises(LiveError) as info:
        config.resolve_untrusted({"model": "m", "input": [item] * 129})
    assert info.value.code == "array_above_max_length"


# -- the SDK's own types ----------------------------------------------------------------------


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) in (typing_extensions.Required, typing_extensions.NotRequired, typing.Annotated):
        tp = typing.get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[Any]:
    tp = _strip(tp)
    if typing.get_origin(tp) is typing.Union:
        return [_strip(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _sequences(members: list[Any]) -> Any:
    (seq,) = [m for m in members if typing.get_args(m) and typing.get_origin(m)
              is not typing.Literal and not typing_extensions.is_typeddict(m)]
    return seq


def _compare(spec: Any, tp: Any, path: str) -> list[str]:
    """Where ``spec`` differs from the SDK's TypedDict ``tp`` (field names, required-ness,
    and below them)."""
    if isinstance(spec, AnyJson):
        return []
    members = _members(tp)
    dicts = [m for m in members if typing_extensions.is_typeddict(m)]
    if isinstance(spec, Obj):
        assert len(dicts) == 1, path
        return _compare_fields(spec.fields, dicts[0], path)
    if isinstance(spec, Tagged):
        out = []
        seen = set()
        for td in dicts:
            tag = typing.get_args(_strip(typing.get_type_hints(td)[spec.key]))[0]
            seen.add(tag)
            out += _compare_fields(spec.variants[tag].fields, td, f"{path}<{tag}>")
        return out + [f"{path}: variant {t} not in the SDK" for t in set(spec.variants) - seen]
    if isinstance(spec, OneOf):
        out = []
        for option in spec.options:
            if isinstance(option, Obj | Arr):
                out += _compare(option, _sequences(members) if isinstance(option, Arr)
                                else dicts[0], path)
        return out
    if isinstance(spec, Arr):
        return _compare(spec.item, typing.get_args(_sequences(members))[0], f"{path}[]")
    return []


def _required(td: Any, hints: dict[str, Any], key: str) -> bool:
    """Whether the SDK requires ``key``: ``Required[...]`` in a ``total=False`` TypedDict
    (read from the hint: under postponed annotations ``__required_keys__`` misses it)."""
    origin = typing.get_origin(hints[key])
    if origin is typing.Annotated:
        origin = typing.get_origin(typing.get_args(hints[key])[0])
    return origin is typing_extensions.Required or (td.__total__ and origin is not typing_extensions.NotRequired)


def _compare_fields(fields: typing.Mapping[str, Field], td: Any, path: str,
                    skip: frozenset[str] = frozenset()) -> list[str]:
    hints = typing.get_type_hints(td, include_extras=True)
    theirs = set(td.__required_keys__ | td.__optional_keys__) - skip
    out = [f"{path}.{k}: ours only" for k in set(fields) - theirs]
    out += [f"{path}.{k}: SDK only" for k in theirs - set(fields)]
    for key in set(fields) & theirs:
        if fields[key].required != _required(td, hints, key):
            out.append(f"{path}.{key}: required differs")
        out += _compare(fields[key].spec, hints[key], f"{path}.{key}")
    return out


def test_every_client_event_has_the_sdk_fields() -> None:
    from openai.types.live.client_event_param import ClientEventParam

    by_type = {typing.get_args(typing.get_type_hints(td)["type"])[0]: td
               for td in typing.get_args(ClientEventParam)}
    assert set(by_type) == set(EVENT_FIELDS) == set(CLIENT_EVENTS)
    for kind, td in by_type.items():
        theirs = td.__required_keys__ | td.__optional_keys__
        assert theirs == {"type", "event_id", *EVENT_FIELDS[kind]}, kind
        assert _compare_fields(EVENT_FIELDS[kind], td, kind,
                               frozenset({"type", "event_id"})) == []
    # decision.create is the one command whose event_id is required (the parser says so).
    td = by_type["decision.create"]
    assert _required(td, typing.get_type_hints(td, include_extras=True), "event_id")


def test_the_session_config_has_the_sdk_fields() -> None:
    from openai.types.live.session_config_param import SessionConfigParam
    from openai.types.live.session_update_config_param import SessionUpdateConfigParam

    assert _compare(config.SESSION_CONFIG, SessionConfigParam, "session") == []
    assert _compare(config.SESSION_UPDATE, SessionUpdateConfigParam, "session") == []


def test_built_in_voices_are_the_sdks() -> None:
    from openai.types.live.built_in_voice import BuiltInVoice

    assert set(config.BUILT_IN_VOICES) == set(typing.get_args(BuiltInVoice))


def test_every_sdk_server_event_is_listed() -> None:
    from openai.types.live.server_event import ServerEvent

    union = typing.get_args(ServerEvent)[0]
    types = {m.model_fields["type"].annotation.__args__[0] for m in typing.get_args(union)}
    assert types == set(SERVER_EVENTS)


def test_the_media_session_config_has_the_sdk_fields() -> None:
    """POST /v1/live/sessions' ``session`` (MediaSessionConfigParam): no audio.format,
    idle_timeout_s and wake_policy."""
    from openai.types.live.media_session_config_param import MediaSessionConfigParam

    assert _compare(config.MEDIA_SESSION_CONFIG, MediaSessionConfigParam, "session") == []


def test_the_data_channel_extras_are_the_sdks_and_only_the_channels() -> None:
    """session.paused / resumed are ConnectServerEvent's (data channel and sideband), not the
    primary union's: the WebSocket never sends them."""
    from openai.types.live.connect_server_event import ConnectServerEvent

    union = typing.get_args(ConnectServerEvent)[0]
    connect = {m.model_fields["type"].annotation.__args__[0] for m in typing.get_args(union)}
    assert set(DATA_CHANNEL_EVENTS) <= connect
    assert not set(DATA_CHANNEL_EVENTS) & set(SERVER_EVENTS)
