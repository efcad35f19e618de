"""The WHIP fast path (appliance/signaling/fastpath.py) answers exactly as the Quart routes.

Each case is sent as raw ASGI twice, on two fresh environments: once to the installed app
(fast path in front) and once to the Quart app behind it, and the two answers must be the
same status, the same header list in the same order and the same body (session ids and
entity-tags, random on each side, are replaced by placeholders before comparing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from signaling.fakes import OFFER

from appliance.signaling.fastpath import WhipFastPath
from appliance.signaling.ice_servers import TurnAdvert
from appliance.signaling.proxied import RealClients, TrustEdge

Answer = tuple[int, list[tuple[str, str]], str]


async def call(asgi: Callable[..., Awaitable[None]], method: str, path: str, *,
               headers: list[tuple[str, str]] | None = None, body: list[bytes] | None = None,
               query: str = "", stall: bool = False) -> Answer | None:
    """One request through ``asgi``; ``body`` is the chunks it arrives in, ``stall`` keeps
    the body from ever completing. None when nothing was answered."""
    chunks = list(body if body is not None else [b""])
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or [])],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "extensions": {},
    }
    # Through the trust edge, as hypercorn's requests are (proxied.py): the loopback
    # client is local, so a loopback bind asks it for no token.
    asgi = TrustEdge(asgi, RealClients())
    sent: list[dict[str, Any]] = []
    done = trio.Event()

    async def receive() -> dict[str, Any]:
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks) or stall}
        if stall:
            await trio.sleep_forever()
        await done.wait()  # as hypercorn: nothing more until the client goes away
        return {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    await asgi(scope, receive, send)
    done.set()
    if not sent:
        return None
    start = sent[0]
    assert start["type"] == "http.response.start"
    out = b"".join(m.get("body", b"") for m in sent[1:] if m["type"] == "http.response.body")
    hdrs = [(k.decode(), v.decode()) for k, v in start["headers"]]
    return start["status"], hdrs, out.decode()


def normalise(ans: Answer | None, sids: list[str]) -> Any:
    if ans is None:
        return None
    status, headers, body = ans
    out = []
    for k, v in headers:
        if k == "location":
            v = re.sub(r"/v1/sessions/[\w-]+$", "/v1/sessions/<id>", v)
        elif k == "etag":
            v = "<etag>"
        elif k == "link":  # a credential minted per session, random id: its shape stays
            v = re.sub(r'username="[^"]*"; credential="[^"]*"',
                       'username="<u>"; credential="<c>"', v)
        out.append((k, v))
    for sid in sids:
        body = body.replace(sid, "<id>")
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body
    return status, out, parsed


SDP = ("Content-Type", "application/sdp")
BIG = OFFER + "a=x\r\n" * 20000

# (name, config overrides, request kwargs); "{sid}" in a path is a session created first.
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("create", {}, {"method": "POST", "path": "/v1/sessions",
                    "headers": [SDP], "body": [OFFER.encode()]}),
    ("create with TURN: one Link per server", {"turn": TurnAdvert(
        b"turn-secret", ("turn:198.51.100.1:3478?transport=udp",
                         "turns:198.51.100.1:443?transport=tcp"))},
     {"method": "POST", "path": "/v1/sessions", "headers": [SDP], "body": [OFFER.encode()]}),
    ("create in chunks, agent in query", {}, {
        "method": "POST", "path": "/v1/sessions", "query": "agent=ws%3A%2F%2Fa.example%2Fx&x=1",
        "headers": [SDP], "body": [OFFER[:50].encode(), OFFER[50:].encode()]}),
    ("agent header", {}, {"method": "POST", "path": "/v1/sessions",
                          "headers": [SDP, ("X-Agent", "examples.tone:Agent")],
                          "body": [OFFER.encode()]}),
    ("bad agent", {}, {"method": "POST", "path": "/v1/sessions",
                       "headers": [SDP, ("X-Agent", "bad agent")], "body": [OFFER.encode()]}),
    ("content type with parameters", {}, {
        "method": "POST", "path": "/v1/sessions",
        "headers": [("Content-Type", "Application/SDP; charset=utf-8")],
        "body": [OFFER.encode()]}),
    ("wrong content type", {}, {"method": "POST", "path": "/v1/sessions",
                                "headers": [("Content-Type", "text/plain")],
                                "body": [OFFER.encode()]}),
    ("no content type", {}, {"method": "POST", "path": "/v1/sessions",
                             "body": [OFFER.encode()]}),
    ("empty body", {}, {"method": "POST", "path": "/v1/sessions", "headers": [SDP],
                        "body": [b"  \r\n"]}),
    ("not utf-8", {}, {"method": "POST", "path": "/v1/sessions", "headers": [SDP],
                       "body": [b"v=0\r\n\xff\xfe"]}),
    ("content-length too big", {}, {
        "method": "POST", "path": "/v1/sessions",
        "headers": [SDP, ("Content-Length", "999999")], "body": [OFFER.encode()]}),
    ("streamed body too big", {}, {"method": "POST", "path": "/v1/sessions",
                                   "headers": [SDP], "body": [BIG[:40000].encode(),
                                                              BIG[40000:].encode()]}),
    ("no audio (transceiver 422)", {}, {
        "method": "POST", "path": "/v1/sessions", "headers": [SDP],
        "body": [OFFER.replace("m=audio", "m=video").encode()]}),
    ("body stalls", {"body_timeout": 0.05}, {
        "method": "POST", "path": "/v1/sessions", "headers": [SDP],
        "body": [OFFER[:10].encode()], "stall": True}),
    ("delete", {}, {"method": "DELETE", "path": "/v1/sessions/{sid}"}),
    ("delete unknown", {}, {"method": "DELETE", "path": "/v1/sessions/nope"}),
    ("delete bad id", {}, {"method": "DELETE", "path": "/v1/sessions/no$such"}),
    ("auth: no token", {"http": ("0.0.0.0", 8443), "api_token": "tok"}, {
        "method": "POST", "path": "/v1/sessions", "headers": [SDP], "body": [OFFER.encode()]}),
    ("auth: bad token", {"http": ("0.0.0.0", 8443), "api_token": "tok"}, {
        "method": "POST", "path": "/v1/sessions",
        "headers": [SDP, ("Authorization", "Bearer nope")], "body": [OFFER.encode()]}),
    ("auth: bad client token", {"http": ("0.0.0.0", 8443), "api_token": "tok"}, {
        "method": "POST", "path": "/v1/sessions",
        "headers": [SDP, ("Authorization", "Bearer ct1.abc.def")], "body": [OFFER.encode()]}),
    ("auth: api token", {"http": ("0.0.0.0", 8443), "api_token": "tok"}, {
        "method": "POST", "path": "/v1/sessions",
        "headers": [SDP, ("authorization", "bearer tok")], "body": [OFFER.encode()]}),
    ("auth: delete without token", {"http": ("0.0.0.0", 8443), "api_token": "tok"}, {
        "method": "DELETE", "path": "/v1/sessions/{sid}"}),
]


class _Counting:
    """Stands in for the Quart app behind the fast path, counting what reaches it."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app
        self.calls = 0

    async def __call__(self, *args: Any) -> None:
        self.calls += 1
        await self.app(*args)


@pytest.mark.parametrize(("name", "config", "req"), CASES, ids=[c[0] for c in CASES])
async def test_fast_path_answers_as_quart_does(make_env: Any, name: str,
                                               config: dict[str, Any],
                                               req: dict[str, Any]) -> None:
    answers = []
    sids: list[str] = []
    for fast in (True, False):
        env = await make_env(**config)
        edge = env.app.asgi_app
        assert isinstance(edge, TrustEdge)  # outermost (proxied.py), the fast path inside
        installed = edge.app
        assert isinstance(installed, WhipFastPath)
        inner = installed.app
        counting = _Counting(inner)
        installed.app = counting
        asgi = installed if fast else inner
        kwargs = dict(req)
        if "{sid}" in kwargs["path"]:
            auth = [("Authorization", "Bearer tok")] if config.get("api_token") else []
            made = await call(inner, "POST", "/v1/sessions",
                              headers=[SDP, *auth], body=[OFFER.encode()])
            assert made is not None and made[0] == 201
            sid = dict(made[1])["location"].rsplit("/", 1)[1]
            sids.append(sid)
            kwargs["path"] = kwargs["path"].replace("{sid}", sid)
        before = dict(env.state.http_responses)
        ans = await call(asgi, **kwargs)
        counted = {k: v - before.get(k, 0) for k, v in env.state.http_responses.items()
                   if v != before.get(k, 0)}
        if ans is not None:
            assert counted == {ans[0]: 1}  # /metrics counts the answer once, either way
        if fast:
            assert counting.calls == 0, "the fast path handed this request to Quart"
        answers.append(normalise(ans, sids))
    assert answers[0] == answers[1]
    assert answers[0] is not None


async def test_other_requests_go_to_quart(make_env: Any) -> None:
    env = await make_env()
    installed = env.app.asgi_app.app
    seen: list[tuple[str, str]] = []
    inner = installed.app

    async def spy(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["method"], scope["path"]))
        await inner(scope, receive, send)

    installed.app = spy
    for method, path in [("GET", "/v1/sessions"), ("OPTIONS", "/v1/sessions"),
                         ("PATCH", "/v1/sessions/x"), ("DELETE", "/v1/sessions/"),
                         ("DELETE", "/v1/sessions/a/b"), ("POST", "/v1/sessions/"),
                         ("GET", "/healthz")]:
        await call(installed, method, path)
    assert len(seen) == 7


async def test_a_bug_is_a_logged_500(make_env: Any, caplog: pytest.LogCaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    answers = []
    for fast in (True, False):
        env = await make_env()

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("bug")

        monkeypatch.setattr(env.state, "create_session", broken)
        asgi = env.app.asgi_app if fast else env.app.asgi_app.app
        caplog.clear()
        answers.append(await call(asgi, "POST", "/v1/sessions", headers=[SDP],
                                  body=[OFFER.encode()]))
        assert any("unhandled error in POST /v1/sessions" in r.getMessage()
                   for r in caplog.records)
    assert answers[0] == answers[1]
    assert answers[0] is not None and answers[0][0] == 500


async def test_a_client_gone_while_the_answer_is_written_is_not_an_error(
        make_env: Any) -> None:
    """Regression: hypercorn closes the stream from another task when the client hangs up
    mid-answer, and the ASGI send raises BusyResourceError; the fast path must not turn
    that into a traceback through our code (tests/security checks the logs for those)."""
    env = await make_env()
    scope = {"type": "http", "method": "DELETE", "path": "/v1/sessions/nope",
             "query_string": b"", "root_path": "", "headers": []}
    attempts: list[str] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        attempts.append(msg["type"])
        raise trio.BusyResourceError("another task is currently sending data")

    await env.app.asgi_app(scope, receive, send)
    assert attempts == ["http.response.start"]
