"""The HTTP API against fake transceivers: WHIP create/patch/delete, list/get, every 4xx."""

from __future__ import annotations

import json
from typing import Any

from signaling.fakes import OFFER

SDP = {"Content-Type": "application/sdp"}
SDPFRAG = {"Content-Type": "application/trickle-ice-sdpfrag"}
TRICKLE = "a=mid:0\r\na=candidate:1 1 udp 1 192.0.2.9 5000 typ host\r\n"
RESTART = "a=ice-ufrag:zzzz\r\na=ice-pwd:0123456789abcdefghijkl\r\na=mid:0\r\n"


async def create(client: Any, path: str = "/v1/sessions", headers: dict[str, str] | None = None) -> Any:
    return await client.post(path, data=OFFER.encode(), headers={**SDP, **(headers or {})})


async def problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    """Assert ``resp`` is an RFC 9457 problem with this status and code."""
    assert resp.status_code == status, await resp.get_data()
    assert resp.headers["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = json.loads(await resp.get_data())
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["title"] and body["detail"] and body["type"].startswith("urn:")
    return body


async def test_create_is_201_with_answer_location_and_etag(make_env: Any) -> None:
    env = await make_env()
    resp = await create(env.client())
    assert resp.status_code == 201
    assert resp.headers["Content-Type"] == "application/sdp"
    location = resp.headers["Location"]
    assert location.startswith("/v1/sessions/")
    sid = location.rsplit("/", 1)[1]
    etag = resp.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 2
    assert resp.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    answer = (await resp.get_data()).decode()
    # Every advertised public address is forwarded as a candidate to the transceiver.
    assert "198.51.100.1 3478 typ host" in answer
    assert "2001:db8::5 3478 typ host" in answer
    reqs = [r for f in env.fakes.values() for r in f.requests if r["op"] == "create"]
    assert len(reqs) == 1
    assert reqs[0]["session_id"] == sid
    assert reqs[0]["offer"] == OFFER
    assert reqs[0]["agent"] is None
    assert reqs[0]["candidates"] == [["198.51.100.1", 3478], ["2001:db8::5", 3478]]


async def test_the_relayed_media_port_is_a_second_lower_priority_candidate(
        make_env: Any) -> None:
    """Issue 40 item 2: with media below port 1024 (which Chromium will not relay to), each
    address is also answered at the relayed-media port, after every UDP candidate (the
    answer ranks them in this order); ICE-TCP stays one passive candidate per address."""
    env = await make_env(n=1, udp_port=443, tcp_port=443, relayed_media_port=3478)
    resp = await create(env.client())
    assert resp.status_code == 201
    (req,) = [r for r in env.fakes[0].requests if r["op"] == "create"]
    assert req["candidates"] == [["198.51.100.1", 443], ["2001:db8::5", 443],
                                 ["198.51.100.1", 3478], ["2001:db8::5", 3478]]
    assert req["tcp_candidates"] == [["198.51.100.1", 443], ["2001:db8::5", 443]]


async def test_agent_from_query_or_header(make_env: Any) -> None:
    env = await make_env(n=1)
    c = env.client()
    assert (await create(c, "/v1/sessions?agent=ws://agent.example/x")).status_code == 201
    assert (await create(c, headers={"X-Agent": "examples.tone:Agent"})).status_code == 201
    agents = [r["agent"] for r in env.fakes[0].requests if r["op"] == "create"]
    assert agents == ["ws://agent.example/x", "examples.tone:Agent"]
    await problem(await create(c, headers={"X-Agent": "bad agent"}), 400, "bad-agent")


async def test_least_loaded_transceiver_is_picked(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    owners = []
    for _ in range(4):
        resp = await create(c)
        owners.append(env.state.sessions[resp.headers["Location"].rsplit("/", 1)[1]].transceiver)
    assert sorted(owners) == [0, 0, 1, 1]
    # End both sessions of transceiver 1: it is now the least loaded and takes the next two.
    for sid, rec in list(env.state.sessions.items()):
        if rec.transceiver == 1:
            assert (await c.delete(f"/v1/sessions/{sid}")).status_code == 200
    for _ in range(2):
        resp = await create(c)
        assert env.state.sessions[resp.headers["Location"].rsplit("/", 1)[1]].transceiver == 1


async def test_patch_trickle_is_204_and_ice_restart_is_200_with_new_etag(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    resp = await create(c)
    loc, etag = resp.headers["Location"], resp.headers["ETag"]

    trickle = await c.patch(loc, data=TRICKLE, headers={**SDPFRAG, "If-Match": etag})
    assert trickle.status_code == 204
    assert await trickle.get_data() == b""

    restart = await c.patch(loc, data=RESTART, headers={**SDPFRAG, "If-Match": "*"})
    assert restart.status_code == 200
    assert restart.headers["Content-Type"] == "application/trickle-ice-sdpfrag"
    assert b"a=ice-ufrag:NEW1" in await restart.get_data()
    new_etag = restart.headers["ETag"]
    assert new_etag != etag

    # The old entity-tag is stale now: RFC 9725 wants 412.
    stale = await c.patch(loc, data=TRICKLE, headers={**SDPFRAG, "If-Match": etag})
    await problem(stale, 412, "etag-mismatch")
    assert stale.headers["ETag"] == new_etag
    ok = await c.patch(loc, data=TRICKLE, headers={**SDPFRAG, "If-Match": f'W/"x", {new_etag}'})
    assert ok.status_code == 204
    # Without If-Match a plain trickle is still accepted.
    assert (await c.patch(loc, data=TRICKLE, headers=SDPFRAG)).status_code == 204


async def test_patch_errors(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    r = await c.patch(loc, data=TRICKLE, headers=SDP)
    await problem(r, 415, "unsupported-media-type")
    assert r.headers["Accept-Patch"] == "application/trickle-ice-sdpfrag"
    await problem(await c.patch(loc, data=b"", headers=SDPFRAG), 400, "empty-body")
    await problem(await c.patch("/v1/sessions/nope", data=TRICKLE, headers=SDPFRAG),
                  404, "unknown-session")


async def test_delete_ends_the_session(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    resp = await c.delete(loc)
    assert resp.status_code == 200
    sid = loc.rsplit("/", 1)[1]
    deletes = [r for f in env.fakes.values() for r in f.requests if r["op"] == "delete"]
    assert deletes == [{"op": "delete", "session_id": sid, "reason": "deleted"}]
    detail = json.loads(await (await c.get(loc)).get_data())
    assert detail["state"] == "ended"
    assert detail["end_reason"] == "deleted"
    await problem(await c.delete(loc), 404, "session-ended")
    await problem(await c.delete("/v1/sessions/nope"), 404, "unknown-session")
    await problem(await c.patch(loc, data=TRICKLE, headers=SDPFRAG), 404, "session-ended")


async def test_delete_keeps_the_transceivers_end_reason(make_env: Any) -> None:
    """A session the transceiver had already ended (consent timeout) keeps that reason and
    time after a DELETE; one it ended and then forgot is "gone", not "deleted"."""
    env = await make_env()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    sid = loc.rsplit("/", 1)[1]
    fake = next(f for f in env.fakes.values() if sid in f.sessions)
    fake.sessions[sid].update(state="ended", end_reason="consent timeout", ended_at=1000.5)
    assert (await c.delete(loc)).status_code == 200
    detail = json.loads(await (await c.get(loc)).get_data())
    assert (detail["state"], detail["end_reason"], detail["ended_at"]) == (
        "ended", "consent timeout", 1000.5)

    loc = (await create(c)).headers["Location"]
    sid = loc.rsplit("/", 1)[1]
    fake = next(f for f in env.fakes.values() if sid in f.sessions)
    del fake.sessions[sid]  # ended and forgotten (past RECENTLY_ENDED) before the DELETE
    assert (await c.delete(loc)).status_code == 200
    detail = json.loads(await (await c.get(loc)).get_data())
    assert (detail["state"], detail["end_reason"]) == ("ended", "gone")


async def test_list_and_get(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    locs = [(await create(c)).headers["Location"] for _ in range(2)]
    resp = await c.get("/v1/sessions")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "application/json"
    sessions = json.loads(await resp.get_data())["sessions"]
    assert sorted(s["id"] for s in sessions) == sorted(loc.rsplit("/", 1)[1] for loc in locs)
    assert {s["transceiver"] for s in sessions} == {0, 1}
    one = json.loads(await (await c.get(locs[0])).get_data())
    assert one["id"] == locs[0].rsplit("/", 1)[1]
    assert one["state"] == "connected"
    assert one["packets_in"] == 5
    assert one["timeline"]["dtls_done"] == 14.0
    await problem(await c.get("/v1/sessions/nope"), 404, "unknown-session")


async def test_sessions_of_a_lost_transceiver_are_ended(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    locs = [(await create(c)).headers["Location"] for _ in range(2)]
    await c.get("/v1/sessions")  # signaling caches the last stats it saw
    lost = next(loc for loc in locs if env.state.sessions[loc.rsplit("/", 1)[1]].transceiver == 0)
    kept = next(loc for loc in locs if loc != lost)
    env.cancel[0].cancel()  # transceiver 0's process is gone...
    await env.state.process_down("transceiver", "0")  # ...and the supervisor says so

    sessions = {s["id"]: s for s in json.loads(await (await c.get("/v1/sessions")).get_data())["sessions"]}
    gone = sessions[lost.rsplit("/", 1)[1]]
    assert gone["state"] == "ended"
    assert gone["end_reason"] == "transceiver lost"
    assert gone["packets_in"] == 5  # the last stats seen survive
    assert sessions[kept.rsplit("/", 1)[1]]["state"] == "connected"
    detail = json.loads(await (await c.get(lost)).get_data())
    assert detail["end_reason"] == "transceiver lost"
    # New sessions go to the survivor only.
    for _ in range(2):
        loc = (await create(c)).headers["Location"]
        assert env.state.sessions[loc.rsplit("/", 1)[1]].transceiver == 1
    # Back up (restarted): it takes sessions again.
    env.state.process_up("transceiver", "0")
    assert env.state.pick_order()[0] == 0


async def test_standalone_signaling_notices_a_dead_transceiver(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    k = env.state.sessions[loc.rsplit("/", 1)[1]].transceiver
    env.cancel[k].cancel()
    for _ in range(3):  # LOST_AFTER failed polls
        await env.state.refresh()
    assert not env.state.transceivers[k].up
    detail = json.loads(await (await c.get(loc)).get_data())
    assert (detail["state"], detail["end_reason"]) == ("ended", "transceiver lost")


async def test_bad_content_type_is_415(make_env: Any) -> None:
    env = await make_env()
    r = await env.client().post("/v1/sessions", data=OFFER, headers={"Content-Type": "text/plain"})
    body = await problem(r, 415, "unsupported-media-type")
    assert "application/sdp" in body["detail"]
    assert r.headers["Accept-Post"] == "application/sdp"
    await problem(await env.client().post("/v1/sessions", data=OFFER), 415, "unsupported-media-type")


async def test_empty_body_is_400(make_env: Any) -> None:
    env = await make_env()
    await problem(await env.client().post("/v1/sessions", data=b"", headers=SDP), 400, "empty-body")
    await problem(await env.client().post("/v1/sessions", data=b"  \r\n", headers=SDP),
                  400, "empty-body")


async def test_oversized_body_is_413(make_env: Any) -> None:
    env = await make_env(max_body=1024)
    big = OFFER + "a=x-pad:" + "x" * 2000 + "\r\n"
    await problem(await env.client().post("/v1/sessions", data=big, headers=SDP), 413, "body-too-large")
    assert not any(f.requests for f in env.fakes.values())


async def test_not_utf8_is_400(make_env: Any) -> None:
    env = await make_env()
    r = await env.client().post("/v1/sessions", data=b"v=0\r\n\xff\xfe", headers=SDP)
    await problem(r, 400, "bad-encoding")


async def test_sdp_errors_pass_through_from_the_transceiver(make_env: Any) -> None:
    env = await make_env()
    r = await env.client().post("/v1/sessions", data="v=0\r\ns=-\r\n", headers=SDP)
    body = await problem(r, 422, "no-audio")
    assert body["detail"] == "the offer has no audio m-section"
    assert env.state.sessions == {}


async def test_no_transceiver_is_503(make_env: Any) -> None:
    env = await make_env(n=0)
    r = await create(env.client())
    await problem(r, 503, "no-transceiver")
    assert r.headers["Retry-After"] == "1"


async def test_draining_transceivers_are_skipped_then_503(make_env: Any) -> None:
    env = await make_env()
    env.fakes[0].create_error = {"ok": False, "status": 503, "code": "draining", "detail": "draining"}
    c = env.client()
    for _ in range(2):
        loc = (await create(c)).headers["Location"]
        assert env.state.sessions[loc.rsplit("/", 1)[1]].transceiver == 1
    env.fakes[1].create_error = {"ok": False, "status": 503, "code": "full", "detail": "full"}
    await problem(await create(c), 503, "full")


async def test_unreachable_transceiver_falls_over_to_the_next(make_env: Any) -> None:
    env = await make_env()
    env.cancel[0].cancel()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    assert env.state.sessions[loc.rsplit("/", 1)[1]].transceiver == 1
    env.cancel[1].cancel()
    await problem(await create(c), 503, "no-transceiver")


async def test_unknown_route_and_method_are_problems(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    await problem(await c.get("/v2/nothing"), 404, "not-found")
    r = await c.put("/v1/sessions", data=b"x")
    await problem(r, 405, "method-not-allowed")
    assert "POST" in r.headers["Allow"]


async def test_cors_preflight_for_browser_whip_clients(make_env: Any) -> None:
    env = await make_env()
    r = await env.client().options("/v1/sessions")
    assert r.status_code == 200
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert "If-Match" in r.headers["Access-Control-Allow-Headers"]
    created = await create(env.client())
    assert "Location" in created.headers["Access-Control-Expose-Headers"]


async def test_health_and_readiness(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    r = await c.get("/healthz")
    assert r.status_code == 200 and json.loads(await r.get_data()) == {"status": "ok"}
    r = await c.get("/readyz")
    assert r.status_code == 200
    body = json.loads(await r.get_data())
    headroom = body.pop("headroom")  # what admission decides on, per transceiver (issue 32)
    assert body == {"ready": True, "transceivers": ["0", "1"], "relays": ["0"]}
    assert sorted(headroom) == ["0", "1"]
    for view in headroom.values():
        assert view["room"] > 0 and 0 < view["headroom"] <= view["limit"]
        assert {"busy", "available", "call_cost", "degraded"} <= set(view)
    env_no_relay = await make_env(relays=0)
    r = await env_no_relay.client().get("/readyz")
    assert r.status_code == 503
    assert json.loads(await r.get_data())["ready"] is False


async def test_web_ui_is_served_and_404s_cleanly(make_env: Any, tmp_path: Any) -> None:
    env = await make_env()
    c = env.client()
    await problem(await c.get("/"), 404, "no-web-ui")
    webui = tmp_path / "webui"
    webui.mkdir()
    (webui / "index.html").write_text("<h1>dashboard</h1>")
    (webui / "demo.html").write_text("<h1>demo</h1>")
    (webui / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("no")
    r = await c.get("/")
    assert r.status_code == 200 and b"dashboard" in await r.get_data()
    assert r.headers["Content-Type"].startswith("text/html")
    assert b"demo" in await (await c.get("/demo")).get_data()
    assert (await c.get("/app.js")).status_code == 200
    await problem(await c.get("/missing.css"), 404, "not-found")
    assert (await c.get("/../secret.txt")).status_code == 404
    assert (await c.get("/%2e%2e/secret.txt")).status_code == 404


async def test_ended_sessions_are_listed_for_an_hour_then_forgotten(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    loc = (await create(c)).headers["Location"]
    await c.delete(loc)
    assert len(json.loads(await (await c.get("/v1/sessions")).get_data())["sessions"]) == 1
    env.clock.t += 3601
    env.fakes[0].sessions.clear()
    env.fakes[1].sessions.clear()
    assert json.loads(await (await c.get("/v1/sessions")).get_data())["sessions"] == []
    await problem(await c.get(loc), 404, "unknown-session")


async def test_malformed_session_ids_are_404_without_asking_anyone(make_env: Any) -> None:
    env = await make_env()
    c = env.client()
    await problem(await c.get("/v1/sessions/" + "x" * 200), 404, "unknown-session")
    await problem(await c.delete("/v1/sessions/a.b"), 404, "unknown-session")
    assert not any(f.requests for f in env.fakes.values())
