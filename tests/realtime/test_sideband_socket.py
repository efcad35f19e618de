"""Signaling's half of the sideband (appliance/signaling/sideband.py) against the
transceiver's half over a real control channel (a Unix socket), with a fake WebSocket:
order, the controller's events reaching the call, a bad event answered locally, a slow
reader closed with 1008 while the call goes on, detach on close, the call's end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from appliance.control import ControlClient, serve_control
from appliance.realtime import sideband as sb
from appliance.realtime.ws_session import SocketClosed
from appliance.signaling.sideband import (
    CLOSE_NORMAL,
    CLOSE_SLOW_READER,
    Attached,
    SidebandSocket,
    close_code,
)

TIMEOUT = 30


class Rig:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fed: list[tuple[str, str]] = []
        self.point = sb.SidebandPoint("rtc_rig", lambda: {"instructions": "x"},
                                      lambda text, origin: self.fed.append((text, origin)))
        self.client = ControlClient(path)

    async def handler(self, req: dict[str, Any]) -> dict[str, Any]:
        return await sb.handle_op(req["op"], req, {"rtc_rig": "connected"}.get)

    async def attach(self, **req: Any) -> Attached:
        resp = await self.client.request({"op": "realtime.attach", "session_id": "rtc_rig",
                                          **req})
        assert resp["ok"], resp
        return Attached("rtc_rig", self.path, self.client, resp["sideband_id"],
                        resp["controller"], resp["session_created"])

    def publish(self, n: int) -> None:
        for i in range(n):
            event = {"type": "response.output_text.delta", "n": i}
            self.point.publish(event, json.dumps(event), None)


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.incoming_send, self.incoming = trio.open_memory_channel[str | None](16)
        self.gate: trio.Event | None = None  # set: send blocks until it is
        self.changed = trio.Event()

    async def receive(self) -> str:
        text = await self.incoming.receive()
        if text is None:
            raise SocketClosed
        return text

    async def send(self, text: str) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.sent.append(json.loads(text))
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, cond: Any) -> None:
        while not cond():
            await self.changed.wait()


async def start(nursery: trio.Nursery, tmp_path: Path) -> Rig:
    path = str(tmp_path / "ctl.sock")
    rig = Rig(path)
    await nursery.start(serve_control, path, rig.handler)
    sb.POINTS["rtc_rig"] = rig.point
    return rig


async def test_events_in_order_and_client_events_reach_the_call(nursery: trio.Nursery,
                                                               tmp_path: Path) -> None:
    rig = await start(nursery, tmp_path)
    try:
        att = await rig.attach()
        ws = FakeSocket()
        result: list[str] = []
        done = trio.Event()

        async def run() -> None:
            result.append(await SidebandSocket(att).run(ws.receive, ws.send))
            done.set()

        with trio.fail_after(TIMEOUT):
            nursery.start_soon(run)
            await ws.until(lambda: len(ws.sent) == 1)
            assert ws.sent[0]["type"] == "session.created"
            rig.publish(50)
            await ws.until(lambda: len(ws.sent) == 51)
            assert [e["n"] for e in ws.sent[1:]] == list(range(50))
            await ws.incoming_send.send('{"type":"response.create"}')
            await ws.incoming_send.send("not json")
            await ws.until(lambda: ws.sent[-1]["type"] == "error")
            assert ws.sent[-1]["error"]["code"] == "invalid_json"
            await ws.incoming_send.send("[" * 100_000)  # too deep for json: answered too
            await ws.until(lambda: len([e for e in ws.sent if e["type"] == "error"]) == 2)
            assert rig.fed == [('{"type":"response.create"}', att.sideband_id)]
            await ws.incoming_send.send(None)  # the client closed
            await done.wait()  # after the detach request's answer
        assert result == ["client_closed"]
        assert rig.point.attachments == {} and rig.point.controller is None
    finally:
        sb.POINTS.pop("rtc_rig", None)
        await rig.client.aclose()


async def test_a_slow_reader_is_closed_and_the_call_goes_on(nursery: trio.Nursery,
                                                          tmp_path: Path) -> None:
    rig = await start(nursery, tmp_path)
    try:
        slow_att, quick_att = await rig.attach(), await rig.attach()
        slow, quick = FakeSocket(), FakeSocket()
        slow.gate = trio.Event()
        sock = SidebandSocket(slow_att, queue_limit=8)
        result: list[str] = []
        done = trio.Event()

        async def run() -> None:
            result.append(await sock.run(slow.receive, slow.send))
            done.set()

        with trio.fail_after(TIMEOUT):
            nursery.start_soon(run)
            nursery.start_soon(SidebandSocket(quick_att).run, quick.receive, quick.send)
            rig.publish(40)
            await sock.ending.wait()  # the poller saw the overflow
            assert sock.end_reason == sb.CLOSED_SLOW
            slow.gate.set()  # the half-sent frame finishes; then the session ends
            await done.wait()
            assert result == [sb.CLOSED_SLOW]
            assert close_code(result[0])[0] == CLOSE_SLOW_READER
            # the call and the other sideband go on
            rig.publish(5)
            await quick.until(lambda: len(quick.sent) == 46)
            assert slow_att.sideband_id not in rig.point.attachments
            assert not rig.point.ended
            await quick.incoming_send.send(None)
    finally:
        sb.POINTS.pop("rtc_rig", None)
        await rig.client.aclose()


async def test_the_call_ending_closes_the_socket_after_its_last_events(
        nursery: trio.Nursery, tmp_path: Path) -> None:
    rig = await start(nursery, tmp_path)
    try:
        att = await rig.attach()
        ws = FakeSocket()
        with trio.fail_after(TIMEOUT):
            sock = SidebandSocket(att)
            async with trio.open_nursery() as inner:
                inner.start_soon(sock.run, ws.receive, ws.send)
                await ws.until(lambda: len(ws.sent) == 1)
                rig.publish(3)
                rig.point.close()
        assert sock.end_reason == sb.CLOSED_ENDED
        assert close_code(sock.end_reason) == (CLOSE_NORMAL, "the call ended")
        assert [e.get("n") for e in ws.sent[1:]] == [0, 1, 2]
    finally:
        sb.POINTS.pop("rtc_rig", None)
        await rig.client.aclose()
