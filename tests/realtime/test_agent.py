"""The trio shell over a real AgentContext (in memory: the transceiver's side played by the
test), with per-call params as signaling gives them: a pre-negotiated ``oai-events``
channel (``dcid``, OpenAI's ``?dcid=``) opened by the agent itself, the initial session
from ``client_secrets``, a user RealtimeAgent from a ``realtime:<file.py:attr>`` spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import trio.testing
from agents.test_channels import MemoryPort
from realtime.shapes import check_event
from realtime.support import tone

from appliance.agents import AgentContext, AgentHost, AgentIdentity, ChannelMessage
from appliance.agents.channels import ChannelOpened
from appliance.agents.context import FRAME_BYTES, Frame
from appliance.agents.registry import AgentError, resolve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "realtime_backwards.py"


async def run_call(spec: str, params: dict[str, Any], script: Any) -> tuple[MemoryPort, AgentHost]:
    host = AgentHost()
    port = MemoryPort()
    host.channels.port = port
    ctx = AgentContext(host, AgentIdentity(spec, "s1", params=params))
    agent = resolve(spec)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run, ctx)
        await script(host, port)
        host.close("done")
    return port, host


def sent_events(port: MemoryPort) -> list[dict[str, Any]]:
    events = [json.loads(d) for _, d in port.sent if isinstance(d, str)]
    for e in events:
        check_event(e)
    return events


async def wait_for(port: MemoryPort, kind: str) -> dict[str, Any]:
    with trio.fail_after(10):
        while True:
            for e in sent_events(port):
                if e["type"] == kind:
                    return e
            await trio.sleep(0.01)


async def speak(host: AgentHost, pcm: bytes, speech: bool, t0: list[float]) -> None:
    """Frames at real time (the autojump clock makes it instant)."""
    for i in range(0, len(pcm), FRAME_BYTES):
        host.push_frame(Frame(pcm[i : i + FRAME_BYTES].ljust(FRAME_BYTES, b"\0"), t0[0],
                              trio.current_time(), speech))
        t0[0] += 0.02
        await trio.sleep(0.02)


async def test_prenegotiated_channel_session_from_params_and_a_user_agent(
        autojump_clock: trio.testing.MockClock) -> None:
    params = {"realtime": {"session": {"instructions": "from client_secrets"}, "dcid": 7,
                           "call_id": "rtc_test"}}

    async def script(host: AgentHost, port: MemoryPort) -> None:
        await trio.sleep(0.01)
        # The agent opened id 7 itself (no DCEP); the transceiver reports it open.
        [info] = host.channels.channels.values()
        assert (info.id, info.label, info.negotiated) == (7, "oai-events", True)
        host.channels.push(ChannelOpened(info))
        created = await wait_for(port, "session.created")
        assert created["session"]["instructions"] == "from client_secrets"
        host.channels.push(ChannelMessage(7, "oai-events", json.dumps({
            "type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "stressed"}]}})))
        host.channels.push(ChannelMessage(7, "oai-events", '{"type": "response.create"}'))
        done = await wait_for(port, "response.done")
        assert done["response"]["output"][0]["content"][0]["transcript"] == "desserts"
        t0 = [0.0]
        await speak(host, bytes(FRAME_BYTES * 20), False, t0)
        await speak(host, tone(800), True, t0)
        await speak(host, bytes(FRAME_BYTES * 20), False, t0)
        await wait_for(port, "output_audio_buffer.started")
        while host.has_output():
            host.pop_output_frame()  # the pacer
            await trio.sleep(0.02)
        stopped = await wait_for(port, "output_audio_buffer.stopped")
        transcripts = [e["transcript"] for e in sent_events(port)
                       if e["type"] == "response.output_audio_transcript.done"]
        assert transcripts[-1].startswith("(backwards, ")
        assert stopped["response_id"]

    port, _ = await run_call(f"realtime:{EXAMPLE}:Backwards", params, script)
    assert all(cid == 7 for cid, _ in port.sent)


async def test_dcep_channel_and_the_builtin_echo(autojump_clock: trio.testing.MockClock) -> None:
    async def script(host: AgentHost, port: MemoryPort) -> None:
        await trio.sleep(0.01)
        assert not host.channels.channels  # no dcid: it waits for the browser's channel
        from appliance.agents.channels import ChannelInfo

        host.channels.push(ChannelOpened(ChannelInfo(1, "oai-events")))
        await wait_for(port, "session.created")
        host.channels.push(ChannelMessage(1, "oai-events", "{"))
        err = await wait_for(port, "error")
        assert err["error"]["code"] == "invalid_json"

    await run_call("realtime", {}, script)


def test_bad_realtime_specs_fail_at_resolve() -> None:
    for spec in ("realtime:", "realtime:nope.nothing:X", f"realtime:{EXAMPLE}:Missing"):
        try:
            resolve(spec)
        except AgentError:
            continue
        raise AssertionError(spec)


async def test_session_update_noise_reduction_reaches_the_transceiver(
        autojump_clock: trio.testing.MockClock) -> None:
    """audio.input.noise_reduction set or cleared by session.update goes to the transceiver
    as a media.update event (Session turns its noise suppressor on, switches, or off); an
    update that leaves it as it was sends nothing."""
    got: list[dict[str, Any]] = []
    params = {"realtime": {"dcid": 3, "session": {
        "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}}}

    async def script(host: AgentHost, port: MemoryPort) -> None:
        host._on_event = got.append
        await trio.sleep(0.01)
        [info] = host.channels.channels.values()
        host.channels.push(ChannelOpened(info))
        await wait_for(port, "session.created")

        async def update(session: dict[str, Any]) -> None:
            host.channels.push(ChannelMessage(3, "oai-events", json.dumps(
                {"type": "session.update", "session": {"type": "realtime", **session}})))
            await trio.sleep(0.1)

        await update({"instructions": "no audio change"})
        await update({"audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
        await update({"audio": {"input": {"noise_reduction": {"type": "far_field"}}}})
        await update({"audio": {"input": {"noise_reduction": None}}})

    await run_call("realtime", params, script)
    media = [e for e in got if e.get("type") == "media.update"]
    assert media == [{"type": "media.update", "noise_reduction": "far_field"},
                     {"type": "media.update", "noise_reduction": None}]
