"""Webhooks (appliance/signaling/webhooks.py) checked by the official ``openai`` SDK's
``client.webhooks.unwrap``, delivered to a local receiver that fails before it succeeds;
and ``client.realtime.calls`` (create with the API token, hangup) against fake transceivers,
with the call's started/ended events."""

from __future__ import annotations

import base64
import json
import math
from functools import partial
from typing import Any

import h11
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from sdk_clients import sdk
from signaling.fakes import OFFER

from appliance.signaling import serve_signaling
from appliance.signaling.webhooks import (
    CALL_ENDED,
    CALL_STARTED,
    LIVE_TRANSPORT_CONNECTED,
    Endpoint,
    WebhookConfigError,
    WebhookQueue,
    Webhooks,
    event,
    parse_endpoint,
    post,
    request_bytes,
    response_status_untrusted,
    secret_key,
    signed_headers,
)

openai = pytest.importorskip("openai")

#: A turn's waterfall as a session object carries it (appliance/session_info.py).
TURN = {"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0, "transcript_ms": 2.1,
        "stt_ms": 2.0, "first_token_ms": -60.3, "first_audio_ms": 31.0, "first_sent_ms": 31.2}
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
TIMEOUT = 30


def unwrap(body: bytes, headers: dict[str, str]) -> Any:
    client = openai.OpenAI(api_key="unused", webhook_secret=SECRET)
    return client.webhooks.unwrap(body, headers)


def test_the_openai_sdk_verifies_our_signature_and_rejects_a_tampered_body() -> None:
    obj = event("realtime.call.incoming", {"call_id": "rtc_x", "sip_headers": []}, now=1e9)
    body = json.dumps(obj).encode()
    import time

    headers = signed_headers(secret_key(SECRET), obj["id"], math.floor(time.time()), body)
    got = unwrap(body, headers)
    assert got.type == "realtime.call.incoming" and got.data.call_id == "rtc_x"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(body.replace(b"rtc_x", b"rtc_y"), headers)
    other = signed_headers(b"another key, 32 bytes long......", obj["id"],
                           math.floor(time.time()), body)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(body, other)


def test_endpoint_secrets(tmp_path: Any) -> None:
    (tmp_path / "s").write_text(SECRET + "\n")
    ep = parse_endpoint(f"http://127.0.0.1:9/hook?t=1,secret-file={tmp_path / 's'}")
    assert ep.key == secret_key(SECRET) and ep.safe_url == "http://127.0.0.1:9/hook"
    assert SECRET[6:] not in repr(ep) and "key" not in repr(ep)
    assert parse_endpoint("https://h/x", env={"APPLIANCE_WEBHOOK_SECRET": SECRET}).key
    assert parse_endpoint("https://h/x,secret-env=S", env={"S": SECRET}).key
    for bad in ("ftp://h/x,secret-env=S", "https://h/x,secret-env=NOPE",
                "https://h/x,secret=whsec_x", f"https://h/x,secret-file={tmp_path / 'none'}"):
        with pytest.raises(WebhookConfigError) as info:
            parse_endpoint(bad, env={"S": SECRET})
        assert SECRET[6:] not in str(info.value)
    for bad_secret in ("nope", "whsec_!!!", "whsec_" + base64.b64encode(b"short").decode()):
        with pytest.raises(WebhookConfigError):
            secret_key(bad_secret)


def _client() -> h11.Connection:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=4096)
    request_bytes(conn, "http://h/x", {}, b"{}")
    return conn


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=64))
def test_response_parser_raises_only_value_error(data: bytes, cut: int) -> None:
    """Any answer, whole or in pieces, then the server closes: a status or ValueError."""
    conn = _client()
    try:
        status = None
        for i in range(0, len(data), cut):
            status = response_status_untrusted(conn, data[i : i + cut])
            if status is not None:
                break
        else:
            status = response_status_untrusted(conn, b"")
    except ValueError:
        return
    assert status is not None and 200 <= status <= 999


def test_response_status_skips_1xx_and_reads_only_the_head() -> None:
    conn = _client()
    assert response_status_untrusted(conn, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 20") is None
    assert response_status_untrusted(conn, b"4 No Content\r\nX: y\r\n\r\n") == 204
    conn = _client()
    with pytest.raises(ValueError, match="bad HTTP response"):
        response_status_untrusted(conn, b"HTTP/1.1 200 OK\r\nX: " + b"a" * 5000)
    with pytest.raises(ValueError, match="bad HTTP response"):
        response_status_untrusted(_client(), b"")  # closed before any answer


async def test_post_writes_one_request_and_follows_no_redirect(nursery: trio.Nursery) -> None:
    """What a receiver gets (the head our old hand-written client wrote: Host with the port,
    the query kept, Connection: close, our headers as given), and a 302 is an answer, not
    an address to follow."""
    seen: list[bytes] = []

    async def handle(stream: trio.SocketStream) -> None:
        buf = b""
        while not buf.endswith(b"{}"):
            buf += await stream.receive_some(65536)
        seen.append(buf)
        await stream.send_all(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/x\r\n"
                              b"Content-Length: 0\r\n\r\n")
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(TIMEOUT):
        status = await post(f"http://127.0.0.1:{port}/hook?t=1", {"webhook-id": "evt_1"}, b"{}")
    assert status == 302 and len(seen) == 1
    head, _, body = seen[0].partition(b"\r\n\r\n")
    assert body == b"{}"
    assert head.split(b"\r\n") == [
        b"POST /hook?t=1 HTTP/1.1", f"Host: 127.0.0.1:{port}".encode(),
        b"Content-Type: application/json", b"Content-Length: 2",
        b"User-Agent: appliance-webhooks", b"Connection: close", b"webhook-id: evt_1"]


def test_queue_is_bounded() -> None:
    q = WebhookQueue([Endpoint("http://a/", b"k" * 16)], limit=2)
    assert q.handle_event(0.0, {"id": "evt_1"}) and q.handle_event(0.0, {"id": "evt_2"})
    assert not q.handle_event(0.0, {"id": "evt_3"}) and q.dropped == 1  # full: dropped
    assert len(q) == 2


def test_queue_retries_with_exponential_backoff() -> None:
    q = WebhookQueue([Endpoint("http://a/", b"k" * 16)], backoff=1.0, backoff_max=4.0,
                     max_attempts=5)
    q.handle_event(0.0, {"id": "evt_1"})
    d = q.poll_delivery(0.0)
    assert d is not None and q.poll_delivery(0.0) is None  # one in flight per endpoint
    now, dues = 0.0, []
    for attempt in range(2, 6):
        q.handle_result(now, d, ok=False)
        due = q.poll_timeout()
        assert due is not None
        dues.append(due - now)
        assert q.poll_delivery(due - 0.001) is None
        now = due
        d = q.poll_delivery(now)
        assert d is not None and d.msg_id == "evt_1" and d.attempts == attempt
    assert dues == [1.0, 2.0, 4.0, 4.0]  # doubling, capped
    q.handle_result(now, d, ok=False)  # the 5th attempt failed: given up
    assert q.failed == 1 and len(q) == 0 and q.poll_timeout() is None


def test_a_retry_does_not_hold_up_the_next_event() -> None:
    q = WebhookQueue([Endpoint("http://a/", b"k" * 16)], backoff=10.0)
    q.handle_event(0.0, {"id": "evt_1"})
    q.handle_event(0.0, {"id": "evt_2"})
    d = q.poll_delivery(0.0)
    assert d is not None and d.msg_id == "evt_1"
    q.handle_result(0.0, d, ok=False)
    d = q.poll_delivery(0.0)
    assert d is not None and d.msg_id == "evt_2"


class Receiver:
    """An HTTP endpoint on loopback answering 500 to the first ``fail`` requests, then 204."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.changed = trio.Event()

    async def serve(self, nursery: trio.Nursery) -> int:
        listeners = await nursery.start(partial(trio.serve_tcp, self.handle, 0,
                                                host="127.0.0.1"))
        return int(listeners[0].socket.getsockname()[1])

    async def handle(self, stream: trio.SocketStream) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += await stream.receive_some(65536)
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        while len(body) < int(headers["content-length"]):
            body += await stream.receive_some(65536)
        self.requests.append((headers, body))
        status = b"500 Internal Server Error" if len(self.requests) <= self.fail else \
            b"204 No Content"
        await stream.send_all(b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n")
        await stream.aclose()
        self.changed.set()
        self.changed = trio.Event()

    async def wait_for(self, n: int) -> None:
        while len(self.requests) < n:
            await self.changed.wait()


async def test_delivery_retries_with_the_same_webhook_id(nursery: trio.Nursery) -> None:
    rx = Receiver(fail=2)
    port = await rx.serve(nursery)
    import time

    hooks = Webhooks([Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))],
                     clock=time.time, backoff=0.05)
    nursery.start_soon(hooks.run)
    hooks.emit(CALL_STARTED, {"call_id": "rtc_1", "transport": "webrtc"})
    with trio.fail_after(TIMEOUT):
        await rx.wait_for(3)
        # One attempt in flight per endpoint: a 4th request means the 3rd was accounted.
        hooks.emit(CALL_ENDED, {"call_id": "rtc_1", "transport": "webrtc"})
        await rx.wait_for(4)
    later = rx.requests.pop()
    assert json.loads(later[1])["type"] == CALL_ENDED
    ids = {h["webhook-id"] for h, _ in rx.requests}
    assert len(ids) == 1 and next(iter(ids)).startswith("evt_")
    assert len({b for _, b in rx.requests}) == 1  # the same body each time
    headers, body = rx.requests[-1]
    got = await trio.to_thread.run_sync(unwrap, body, headers)
    assert got.type == CALL_STARTED  # our own type: the SDK keeps it, unvalidated
    assert json.loads(body)["data"]["call_id"] == "rtc_1"
    assert hooks.queue.delivered >= 1 and hooks.queue.failed == 0


# -- the SDK's realtime.calls against fake transceivers, with webhooks ----------------------


def sdk_calls(url: str, token: str) -> dict[str, Any]:
    import urllib.request

    client = sdk(url + "/v1", api_key=token)
    raw = client.realtime.calls.with_raw_response.create(sdp=OFFER)
    call_id = raw.headers["location"].rsplit("/", 1)[1]

    def get() -> dict[str, Any]:
        req = urllib.request.Request(f"{url}/v1/realtime/calls/{call_id}",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    before = get()
    client.realtime.calls.hangup(call_id)
    after = get()
    return {"call_id": call_id, "sdp": raw.content.decode(), "before": before, "after": after}


async def test_sdk_calls_create_and_hangup_with_webhooks(make_env: Any,
                                                         nursery: trio.Nursery) -> None:
    rx = Receiver(fail=0)
    port = await rx.serve(nursery)
    ep = Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))
    env = await make_env(api_token="the-api-token", auth_required=True, webhooks=[ep])
    import time

    env.clock.t = time.time()  # the SDK checks the webhook timestamp against its own clock
    env.state.config.http = ("127.0.0.1", 0)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    with trio.fail_after(TIMEOUT):
        out = await trio.to_thread.run_sync(sdk_calls, binds[0], "the-api-token")
        await rx.wait_for(2)
    assert out["call_id"].startswith("rtc_") and out["sdp"].startswith("v=0")
    assert out["before"]["status"] == "connected"
    assert out["after"]["status"] == "ended"
    assert out["after"]["media"]["end_reason"] == "hangup"
    events = [json.loads(b) for _, b in rx.requests]
    assert [e["type"] for e in events] == [CALL_STARTED, CALL_ENDED]
    assert {e["data"]["call_id"] for e in events} == {out["call_id"]}
    report = events[1]["data"]["report"]
    assert report["end_reason"] == "hangup" and report["hung_up_by"] == "api"
    assert report["duration_seconds"] >= 0 and "packets_in" in report["stats"]
    for headers, body in rx.requests:  # each verifies
        await trio.to_thread.run_sync(unwrap, body, headers)


def sdk_live_create(url: str, token: str) -> str:
    client = sdk(url + "/v1", api_key=token)
    made = client.live.create(session={"model": "gpt-live-1"},
                              transport={"type": "webrtc", "sdp": OFFER})
    return made.session.id


async def test_a_webrtc_live_session_fires_live_transport_connected_once(
        make_env: Any, nursery: trio.Nursery) -> None:
    """``live.transport.connected`` in the SDK's own shape (``data`` exactly
    ``{session_id, type: "webrtc"}``), signed so ``client.webhooks.unwrap`` takes it, once
    per WebRTC Live session, beside the family's ``realtime.call.started``."""
    from openai.types.webhooks.live_transport_connected_webhook_event import (
        LiveTransportConnectedWebhookEvent,
    )

    rx = Receiver(fail=0)
    port = await rx.serve(nursery)
    ep = Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))
    env = await make_env(api_token="the-api-token", auth_required=True, webhooks=[ep])
    import time

    env.clock.t = time.time()  # the SDK checks the webhook timestamp against its own clock
    env.state.config.http = ("127.0.0.1", 0)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    with trio.fail_after(TIMEOUT):
        session_id = await trio.to_thread.run_sync(sdk_live_create, binds[0], "the-api-token")
        await rx.wait_for(2)
    events = [json.loads(b) for _, b in rx.requests]
    assert sorted(e["type"] for e in events) == sorted([CALL_STARTED, LIVE_TRANSPORT_CONNECTED])
    [live] = [(h, b) for h, b in rx.requests
              if json.loads(b)["type"] == LIVE_TRANSPORT_CONNECTED]
    got = await trio.to_thread.run_sync(unwrap, live[1], live[0])
    assert isinstance(got, LiveTransportConnectedWebhookEvent)
    assert got.data.session_id == session_id and session_id.startswith("live_")
    assert json.loads(live[1])["data"] == {"session_id": session_id, "type": "webrtc"}


def websocket_session(url: str) -> None:
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws", 1) + "/v1/realtime?model=m") as ws:
        ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hi"}]}}))
        while json.loads(ws.recv(timeout=TIMEOUT))["type"] != "conversation.item.done":
            pass


async def test_a_websocket_session_reports_its_end(make_env: Any, nursery: trio.Nursery) -> None:
    rx = Receiver(fail=0)
    port = await rx.serve(nursery)
    ep = Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))
    env = await make_env(webhooks=[ep])
    env.state.config.http = ("127.0.0.1", 0)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    with trio.fail_after(TIMEOUT):
        await trio.to_thread.run_sync(websocket_session, binds[0])
        await rx.wait_for(2)
    started, ended = (json.loads(b) for _, b in rx.requests)
    assert started["type"] == CALL_STARTED and ended["type"] == CALL_ENDED
    assert started["data"]["transport"] == "websocket" and started["data"]["model"] == "m"
    report = ended["data"]["report"]
    assert report["end_reason"] == "client_closed" and report["hung_up_by"] == "client"
    assert report["stats"]["events_in"] == 1 and report["stats"]["events_out"] >= 3


def websocket_audio_turn(url: str) -> None:
    """0.6 s of tone then silence, appended in 100 ms pieces (24 kHz PCM16): server_vad
    ends the turn and the echo agent plays it back."""
    import base64

    import numpy as np
    from websockets.sync.client import connect

    t = np.arange(int(24_000 * 0.6)) / 24_000
    audio = (np.sin(2 * np.pi * 300 * t) * 8000).astype("<i2").tobytes() + bytes(2 * 36_000)
    with connect(url.replace("http", "ws", 1) + "/v1/realtime?model=m") as ws:
        for i in range(0, len(audio), 4_800):
            ws.send(json.dumps({"type": "input_audio_buffer.append",
                                "audio": base64.b64encode(audio[i : i + 4_800]).decode()}))
        while json.loads(ws.recv(timeout=TIMEOUT))["type"] != "response.done":
            pass


async def test_a_websocket_sessions_turns_reach_its_report_and_the_histograms(
        make_env: Any, nursery: trio.Nursery) -> None:
    """Issue 38 item 5 on the WebSocket (which signaling runs itself, no transceiver): the
    turn's waterfall is in the end-of-call report's ``turns`` and in /metrics."""
    rx = Receiver(fail=0)
    port = await rx.serve(nursery)
    ep = Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))
    env = await make_env(webhooks=[ep])
    env.state.config.http = ("127.0.0.1", 0)
    binds = await nursery.start(partial(serve_signaling, env.state.config, state=env.state))
    with trio.fail_after(TIMEOUT):
        await trio.to_thread.run_sync(websocket_audio_turn, binds[0])
        await rx.wait_for(2)
    _, ended = (json.loads(b) for _, b in rx.requests)
    (turn,) = ended["data"]["report"]["turns"]
    assert turn["turn"] == 1
    assert turn["speech_start_ms"] < turn["speech_end_ms"] < 0 <= turn["first_sent_ms"]
    assert env.state.registry.turn_hist["first_sent"].count == 1


def test_webhook_url_flags(tmp_path: Any, monkeypatch: Any) -> None:
    import argparse

    from appliance.signaling.options import add_webhook_arguments, webhook_endpoints

    parser = argparse.ArgumentParser()
    add_webhook_arguments(parser)
    (tmp_path / "s").write_text(SECRET)
    monkeypatch.setenv("APPLIANCE_WEBHOOK_SECRET", SECRET)
    args = parser.parse_args(["--webhook-url", f"http://127.0.0.1:1/a,secret-file={tmp_path / 's'}",
                              "--webhook-url", "https://example.invalid/b"])
    eps = webhook_endpoints(args)
    assert [e.url for e in eps] == ["http://127.0.0.1:1/a", "https://example.invalid/b"]
    assert webhook_endpoints(parser.parse_args([])) == []


async def test_a_call_ended_on_the_transceiver_is_heard_through_its_events(
        make_env: Any, nursery: trio.Nursery) -> None:
    """The agent hangs up: the transceiver's ``events`` long-poll brings the end and its
    facts (no ``list`` poll: signaling asks nothing else after the create)."""
    rx = Receiver(fail=0)
    port = await rx.serve(nursery)
    ep = Endpoint(f"http://127.0.0.1:{port}/hook", secret_key(SECRET))
    env = await make_env(webhooks=[ep])
    nursery.start_soon(env.state.webhooks.run)
    env.state.call_events.start(nursery)
    resp = await env.client().post("/v1/realtime/calls", data=OFFER,
                                   headers={"Content-Type": "application/sdp"})
    assert resp.status_code == 201
    call_id = resp.headers["Location"].rsplit("/", 1)[1]
    with trio.fail_after(TIMEOUT):
        await rx.wait_for(1)
        [fake] = [f for f in env.fakes.values() if call_id in f.sessions]
        fake.end_call(
            call_id, end_reason="agent-done", ended_at=env.clock.t + 12.5,
            packets_in=640, transcript=[{"who": "user", "text": "what time is it", "at": 1.0},
                                        {"who": "agent", "text": "It is noon.", "at": 2.0}],
            turns=[TURN])
        await rx.wait_for(2)
    started, ended = (json.loads(b) for _, b in rx.requests)
    assert (started["type"], ended["type"]) == (CALL_STARTED, CALL_ENDED)
    report = ended["data"]["report"]
    assert report["end_reason"] == "agent-done" and report["hung_up_by"] == "agent"
    assert report["duration_seconds"] == 12.5 and report["stats"]["packets_in"] == 640
    assert [(t["who"], t["text"]) for t in report["transcript"]] == [
        ("user", "what time is it"), ("agent", "It is noon.")]
    assert report["turns"] == [TURN]  # the turn's waterfall, as the session object has it
    assert env.state.webhooks.pending_calls == {}
    assert set(fake.ops()) == {"create", "events"}  # the end came with no list or get
    assert env.state.registry.lookup(call_id).end_reason == "agent-done"


def test_who_hung_up() -> None:
    from appliance.signaling.webhooks import hung_up_by

    assert [hung_up_by(r) for r in ("hangup", "dtls-closed", "agent: bye", "agent-done",
                                    "transceiver lost", "what")] == [
        "api", "client", "agent", "agent", "server", "unknown"]
