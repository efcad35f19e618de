"""An agent's ``turn.metrics`` events (issue 38 item 5) become the session object's
``turns`` — kept to their shape (appliance/session_info.py ``turn_line``) — which the
control channel's ``get`` and ``list`` carry to signaling (its end-of-call report, the
``appliance_turn_*_seconds`` histograms, the dashboard)."""

from __future__ import annotations

import socket
from pathlib import Path

import trio
from agents.turn_agent import TURN
from transceiver.support import Client, sine

from appliance.control import control_request
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.server import TransceiverAddresses, TransceiverConfig, serve_transceiver

SECRETS = (b"routing-secret-for-tests-0123456",)
AGENT = f"{Path(__file__).parents[1] / 'agents' / 'turn_agent.py'}:agent"


async def test_turn_metrics_reach_the_session_object(tmp_path: Path,
                                                     relay_sock: socket.socket) -> None:
    config = TransceiverConfig(id=1, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"))
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.control is not None
        client = Client(relay_sock, addrs.udp)
        resp = await control_request(addrs.control, {
            "op": "create", "session_id": "t1", "offer": client.offer(), "agent": AGENT,
            "candidates": [["198.51.100.1", 3478]]})
        assert resp["ok"], resp
        client.start(resp["answer"], trio.current_time())
        encoder = OpusEncoder()
        get = {"op": "get", "session_id": "t1"}
        with trio.fail_after(10):  # a hang guard: until the agent has reported its turn
            while client.srtp is None:
                await client.pump(trio.current_time())
                await trio.sleep(0.005)  # a poll interval: the loop checks the state
            for pcm in sine(440, 15):
                await client.send_audio(pcm, encoder)
            while not (await control_request(addrs.control, get))["session"]["turns"]:
                await client.pump(trio.current_time())
                await trio.sleep(0.005)  # a poll interval: the loop checks the state
        session = (await control_request(addrs.control, get))["session"]
        # The well-formed event, without what is not a mark; the one with no turn dropped.
        assert session["turns"] == [TURN]
        listed = (await control_request(addrs.control, {"op": "list"}))["sessions"]
        assert [s["turns"] for s in listed] == [[TURN]]
        await control_request(addrs.control, {"op": "delete", "session_id": "t1"})
        ended = (await control_request(addrs.control, get))["session"]
        assert ended["state"] == "ended" and ended["turns"] == [TURN]  # kept once it ended
        nursery.cancel_scope.cancel()
