"""Recordings end to end (issue 29 item 5): ``appliance up --record`` (relay, transceiver,
signaling as real processes) and an aiortc caller whose microphone sends 440 Hz bursts to
the echo agent. Once the call has ended, ``GET /v1/realtime/calls/{id}/recording`` gives a
stereo WAV whose left channel (the caller) carries the bursts and whose right channel (the
agent) carries their echo, a little later: the two directions are on one time axis. While
the file is being written, and for a call that was never recorded, the route says so."""

from __future__ import annotations

import asyncio
import fractions
import io
import json
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from e2e.procs import Proc, free_tcp_port, free_udp_port
from e2e.test_up_http import http_json, in_fresh_thread

from appliance.transceiver.recording import TOLERANCE

pytestmark = [pytest.mark.interop, pytest.mark.slow]
RATE = 48_000
BURST, PERIOD = 0.2, 0.5  # s of tone, s from one burst's start to the next


class BurstTrack(MediaStreamTrack):
    """440 Hz bursts at real time: ``BURST`` s on in every ``PERIOD`` s."""

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
        on = (t % PERIOD) < BURST
        samples = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t) * on).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, RATE)
        self.pts += 960
        return frame


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("rec")
    http, udp = free_tcp_port(), free_udp_port()
    proc = Proc(["up", "--http", f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}",
                 "--public-address", "127.0.0.1", "--state-dir", str(tmp / "state"),
                 "--transceivers", "1", "--record", "--recording-quota", "200M",
                 "--recording-retention", "1d"], "appliance ready", timeout=60)
    try:
        yield f"http://127.0.0.1:{http}", tmp / "state" / "recordings"
    finally:
        rc = proc.stop()
    assert rc == 0, "".join(proc.stderr)[-3000:]


async def echo_call(base: str, seconds: float) -> tuple[str, int, dict[str, Any]]:
    """A call of ``seconds`` of echoed audio (counted from the first echo heard); returns
    (session id, echo frames heard, the recording route's answer while the call was up)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(BurstTrack())
    loud = 0
    heard = asyncio.Event()

    @pc.on("track")
    def _(track: Any) -> None:
        async def drain() -> None:
            nonlocal loud
            while True:
                frame = await track.recv()
                if float(np.abs(frame.to_ndarray()).max()) > 3000:
                    loud += 1
                    heard.set()
        asyncio.ensure_future(drain())

    await pc.setLocalDescription(await pc.createOffer())
    status, headers, body = await asyncio.to_thread(
        http_json, "POST", base + "/v1/sessions", pc.localDescription.sdp.encode(),
        "application/sdp")
    assert status == 201, body[:300]
    sid = headers["location"].rsplit("/", 1)[-1]
    await pc.setRemoteDescription(RTCSessionDescription(body.decode(), "answer"))
    try:
        await asyncio.wait_for(heard.wait(), 20)
        await asyncio.sleep(seconds)  # the scenario's length, not a synchronisation
        live = await asyncio.to_thread(
            http_json, "GET", f"{base}/v1/realtime/calls/{sid}/recording")
    finally:
        await pc.close()
    status, _, body = await asyncio.to_thread(http_json, "DELETE", f"{base}/v1/sessions/{sid}")
    assert status in (200, 204, 404), body[:200]
    return sid, loud, {"status": live[0], "body": json.loads(live[2])}


def fetch_recording(base: str, sid: str) -> bytes:
    """The finished recording: polled while the route says it is being written."""
    deadline = time.monotonic() + 30
    while True:
        status, headers, body = http_json("GET", f"{base}/v1/realtime/calls/{sid}/recording")
        if status == 200:
            assert headers["content-type"] == "audio/wav"
            return body
        assert status == 404, body[:300]
        assert json.loads(body)["error"]["code"] == "recording_in_progress", body
        assert time.monotonic() < deadline, "the recording was never finalised"
        time.sleep(0.1)  # polling a condition (the file's completion), bounded above


def envelope(x: np.ndarray) -> np.ndarray:
    """RMS per 10 ms."""
    n = len(x) // 480 * 480
    return np.sqrt((x[:n].astype(np.float64).reshape(-1, 480) ** 2).mean(axis=1))


def dominant_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * RATE / len(x))


def test_recorded_call_has_the_caller_left_and_the_echo_right(up: tuple[str, Path]) -> None:
    base, directory = up
    sid, loud, live = in_fresh_thread(lambda: asyncio.run(echo_call(base, 3.0)))
    assert loud >= 30, loud  # the echo agent answered
    assert live["status"] == 404 and live["body"]["error"]["code"] == "recording_in_progress"
    data = fetch_recording(base, sid)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
    assert len(pcm) >= 3 * RATE, len(pcm) / RATE
    left, right = pcm[:, 0].astype(np.float64), pcm[:, 1].astype(np.float64)
    # Both channels carry the 440 Hz bursts (the last 2 s, well past setup).
    for channel in (left, right):
        tail = channel[-2 * RATE :]
        assert np.sqrt(np.mean(tail ** 2)) > 1000
        assert abs(dominant_hz(tail) - 440) < 10
    # On one time axis: the right channel's bursts follow the left's by the echo's round
    # trip through the agent (a few frames), not by nothing and not by a burst period.
    el, er = envelope(left[-2 * RATE :]), envelope(right[-2 * RATE :])
    el, er = el - el.mean(), er - er.mean()
    lags = range(-20, 21)  # ±200 ms in 10 ms steps (less than half a burst period)
    corr = [float(np.dot(el[max(0, -k) : len(el) - max(0, k)], er[max(0, k) : len(er) - max(0, -k)]))
            for k in lags]
    lag_ms = 10 * lags[int(np.argmax(corr))]
    # A frame is laid right after its direction's previous one while that is within the
    # aligner's tolerance of its own clock position (recording.py TOLERANCE, 100 ms), so a
    # loop that handed the tap a burst (a busy box) may lay the echo up to that far ahead
    # of its true place: stress runs measured -10 and -100 ms. Within the tolerance (and
    # an envelope step), never a burst period. (CI on 2026-12-06 measured -200: a stall
    # longer than the tolerance had pushed one direction a burst ahead for the rest of the
    # call; the aligner now moves such a burst back, tests/transceiver/test_recording.py.)
    tolerance_ms = 1000 * TOLERANCE / RATE
    assert -tolerance_ms - 10 <= lag_ms <= 120, lag_ms
    meta = json.loads((directory / f"{sid}.json").read_text())
    assert meta["complete"] is True and meta["stopped"] is None
    assert meta["duration_seconds"] == pytest.approx(len(pcm) / RATE, abs=0.01)


def test_recording_route_errors(up: tuple[str, Path]) -> None:
    base, _ = up
    status, _, body = http_json("GET", f"{base}/v1/realtime/calls/rtc_nosuchcall/recording")
    assert status == 404 and json.loads(body)["error"]["code"] == "recording_not_found"
    status, _, body = http_json("GET", f"{base}/v1/realtime/calls/..%2Fx/recording")
    assert status == 404
    status, headers, _ = http_json("DELETE", f"{base}/v1/realtime/calls/rtc_x/recording")
    assert status == 405 and headers["allow"] == "GET, OPTIONS"


async def realtime_call(base: str, session: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A short call on POST /v1/realtime/calls with ``session``; (call id, its media view)."""
    from e2e.test_aec_phone_up import multipart

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTrack(BurstTrack())
    pc.createDataChannel("oai-events")
    connected = asyncio.Event()

    @pc.on("connectionstatechange")
    def _() -> None:
        if pc.connectionState == "connected":
            connected.set()

    await pc.setLocalDescription(await pc.createOffer())
    body, ctype = multipart(pc.localDescription.sdp, session)
    status, headers, answer = await asyncio.to_thread(
        http_json, "POST", base + "/v1/realtime/calls", body, ctype)
    assert status == 201, answer[:300]
    call_id = headers["location"].rsplit("/", 1)[-1]
    await pc.setRemoteDescription(RTCSessionDescription(answer.decode(), "answer"))
    try:
        await asyncio.wait_for(connected.wait(), 20)
        await asyncio.sleep(1.0)  # a second of audio: the scenario, not a synchronisation
        status, _, view = await asyncio.to_thread(
            http_json, "GET", f"{base}/v1/realtime/calls/{call_id}")
        assert status == 200, view[:300]
    finally:
        await pc.close()
        await asyncio.to_thread(http_json, "DELETE", f"{base}/v1/realtime/calls/{call_id}")
    return call_id, json.loads(view)["media"]["media"]


def test_a_call_opts_out_through_its_session(up: tuple[str, Path]) -> None:
    """Under --record, ``session.appliance.record: false`` leaves that call unrecorded;
    ``true`` (the default here) records it."""
    base, _ = up
    out_id, out_media = in_fresh_thread(lambda: asyncio.run(realtime_call(
        base, {"type": "realtime", "appliance": {"record": False}})))
    in_id, in_media = in_fresh_thread(lambda: asyncio.run(realtime_call(
        base, {"type": "realtime", "appliance": {"record": True}})))
    assert out_media["recording"] is None and "recorder-in" not in out_media["in"]
    assert in_media["recording"]["state"] == "recording"
    with wave.open(io.BytesIO(fetch_recording(base, in_id))) as w:
        assert w.getnchannels() == 2 and w.getnframes() > 0
    status, _, body = http_json("GET", f"{base}/v1/realtime/calls/{out_id}/recording")
    assert status == 404 and json.loads(body)["error"]["code"] == "recording_not_found"
