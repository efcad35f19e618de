"""The sideband, ``GET /v1/realtime?call_id=…``, with the real clients (issue 29 items 2, 6, 8):
``appliance up --agent realtime`` as real processes; the "browser" is aiortc placing a call
with ``POST /v1/realtime/calls`` and speaking Realtime on its ``oai-events`` channel; the
backend is openai-agents' call-id model (``OpenAIRealtimeSIPModel``, a subprocess: its
``agents`` package shadows tests/agents) or the ``openai`` SDK's ``realtime.connect(call_id=)``.

The built-in agent calls a declared tool on the typed trigger ``call tool NAME {json}``
(docs/realtime.md "Tools"): the browser types it, the backend declared the tool, so the
call goes to the backend only; its output is answered and the browser hears (reads) it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from browser.helpers import running_appliance_up
from e2e.test_up_http import http_json, in_fresh_thread
from sdk_clients import async_sdk

openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

pytestmark = [pytest.mark.interop, pytest.mark.slow]
AGENTS_SDK = Path(__file__).resolve().parents[2] / ".venv" / "openai-agents"
WAIT = 60.0
START = 180.0  # a fresh interpreter importing openai-agents, on a loaded box


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("sideband")
    with running_appliance_up(tmp, "--transceivers", "1", "--agent", "realtime",
                              name="sideband", ready_timeout=60) as base:
        yield base


class Events:
    """A list of JSON events with waiting (the browser's channel, or a sideband socket)."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.cond = asyncio.Condition()

    async def add(self, message: str | bytes) -> None:
        async with self.cond:
            self.got.append(json.loads(message))
            self.cond.notify_all()

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.got]

    async def wait(self, kind: str, n: int = 1, within: float = WAIT, **match: Any
                   ) -> dict[str, Any]:
        def found() -> list[dict[str, Any]]:
            return [e for e in self.got if e["type"] == kind
                    and all(e.get(k) == v for k, v in match.items())]
        try:
            async with asyncio.timeout(within), self.cond:
                await self.cond.wait_for(lambda: len(found()) >= n)
        except TimeoutError:
            raise AssertionError(f"no {kind} #{n}: got {self.kinds()}") from None
        return found()[n - 1]


class Browser:
    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.events = Events()
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", lambda m: asyncio.ensure_future(self.events.add(m)))
        self.pc.addTransceiver("audio", direction="sendrecv")
        self.call_id = ""

    async def call(self, base: str) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        status, headers, body = await asyncio.to_thread(
            http_json, "POST", base + "/v1/realtime/calls",
            self.pc.localDescription.sdp.encode(), "application/sdp")
        assert status == 201, body[:300]
        self.call_id = headers["location"].rsplit("/", 1)[-1]
        await self.pc.setRemoteDescription(RTCSessionDescription(body.decode(), "answer"))
        await self.events.wait("session.created")
        return self.call_id

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    def say(self, text: str) -> None:
        self.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": text}]}})
        self.send({"type": "response.create"})

    def transcripts(self) -> list[str]:
        return [e["transcript"] for e in self.events.got
                if e["type"] == "response.output_audio_transcript.done"]


def ws_base(base: str) -> str:
    return base.replace("http", "ws", 1)


async def refused(url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    try:
        async with websockets.connect(url, **kw):
            pass
    except websockets.exceptions.InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body or b"{}")
    raise AssertionError(f"{url} was not refused")


# -- openai-agents' call-id model runs the backend's tool for the browser's call ----------

BACKEND = r"""
import asyncio, json, sys
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.openai_realtime import OpenAIRealtimeSIPModel

ran = []

def _raw(event):  # a raw server event's type, for the trace on stderr
    data = getattr(getattr(event, "data", None), "data", None)
    return data.get("type", "") if isinstance(data, dict) else ""

@function_tool
def get_weather(city: str) -> str:
    'The weather in a city.'
    ran.append(city)
    return f"sunny in {city}"

async def main():
    url, call_id = sys.argv[1], sys.argv[2]
    agent = RealtimeAgent(name="backend", instructions="the backend's", tools=[get_weather])
    runner = RealtimeRunner(agent, model=OpenAIRealtimeSIPModel())
    session = await runner.run(model_config={"url": url, "call_id": call_id,
                                             "api_key": "unused"})
    kinds = []
    async with session:
        print("ATTACHED", flush=True)
        async for event in session:
            kinds.append(event.type)
            print("event", event.type, _raw(event), file=sys.stderr, flush=True)
            if event.type == "tool_end":
                break
        async for event in session:  # the tool's output answered: the next response.done
            print("event", event.type, _raw(event), file=sys.stderr, flush=True)
            data = getattr(event, "data", None)
            if (event.type == "raw_model_event" and getattr(data, "type", "") ==
                    "raw_server_event" and data.data.get("type") == "response.done"):
                break
    print(json.dumps({"ran": ran, "kinds": kinds}), flush=True)

asyncio.run(main())
"""


async def backend_tool_call(base: str) -> dict[str, Any]:
    browser = Browser()
    try:
        call_id = await browser.call(base)
        url = f"{ws_base(base)}/v1/realtime?call_id={call_id}&lock=tools,instructions"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(AGENTS_SDK)
        env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BACKEND, url, call_id, env=env, cwd="/",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stdout is not None
            async with asyncio.timeout(START):
                line = await proc.stdout.readline()
            assert line.strip() == b"ATTACHED", line
            # the backend's session.update reached the call (the browser sees it too)
            await browser.events.wait("session.updated")
            updated = [e for e in browser.events.got if e["type"] == "session.updated"]
            async with asyncio.timeout(WAIT):
                while not any(t.get("name") == "get_weather" for e in updated
                              for t in e["session"]["tools"]):
                    n = len(updated)
                    await browser.events.wait("session.updated", n + 1)
                    updated = [e for e in browser.events.got if e["type"] == "session.updated"]
            # the browser may not rewrite what the backend locked
            browser.send({"type": "session.update", "event_id": "evt_lock", "session": {
                "type": "realtime", "instructions": "ignore the backend"}})
            locked = await browser.events.wait("error")
            browser.say('call tool get_weather {"city": "Oslo"}')
            # the backend (which ends on the answer's response.done) and the browser's
            # channel are watched at once, so a failure says which side stopped
            backend = asyncio.ensure_future(proc.communicate())
            answer = asyncio.ensure_future(browser.events.wait("response.done", 2))
            await asyncio.wait({backend, answer}, return_when=asyncio.FIRST_COMPLETED)
            if backend.done() and proc.returncode != 0:
                answer.cancel()
                raise AssertionError(f"the backend exited {proc.returncode}: "
                                     f"{backend.result()[1].decode()[-3000:]}")
            try:
                await answer
            except AssertionError as exc:
                alive = not backend.done()
                if alive:
                    proc.kill()
                out, err = await backend
                raise AssertionError(
                    f"{exc}; the backend ({'killed' if alive else 'exited'}, "
                    f"{proc.returncode}) traced: {err.decode()[-3000:]}; its stdout: "
                    f"{out.decode()[-500:]}; the browser's channel: "
                    f"{browser.channel.readyState}, ICE {browser.pc.iceConnectionState}"
                    ) from None
            async with asyncio.timeout(WAIT):
                out, err = await backend
            assert proc.returncode == 0, err.decode()[-3000:]
            result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            result["locked"] = locked
            result["browser"] = browser.events.got
            result["transcripts"] = browser.transcripts()
            return result
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    finally:
        await browser.pc.close()


@pytest.mark.skipif(not AGENTS_SDK.is_dir(), reason="openai-agents not installed (make "
                    "install-test puts it in .venv/openai-agents)")
def test_backend_runs_its_tool_for_the_browser_call(up: str) -> None:
    out = in_fresh_thread(lambda: asyncio.run(backend_tool_call(up)), timeout=START + 120)
    assert out["ran"] == ["Oslo"]  # the backend's Python tool ran, on the browser's turn
    assert "tool_start" in out["kinds"]
    err = out["locked"]["error"]
    assert (err["code"], err["param"], err["event_id"]) == (
        "session_field_locked", "session.instructions", "evt_lock")
    # the browser never saw the backend's function call, only the answer to it
    kinds = [e["type"] for e in out["browser"]]
    assert "response.function_call_arguments.done" not in kinds
    for e in out["browser"]:
        if e["type"] == "response.done":
            assert all(o["type"] != "function_call" for o in e["response"]["output"])
    assert out["transcripts"][-1] == "tool get_weather returned: sunny in Oslo"


# -- the openai SDK as an observer; refusals before the upgrade; drop and hangup -------------

async def observer_and_refusals(base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ws = ws_base(base)
    out["unknown"] = await refused(f"{ws}/v1/realtime?call_id=rtc_nope")
    browser = Browser()
    client = async_sdk(base + "/v1",
                                websocket_base_url=ws + "/v1")
    try:
        call_id = await browser.call(base)
        status, _, body = await asyncio.to_thread(
            http_json, "POST", base + "/v1/realtime/client_secrets", b"{}", "application/json")
        assert status == 200
        ek = json.loads(body)["value"]
        out["ek"] = await refused(f"{ws}/v1/realtime?call_id={call_id}",
                                  additional_headers={"Authorization": f"Bearer {ek}"})
        ctl = Events()
        async with client.realtime.connect(call_id=call_id) as conn:
            first = await conn.recv()
            out["created"] = first.model_dump()
            out["second_controller"] = await refused(
                f"{ws}/v1/realtime?call_id={call_id}&role=controller")
            async with websockets.connect(f"{ws}/v1/realtime?call_id={call_id}") as obs_ws:
                obs = Events()
                await obs.add(await obs_ws.recv())

                async def read_obs() -> None:
                    async for m in obs_ws:
                        await obs.add(m)

                reader = asyncio.ensure_future(read_obs())
                await obs_ws.send(json.dumps({"type": "response.create", "event_id": "o1"}))
                out["observer_error"] = await obs.wait("error")
                # the controller (the SDK) asks, the agent answers: every side sees it
                await conn.conversation.item.create(item={
                    "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "from the backend"}]})
                await conn.response.create()
                async with asyncio.timeout(WAIT):
                    async for event in conn:
                        await ctl.add(event.model_dump_json())
                        if event.type == "response.done":
                            break
                await browser.events.wait("response.done")
                await obs.wait("response.done")
                out["browser_transcripts"] = browser.transcripts()
                out["ctl_kinds"] = ctl.kinds()
                out["obs_kinds"] = obs.kinds()
                reader.cancel()
        # the controller dropped: the call goes on
        browser.say("still here")
        await browser.events.wait("response.done", 2)
        out["after_drop"] = browser.transcripts()
        status, _, body = await asyncio.to_thread(
            http_json, "GET", f"{base}/v1/realtime/calls/{call_id}")
        out["state"] = (status, json.loads(body))
        async with websockets.connect(f"{ws}/v1/realtime?call_id={call_id}") as late:
            await late.recv()  # session.created
            await client.realtime.calls.hangup(call_id)  # the SDK's POST …/hangup
            out["hangup"] = 200
            try:
                async with asyncio.timeout(WAIT):
                    async for _ in late:
                        pass
            except websockets.exceptions.ConnectionClosed:
                pass
            out["close"] = (late.close_code, late.close_reason)
        out["ended"] = await refused(f"{ws}/v1/realtime?call_id={call_id}")
        status, _, body = await asyncio.to_thread(
            http_json, "GET", f"{base}/v1/realtime/calls/{call_id}")
        out["state_after"] = (status, json.loads(body))
    finally:
        await client.close()
        await browser.pc.close()
    return out


def test_observer_refusals_drop_and_hangup(up: str) -> None:
    out = in_fresh_thread(lambda: asyncio.run(observer_and_refusals(up)), timeout=240)
    assert out["unknown"][0] == 404
    assert out["unknown"][1]["error"]["code"] == "call_not_found"
    assert out["ek"][0] == 403  # a client secret never attaches
    assert out["created"]["type"] == "session.created"
    assert out["created"]["session"]["type"] == "realtime"
    assert out["second_controller"][0] == 409
    assert out["observer_error"]["error"]["code"] == "sideband_observer"
    assert out["observer_error"]["error"]["event_id"] == "o1"
    assert out["browser_transcripts"] == ["from the backend"]  # the echo answers it
    for kinds in (out["ctl_kinds"], out["obs_kinds"]):
        assert kinds.index("response.created") < kinds.index("response.done")
    assert "error" not in out["ctl_kinds"]  # the observer's error was the observer's
    assert out["after_drop"] == ["from the backend", "still here"]
    status, body = out["state"]
    assert status == 200 and body["status"] == "connected" and body["object"] == "realtime.call"
    assert out["hangup"] == 200  # (the SDK raises on any other status)
    assert out["close"] == (1000, "the call ended")
    assert out["ended"][0] == 410
    status, body = out["state_after"]
    assert status == 200 and body["status"] == "ended"
