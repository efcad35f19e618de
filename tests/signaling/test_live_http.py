"""``POST /v1/live/sessions`` (appliance/signaling/live_http.py) against fake transceivers:
the SDK's request and response shapes, the one call path (the ``create`` a transceiver gets:
the ``live:`` agent, the checked session as ``params["live"]``, a ``live_`` id), OpenAI's
errors naming the ``param``, and auth (the API token only: GPT-Live has no ephemeral keys)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from signaling.fakes import OFFER
from signaling.test_realtime_http import API, bearer, creates, openai_error, secret

from appliance.signaling.live_http import parse_create_untrusted
from appliance.signaling.realtime_http import RealtimeProblem

pytest.importorskip("openai.types.live")
ROUTE = "/v1/live/sessions"


def body(**session: Any) -> dict[str, Any]:
    return {"session": {"model": "gpt-live-1", **session},
            "transport": {"type": "webrtc", "sdp": OFFER}}


async def test_create_answers_the_sdk_shape_and_places_a_live_call(make_env: Any) -> None:
    from openai.types.live.live_create_response import LiveCreateResponse

    env = await make_env()
    c = env.client()
    resp = await c.post(ROUTE, json=body(instructions="be brief",
                                         wake_policy={"type": "speech"}, idle_timeout_s=30))
    assert resp.status_code == 201, await resp.get_data()
    assert resp.mimetype == "application/json"
    out = json.loads(await resp.get_data())
    made = LiveCreateResponse.model_validate(out)
    assert set(out) == {"session", "transport"} and set(out["session"]) == {"id"}
    assert made.session.id.startswith("live_") and made.transport.type == "webrtc"
    assert made.transport.sdp.startswith("v=0")
    [create] = creates(env)
    assert create["session_id"] == made.session.id
    assert create["agent"] == "live:assistant"  # --live-agent's default, as a call spec
    assert create["params"]["live"]["session"] == body(
        instructions="be brief", wake_policy={"type": "speech"},
        idle_timeout_s=30)["session"]
    assert env.state.registry.get(made.session.id) is not None


async def test_x_agent_picks_the_live_agent(make_env: Any) -> None:
    env = await make_env()
    resp = await env.client().post(ROUTE, json=body(), headers={"X-Agent": "realtime"})
    assert resp.status_code == 201
    assert [r["agent"] for r in creates(env)] == ["live:realtime"]


@pytest.mark.parametrize(("payload", "code", "param"), [
    ({"session": {"model": "gpt-live-1"}}, "missing_required_parameter", "transport"),
    ({**body(), "extra": 1}, "unknown_parameter", "extra"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "sip", "sdp": OFFER}},
     "invalid_value", "transport.type"),
    ({"session": {"model": "gpt-live-1"}, "transport": {"type": "webrtc", "sdp": " "}},
     "invalid_value", "transport.sdp"),
    (body(audio={"format": {"type": "audio/pcm", "rate": 24000}}), "unknown_parameter",
     "session.audio.format"),
    ({"session": {}, "transport": {"type": "webrtc", "sdp": OFFER}},
     "missing_required_parameter", "session.model"),
    (body(idle_timeout_s=10), "invalid_value", "session.idle_timeout_s"),
    (body(wake_policy={"type": "speech", "vad_threshold": 2}), "invalid_value",
     "session.wake_policy.vad_threshold"),
    (body(client={"data_channel": {"allowed_client_events": ["Not An Event"]}}),
     "invalid_value", "session.client.data_channel.allowed_client_events[0]"),
    (body(delegation={"type": "decisions", "decisions": {}}), "unsupported_value",
     "session.delegation.type"),
])
async def test_bad_bodies_name_the_param(make_env: Any, payload: dict[str, Any], code: str,
                                         param: str) -> None:
    env = await make_env()
    err = await openai_error(await env.client().post(ROUTE, json=payload), 400)
    assert (err["code"], err["param"]) == (code, param), err
    assert creates(env) == []


async def test_not_json_and_not_an_object(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    err = await openai_error(await c.post(ROUTE, data=b"{", headers={
        "Content-Type": "application/json"}), 400)
    assert err["code"] == "invalid_json"
    err = await openai_error(await c.post(ROUTE, json=[1]), 400)
    assert err["code"] == "invalid_type"
    err = await openai_error(await c.post(ROUTE, data=OFFER, headers={
        "Content-Type": "application/sdp"}), 415)
    assert err["code"] == "unsupported_media_type"
    await openai_error(await c.delete(ROUTE), 405)
    assert creates(env) == []


async def test_only_the_api_token_creates_off_loopback(make_env: Any) -> None:
    env = await make_env(http=("0.0.0.0", 8443), api_token="the-api-token")
    c = env.client()
    err = await openai_error(await c.post(ROUTE, json=body()), 401)
    assert err["code"] == "invalid_api_key"
    ek = (await secret(c, headers=API))["value"]
    await openai_error(await c.post(ROUTE, json=body(), headers=bearer(ek)), 401)
    assert creates(env) == []
    assert (await c.post(ROUTE, json=body(), headers=API)).status_code == 201


def test_the_parser_raises_only_its_problem() -> None:
    for raw in (b"", b"null", b"[]", b'{"session": 1, "transport": 2}', b"\xff",
                b'{"session": {"model": "m"}, "transport": {"type": "webrtc", "sdp": 5}}'):
        with pytest.raises(RealtimeProblem):
            parse_create_untrusted(raw)


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.sampled_from(["webrtc", "gpt-live-1", "speech", OFFER, ""]), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["session", "transport", "type", "sdp", "model", "wake_policy", "idle_timeout_s",
         "vad_threshold", "client", "data_channel", "audio", "x"]), inner, max_size=4)),
    max_leaves=20)


@settings(max_examples=300, deadline=None, database=None)
@given(st.one_of(st.binary(max_size=64), _JSON.map(lambda v: json.dumps(v).encode())))
def test_the_parser_takes_any_body(raw: bytes) -> None:
    """parse_create_untrusted may raise only its RealtimeProblem, always a 400 — for a
    create and for a fork's body (issue 42 item 7)."""
    for fork in (None, STORED):
        status = 400
        try:
            parse_create_untrusted(raw, fork)
        except RealtimeProblem as p:
            status = p.status
        assert status == 400


#: A stored session (appliance/live/store.py): its config as given, its conversation.
STORED: dict[str, Any] = {
    "id": "live_stored1", "session": {"model": "gpt-live-1", "store": True,
                                      "instructions": "be brief",
                                      "audio": {"format": {"type": "audio/pcmu", "rate": 8000}}},
    "conversation": [{"role": "user", "content": [{"type": "input_text", "text": "I am Ada"}]},
                     {"role": "assistant",
                      "content": [{"type": "output_text", "text": "Hello Ada"}]}]}


async def test_a_webrtc_fork_places_a_call_primed_with_the_stored_conversation(
        make_env: Any, tmp_path: Any) -> None:
    """``POST /v1/live/sessions/{id}/fork`` (the SDK's ``client.live.sessions.fork``): the
    call is placed as a create is, its session the stored one's (no audio.format on
    WebRTC) with the stored conversation as ``input``, recorded (``media.record``) with
    the conversation kept in the recordings directory; an unknown id is a 404."""
    from openai.types.live.session_fork_response import SessionForkResponse

    from appliance.live import store

    env = await make_env(recordings_dir=tmp_path)
    store.save(tmp_path, STORED)
    c = env.client()
    resp = await c.post(f"{ROUTE}/live_stored1/fork",
                        json={"transport": {"type": "webrtc", "sdp": OFFER},
                              "session": {"client": {"data_channel": {}}}})
    assert resp.status_code == 201, await resp.get_data()
    made = SessionForkResponse.model_validate(json.loads(await resp.get_data()))
    assert made.session.id.startswith("live_") and made.session.id != "live_stored1"
    [create] = creates(env)
    params = create["params"]
    session = params["live"]["session"]
    assert session["input"] == STORED["conversation"] and session["instructions"] == "be brief"
    assert "format" not in session.get("audio", {}) and session["client"] == {"data_channel": {}}
    assert params["media"] == {"record": True} and params["live"]["store_dir"] == str(tmp_path)
    err = await openai_error(await c.post(f"{ROUTE}/live_unknown/fork", json={
        "transport": {"type": "webrtc", "sdp": OFFER}}), 404)
    assert err["param"] == "session_id" and "live_unknown" in err["message"]
    err = await openai_error(await c.post(f"{ROUTE}/live_stored1/fork", json={
        "transport": {"type": "webrtc", "sdp": OFFER},
        "session": {"audio": {"format": {"type": "audio/pcm", "rate": 24000}}}}), 400)
    assert err["param"] == "session.audio"


def test_responses_delegation_needs_the_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A WebRTC session with Responses delegation is refused at the POST when no ``--llm``
    is configured (the transceiver would have nowhere to send the work), and accepted
    when one is; a hosted tool is refused either way, naming it."""
    session = {"delegation": {"type": "responses", "responses": {"model": "m"}}}
    raw = json.dumps(body(**session)).encode()
    monkeypatch.delenv("APPLIANCE_LLM_URL", raising=False)
    with pytest.raises(RealtimeProblem) as info:
        parse_create_untrusted(raw)
    assert info.value.status == 400 and info.value.param == "session.delegation.type"
    assert "--llm" in info.value.detail
    monkeypatch.setenv("APPLIANCE_LLM_URL", "http://127.0.0.1:9/v1")
    checked, _ = parse_create_untrusted(raw)
    assert checked["delegation"]["type"] == "responses"
    hosted = body(delegation={"type": "responses", "responses": {
        "model": "m", "tools": [{"type": "file_search"}]}})
    with pytest.raises(RealtimeProblem) as info:
        parse_create_untrusted(json.dumps(hosted).encode())
    assert info.value.param == "session.delegation.responses.tools[0].type"
