"""Per-call parameters (TEAM.md contract, issue 17): a ``create``'s ``params`` object reaches
the agent as ``ctx.params``; one that is not a JSON object, or is over
``control.MAX_PARAMS_BYTES``, is refused (400 ``bad-params``) before anything is made."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import trio
from transceiver.support import Client

from appliance.agents import AgentContext, register
from appliance.control import MAX_PARAMS_BYTES, control_request
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

SECRETS = (b"routing-secret-for-tests-0123456",)
SEEN: list[dict[str, Any]] = []


async def probe(ctx: AgentContext) -> None:
    SEEN.append(ctx.params)


register("params-probe", probe)


async def test_params_reach_the_agent_and_bad_ones_are_refused(
    tmp_path: Path, relay_sock: socket.socket
) -> None:
    config = TransceiverConfig(id=1, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"))
    params = {"realtime": {"session": {"instructions": "hi"}, "dcid": None, "call_id": "rtc_1"}}
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None
        peer = Client(relay_sock, addrs.udp)
        base = {"op": "create", "offer": peer.offer(), "agent": "params-probe",
                "candidates": [["198.51.100.1", 3478]]}
        for i, bad in enumerate([[1], "x", {"x": "y" * MAX_PARAMS_BYTES}, {"n": float("nan")}]):
            resp = await control_request(addrs.control, {**base, "session_id": f"b{i}", "params": bad})
            assert not resp["ok"] and resp["status"] == 400 and resp["code"] == "bad-params", resp
        assert (await control_request(addrs.control, {"op": "list"}))["sessions"] == []
        resp = await control_request(addrs.control, {**base, "session_id": "c1", "params": params})
        assert resp["ok"], resp
        peer.start(resp["answer"], trio.current_time())
        with trio.fail_after(10):
            while not SEEN:  # the agent runs once DTLS is up
                await peer.pump(trio.current_time())
                await trio.sleep(0.005)  # a poll interval: the loop checks the state
        assert SEEN == [params]
        nursery.cancel_scope.cancel()


UPDATED: list[bool] = []


async def media_updater(ctx: AgentContext) -> None:
    """Asks the transceiver for noise reduction mid-call (what the Realtime shell does on a
    session.update that sets audio.input.noise_reduction)."""
    await ctx.send_event({"type": "media.update", "noise_reduction": "far_field"})
    UPDATED.append(True)
    async for _ in ctx.frames():
        pass


register("media-updater", media_updater)


async def test_media_params_build_the_stages_and_an_agent_can_change_them(
    tmp_path: Path, relay_sock: socket.socket
) -> None:
    config = TransceiverConfig(id=1, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"))
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None
        peer = Client(relay_sock, addrs.udp)
        base = {"op": "create", "offer": peer.offer(), "agent": "media-updater",
                "candidates": [["198.51.100.1", 3478]]}
        resp = await control_request(addrs.control, {
            **base, "session_id": "bad", "params": {"media": {"recorder_seconds": -1}}})
        assert resp["status"] == 400 and resp["code"] == "bad-params"
        assert "recorder_seconds" in str(resp)
        resp = await control_request(addrs.control, {
            **base, "session_id": "m1", "params": {"media": {"recorder_seconds": 5}}})
        assert resp["ok"], resp
        got = await control_request(addrs.control, {"op": "get", "session_id": "m1"})
        media = got["session"]["media"]
        assert media["in"] == ["recorder-in", "level-in"]
        assert media["out"] == ["level-out", "recorder-out"]
        assert media["recorder"]["max_frames"] == 500
        peer.start(resp["answer"], trio.current_time())
        with trio.fail_after(10):
            while not UPDATED:  # the agent runs once DTLS is up
                await peer.pump(trio.current_time())
                await trio.sleep(0.005)  # a poll interval: the loop checks the state
        got = await control_request(addrs.control, {"op": "get", "session_id": "m1"})
        media = got["session"]["media"]
        assert media["in"] == ["recorder-in", "denoise", "level-in"], media
        assert media["stages"]["denoise"]["mode"] == "far_field"
        nursery.cancel_scope.cancel()
