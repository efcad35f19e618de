"""The OpenAI-Realtime-compatible HTTP surface (appliance/signaling/realtime_http.py) against fake
transceivers: client secrets, calls (raw SDP and multipart), ``?dcid``, the per-call
``params`` each ``create`` carries, GET/DELETE, CORS and OpenAI-shaped errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from signaling.fakes import OFFER

from appliance.control import MAX_PARAMS_BYTES
from appliance.signaling.realtime_http import (
    SECRET_TTL_MAX,
    RealtimeProblem,
    Secret,
    SecretTable,
    check_session,
    effective_session,
    merge_session,
    parse_dcid,
    parse_expires_after,
)

SDP = {"Content-Type": "application/sdp"}
API = {"Authorization": "Bearer the-api-token"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def body_of(resp: Any) -> Any:
    return json.loads(await resp.get_data())


async def openai_error(resp: Any, status: int) -> dict[str, Any]:
    """The response is OpenAI's error object (and not problem+json) with ``status``."""
    assert resp.status_code == status, await resp.get_data()
    assert resp.mimetype == "application/json"
    body = await body_of(resp)
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "code", "param"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return err


async def secret(client: Any, headers: dict[str, str] | None = None, **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/realtime/client_secrets", headers=headers or {},
                             json=body if body else None)
    assert resp.status_code == 200, await resp.get_data()
    assert resp.headers["Cache-Control"] == "no-store"
    out: dict[str, Any] = await body_of(resp)
    return out


def multipart(fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body (RFC 7578) as the OpenAI server-side sample sends it."""
    boundary = "----appliance-test-boundary"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             for k, v in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def creates(env: Any) -> list[dict[str, Any]]:
    return [r for f in env.fakes.values() for r in f.requests if r["op"] == "create"]


async def test_client_secret_has_the_ga_shape(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    out = await secret(c, expires_after={"anchor": "created_at", "seconds": 60},
                       session={"type": "realtime", "instructions": "be brief",
                                "audio": {"output": {"voice": "marin"}}, "x_custom": 1})
    assert set(out) == {"value", "expires_at", "session", "ice_servers"}
    assert out["ice_servers"] == []  # no TURN configured (test_ice_servers.py: with)
    assert out["value"].startswith("ek_")
    assert out["expires_at"] == int(env.clock() + 60)
    s = out["session"]
    assert s["type"] == "realtime" and s["object"] == "realtime.session"
    assert s["id"].startswith("sess_")
    assert s["instructions"] == "be brief" and s["x_custom"] == 1  # unknown fields kept
    assert s["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "marin", "speed": 1.0}
    assert s["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert s["output_modalities"] == ["audio"]
    # Defaults: 10 minutes, no body at all.
    out = await secret(c)
    assert out["expires_at"] == int(env.clock() + 600)


@pytest.mark.parametrize(("body", "param"), [
    ({"expires_after": {"anchor": "created_at", "seconds": 5}}, "expires_after.seconds"),
    ({"expires_after": {"seconds": SECRET_TTL_MAX + 1}}, "expires_after.seconds"),
    ({"expires_after": {"seconds": True}}, "expires_after.seconds"),
    ({"expires_after": {"anchor": "now", "seconds": 60}}, "expires_after.anchor"),
    ({"expires_after": 60}, "expires_after"),
    ({"session": {"type": "transcription"}}, "session.type"),
    ({"session": "realtime"}, "session"),
])
async def test_client_secret_bad_input_names_the_param(make_env: Any, body: Any, param: str) -> None:
    env = await make_env()
    resp = await env.client().post("/v1/realtime/client_secrets", json=body)
    err = await openai_error(resp, 400)
    assert err["param"] == param


async def test_client_secret_bad_body(make_env: Any) -> None:
    c = (await make_env()).client()
    resp = await c.post("/v1/realtime/client_secrets", data="{", headers={"Content-Type": "application/json"})
    await openai_error(resp, 400)
    resp = await c.post("/v1/realtime/client_secrets", data="[]", headers={"Content-Type": "application/json"})
    await openai_error(resp, 400)
    resp = await c.post("/v1/realtime/client_secrets", data="x=1", headers={"Content-Type": "text/plain"})
    await openai_error(resp, 415)


async def test_call_with_a_client_secret(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    ek = (await secret(c, session={"instructions": "hi", "audio": {"output": {"voice": "ash"}}}))["value"]
    resp = await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ek),
                        "X-OpenAI-Agents-SDK": "openai-agents-sdk.0.20.0"})
    assert resp.status_code == 201, await resp.get_data()
    assert resp.mimetype == "application/sdp"
    assert (await resp.get_data(as_text=True)).startswith("v=0")
    location = resp.headers["Location"]
    call_id = location.rsplit("/", 1)[1]
    assert location == f"/v1/realtime/calls/{call_id}" and call_id.startswith("rtc_")
    [req] = creates(env)
    assert req["session_id"] == call_id
    assert req["agent"] == "realtime"  # the configured --realtime-agent
    assert req["params"] == {"realtime": {
        "session": {"instructions": "hi", "audio": {"output": {"voice": "ash"}}},
        "dcid": None, "call_id": call_id}}
    # GET shows the call; DELETE ends it; the same secret may do both.
    got = await c.get(location, headers=bearer(ek))
    assert got.status_code == 200
    view = await body_of(got)
    assert view["id"] == call_id and view["object"] == "realtime.call"
    assert view["status"] == "connected" and view["session"]["instructions"] == "hi"
    assert (await c.delete(location, headers=bearer(ek))).status_code == 200
    assert (await body_of(await c.get(location)))["status"] == "ended"
    # Ending it again is the transceiver's 404, in OpenAI's shape.
    await openai_error(await c.post(location + "/hangup"), 404)


async def test_multipart_call_merges_its_session_over_the_secret(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    ek = (await secret(c, session={"instructions": "a", "audio": {"input": {"x": 1}}}))["value"]
    form = {"sdp": OFFER, "session": json.dumps({"audio": {"output": {"voice": "verse"}}})}
    data, ctype = multipart(form)
    resp = await c.post("/v1/realtime/calls?dcid=3", data=data, headers={**ctype, **bearer(ek)})
    assert resp.status_code == 201, await resp.get_data()
    [req] = creates(env)
    assert req["params"]["realtime"]["dcid"] == 3
    assert req["params"]["realtime"]["session"] == {
        "instructions": "a", "audio": {"input": {"x": 1}, "output": {"voice": "verse"}}}


@pytest.mark.parametrize(("form", "param"), [
    ({"session": "{}"}, "sdp"),
    ({"sdp": OFFER, "session": "{"}, "session"),
    ({"sdp": OFFER, "session": "[1]"}, "session"),
    ({"sdp": OFFER, "session": '{"type": "transcription"}'}, "session.type"),
])
async def test_multipart_errors(make_env: Any, form: dict[str, str], param: str) -> None:
    c = (await make_env()).client()
    data, ctype = multipart(form)
    err = await openai_error(await c.post("/v1/realtime/calls", data=data, headers=ctype), 400)
    assert err["param"] == param


@pytest.mark.parametrize("dcid", ["-1", "65535", "x", "1.5", "%D9%A1", "%20"])
async def test_bad_dcid(make_env: Any, dcid: str) -> None:
    c = (await make_env()).client()
    err = await openai_error(await c.post(f"/v1/realtime/calls?dcid={dcid}", data=OFFER, headers=SDP), 400)
    assert err["param"] == "dcid"


async def test_call_errors_are_openai_shaped(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    await openai_error(await c.post("/v1/realtime/calls", data=OFFER,
                                    headers={"Content-Type": "text/plain"}), 415)
    await openai_error(await c.post("/v1/realtime/calls", data="", headers=SDP), 400)
    # The transceiver's SDP error passes through with its status.
    err = await openai_error(await c.post("/v1/realtime/calls", data="v=0\r\n", headers=SDP), 422)
    assert err["code"] == "no-audio"
    await openai_error(await c.get("/v1/realtime/calls/rtc_nope"), 404)
    await openai_error(await c.delete("/v1/realtime/calls/not-a-call"), 404)
    # Too large a body: 413, before it is read.
    big = "v=0\r\n" + "a=x\r\n" * (env.state.config.max_body // 5)
    await openai_error(await c.post("/v1/realtime/calls", data=big, headers=SDP), 413)
    # Wrong methods too.
    resp = await c.get("/v1/realtime/calls")
    await openai_error(resp, 405)
    assert "POST" in resp.headers["Allow"]
    await openai_error(await c.put("/v1/realtime/calls/rtc_x"), 405)
    # The rest of the API keeps problem+json.
    resp = await c.get("/v1/sessions/nope")
    assert resp.mimetype == "application/problem+json"


async def test_agent_is_picked_by_full_rights_callers_only(make_env: Any) -> None:
    env = await make_env(http=("0.0.0.0", 8443), api_token="the-api-token")
    c = env.client()
    # At mint time (API token): the secret's calls use that agent.
    ek = (await secret(c, headers={**API, "X-Agent": "realtime:examples/x.py:A"}))["value"]
    assert (await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ek)})).status_code == 201
    # Per call, with the API token.
    assert (await c.post("/v1/realtime/calls?agent=echo", data=OFFER, headers={**SDP, **API})).status_code == 201
    assert [r["agent"] for r in creates(env)] == ["realtime:examples/x.py:A", "echo"]
    # A client secret may not pick one.
    err = await openai_error(await c.post("/v1/realtime/calls?agent=echo", data=OFFER,
                                          headers={**SDP, **bearer(ek)}), 403)
    assert err["param"] == "agent"


async def test_auth_off_loopback(make_env: Any) -> None:
    env = await make_env(http=("0.0.0.0", 8443), api_token="the-api-token")
    c = env.client()
    # Minting needs the API token.
    err = await openai_error(await c.post("/v1/realtime/client_secrets"), 401)
    assert err["code"] == "invalid_api_key"
    assert "Bearer" in (await c.post("/v1/realtime/client_secrets")).headers["WWW-Authenticate"]
    ek = (await secret(c, headers=API))["value"]
    # A client secret cannot mint more, nor use the rest of the API.
    await openai_error(await c.post("/v1/realtime/client_secrets", headers=bearer(ek)), 403)
    assert (await c.get("/v1/sessions", headers=bearer(ek))).status_code == 401
    # Calls: no token, a wrong one, a ct1. client token: refused; ek_ and the API token: in.
    await openai_error(await c.post("/v1/realtime/calls", data=OFFER, headers=SDP), 401)
    await openai_error(await c.post("/v1/realtime/calls", data=OFFER,
                                    headers={**SDP, **bearer("ek_forged.AAAA")}), 401)
    ct = json.loads(await (await c.post("/v1/client_tokens", headers=API)).get_data())["token"]
    await openai_error(await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ct)}), 403)
    mine = await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ek)})
    theirs = await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **API})
    assert mine.status_code == theirs.status_code == 201
    # A secret sees and ends only its own calls; the API token any.
    other = (await secret(c, headers=API))["value"]
    await openai_error(await c.get(mine.headers["Location"], headers=bearer(other)), 403)
    await openai_error(await c.delete(theirs.headers["Location"], headers=bearer(ek)), 403)
    assert (await c.get(theirs.headers["Location"], headers=API)).status_code == 200
    assert (await c.delete(mine.headers["Location"], headers=bearer(ek))).status_code == 200
    # An ek_ secret is not a client token for /v1/sessions either.
    assert (await c.post("/v1/sessions", data=OFFER, headers={**SDP, **bearer(ek)})).status_code == 401


async def test_secret_expiry_is_checked_even_on_loopback(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    ek = (await secret(c, expires_after={"seconds": 10}))["value"]
    env.clock.t += 9.5
    assert (await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ek)})).status_code == 201
    env.clock.t += 1
    err = await openai_error(await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer(ek)}), 401)
    assert "expired" in err["message"]
    # Any other bearer (an OpenAI key a sample page still sends) is ignored on loopback.
    assert (await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, **bearer("sk-x")})).status_code == 201


async def test_cors(make_env: Any) -> None:
    c = (await make_env()).client()
    for path in ("/v1/realtime/calls", "/v1/realtime/client_secrets", "/v1/realtime/calls/rtc_x"):
        resp = await c.options(path, headers={
            "Origin": "http://page.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-openai-agents-sdk"})
        assert resp.status_code == 200, path
        allowed = {h.strip().lower() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type", "x-openai-agents-sdk"} <= allowed
        assert "POST" in resp.headers["Access-Control-Allow-Methods"]
        assert resp.headers["Access-Control-Allow-Origin"] == "*"
    resp = await c.post("/v1/realtime/calls", data=OFFER, headers={**SDP, "Origin": "http://page.example"})
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert "Location" in resp.headers["Access-Control-Expose-Headers"]
    # The WHIP routes keep their own preflight.
    resp = await c.options("/v1/sessions", headers={"Access-Control-Request-Method": "POST"})
    assert "If-Match" in resp.headers["Access-Control-Allow-Headers"]


async def test_params_over_the_cap_are_refused_before_any_transceiver(make_env: Any) -> None:
    env = await make_env(max_body=4 * MAX_PARAMS_BYTES)
    c = env.client()
    form = {"sdp": OFFER, "session": json.dumps({"instructions": "x" * MAX_PARAMS_BYTES})}
    data, ctype = multipart(form)
    err = await openai_error(await c.post("/v1/realtime/calls", data=data, headers=ctype), 400)
    assert err["code"] == "bad-params"
    assert creates(env) == []


def test_secret_table_is_bounded_and_drops_expired() -> None:
    t = SecretTable(limit=3)
    for i in range(5):
        t.add(f"j{i}", Secret(exp=100.0 + i, session={}, agent=None), now=0.0)
    assert len(t) == 3 and t.get("j0") is None and t.get("j4") is not None
    t.add("late", Secret(exp=200.0, session={}, agent=None), now=103.5)
    assert t.get("j3") is None and t.get("j4") is not None and len(t) == 2


def test_merge_session() -> None:
    assert merge_session({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 3}, "d": [2]}) == \
        {"a": {"b": 3, "c": 2}, "d": [2]}
    assert effective_session({"audio": None})["audio"] is None  # replaced, as sent


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12))
def test_parse_dcid_raises_only_its_problem(text: str) -> None:
    param = None
    n = None
    try:
        n = parse_dcid(text)
    except RealtimeProblem as p:
        param = p.param
    assert param == "dcid" or n is None or 0 <= n <= 65534


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4)
                    | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, st.dictionaries(st.sampled_from(["anchor", "seconds"]), JSON)))
def test_expires_after_raises_only_its_problem(value: Any) -> None:
    problem: RealtimeProblem | None = None
    try:
        assert 10 <= parse_expires_after(value) <= SECRET_TTL_MAX
    except RealtimeProblem as p:
        problem = p
    if problem is not None:
        assert problem.status == 400 and str(problem.param).startswith("expires_after")


@settings(max_examples=300, deadline=None)
@given(st.one_of(JSON, st.dictionaries(st.sampled_from(["type", "audio", "x"]), JSON)))
def test_check_session_raises_only_its_problem(value: Any) -> None:
    problem: RealtimeProblem | None = None
    try:
        assert effective_session(check_session(value))["type"] == "realtime"
    except RealtimeProblem as p:
        problem = p
    if problem is not None:
        assert problem.status == 400 and str(problem.param).startswith("session")
