"""``GET /v1/realtime?model=…``: the official ``openai`` SDK's ``client.realtime.connect``
(and openai-agents' RealtimeRunner) against the signaling server on loopback.

The SDKs are asyncio/threaded clients: each runs in a worker thread
(``trio.to_thread.run_sync``) while the server runs in the test's trio nursery.
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from sdk_clients import sdk

from appliance.signaling import SignalingConfig, SignalingState, serve_signaling

openai = pytest.importorskip("openai")

API_TOKEN = "test-api-token-0123456789"
TIMEOUT = 60  # the whole exchange, generous: the box is loaded


async def start_server(nursery: trio.Nursery, **overrides: Any) -> tuple[str, SignalingState]:
    cfg = SignalingConfig(http=("127.0.0.1", 0), transceivers={}, relays={})
    for k, v in overrides.items():
        setattr(cfg, k, v)
    state = SignalingState(cfg)
    binds = await nursery.start(partial(serve_signaling, cfg, state=state))
    return binds[0], state


def tone_pcm24k(seconds: float, *, freq: float = 440.0, level: float = 0.3) -> bytes:
    n = int(24_000 * seconds)
    t = np.arange(n) / 24_000
    return (np.sin(2 * math.pi * freq * t) * level * 32767).astype("<i2").tobytes()


def collect_until(conn: Any, done: Callable[[Any], bool]) -> list[Any]:
    events = []
    for event in conn:
        events.append(event)
        if done(event):
            return events
    raise AssertionError(f"the socket closed first: {[e.type for e in events]}")


def client(url: str, **kw: Any) -> Any:
    return sdk(url + "/v1", api_key=kw.pop("api_key", "unused-on-loopback"),
                         websocket_base_url=url.replace("http", "ws", 1) + "/v1", **kw)


def text_turn(url: str) -> list[Any]:
    with client(url).realtime.connect(model="gpt-realtime") as conn:
        first = conn.recv()
        assert first.type == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        collect_until(conn, lambda e: e.type == "session.updated")
        conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hello appliance"}]})
        conn.response.create()
        return [first, *collect_until(conn, lambda e: e.type == "response.done")]


async def test_text_turn_with_the_openai_sdk(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(text_turn, url)
    assert events[0].session.model == "gpt-realtime"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "hello appliance"
    done = events[-1]
    assert done.response.status == "completed"
    assert done.response.output[0].content[0].text == "hello appliance"


def audio_turn(url: str, fmt: dict[str, Any]) -> tuple[list[Any], bytes]:
    with client(url).realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "realtime", "audio": {
            "input": {"format": fmt, "turn_detection": {"type": "server_vad",
                                                        "silence_duration_ms": 500}},
            "output": {"format": fmt}}})
        collect_until(conn, lambda e: e.type == "session.updated")
        pcm = tone_pcm24k(1.0) + bytes(2 * 24_000)  # 1 s of tone, 1 s of silence
        if fmt["type"] != "audio/pcm":
            from appliance.realtime.audio import g711_from_48k, pcm24k_to_48k

            pcm = g711_from_48k(pcm24k_to_48k(pcm), alaw=fmt["type"] == "audio/pcma")
        step = len(pcm) // 20
        for i in range(0, len(pcm), step):  # 100 ms appends, as a streaming client does
            conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
        events = collect_until(conn, lambda e: e.type == "response.done")
        audio = b"".join(base64.b64decode(e.delta) for e in events
                         if e.type == "response.output_audio.delta")
        return events, audio


@pytest.mark.parametrize("fmt", [{"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcmu"},
                                 {"type": "audio/pcma"}])
async def test_audio_turn_server_vad(nursery: trio.Nursery, fmt: dict[str, Any]) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events, audio = await trio.to_thread.run_sync(audio_turn, url, fmt)
    kinds = [e.type for e in events]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "response.created", "response.done"):
        assert kind in kinds, kinds
    assert not [k for k in kinds if k.startswith("output_audio_buffer.")]  # WebRTC only
    transcript = "".join(e.delta for e in events
                         if e.type == "response.output_audio_transcript.delta")
    assert transcript.startswith("(echo, ")
    per_second = 48_000 if fmt["type"] == "audio/pcm" else 8_000  # bytes
    # The echo is the turn: the tone (~1 s), its prefix padding and trailing silence.
    assert 0.9 * per_second <= len(audio) <= 2.0 * per_second
    if fmt["type"] == "audio/pcm":
        samples = np.frombuffer(audio, "<i2").astype(np.float64)
        assert np.sqrt(np.mean(samples**2)) > 1000  # the tone came back, not silence


def manual_commit(url: str) -> list[Any]:
    with client(url).realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "realtime",
                                     "audio": {"input": {"turn_detection": None}}})
        collect_until(conn, lambda e: e.type == "session.updated")
        conn.input_audio_buffer.append(audio=base64.b64encode(tone_pcm24k(0.5)).decode())
        conn.input_audio_buffer.commit()
        conn.response.create()
        return collect_until(conn, lambda e: e.type == "response.done")


async def test_manual_commit(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(manual_commit, url)
    kinds = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    audio = b"".join(base64.b64decode(e.delta) for e in events
                     if e.type == "response.output_audio.delta")
    assert len(audio) == 24_000  # 0.5 s of 24 kHz PCM16, echoed whole


def tool_round_trip(url: str) -> list[Any]:
    tool = {"type": "function", "name": "add", "description": "add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                            "b": {"type": "number"}}}}
    with client(url).realtime.connect(model="gpt-realtime") as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "tools": [tool]})
        collect_until(conn, lambda e: e.type == "session.updated")
        conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": 'call tool add {"a": 2, "b": 3}'}]})
        conn.response.create()
        events = collect_until(conn, lambda e: e.type == "response.done")
        call = next(e for e in events if e.type == "response.function_call_arguments.done")
        args = json.loads(call.arguments)
        conn.conversation.item.create(item={"type": "function_call_output",
                                            "call_id": call.call_id,
                                            "output": str(args["a"] + args["b"])})
        conn.response.create()
        return events + collect_until(conn, lambda e: e.type == "response.done")


async def test_the_echo_agent_calls_a_declared_tool(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        events = await trio.to_thread.run_sync(tool_round_trip, url)
    first_done = next(e for e in events if e.type == "response.done")
    calls = [o for o in first_done.response.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]
    text = "".join(e.delta for e in events[events.index(first_done):]
                   if e.type == "response.output_text.delta")
    assert text == "tool add returned: 5"


def refused(url: str, **kw: Any) -> Any:
    try:
        with client(url, **kw).realtime.connect(model="gpt-realtime") as conn:
            conn.recv()
    except Exception as exc:
        return exc
    raise AssertionError("the connection was accepted")


def accepted_model(url: str, **kw: Any) -> str:
    with client(url, **kw).realtime.connect(model="gpt-realtime") as conn:
        event = conn.recv()
        assert event.type == "session.created"
        return str(event.session.model)


def subprotocol_session(url: str, token: str) -> str:
    from websockets.sync.client import connect

    with connect(url.replace("http", "ws", 1) + "/v1/realtime?model=m1",
                 subprotocols=["realtime", f"openai-insecure-api-key.{token}"]) as ws:
        assert ws.subprotocol == "realtime"
        event = json.loads(ws.recv(timeout=TIMEOUT))
        assert event["type"] == "session.created"
        return str(event["session"]["model"])


async def test_auth_off_loopback(nursery: trio.Nursery) -> None:
    url, state = await start_server(nursery, api_token=API_TOKEN, auth_required=True)
    with trio.fail_after(TIMEOUT):
        exc = await trio.to_thread.run_sync(partial(refused, url, api_key="wrong"))
        assert "401" in str(exc)
        assert await trio.to_thread.run_sync(
            partial(accepted_model, url, api_key=API_TOKEN)) == "gpt-realtime"
        assert await trio.to_thread.run_sync(subprotocol_session, url, API_TOKEN) == "m1"
        # An ek_ client secret opens one too, with the config it was minted with.
        secret = await trio.to_thread.run_sync(partial(
            client(url, api_key=API_TOKEN).realtime.client_secrets.create,
            session={"type": "realtime", "instructions": "be brief"}))
        assert secret.value.startswith("ek_")
        assert await trio.to_thread.run_sync(subprotocol_session, url, secret.value) == "m1"


def _creates() -> int:
    """How many 60 KB creates overflow the server's queue of 16 events for certain: each is
    echoed as two events (~120 KB), and the echoes must fill the server's send buffer
    (at most the kernel's tcp_wmem maximum) and our small receive buffer first."""
    try:
        wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        wmem_max = 4 << 20  # Linux's default maximum
    return math.ceil((wmem_max + (2 << 20)) / 120_000) + 8


CREATES = _creates()  # 61 with Linux's default 4 MB maximum send buffer


def slow_reader(url: str) -> int | None:
    """Send big events and read none: once the socket's buffers are full the server's
    queue grows, and past its bound the server must close with 1008, not buffer forever."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    item = json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "x" * 60_000}]}})
    # A small receive buffer (set before connect, so the window is small from the start):
    # the server's sends stall after a few echoes, so a few MB of creates are far past its
    # bound; all of them are still in flight when it closes, ahead of our close reply.
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32_768)
    sock.connect((host, int(port)))
    # close_timeout=None: we wait for the *server* to end the TCP connection after the
    # close handshake, however long that takes (it took 20 s, until this client gave up,
    # while the server stopped reading after its close: realtime_ws.close_socket).
    with connect(url.replace("http", "ws", 1) + "/v1/realtime?model=m", max_queue=2,
                 max_size=None, sock=sock, close_timeout=None) as ws:
        try:
            for _ in range(CREATES):
                ws.send(item)
        except ConnectionClosed:
            pass
        try:
            while True:  # now read what was in flight, then the close
                ws.recv(timeout=TIMEOUT)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    return None


async def test_a_slow_reader_is_disconnected(nursery: trio.Nursery, monkeypatch: Any) -> None:
    from appliance.realtime import ws_session

    monkeypatch.setattr(ws_session, "QUEUE_LIMIT", 16)  # 2 events a create: 8 creates
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):  # a server that never closes fails here
        code = await trio.to_thread.run_sync(slow_reader, url, abandon_on_cancel=True)
    assert code == ws_session.CLOSE_SLOW_READER


def query_errors(url: str) -> list[tuple[int, str]]:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    out = []
    for q in ("", "?call_id=rtc_nope"):
        try:
            connect(url.replace("http", "ws", 1) + "/v1/realtime" + q).close()
        except InvalidStatus as exc:
            body = json.loads(exc.response.body or b"{}")
            out.append((exc.response.status_code, body["error"]["param"]))
    return out


async def test_missing_model_and_call_id_are_refused_before_upgrade(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT):
        # an unknown call: 404 before the upgrade (the sideband: tests/realtime/test_sideband.py)
        assert await trio.to_thread.run_sync(query_errors, url) == [(400, "model"),
                                                                   (404, "call_id")]


# -- openai-agents: RealtimeRunner over its WebSocket model --------------------------------
# openai-agents' top-level package is `agents`, the name of the suite's tests/agents/: it is
# installed in a directory of its own (Makefile, install-test) and runs in a subprocess.

AGENTS_SDK = Path(__file__).resolve().parents[2] / ".venv" / "openai-agents"

RUNNER = r"""
import asyncio, json, sys
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

ran = []

@function_tool
def get_weather(city: str) -> str:
    'The weather in a city.'
    ran.append(city)
    return f"sunny in {city}"

def server_event(event):
    data = getattr(event, "data", None)
    if event.type == "raw_model_event" and getattr(data, "type", "") == "raw_server_event":
        return data.data
    return None

async def main():
    agent = RealtimeAgent(name="assistant", instructions="answer", tools=[get_weather])
    runner = RealtimeRunner(agent, config={"model_settings": {
        "model_name": "gpt-realtime", "modalities": ["text"]}})
    kinds, done = [], []
    session = await runner.run(model_config={"url": sys.argv[1], "api_key": "unused"})
    async with session:
        await session.send_message('call tool get_weather {"city": "Oslo"}')
        async for event in session:
            kinds.append(event.type)
            raw = server_event(event)
            if raw is not None and raw.get("type") == "response.done":
                done.append(raw)
                if len(done) == 2:
                    break
    print(json.dumps({"ran": ran, "kinds": kinds, "done": done}))

asyncio.run(main())
"""


@pytest.mark.skipif(not AGENTS_SDK.is_dir(), reason="openai-agents not installed (make "
                    "install-test puts it in .venv/openai-agents)")
async def test_openai_agents_realtime_runner_runs_a_tool(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=gpt-realtime"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(AGENTS_SDK)
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    with trio.fail_after(TIMEOUT):
        proc = await trio.run_process([sys.executable, "-c", RUNNER, ws_url], env=env,
                                      capture_stdout=True, capture_stderr=True, check=False,
                                      cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert out["ran"] == ["Oslo"]  # the runner ran the Python tool the agent asked for
    assert "tool_start" in out["kinds"] and "tool_end" in out["kinds"]
    first, second = out["done"]
    calls = [o for o in first["response"]["output"] if o["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Oslo"})]
    texts = [c.get("text") or c.get("transcript") for o in second["response"]["output"]
             for c in o.get("content", [])]
    assert texts == ["tool get_weather returned: sunny in Oslo"]
