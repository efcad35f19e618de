"""A phone-style call end to end (issue 31 items 2 and 4): ``appliance up`` (relay,
transceiver, signaling as real processes) and an aiortc caller on ``POST
/v1/realtime/calls`` whose "microphone" is a speakerphone: its own speech (espeak-ng) plus
what it hears of the agent, played back 80 ms later at -6 dB — the echo path a telephone
or a softphone without echo cancelling gives us. The built-in realtime agent answers each
turn by playing it back, with server VAD and barge-in on.

The same call twice, once with the session's ``appliance.echo_cancellation`` off and once
on: without AEC the agent's own voice comes back as speech (``speech_started`` while its
answer plays, the answer cut: it interrupts itself); with AEC its answer plays out and
the only speech the VAD hears is the caller's."""

from __future__ import annotations

import asyncio
import fractions
import json
import math
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from e2e.procs import Proc, free_tcp_port, free_udp_port
from e2e.test_realtime_aiortc import Events
from e2e.test_up_http import http_json, in_fresh_thread
from transceiver.speech_audio import espeak

pytestmark = [pytest.mark.interop, pytest.mark.slow]
RATE = 48_000
FRAME = 960
ECHO_DELAY_FRAMES = 4  # 80 ms
ECHO_GAIN = 0.5  # -6 dB


class SpeakerphoneMic(MediaStreamTrack):
    """Real-time 20 ms frames: ``speech`` (from 0.5 s on) + noise + the agent's audio heard
    ``ECHO_DELAY_FRAMES`` frames ago at ``ECHO_GAIN``."""

    kind = "audio"

    def __init__(self, speech: np.ndarray) -> None:
        super().__init__()
        self.script = np.concatenate([np.zeros(RATE // 2), speech])
        self.k = 0
        self.start: float | None = None
        self.heard: dict[int, np.ndarray] = {}  # mic frame index -> echo to add then
        self.rng = np.random.default_rng(5)

    def hear(self, pcm: np.ndarray) -> None:
        """A frame of the agent's audio reached the loudspeaker now."""
        loop = asyncio.get_running_loop()
        if self.start is None:
            return
        slot = math.ceil((loop.time() - self.start) / 0.02) + ECHO_DELAY_FRAMES
        while slot in self.heard:
            slot += 1
        self.heard[slot] = pcm[:FRAME].astype(np.float64)

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        delay = self.start + self.k * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # real-time pacing of a media source, not test sync
        i = self.k * FRAME
        x = self.rng.normal(0, 20, FRAME)
        own = self.script[i : i + FRAME]
        x[: len(own)] += own
        echo = self.heard.pop(self.k, None)
        if echo is not None:
            x[: len(echo)] += ECHO_GAIN * echo
        samples = np.clip(x, -32768, 32767).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = i
        frame.time_base = fractions.Fraction(1, RATE)
        self.k += 1
        return frame


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("aec")
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp / "state"),
                 "--transceivers", "1"], "appliance ready", timeout=60)
    try:
        yield f"http://127.0.0.1:{http}"
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]


def multipart(sdp: str, session: dict[str, Any]) -> tuple[bytes, str]:
    boundary = "b" + secrets.token_hex(8)
    parts = [(name, value) for name, value in (("sdp", sdp), ("session", json.dumps(session)))]
    body = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in parts) + f"--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


async def phone_call(base: str, speech: np.ndarray, aec: bool) -> dict[str, Any]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = SpeakerphoneMic(speech)
    pc.addTrack(mic)
    channel = pc.createDataChannel("oai-events")
    events = Events()
    channel.on("message", lambda m: asyncio.ensure_future(events.add(m)))

    @pc.on("track")
    def _(track: Any) -> None:
        async def loudspeaker() -> None:
            while True:
                try:
                    frame = await track.recv()
                except MediaStreamError:
                    return  # the call ended
                channels = len(frame.layout.channels)
                mic.hear(frame.to_ndarray().reshape(-1)[::channels])
        asyncio.ensure_future(loudspeaker())

    session = {"type": "realtime", "appliance": {"echo_cancellation": aec},
               "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                      "silence_duration_ms": 500}}}}
    await pc.setLocalDescription(await pc.createOffer())
    body, ctype = multipart(pc.localDescription.sdp, session)
    status, headers, answer = await asyncio.to_thread(
        http_json, "POST", base + "/v1/realtime/calls", body, ctype)
    assert status == 201, answer[:300]
    call_id = headers["location"].rsplit("/", 1)[-1]
    await pc.setRemoteDescription(RTCSessionDescription(answer.decode(), "answer"))
    out: dict[str, Any] = {"aec": aec}
    try:
        await events.wait("session.created", within=20)
        await events.wait("input_audio_buffer.speech_started", within=20)  # the caller
        await events.wait("output_audio_buffer.started", within=20)  # the agent answers
        if aec:
            # The answer plays out (a few seconds); then listen a little longer for any
            # late self-interruption (the scenario's length, not a synchronisation).
            await events.wait("output_audio_buffer.stopped", within=30)
            await asyncio.sleep(1.5)
        else:
            await events.wait("input_audio_buffer.speech_started", 2, within=30)
            await events.wait("output_audio_buffer.cleared", within=10)
        status, _, view = await asyncio.to_thread(
            http_json, "GET", f"{base}/v1/realtime/calls/{call_id}")
        assert status == 200, view[:300]
        out["media"] = json.loads(view)["media"]["media"]
    finally:
        await pc.close()
        await asyncio.to_thread(http_json, "DELETE", f"{base}/v1/realtime/calls/{call_id}")
    out["events"] = list(events.got)
    return out


def self_interruptions(events: list[dict[str, Any]]) -> int:
    """speech_started events while an answer of the agent was playing."""
    playing, n = False, 0
    for e in events:
        kind = e["type"]
        if kind == "output_audio_buffer.started":
            playing = True
        elif kind in ("output_audio_buffer.stopped", "output_audio_buffer.cleared"):
            playing = False
        elif kind == "input_audio_buffer.speech_started" and playing:
            n += 1
    return n


def first_phrase(x: np.ndarray) -> np.ndarray:
    """Up to the first pause of 300 ms or more: one turn (a longer pause inside it would
    end the turn, and the caller talking on would be a real barge-in)."""
    e = np.sqrt((x[: len(x) // FRAME * FRAME].reshape(-1, FRAME) ** 2).mean(axis=1))
    quiet = 0
    for i, v in enumerate(e):
        quiet = quiet + 1 if v < 300 else 0
        if quiet >= 15 and i > 50:
            return x[: (i - quiet + 1) * FRAME]
    return x


# Issue 31: this test's failures (ERLE 0.2 dB at a 194 ms estimate in CI; a 297 ms
# estimate under .ci/hog.py) were the echo path stepping — by a frame, or by a stall's
# worth — late in the agent's answer (this caller's playout is an asyncio consumer: under
# load it slips), which the gate let through until D moved. The microphone stayed in place
# (the stage's own streams, dumped from 14 hog runs). While the filter has slipped the gate
# now judges as for an unknown delay (stages/aec.py; tests/transceiver/test_aec_timing.py
# has the steps as unit tests). 20 runs in a row passed after that, 10 under the hog.
def test_aec_keeps_the_agent_from_interrupting_itself(up: str, tmp_path: Path) -> None:
    speech = first_phrase(espeak(0))
    assert 2.0 < len(speech) / RATE < 4.0
    results = {}
    for aec in (False, True):
        results[aec] = in_fresh_thread(
            lambda aec=aec: asyncio.run(phone_call(up, speech, aec)), timeout=120)
    for aec, r in results.items():
        print("aec" if aec else "no aec", [e["type"] for e in r["events"]
                                             if "audio_buffer" in e["type"]],
              r["media"]["stages"].get("aec"))
    off, on = results[False], results[True]
    # Without AEC: its own voice came back as the caller's speech, and the answer was cut.
    assert "aec" not in off["media"]["in"]
    assert self_interruptions(off["events"]) >= 1
    assert any(e["type"] == "output_audio_buffer.cleared" for e in off["events"])
    # With AEC: the stage ran, found the echo's delay, and the agent was never cut off.
    assert "aec" in on["media"]["in"]
    stats = on["media"]["stages"]["aec"]
    assert stats["gated"] > 0
    assert self_interruptions(on["events"]) == 0, [e["type"] for e in on["events"]]
    assert not any(e["type"] == "output_audio_buffer.cleared" for e in on["events"])
    starts = [e for e in on["events"] if e["type"] == "input_audio_buffer.speech_started"]
    assert len(starts) == 1  # the caller's one sentence, and nothing of the agent's
