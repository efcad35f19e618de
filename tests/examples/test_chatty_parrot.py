"""examples/chatty_parrot.py through real relay and transceiver processes, with aiortc as
the caller (audio and a "chat" data channel on one bundled transport): the parrot
announces each turn on the channel as JSON and answers typed messages, while its audio
turn taking works as the plain parrot's."""

from __future__ import annotations

import asyncio
import fractions
import json
import uuid
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from e2e.test_aiortc_relay import RATE, cluster, control

pytestmark = [pytest.mark.interop, pytest.mark.slow]

__all__ = ["cluster"]  # the module fixture, re-used
AGENT = str(Path(__file__).resolve().parents[2] / "examples" / "chatty_parrot.py") + ":ChattyParrot"
TALK_S = 0.8  # one utterance, then silence: the parrot's turn


class OneUtterance(MediaStreamTrack):
    """0.8 s of a 440 Hz tone, then silence, at real time (20 ms frames, mono s16)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.pts = 0
        self.start: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        delay = self.start + self.pts / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # real-time pacing of a media source, not test sync
        n = 960
        t = (np.arange(n) + self.pts) / RATE
        amp = 0.3 * 32767 if self.pts < TALK_S * RATE else 0.0
        samples = (amp * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.pts, fractions.Fraction(1, RATE)
        self.pts += n
        return frame


async def session(cluster: dict[str, Any]) -> list[Any]:
    pc = RTCPeerConnection()
    pc.addTrack(OneUtterance())
    chat = pc.createDataChannel("chat")
    got: list[Any] = []
    arrived = asyncio.Event()

    @chat.on("message")
    def _(message: Any) -> None:
        got.append(message)
        arrived.set()

    async def until(cond: Any, what: str) -> None:
        try:
            async with asyncio.timeout(15):
                while not cond():
                    arrived.clear()
                    await arrived.wait()
        except TimeoutError:
            raise AssertionError(f"{what}: got {got}") from None

    await pc.setLocalDescription(await pc.createOffer())
    resp = await asyncio.to_thread(control, str(cluster["tmp"] / "t0.sock"), {
        "op": "create", "session_id": uuid.uuid4().hex, "offer": pc.localDescription.sdp,
        "agent": AGENT, "candidates": [["127.0.0.1", cluster["public"]]]})
    assert resp["ok"], resp
    await pc.setRemoteDescription(RTCSessionDescription(resp["answer"], "answer"))
    turns = lambda: [json.loads(m)["state"] for m in got if m.startswith("{")]  # noqa: E731
    # Opened: listening. The caller speaks 0.8 s, then 600 ms of silence: the parrot
    # speaks it back, and when it is done the floor is the caller's again.
    await until(lambda: turns()[:3] == ["listening", "speaking", "listening"], "three turns")
    chat.send("hello")
    await until(lambda: "Polly says: hello" in got, "the reply")
    await pc.close()
    return got


def test_chatty_parrot_announces_turns_and_answers(cluster: dict[str, Any]) -> None:
    got = asyncio.run(session(cluster))
    events = [json.loads(m) for m in got if m.startswith("{")]
    assert events[:3] == [{"type": "turn", "state": s} for s in ("listening", "speaking", "listening")]
    assert got[-1] == "Polly says: hello"
