"""aiortc (an independent WebRTC stack: full ICE, OpenSSL DTLS, libsrtp) calls the echo agent
through a real relay process in front of real transceiver processes.

Signaling here is the transceiver's control channel itself (docs/control-protocol.md), so
this test pins the media path — relay routing by ufrag, PROXY v2, ICE-lite, DTLS, SRTP, Opus,
RTCP — independently of the HTTP layer."""

from __future__ import annotations

import asyncio
import fractions
import json
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from e2e.procs import Proc, free_udp_port, write_secret

pytestmark = [pytest.mark.interop, pytest.mark.slow]

RATE = 48000


class ToneTrack(MediaStreamTrack):
    """A 440 Hz sine at real time, 20 ms frames, mono s16."""

    kind = "audio"

    def __init__(self, freq: float = 440.0) -> None:
        super().__init__()
        self.freq = freq
        self.pts = 0
        self.start: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        target = self.start + self.pts / RATE
        delay = target - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # real-time pacing of a media source, not test sync
        n = 960
        t = (np.arange(n) + self.pts) / RATE
        samples = (0.3 * 32767 * np.sin(2 * np.pi * self.freq * t)).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, RATE)
        self.pts += n
        return frame


def control(path: str, msg: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(json.dumps(msg).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("cluster")
    secret = write_secret(tmp)
    procs: list[Proc] = []
    try:
        tports = []
        for k in range(2):
            port = free_udp_port()
            tports.append(port)
            procs.append(Proc(["transceiver", "--id", str(k), "--listen", f"127.0.0.1:{port}",
                               "--control", str(tmp / f"t{k}.sock"), "--secret-file", str(secret)],
                              "transceiver"))
        public = free_udp_port()
        procs.append(Proc(["relay", "--listen", f"127.0.0.1:{public}", "--secret-file",
                           str(secret), "--control", str(tmp / "relay.sock"),
                           *[a for k, p in enumerate(tports)
                             for a in ("--transceiver", f"{k}=127.0.0.1:{p}")]],
                          "relay listening"))
        yield {"public": public, "tmp": tmp, "procs": procs}
    finally:
        for p in reversed(procs):
            p.stop()


def dominant_hz(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * RATE / len(pcm))


async def call(cluster: dict[str, Any], k: int, seconds: float = 2.0,
               setup: str = "actpass") -> tuple[np.ndarray, str]:
    pc = RTCPeerConnection()
    pc.addTrack(ToneTrack())
    received: list[np.ndarray] = []
    got_track: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        got_track.set_result(track)

    await pc.setLocalDescription(await pc.createOffer())
    sid = uuid.uuid4().hex
    ctl = str(cluster["tmp"] / f"t{k}.sock")
    resp = await asyncio.to_thread(control, ctl, {
        # aiortc offers actpass (answered active: the transceiver is the DTLS client);
        # munged to active, the transceiver falls back to passive (docs/adr-dtls-active.md).
        "op": "create", "session_id": sid, "agent": "echo",
        "offer": pc.localDescription.sdp.replace("a=setup:actpass", f"a=setup:{setup}"),
        "candidates": [["127.0.0.1", cluster["public"]]]})
    assert resp["ok"], resp
    assert f"127.0.0.1 {cluster['public']} typ host" in resp["answer"]
    assert ("a=setup:passive" if setup == "active" else "a=setup:active") in resp["answer"]
    await pc.setRemoteDescription(RTCSessionDescription(resp["answer"], "answer"))
    track = await asyncio.wait_for(got_track, 10)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        frame = await asyncio.wait_for(track.recv(), 5)
        # aiortc decodes to packed s16; keep the first channel.
        channels = len(frame.layout.channels)
        received.append(frame.to_ndarray().reshape(-1)[::channels])
    await pc.close()
    return np.concatenate(received).astype(np.float64), sid


@pytest.mark.parametrize("setup", ["actpass", "active"], ids=["we-dtls-client", "we-dtls-server"])
@pytest.mark.parametrize("k", [0, 1])
def test_aiortc_tone_is_echoed_through_relay(cluster: dict[str, Any], k: int, setup: str) -> None:
    pcm, sid = asyncio.run(call(cluster, k, seconds=3.0, setup=setup))
    tail = pcm[-RATE:]  # the last second: well past setup
    assert np.sqrt(np.mean(tail ** 2)) > 500, "echo is silent"
    assert abs(dominant_hz(tail) - 440) < 15
    detail = control(str(cluster["tmp"] / f"t{k}.sock"), {"op": "get", "session_id": sid})
    session = detail["session"]
    assert session["transceiver"] == k
    assert session["packets_in"] > 50
    assert session["packets_out"] > 50
    assert session["timeline"]["dtls_done"] is not None
    # The flow went through the relay: the transceiver saw the client via the relay's
    # PROXY header, addressed to the public port.
    assert str(cluster["public"]) in json.dumps(session["relay_flow"])
    stats = control(str(cluster["tmp"] / "relay.sock"), {"op": "stats"})
    assert stats["flows"] >= 1
