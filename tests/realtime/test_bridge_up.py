"""The upstream bridge end to end: aiortc (an independent WebRTC stack: ICE, OpenSSL DTLS,
libsrtp, its own SCTP) calls ``appliance up --agent realtime+ws://…`` over the plain
``POST /v1/sessions`` route with audio and a DCEP-opened ``oai-events`` channel; the agent
spec points at the schema-checking Realtime WebSocket server of rt_server.py, run by this
test. Checked:

* the caller's tone reaches the upstream as ``input_audio_buffer.append`` (24 kHz, 440 Hz);
* the upstream's VAD turn and reply come back: its 1 kHz audio as RTP (Opus), its events on
  the channel (``session.created`` first, ``response.done``; never an audio delta), plus the
  bridge's ``output_audio_buffer.started`` / ``stopped``;
* every event the upstream received is a valid GA client event (no violations), the
  handshake carried the key, and the key appears in no log line (debug logging on);
* the upstream dropping the socket sends an ``error`` event and ends the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import trio
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from e2e.procs import Proc, free_tcp_port, free_udp_port
from e2e.test_up_http import http_json
from realtime.rt_server import Upstream
from trio_websocket import serve_websocket

pytestmark = [pytest.mark.interop, pytest.mark.slow]

RATE = 48_000
KEY = "sk-e2e-" + "k3y" * 10
TALK_S = 0.6


class Utterance(MediaStreamTrack):
    """0.6 s of 440 Hz, then silence, at real time (20 ms frames, mono s16)."""

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
        t = (np.arange(960) + self.pts) / RATE
        amp = 0.3 * 32767 if self.pts < TALK_S * RATE else 0.0
        samples = (amp * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.pts, fractions.Fraction(1, RATE)
        self.pts += 960
        return frame


@pytest.fixture
def appliance_up(tmp_path: Path) -> Iterator[tuple[str, Proc, list[int]]]:
    """``up`` whose agent is the bridge to the port the test's server will listen on."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    holder.close()  # the test's server binds it next (nothing else binds ephemeral ports here)
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp_path / "state"),
                 "--transceivers", "1", "--log-level", "debug", "--agent",
                 f"realtime+ws://127.0.0.1:{port}/v1/realtime?model=x"],
                "appliance ready", timeout=60, env={"APPLIANCE_REALTIME_KEY": KEY})
    try:
        yield f"http://127.0.0.1:{http}", proc, [port]
    finally:
        proc.stop()


async def client(base: str, up: Upstream, token: trio.lowlevel.TrioToken) -> dict[str, Any]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(Utterance())
    events: list[dict[str, Any]] = []
    arrived = asyncio.Event()
    channel = pc.createDataChannel("oai-events")  # DCEP, as OpenAI's WebRTC guide does

    @channel.on("message")
    def _(message: Any) -> None:
        events.append(json.loads(message))
        arrived.set()

    async def until(kind: str, what: str, seconds: float = 20) -> dict[str, Any]:
        try:
            async with asyncio.timeout(seconds):
                while not any(e["type"] == kind for e in events):
                    arrived.clear()
                    await arrived.wait()
        except TimeoutError:
            raise AssertionError(f"{what}: got {[e['type'] for e in events]}") from None
        return next(e for e in events if e["type"] == kind)

    loop = asyncio.get_running_loop()
    got_track: asyncio.Future[MediaStreamTrack] = loop.create_future()
    pc.on("track", got_track.set_result)
    received: list[np.ndarray] = []
    await pc.setLocalDescription(await pc.createOffer())
    status, headers, body = await asyncio.to_thread(
        http_json, "POST", base + "/v1/sessions", pc.localDescription.sdp.encode(),
        "application/sdp")
    assert status == 201, (status, body[:500])
    location = headers["location"]
    await pc.setRemoteDescription(RTCSessionDescription(body.decode(), "answer"))
    track = await asyncio.wait_for(got_track, 10)

    async def drain() -> None:
        while True:
            frame = await track.recv()
            channels = len(frame.layout.channels)
            received.append(frame.to_ndarray().reshape(-1)[::channels])

    drainer = asyncio.ensure_future(drain())
    try:
        await until("session.created", "the session")
        await until("output_audio_buffer.stopped", "a turn answered and played", 30)
        reply = np.concatenate(received) if received else np.zeros(0)
        # Now the upstream goes away: the caller is told, and the call ends.
        await asyncio.to_thread(trio.from_thread.run, up.disconnect, 1011, "upstream crashed",
                                trio_token=token)
        error = await until("error", "the error event")
        deadline = loop.time() + 15
        while True:
            _, _, raw = await asyncio.to_thread(http_json, "GET", base + location)
            session = json.loads(raw)
            if session["state"] == "ended":
                break
            assert loop.time() < deadline, session
            await asyncio.sleep(0.1)  # polling the HTTP API: no push channel for it
    finally:
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drainer
        await pc.close()
    return {"events": events, "reply": reply, "error": error, "session": session}


async def test_aiortc_through_up_to_an_upstream_realtime_server(
    appliance_up: tuple[str, Proc, list[int]]
) -> None:
    base, proc, (port,) = appliance_up
    up = Upstream(reply_seconds=1.0)
    token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_websocket, up.handle, "127.0.0.1", port,
                                    ssl_context=None))
        out = await trio.to_thread.run_sync(lambda: asyncio.run(client(base, up, token)))
        nursery.cancel_scope.cancel()
    kinds = [e["type"] for e in out["events"]]
    # Upstream side: the key, GA-valid events only, the caller's audio as appends.
    assert up.headers[0]["authorization"] == f"Bearer {KEY}"
    assert up.violations == []
    assert "input_audio_buffer.append" in up.kinds()
    appended = np.frombuffer(bytes(up.appended), "<i2").astype(np.float64)
    first = appended[np.argmax(np.abs(appended) > 2000):][: int(0.4 * 24_000)]
    spectrum = np.abs(np.fft.rfft(first * np.hanning(len(first))))
    assert np.argmax(spectrum) * 24_000 / len(first) == pytest.approx(440, abs=30)
    # Browser side: events through, the bridge's playout events, no audio delta.
    assert kinds[0] == "session.created"
    for k in ("input_audio_buffer.speech_started", "response.created", "response.done",
              "output_audio_buffer.started", "output_audio_buffer.stopped"):
        assert k in kinds, (k, kinds)
    assert "response.output_audio.delta" not in kinds
    # The reply's audio came back as RTP: ~1 s of 1 kHz.
    reply = out["reply"].astype(np.float64)
    loud = [reply[i : i + 960] for i in range(0, len(reply) - 960, 960)
            if np.abs(reply[i : i + 960]).max() > 3000]
    assert len(loud) >= 40, len(loud)
    joined = np.concatenate(loud)
    peak = np.argmax(np.abs(np.fft.rfft(joined * np.hanning(len(joined))))) * RATE / len(joined)
    assert peak == pytest.approx(1000, abs=30)
    # The upstream dropping the socket: an error event, then the call ended with the reason.
    assert out["error"]["error"]["code"] == "upstream_disconnected"
    assert out["session"]["end_reason"].startswith("agent: upstream: closed 1011"), out["session"]
    proc.stop()
    logs = "".join(proc.stdout + proc.stderr)
    assert "realtime" in logs and KEY not in logs
