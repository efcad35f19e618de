"""Issue 9 item 5: hostile HTTP against signaling.

* the generated SDP corpus (tests/security/corpus.py, ~400 offers) against a real
  ``python -m appliance up`` (started once for the module) and against the signaling app
  with a fake transceiver that runs the real SDP parser: each is a 4xx problem+json naming
  the problem (or, for mutations that leave a valid offer, a 201), never a 5xx, each well
  under a second, and a valid call still works afterwards;
* slow clients over real sockets: a slowloris sending headers one byte per 100 ms, uploads
  that stall mid-body — cut off by hypercorn's keep-alive timeout and the app's body
  timeout while a concurrent valid offer is answered as fast as ever;
* oversized bodies: 413 at once, without the server reading them;
* unauthenticated, wrong-token and expired-token requests: 401 at once. 127.0.0.0/8 is all
  loopback to signaling (``is_loopback``), so no loopback bind turns auth on: these run
  against signaling served by real hypercorn in-process with ``auth_required=True``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from security.corpus import MARK, SDP, Case, build, valid_offer
from security.support import REPO, Up
from signaling.fakes import FakeClock, FakeRelay, FakeTransceiver

from appliance.client.call import open_call
from appliance.client.http import Response, request
from appliance.control import serve_control
from appliance.proto.sdp import SdpError, choose_plans, parse_offer_untrusted
from appliance.signaling import SignalingConfig, SignalingState, create_app
from appliance.signaling.server import serve_signaling
from appliance.signaling.state import is_loopback

pytestmark = pytest.mark.slow

PROBLEM = "application/problem+json"
KEEP_ALIVE = 5.0  # hypercorn's keep_alive_timeout: a request whose headers never end
#: Seconds within which every hostile request is answered (and a valid one beside an attack).
#: What it tells apart: an answer given at once (milliseconds, tens of them on a loaded box)
#: from one that waited for a server timeout (keep-alive 5 s, body 10 s) or for a body it
#: should never have read. Half the shortest timeout separates the two with the margin a
#: busy machine needs; 1 s did not always (issue 33: no wall-clock bound tighter than the
#: property under test).
DEADLINE = KEEP_ALIVE / 2
BODY_TIMEOUT = SignalingConfig().body_timeout
CORPUS = build()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    u = Up.start(tmp_path_factory.mktemp("hostile"))
    try:
        yield u
    finally:
        u.stop()
        artifacts = REPO / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        (artifacts / "security-hostile-up.log").write_text(u.text())
        log = u.text()
        # Our code never failed a request ("unhandled error" is app.py's 500 handler) and no
        # traceback runs through it. (hypercorn itself logs "Error in ASGI Framework" with a
        # BusyResourceError when a client hangs up while a response is being written: its
        # own race between send_eof and send_all, harmless to the client, who is gone.)
        assert "unhandled error" not in log, log[-4000:]
        assert "/appliance/" not in "".join(
            line for line in log.splitlines() if line.lstrip(" |").startswith("File ")), log[-4000:]


def headers_for(case: Case) -> dict[str, str]:
    return {} if case.content_type is None else {"Content-Type": case.content_type}


def check(case: Case, status: int, ctype: str, body: bytes, elapsed: float) -> str | None:
    """Why this answer is wrong for this case; None when it is right."""
    if elapsed > DEADLINE:
        return f"took {elapsed:.3f} s"
    if status == 201:
        if case.expect != "any":
            return "accepted"
        if MARK.encode() in body:
            return "the answer reflects the offer's injected content"
        return None
    if not 400 <= status < 500:
        return f"status {status}"
    if not ctype.startswith(PROBLEM):
        return f"content type {ctype!r}"
    try:
        problem = json.loads(body)
    except ValueError:
        return "body is not JSON"
    if problem.get("status") != status or not problem.get("code") or not problem.get("detail"):
        return f"incomplete problem {problem}"
    if case.status is not None and status != case.status:
        return f"status {status}, wanted {case.status} ({problem['code']})"
    if case.codes is not None and problem["code"] not in case.codes:
        return f"code {problem['code']!r}, wanted one of {sorted(case.codes)}"
    return None


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 300
    assert sum(c.expect == "reject" for c in CORPUS) >= 100
    assert len({c.name for c in CORPUS}) == len(CORPUS)


def test_127_slash_8_is_loopback() -> None:
    """Why the auth tests below turn auth on in the config instead of binding 127.0.0.2."""
    assert is_loopback("127.0.0.2")
    assert not SignalingConfig(http=("127.0.0.2", 80)).requires_auth()


# -- the corpus against `appliance up` ------------------------------------------------------


async def post_offer(base: str, body: bytes, headers: dict[str, str]) -> tuple[Response, float]:
    t0 = time.monotonic()
    resp = await request("POST", base + "/v1/sessions", body=body, headers=headers)
    return resp, time.monotonic() - t0


async def valid_roundtrip(base: str) -> float:
    resp, elapsed = await post_offer(base, valid_offer(), {"Content-Type": SDP})
    assert resp.status == 201, resp.body[:300]
    location = resp.header("location")
    assert location
    assert (await request("DELETE", base + location)).status == 200
    return elapsed


async def test_corpus_against_appliance_up(up: Up) -> None:
    failures: list[str] = []
    outcomes: dict[str, int] = {}
    worst = 0.0
    for i, case in enumerate(CORPUS):
        resp, elapsed = await post_offer(up.base, case.body, headers_for(case))
        worst = max(worst, elapsed)
        why = check(case, resp.status, resp.header("content-type") or "", resp.body, elapsed)
        if why:
            failures.append(f"{case.name}: {why}: {resp.body[:200]!r}")
        if resp.status == 201:
            location = resp.header("location")
            assert location
            await request("DELETE", up.base + location)
            outcomes["201"] = outcomes.get("201", 0) + 1
        else:
            key = f"{resp.status} {json.loads(resp.body).get('code') if resp.body else ''}"
            outcomes[key] = outcomes.get(key, 0) + 1
        if i % 50 == 49:
            await valid_roundtrip(up.base)  # still serving between hostile offers
    assert not failures, "\n".join(failures)
    assert not any(k.startswith("5") for k in outcomes), outcomes
    print(f"\n{len(CORPUS)} hostile offers, worst {worst * 1000:.1f} ms: {outcomes}")
    assert up.alive()
    # A real call, media included, after the whole corpus.
    async with open_call(up.base, connect_timeout=10) as call:
        with trio.fail_after(5):
            ts = 0
            while True:
                call.send_rtp(b"\xf8\xff\xfe", ts)  # an Opus DTX frame; the echo answers it
                ts += 960
                if call.receive_nowait() is not None:
                    break
                await trio.sleep(0.02)


# -- the corpus against the app, with the real SDP parser behind a fake transceiver ------------


class ParsingTransceiver(FakeTransceiver):
    """A fake transceiver that refuses offers as the real one does (same parser)."""

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["op"] == "create":
            try:
                choose_plans(parse_offer_untrusted(req["offer"]))
            except SdpError as exc:
                return {"ok": False, "status": exc.status, "code": exc.code, "detail": exc.detail}
        return await super().handle(req)


@dataclass
class Served:
    base: str
    state: SignalingState
    fake: ParsingTransceiver
    clock: FakeClock


async def _signaling(nursery: trio.Nursery, tmp: Path, **overrides: Any) -> Served:
    fake = ParsingTransceiver(0)
    t_addr = await nursery.start(serve_control, str(tmp / "t0.sock"), fake.handle)
    r_addr = await nursery.start(serve_control, str(tmp / "r0.sock"), FakeRelay().handle)
    cfg = SignalingConfig(http=("127.0.0.1", 0), transceivers={0: t_addr}, relays={"0": r_addr},
                          public_addresses=["127.0.0.1"], webui_dir=None, events_interval=0.05)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    clock = FakeClock(time.time())
    state = SignalingState(cfg, clock=clock)
    binds: list[str] = await nursery.start(partial(serve_signaling, cfg, state=state))
    return Served(binds[0], state, fake, clock)


async def test_corpus_against_app_with_fake_transceiver(make_app: Any) -> None:
    app = make_app
    client = app.test_client()
    failures = []
    for case in CORPUS:
        t0 = time.monotonic()
        resp = await client.post("/v1/sessions", data=case.body, headers=headers_for(case))
        body = await resp.get_data()
        why = check(case, resp.status_code, resp.headers.get("Content-Type", ""), body,
                    time.monotonic() - t0)
        if why:
            failures.append(f"{case.name}: {why}: {body[:200]!r}")
    assert not failures, "\n".join(failures)
    resp = await client.post("/v1/sessions", data=valid_offer(), headers={"Content-Type": SDP})
    assert resp.status_code == 201


@pytest.fixture
async def make_app(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Any]:
    fake = ParsingTransceiver(0)
    t_addr = await nursery.start(serve_control, str(tmp_path / "t0.sock"), fake.handle)
    r_addr = await nursery.start(serve_control, str(tmp_path / "r0.sock"), FakeRelay().handle)
    # The fake never reports load, so admission would count every served corpus offer as
    # a placed call and refuse past its cold-start estimate (~67 calls): this test is about
    # parsing hostile input, not capacity (tests/signaling/test_admission.py is): the
    # cheapest plausible prior cost admits ~5,000.
    state = SignalingState(SignalingConfig(transceivers={0: t_addr}, relays={"0": r_addr},
                                           webui_dir=None, admission_limit=1.0,
                                           admission_call_cost=0.0002))
    yield create_app(state)
    await state.aclose()


# -- slow clients ---------------------------------------------------------------------------------


async def probe_latency(base: str, stop: trio.Event, out: list[float]) -> None:
    """A valid offer (then DELETE) every 200 ms until ``stop``: the latency of each."""
    while not stop.is_set():
        out.append(await valid_roundtrip(base))
        with trio.move_on_after(0.2):
            await stop.wait()


async def slowloris(base: str, results: list[float]) -> None:
    """Headers one byte per 100 ms, never finished; when the server hangs up (seconds)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    head = (b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n"
            b"X-Slow: " + b"s" * 4000)
    t0 = time.monotonic()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        for byte in head:
            try:
                await stream.send_all(bytes([byte]))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            with trio.move_on_after(0.1):
                try:
                    if await stream.receive_some(4096) == b"":
                        break
                except trio.BrokenResourceError:
                    break
    results.append(time.monotonic() - t0)


async def test_slowloris_headers_are_cut_off_without_blocking_others(up: Up) -> None:
    closed: list[float] = []
    latencies: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_latency, up.base, stop, latencies)
        with trio.fail_after(KEEP_ALIVE + 10):
            async with trio.open_nursery() as lorises:
                for _ in range(30):
                    lorises.start_soon(slowloris, up.base, closed)
        stop.set()
    assert len(closed) == 30
    # The server hung up on every one at its keep-alive timeout (~5 s), not after 400 s
    # of headers.
    assert max(closed) < KEEP_ALIVE + 3, closed
    assert len(latencies) >= 10
    assert max(latencies) < DEADLINE, latencies
    print(f"\nslowloris x30 cut after {min(closed):.1f}-{max(closed):.1f} s; concurrent "
          f"valid offers {len(latencies)}, max {max(latencies) * 1000:.0f} ms")


async def stalled_upload(base: str, results: list[tuple[float, bytes]]) -> None:
    """Headers promise 4000 bytes; 100 arrive; then nothing. What comes back, and when."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    body = valid_offer()[:100]
    t0 = time.monotonic()
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                              b"application/sdp\r\nContent-Length: 4000\r\n\r\n" + body)
        got = b""
        while b"\r\n\r\n" not in got:
            try:
                chunk = await stream.receive_some(4096)
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            got += chunk
    results.append((time.monotonic() - t0, got))


async def test_stalled_uploads_get_408_without_blocking_others(up: Up) -> None:
    results: list[tuple[float, bytes]] = []
    latencies: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe_latency, up.base, stop, latencies)
        with trio.fail_after(BODY_TIMEOUT + 10):
            async with trio.open_nursery() as stalls:
                for _ in range(20):
                    stalls.start_soon(stalled_upload, up.base, results)
        stop.set()
    assert len(results) == 20
    for elapsed, got in results:
        assert got.startswith(b"HTTP/1.1 408"), got[:200]
        assert PROBLEM.encode() in got
        assert BODY_TIMEOUT - 0.5 < elapsed < BODY_TIMEOUT + 3, elapsed
    assert max(latencies) < DEADLINE, latencies
    print(f"\nstalled uploads x20: 408 after {min(r[0] for r in results):.1f}-"
          f"{max(r[0] for r in results):.1f} s; concurrent valid offers {len(latencies)}, "
          f"max {max(latencies) * 1000:.0f} ms")


async def test_body_timeout_is_the_configured_one(nursery: trio.Nursery, tmp_path: Path) -> None:
    """Regression: a stalled body held its connection for Quart's default 60 s."""
    served = await _signaling(nursery, tmp_path, body_timeout=0.5)
    results: list[tuple[float, bytes]] = []
    with trio.fail_after(5):
        await stalled_upload(served.base, results)
    elapsed, got = results[0]
    # Far under Quart's 60 s: the configured 0.5 s plus at most DEADLINE of answering.
    assert got.startswith(b"HTTP/1.1 408") and elapsed < 0.5 + DEADLINE, (elapsed, got[:200])


# -- oversized bodies ------------------------------------------------------------------------------


async def send_big(base: str, head: bytes, chunks: Iterator[bytes]) -> tuple[float, bytes, int]:
    """Send ``head`` then ``chunks`` until the server answers; (seconds, answer, bytes sent)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    t0 = time.monotonic()
    stream = await trio.open_tcp_stream(host, int(port))
    sent = 0
    got = b""
    async with stream:
        await stream.send_all(head)

        async def reader() -> None:
            nonlocal got
            while b"\r\n\r\n" not in got:
                try:
                    chunk = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    break
                if not chunk:
                    break
                got += chunk
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            for chunk in chunks:
                try:
                    await stream.send_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                sent += len(chunk)
                await trio.sleep(0.01)
            await trio.sleep_forever()
    return time.monotonic() - t0, got, sent


def _mb(n: int) -> Iterator[bytes]:
    for _ in range(n * 16):
        yield b"a" * 65536


@pytest.mark.parametrize(("path", "ctype"), [
    ("/v1/sessions", "application/sdp"),
    ("/v1/sessions", "text/plain"),
    ("/v1/client_tokens", "application/json"),
])
async def test_oversized_bodies_get_413_quickly(up: Up, path: str, ctype: str) -> None:
    declared = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
                + ctype.encode() + b"\r\nContent-Length: 104857600\r\n\r\n")
    chunked = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
               + ctype.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    with trio.fail_after(10):
        elapsed, got, sent = await send_big(up.base, declared, _mb(100))
    status = int(got.split(b" ", 2)[1])
    assert status in (413, 415), got[:300]  # a wrong type may be refused before the size
    assert elapsed < DEADLINE and sent < 10 << 20, (elapsed, sent)
    with trio.fail_after(10):
        elapsed, got, sent = await send_big(
            up.base, chunked, (b"10000\r\n" + c + b"\r\n" for c in _mb(100)))
    status = int(got.split(b" ", 2)[1])
    assert status in (413, 415), got[:300]
    assert elapsed < DEADLINE and sent < 10 << 20, (elapsed, sent)


async def test_oversized_headers_are_refused(up: Up) -> None:
    host, port = up.base.removeprefix("http://").rsplit(":", 1)
    for head in [b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"h" * 200_000 + b"\r\n\r\n",
                 b"GET /" + b"p" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"POST /v1/sessions HTTP/1.1\r\n" + b"X-H: v\r\n" * 20_000 + b"\r\n"]:
        t0 = time.monotonic()
        stream = await trio.open_tcp_stream(host, int(port))
        got = b""
        with trio.fail_after(5):
            async with stream:
                try:
                    await stream.send_all(head)
                    while chunk := await stream.receive_some(4096):
                        got += chunk
                except trio.BrokenResourceError:
                    pass
        # hypercorn answers 400 (or just hangs up) once the head passes 16 KiB.
        assert got == b"" or got.startswith((b"HTTP/1.1 4", b"HTTP/1.0 4")), got[:200]
        assert time.monotonic() - t0 < DEADLINE
    await valid_roundtrip(up.base)


# -- auth: 401 at once ---------------------------------------------------------------------------

API_TOKEN = "security-test-api-token-0123456789"


async def test_unauthenticated_and_expired_get_401_quickly(nursery: trio.Nursery,
                                                           tmp_path: Path) -> None:
    served = await _signaling(nursery, tmp_path, auth_required=True, api_token=API_TOKEN)
    base = served.base
    sdp = {"Content-Type": SDP}

    async def expect(method: str, path: str, headers: dict[str, str], status: int, code: str,
                     body: bytes = b"") -> None:
        t0 = time.monotonic()
        resp = await request(method, base + path, body=body, headers=headers)
        elapsed = time.monotonic() - t0
        assert resp.status == status, (method, path, headers, resp.body[:200])
        assert json.loads(resp.body)["code"] == code, resp.body[:200]
        assert (resp.header("content-type") or "").startswith(PROBLEM)
        assert elapsed < DEADLINE
        if status == 401:
            assert (resp.header("www-authenticate") or "").startswith("Bearer")

    ok = await request("POST", base + "/v1/client_tokens", body=b'{"ttl": 5}',
                       headers={"Authorization": f"Bearer {API_TOKEN}",
                                "Content-Type": "application/json"})
    assert ok.status == 201
    token = json.loads(ok.body)["token"]
    offer = valid_offer()
    resp = await request("POST", base + "/v1/sessions", body=offer,
                         headers={**sdp, "Authorization": f"Bearer {token}"})
    assert resp.status == 201
    location = resp.header("location") or ""
    creates = sum(r["op"] == "create" for r in served.fake.requests)

    for path, method in [("/v1/sessions", "POST"), ("/v1/sessions", "GET"),
                         ("/v1/client_tokens", "POST"), ("/metrics", "GET"),
                         ("/v1/events", "GET"), ("/v1/sessions/abc", "PATCH"),
                         ("/v1/sessions/abc", "DELETE")]:
        for hdrs in [{}, {"Authorization": "Bearer"}, {"Authorization": "Bearer "},
                     {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Token x"}]:
            await expect(method, path, {**sdp, **hdrs}, 401, "missing-token", offer)
        for bad in ["wrong", API_TOKEN[:-1], API_TOKEN + "x", "x" * 8000, "ct1.", "ct1.a.b",
                    token[:-2] + ("AA" if not token.endswith("AA") else "BB"),
                    "ct1." + "A" * 3000 + ".AAAA", "\u00e9t\u00e9".encode().decode("latin-1")]:
            code = "bad-token" if not bad.startswith("ct1.") else None
            t0 = time.monotonic()
            resp = await request(method, base + path, body=offer,
                                 headers={**sdp, "Authorization": f"Bearer {bad}"})
            assert resp.status == 401, (path, bad[:40], resp.body[:200])
            got = json.loads(resp.body)["code"]
            assert got == code if code else got.startswith("token-"), (bad[:40], got)
            assert time.monotonic() - t0 < DEADLINE
    # Oversized and hostile bodies without a token: 401 before the body is read.
    with trio.fail_after(10):
        elapsed, got, sent = await send_big(
            base, b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n"
                  b"Content-Length: 104857600\r\n\r\n", _mb(100))
    assert got.startswith(b"HTTP/1.1 401") and elapsed < DEADLINE and sent < 10 << 20
    for case in CORPUS[::10]:
        await expect("POST", "/v1/sessions", headers_for(case), 401, "missing-token", case.body)

    # The client token expires: 401 token-expired, and its session cannot be touched.
    served.clock.t += 6
    await expect("POST", "/v1/sessions", {**sdp, "Authorization": f"Bearer {token}"}, 401,
                 "token-expired", offer)
    await expect("DELETE", location, {"Authorization": f"Bearer {token}"}, 401, "token-expired")
    await expect("PATCH", location, {"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/trickle-ice-sdpfrag"},
                 401, "token-expired", b"a=ice-ufrag:abcd\r\na=ice-pwd:" + b"p" * 22 + b"\r\n")
    # None of it reached a transceiver.
    assert sum(r["op"] == "create" for r in served.fake.requests) == creates
    assert not any(r["op"] in ("patch", "delete") for r in served.fake.requests)
