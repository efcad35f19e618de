"""The sideband on a phone call, OpenAI's SIP flow end to end (issue 29 item 2): SIPp places
a call (RTP from a pcap: silence, so server VAD hears no turn of its own), the webhook
``realtime.call.incoming`` reaches the receiver, the backend accepts it with the ``openai``
SDK (the Realtime agent: signaling's default), then attaches with
``client.realtime.connect(call_id=…)`` as openai-agents' ``OpenAIRealtimeSIPModel`` does:
``session.created`` (the accept's session) first, its ``session.update`` and a text turn
answered by the call's agent on the transceiver, ``client.realtime.calls.hangup`` sends
SIPp its BYE and closes the socket with 1000. And the look-up's refusals before the
upgrade (appliance/signaling/sideband.py): unknown 404, ek_ 403, ringing 409, ended 410.
Last, openai-agents' ``OpenAIRealtimeSIPModel`` itself (a subprocess: its ``agents``
package shadows tests/agents) runs its Python tool on the phone call's typed trigger.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from sdk_clients import async_sdk
from sip.support import (
    SIPP,
    TIMEOUT,
    run_sipp,
    start_phone_stack,
    until_incoming,
    write_tone_pcap,
)

from appliance.signaling import SignalingConfig, SignalingState
from appliance.signaling.phone_media import TransceiverPhoneMedia
from appliance.signaling.proxied import CLIENT_IS_LOCAL
from appliance.signaling.realtime_http import Realtime, RealtimeProblem
from appliance.signaling.sideband import attach
from appliance.signaling.sip_call import CallState
from appliance.signaling.sip_calls import SipCall, SipCalls
from appliance.signaling.sip_config import SipSettings

openai = pytest.importorskip("openai")
websockets = pytest.importorskip("websockets")

WAIT = 30.0
TEXT = "hello from the backend"


# -- the look-up, in process -------------------------------------------------------------

def lookup_rig(tmp_path: Path) -> tuple[Realtime, SipCalls]:
    cfg = SignalingConfig(http=("127.0.0.1", 0), public_addresses=["127.0.0.1"],
                          udp_port=9, webui_dir=tmp_path / "webui",
                          transceivers={0: str(tmp_path / "t0.sock")})
    state = SignalingState(cfg)
    calls = SipCalls(state, SipSettings(udp_tcp=("127.0.0.1", 0)),
                     media=TransceiverPhoneMedia(state))
    return Realtime(state), calls


def sip_call(call_id: str, state: str) -> SipCall:
    incoming: Any = SimpleNamespace(offer_sdp=b"", source=("127.0.0.1", 5060))
    return SipCall(call_id, "sip_x", 0.0, incoming, state=CallState(state), end_reason="hangup")


async def refusal(rt: Realtime, calls: SipCalls | None, call_id: str,
                  authorization: str = "") -> tuple[int, str]:
    local = CLIENT_IS_LOCAL.set(True)  # a loopback caller, as the trust edge marks one
    try:
        with pytest.raises(RealtimeProblem) as got:
            await attach(rt, call_id, authorization, {}, calls)
    finally:
        CLIENT_IS_LOCAL.reset(local)
    return got.value.status, got.value.code


async def test_the_lookup_refuses_unknown_ringing_and_ended_sip_calls(tmp_path: Path) -> None:
    rt, calls = lookup_rig(tmp_path)
    ringing, ended, placed = (f"rtc_sip_{c * 24}" for c in "abc")
    calls.calls[ringing] = sip_call(ringing, "ringing")
    calls.ended[ended] = sip_call(ended, "ended")
    calls.calls[placed] = sip_call(placed, "active")
    assert await refusal(rt, calls, f"rtc_sip_{'0' * 24}") == (404, "call_not_found")
    assert await refusal(rt, None, ringing) == (404, "call_not_found")  # SIP is off
    assert await refusal(rt, calls, ringing) == (409, "call_not_answered")
    assert await refusal(rt, calls, ended) == (410, "call_ended")
    # a live call whose transceiver signaling no longer has (health dropped it): ended
    assert isinstance(calls.media, TransceiverPhoneMedia)
    calls.media.where[placed] = 7
    assert calls.sideband_transceiver(placed) == 7
    assert await refusal(rt, calls, placed) == (410, "call_ended")
    # neither a WebRTC call nor a SIP call id; not a call id at all
    assert await refusal(rt, calls, "rtc_nope") == (404, "call_not_found")
    assert await refusal(rt, calls, "") == (400, "invalid_value")


# -- OpenAI's SIP flow, end to end -------------------------------------------------------

async def refused(url: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    try:
        async with websockets.connect(url, **kw):
            pass
    except websockets.exceptions.InvalidStatus as exc:
        return exc.response.status_code, json.loads(exc.response.body or b"{}")
    raise AssertionError(f"{url} was not refused")


async def backend(base: str, call_id: str) -> dict[str, Any]:
    """The application's server: accept, attach by call id, drive a turn, hang up."""
    ws = base.replace("http", "ws", 1)
    client = async_sdk(base + "/v1",
                                websocket_base_url=ws + "/v1", max_retries=0)
    out: dict[str, Any] = {"events": []}
    events: list[dict[str, Any]] = out["events"]
    await client.realtime.calls.accept(call_id, type="realtime", model="gpt-realtime",
                                       instructions="You answer the phone.")
    out["unknown"] = await refused(f"{ws}/v1/realtime?call_id=rtc_sip_{'0' * 24}")
    secret = await client.realtime.client_secrets.create(session={"type": "realtime"})
    out["ek"] = await refused(f"{ws}/v1/realtime?call_id={call_id}", additional_headers={
        "Authorization": f"Bearer {secret.value}"})
    async with client.realtime.connect(call_id=call_id) as conn:
        async def until(kind: str) -> dict[str, Any]:
            async with asyncio.timeout(WAIT):
                while True:
                    event = (await conn.recv()).model_dump(exclude_unset=True)
                    events.append(event)
                    if event["type"] == kind:
                        return event

        await until("session.created")
        await conn.session.update(session={"type": "realtime",
                                           "instructions": "the backend's"})
        out["updated"] = await until("session.updated")
        await conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": TEXT}]})
        await conn.response.create()
        out["done"] = await until("response.done")
        await client.realtime.calls.hangup(call_id)
        try:
            async with asyncio.timeout(WAIT):
                while True:
                    events.append((await conn.recv()).model_dump(exclude_unset=True))
        except websockets.exceptions.ConnectionClosed as exc:
            out["close"] = exc.rcvd.code if exc.rcvd is not None else None
    out["after"] = await refused(f"{ws}/v1/realtime?call_id={call_id}")
    view = await client.get(f"/realtime/calls/{call_id}", cast_to=object)
    out["view"] = view
    await client.close()
    return out


@pytest.mark.interop
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
async def test_a_backend_drives_a_sipp_call_over_the_sideband(nursery: trio.Nursery,
                                                             tmp_path: Path) -> None:
    stack = await start_phone_stack(nursery, tmp_path, agent="realtime", webhooks=True)
    write_tone_pcap(tmp_path / "tone.pcap", freq=0.0, seconds=40.0)  # silence, 40 s
    with trio.fail_after(TIMEOUT * 3):
        run = await run_sipp(nursery, stack.phone, "pcap_callee_bye.xml", cwd=tmp_path)
        call_id = (await until_incoming(stack.phone, run))["data"]["call_id"]
        out = await trio.to_thread.run_sync(
            lambda: asyncio.run(backend(stack.phone.base_url, call_id)))
        code, text = await run.result()
    assert code == 0, text  # 200, ACK, RTP, then our BYE (the backend's hangup)
    assert out["unknown"][0] == 404 and out["unknown"][1]["error"]["code"] == "call_not_found"
    assert out["ek"][0] == 403
    assert out["ek"][1]["error"]["code"] == "insufficient_permissions"
    events = out["events"]
    kinds = [e["type"] for e in events]
    created = events[0]
    assert created["type"] == "session.created", kinds
    assert created["session"]["instructions"] == "You answer the phone."  # the accept's
    assert out["updated"]["session"]["instructions"] == "the backend's"
    # the phone call's agent (the built-in echo Realtime agent) answered the text turn
    done = out["done"]["response"]
    assert done["status"] == "completed", done
    said = [e.get("transcript") or e.get("text") for e in events
            if e["type"] in ("response.output_audio_transcript.done",
                             "response.output_text.done")]
    assert said == [TEXT], kinds
    assert out["close"] == 1000, kinds
    assert out["after"][0] == 410 and out["after"][1]["error"]["code"] == "call_ended"
    assert out["view"]["status"] == "ended" and out["view"]["agent"] == "realtime"
    tr = stack.transceiver
    ended = tr.ended_phones[-1]
    assert ended["id"] == call_id and ended["end_reason"] == "sip-ended"
    assert ended["phone"]["leg"]["rtp_in"] > 0  # SIPp's pcap reached the call


# -- openai-agents' call-id model on the phone call (its examples/realtime/twilio_sip) -----

AGENTS_SDK = Path(__file__).resolve().parents[2] / ".venv" / "openai-agents"
START = 180.0  # a fresh interpreter importing openai-agents, on a loaded box

BACKEND = r"""
import asyncio, json, sys
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from agents.realtime.openai_realtime import OpenAIRealtimeSIPModel

ran = []

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
    kinds, said = [], []
    async with session:
        # the typed trigger of the built-in agent (docs/realtime.md "Tools")
        await session.send_message('call tool get_weather {"city": "Oslo"}')
        async for event in session:
            kinds.append(event.type)
            if event.type == "tool_end":
                break
        # the tool's output answered: the response.done of a response with no function
        # call in it (the calling response's own done may still come after tool_end)
        async for event in session:
            data = getattr(event, "data", None)
            if event.type == "raw_model_event" and getattr(data, "type", "") == \
                    "raw_server_event":
                raw = data.data
                if raw.get("type") == "response.output_audio_transcript.done":
                    said.append([raw.get("response_id"), raw.get("transcript")])
                if raw.get("type") == "response.done" and not any(
                        o.get("type") == "function_call" for o in raw["response"]["output"]):
                    answer = raw["response"]["id"]
                    break
    print(json.dumps({"ran": ran, "kinds": kinds, "said": said, "answer": answer}),
          flush=True)

asyncio.run(main())
"""


@pytest.mark.interop
@pytest.mark.slow
@pytest.mark.skipif(SIPP is None, reason="sipp missing: `make sysdeps`")
@pytest.mark.skipif(not AGENTS_SDK.is_dir(), reason="openai-agents not installed (make "
                    "install-test puts it in .venv/openai-agents)")
async def test_openai_agents_sip_model_runs_its_tool_on_a_sipp_call(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    import os
    import sys

    stack = await start_phone_stack(nursery, tmp_path, agent="realtime", webhooks=True)
    write_tone_pcap(tmp_path / "tone.pcap", freq=0.0, seconds=START + TIMEOUT)  # silence
    base = stack.phone.base_url
    client = stack.phone.client()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(AGENTS_SDK)
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    with trio.fail_after(START + TIMEOUT):
        run = await run_sipp(nursery, stack.phone, "pcap_callee_bye.xml", cwd=tmp_path,
                             extra=("-timeout", str(int(START + TIMEOUT))))
        call_id = (await until_incoming(stack.phone, run))["data"]["call_id"]
        await trio.to_thread.run_sync(lambda: client.realtime.calls.accept(
            call_id, type="realtime", model="gpt-realtime", instructions="the phone's"))
        url = f"{base.replace('http', 'ws', 1)}/v1/realtime?call_id={call_id}&lock=tools"
        done = await trio.run_process([sys.executable, "-c", BACKEND, url, call_id],
                                      env=env, cwd="/", capture_stdout=True,
                                      capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        await trio.to_thread.run_sync(lambda: client.realtime.calls.hangup(call_id))
        code, text = await run.result()
    assert code == 0, text  # our BYE came
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out["ran"] == ["Oslo"]  # the backend's Python tool ran, for the phone call
    assert "tool_start" in out["kinds"]
    answered = [text for rid, text in out["said"] if rid == out["answer"]]
    assert answered == ["tool get_weather returned: sunny in Oslo"], out
