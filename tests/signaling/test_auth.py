"""Auth on a non-loopback bind: the API token, client tokens (scope, ownership, expiry)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from signaling.fakes import OFFER

from appliance.signaling.state import SignalingConfig
from appliance.signaling.tokens import ClientTokens, TokenError

SDP = {"Content-Type": "application/sdp"}
SDPFRAG = {"Content-Type": "application/trickle-ice-sdpfrag"}
TRICKLE = "a=mid:0\r\na=candidate:1 1 udp 1 192.0.2.9 5000 typ host\r\n"
API = {"Authorization": "Bearer the-api-token"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def code_of(resp: Any) -> tuple[int, str | None]:
    body = await resp.get_data()
    try:
        return resp.status_code, json.loads(body).get("code")
    except ValueError:
        return resp.status_code, None


async def public_env(make_env: Any) -> Any:
    # The auth decision comes from the configured bind address; nothing binds it here.
    return await make_env(http=("0.0.0.0", 8443), api_token="the-api-token")


async def mint(client: Any, **body: Any) -> dict[str, Any]:
    resp = await client.post("/v1/client_tokens", headers=API, json=body if body else None)
    assert resp.status_code == 201, await resp.get_data()
    assert resp.headers["Cache-Control"] == "no-store"
    out: dict[str, Any] = json.loads(await resp.get_data())
    return out


@pytest.mark.parametrize(
    ("host", "needs"),
    [("127.0.0.1", False), ("::1", False), ("localhost", False), ("0.0.0.0", True),
     ("::", True), ("192.0.2.10", True)],
)
def test_auth_is_required_off_loopback(host: str, needs: bool) -> None:
    assert SignalingConfig(http=(host, 80)).requires_auth() is needs


async def test_loopback_needs_no_token(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    assert (await c.post("/v1/sessions", data=OFFER, headers=SDP)).status_code == 201
    assert (await c.get("/v1/sessions")).status_code == 200
    assert (await c.get("/metrics")).status_code == 200


async def test_everything_but_health_and_ui_needs_the_api_token(make_env: Any) -> None:
    env = await public_env(make_env)
    c = env.client()
    for method, path in [("GET", "/v1/sessions"), ("GET", "/v1/sessions/x"), ("GET", "/metrics"),
                         ("GET", "/v1/events"), ("POST", "/v1/client_tokens"),
                         ("DELETE", "/v1/sessions/x")]:
        resp = await c.open(path, method=method)
        assert await code_of(resp) == (401, "missing-token"), (method, path)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    r = await c.post("/v1/sessions", data=OFFER, headers=SDP)
    assert await code_of(r) == (401, "missing-token")
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **bearer("wrong")})
    assert await code_of(r) == (401, "bad-token")
    r = await c.get("/v1/sessions", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert await code_of(r) == (401, "missing-token")
    assert (await c.get("/healthz")).status_code == 200
    assert (await c.get("/readyz")).status_code == 200
    assert await code_of(await c.get("/")) == (404, "no-web-ui")  # not 401: the UI is public
    assert (await c.post("/v1/sessions", data=OFFER, headers={**SDP, **API})).status_code == 201
    assert (await c.get("/v1/sessions", headers=API)).status_code == 200
    assert (await c.get("/metrics", headers=API)).status_code == 200


async def test_client_token_creates_patches_and_deletes_its_own_sessions(make_env: Any) -> None:
    env = await public_env(make_env)
    c = env.client()
    minted = await mint(c)
    assert minted["scope"] == ["sessions"]
    assert minted["expires_at"] == pytest.approx(env.clock.t + 600)
    tok = bearer(minted["token"])
    created = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok})
    assert created.status_code == 201
    loc = created.headers["Location"]
    assert (await c.patch(loc, data=TRICKLE, headers={**SDPFRAG, **tok})).status_code == 204

    # Another browser's token cannot touch it; the API token can.
    other = bearer((await mint(c))["token"])
    assert await code_of(await c.patch(loc, data=TRICKLE, headers={**SDPFRAG, **other})) == (403, "not-owner")
    assert await code_of(await c.delete(loc, headers=other)) == (403, "not-owner")
    # A client token is not an API token.
    assert await code_of(await c.get("/v1/sessions", headers=tok)) == (403, "token-scope")
    assert await code_of(await c.post("/v1/client_tokens", headers=tok)) == (403, "token-scope")
    assert (await c.delete(loc, headers=tok)).status_code == 200


async def test_only_a_full_rights_caller_may_choose_the_agent(make_env: Any) -> None:
    """An agent spec is code to import or a URL the transceiver dials with the deployment's
    keys: a browser's client token gets the configured agent, and a 403 for naming one."""
    env = await public_env(make_env)
    c = env.client()
    tok = bearer((await mint(c))["token"])
    for how in ({"query_string": {"agent": "realtime+wss://attacker.example/v1/realtime"}},
                {"headers": {**SDP, **tok, "X-Agent": "/tmp/evil.py:agent"}}):
        kw: dict[str, Any] = {"headers": {**SDP, **tok}, **how}
        r = await c.post("/v1/sessions", data=OFFER, **kw)
        assert await code_of(r) == (403, "agent-not-allowed"), how
    assert (await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok})).status_code == 201
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **API},
                     query_string={"agent": "echo"})
    assert r.status_code == 201


async def test_a_client_token_minted_for_an_agent_gets_that_agent_only(make_env: Any) -> None:
    """The minter (full rights) may choose the agent, as it could create the session itself:
    the demo page's agent picker on a deployment that needs tokens. The token's sessions get
    that agent, named or not; another is a 403 that says how to get one; the agent is inside
    the MAC, so it cannot be edited."""
    env = await public_env(make_env)
    c = env.client()
    minted = await mint(c, agent="assistant")
    assert minted["agent"] == "assistant"
    tok = bearer(minted["token"])
    for query in ({}, {"agent": "assistant"}):
        r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok}, query_string=query)
        assert r.status_code == 201, await r.get_data()
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok},
                     query_string={"agent": "echo"})
    assert await code_of(r) == (403, "agent-not-allowed")
    assert "minted for the agent 'assistant'" in (await r.get_json())["detail"]
    agents = [q["agent"] for f in env.fakes.values() for q in f.requests if q["op"] == "create"]
    assert agents == ["assistant", "assistant"]
    # Only a full-rights caller mints, and a bad agent is refused at minting.
    assert await code_of(await c.post("/v1/client_tokens", json={"agent": "echo"},
                                      headers=tok)) == (403, "token-scope")
    r = await c.post("/v1/client_tokens", json={"agent": "bad agent\n"}, headers=API)
    assert await code_of(r) == (400, "bad-agent")
    assert await code_of(await c.post("/v1/client_tokens", json={"agent": 7},
                                      headers=API)) == (400, "bad-agent")


async def test_client_token_expires(make_env: Any) -> None:
    env = await public_env(make_env)
    c = env.client()
    tok = bearer((await mint(c, ttl=30))["token"])
    env.clock.t += 29.9
    assert (await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok})).status_code == 201
    env.clock.t += 0.1
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **tok})
    assert await code_of(r) == (401, "token-expired")
    assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]


async def test_tampered_client_token_is_401(make_env: Any) -> None:
    env = await public_env(make_env)
    c = env.client()
    token = (await mint(c))["token"]
    head, body, mac = token.split(".")
    forged = f"{head}.{body}.{'A' * len(mac)}"
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **bearer(forged)})
    assert await code_of(r) == (401, "token-bad-signature")
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **bearer("ct1.%%%.!!")})
    assert await code_of(r) == (401, "token-malformed")
    # A token minted by another signaling process (another key) does not verify here.
    alien, _ = ClientTokens().mint(now=env.clock.t, ttl=60)
    r = await c.post("/v1/sessions", data=OFFER, headers={**SDP, **bearer(alien)})
    assert await code_of(r) == (401, "token-bad-signature")


@pytest.mark.parametrize("body", [{"ttl": 0}, {"ttl": -1}, {"ttl": "60"}, {"ttl": 1e9},
                                  {"ttl": True}, [1]])
async def test_client_token_ttl_is_validated(make_env: Any, body: Any) -> None:
    env = await public_env(make_env)
    r = await env.client().post("/v1/client_tokens", headers=API, json=body)
    assert (await code_of(r))[0] == 400


async def test_client_token_request_body_errors(make_env: Any) -> None:
    env = await public_env(make_env)
    c = env.client()
    r = await c.post("/v1/client_tokens", data=b"{nope", headers={**API, "Content-Type": "application/json"})
    assert await code_of(r) == (400, "bad-json")
    r = await c.post("/v1/client_tokens", data=b"ttl=5", headers={**API, "Content-Type": "text/plain"})
    assert await code_of(r) == (415, "unsupported-media-type")


def test_tokens_round_trip_and_expiry() -> None:
    tokens = ClientTokens(b"k" * 32)
    token, claims = tokens.mint(now=100.0, ttl=60)
    assert tokens.verify_untrusted(token, now=159.9) == claims
    with pytest.raises(TokenError) as info:
        tokens.verify_untrusted(token, now=160.0)
    assert info.value.reason == "expired"


@given(st.text(max_size=300))
def test_verify_untrusted_raises_only_token_error(text: str) -> None:
    tokens = ClientTokens(b"k" * 32)
    for candidate in (text, "ct1." + text, "ct1." + text + "." + text):
        with pytest.raises(TokenError):
            tokens.verify_untrusted(candidate, now=0.0)
