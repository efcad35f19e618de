"""Data channels end to end with an independent SCTP (aiortc's), through a real relay and
transceiver processes: audio and channels on one bundled transport.

* the built-in ``echo`` (a synchronous handler in the network loop) echoes every message on
  the channel it came from: a DCEP-opened ordered channel and an unordered, partially
  reliable one; empty, small, 16 KiB and 64 KiB messages (aiortc takes 64 KiB); a burst of
  1,000; a close from the client answered with the transceiver's own reset;
* an in-process agent task (tests/e2e/dc_agent.py) opens a pre-negotiated channel (id 10,
  no DCEP) before SCTP is up and answers on it.
The session detail counts it all."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from e2e.test_aiortc_relay import ToneTrack, cluster, control

pytestmark = [pytest.mark.interop, pytest.mark.slow]

__all__ = ["cluster"]  # the module fixture, re-used
TASK_AGENT = str(Path(__file__).with_name("dc_agent.py")) + ":agent"


class Client:
    """An aiortc peer with audio and data channels, set up over the control channel."""

    def __init__(self, cluster: dict[str, Any], agent: str, *, audio: bool = True) -> None:
        self.cluster, self.agent = cluster, agent
        self.pc = RTCPeerConnection()
        if audio:  # without: a data-only offer (only an m=application section)
            self.pc.addTrack(ToneTrack())
        self.got: dict[str, list[Any]] = {}
        self._want: dict[str, tuple[int, asyncio.Event]] = {}
        self.ctl = str(cluster["tmp"] / "t0.sock")
        self.sid = uuid.uuid4().hex

    def channel(self, label: str, **kw: Any) -> RTCDataChannel:
        ch = self.pc.createDataChannel(label, **kw)
        self.got[label] = []

        @ch.on("message")
        def _(message: Any) -> None:
            self.got[label].append(message)
            want = self._want.get(label)
            if want is not None and len(self.got[label]) >= want[0]:
                want[1].set()

        return ch

    async def connect(self, first: RTCDataChannel) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        resp = await asyncio.to_thread(control, self.ctl, {
            "op": "create", "session_id": self.sid, "offer": self.pc.localDescription.sdp,
            "agent": self.agent, "candidates": [["127.0.0.1", self.cluster["public"]]]})
        assert resp["ok"], resp
        assert "m=application" in resp["answer"] and "a=sctp-port:5000" in resp["answer"]
        await self.pc.setRemoteDescription(RTCSessionDescription(resp["answer"], "answer"))
        opened = asyncio.Event()
        first.on("open", opened.set)
        if first.readyState != "open":
            await asyncio.wait_for(opened.wait(), 15)

    async def round_trip(self, ch: RTCDataChannel, messages: list[Any]) -> list[Any]:
        label = ch.label
        start = len(self.got[label])
        done = asyncio.Event()
        self._want[label] = (start + len(messages), done)
        for m in messages:
            ch.send(m)
        try:
            await asyncio.wait_for(done.wait(), 20)
        except TimeoutError:
            n = len(self.got[label]) - start
            raise AssertionError(f"{label}: {n} of {len(messages)} came back") from None
        return self.got[label][start:]

    async def session(self) -> dict[str, Any]:
        resp = await asyncio.to_thread(control, self.ctl, {"op": "get", "session_id": self.sid})
        session: dict[str, Any] = resp["session"]
        return session

    async def detail(self) -> dict[str, Any]:
        channels: dict[str, Any] = (await self.session())["datachannels"]
        return channels


async def echo_session(cluster: dict[str, Any]) -> dict[str, Any]:
    c = Client(cluster, "echo")
    chat = c.channel("chat")
    lossy = c.channel("lossy", ordered=False, maxRetransmits=0)
    await c.connect(chat)
    out: dict[str, Any] = {}
    out["small"] = await c.round_trip(chat, ["", "x", b"", b"\x01", "héllo"])
    out["big"] = await c.round_trip(chat, [bytes(range(256)) * 64, "y" * 65536])
    out["burst"] = await c.round_trip(chat, [f"m{i}" for i in range(1000)])
    out["lossy"] = await c.round_trip(lossy, ["fast"])
    out["detail"] = await c.detail()
    closed = asyncio.Event()
    chat.on("close", closed.set)
    chat.close()
    await asyncio.wait_for(closed.wait(), 10)  # needs the transceiver's reset (RFC 8831 §6.7)
    # aiortc's close fires on our reset request; our table drops the channel when aiortc's
    # answer to it arrives, a moment later: poll the server's view (bounded).
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        out["after_close"] = [ch["label"] for ch in (await c.detail())["open"]]
        if "chat" not in out["after_close"] or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.02)
    await c.pc.close()
    return out


async def task_agent_session(cluster: dict[str, Any]) -> dict[str, Any]:
    c = Client(cluster, TASK_AGENT)
    chat = c.channel("chat")
    pre = c.channel("pre", negotiated=True, id=10)
    await c.connect(chat)
    out = {"chat": await c.round_trip(chat, ["hi", b"\x00"]),
           "pre": await c.round_trip(pre, ["negotiated"]),
           "detail": await c.detail()}
    await c.pc.close()
    return out


def test_echo_agent_echoes_every_message_on_its_channel(cluster: dict[str, Any]) -> None:
    out = asyncio.run(echo_session(cluster))
    assert out["small"] == ["", "x", b"", b"\x01", "héllo"]  # text stays text, empty stays
    assert out["big"] == [bytes(range(256)) * 64, "y" * 65536]
    assert out["burst"] == [f"m{i}" for i in range(1000)]  # ordered channel: in order
    assert out["lossy"] == ["fast"]
    channels = out["detail"]
    assert channels["sctp"] == "connected"
    by_label = {ch["label"]: ch for ch in channels["open"]}
    assert by_label["lossy"]["ordered"] is False and by_label["lossy"]["max_retransmits"] == 0
    assert channels["messages_in"] == channels["messages_out"] == 5 + 2 + 1000 + 1
    assert channels["bytes_in"] == channels["bytes_out"] > 65536 + 16384
    assert "chat" not in out["after_close"] and "lossy" in out["after_close"]


def test_agent_task_opens_a_negotiated_channel_and_answers(cluster: dict[str, Any]) -> None:
    out = asyncio.run(task_agent_session(cluster))
    assert out["chat"] == ["chat:hi", b"\x00"]
    assert out["pre"] == ["pre:negotiated"]
    negotiated = {ch["label"]: ch["negotiated"] for ch in out["detail"]["open"]}
    assert negotiated == {"chat": False, "pre": True}


async def data_only_session(cluster: dict[str, Any], agent: str) -> dict[str, Any]:
    c = Client(cluster, agent, audio=False)
    chat = c.channel("chat")
    await c.pc.setLocalDescription(await c.pc.createOffer())
    offer = c.pc.localDescription.sdp
    await c.connect(chat)
    out = {"offer": offer, "chat": await c.round_trip(chat, ["hi", b"\x00", "z" * 65536]),
           "session": await c.session()}
    await c.pc.close()
    return out


@pytest.mark.parametrize("agent", ["echo", TASK_AGENT], ids=["echo", "task-agent"])
def test_data_only_session_with_aiortc(cluster: dict[str, Any], agent: str) -> None:
    """An offer with only an application section (RFC 8841, no audio) is a data-only
    session: answered with the application line alone, no SRTP, no codec; the built-in echo
    (synchronous) and an agent task (whose frames() simply has nothing) both get the
    channel."""
    out = asyncio.run(data_only_session(cluster, agent))
    assert "m=audio" not in out["offer"] and "m=application" in out["offer"]
    prefix = "" if agent == "echo" else "chat:"
    assert out["chat"][0] == prefix + "hi" and out["chat"][1] == b"\x00"
    assert out["chat"][2] == prefix + "z" * 65536
    session = out["session"]
    assert session["state"] == "connected" and session["codec"] is None
    assert session["srtp_profile"] is None and session["packets_out"] == 0
    assert session["datachannels"]["sctp"] == "connected"
