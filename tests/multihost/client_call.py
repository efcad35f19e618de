"""The client host of the multi-host test: one aiortc call, run inside the client network
namespace (``ip netns exec NS python client_call.py ...``); prints one JSON object.

Signaling is the transceiver's control channel (a Unix socket on the shared filesystem, which
crosses network namespaces), exactly as in tests/e2e/test_aiortc_relay.py. Every datagram
aioice receives is recorded with its source address, so the test can prove the client only
ever heard from the global relay."""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import socket
import sys
import uuid
from typing import Any

import av
import numpy as np
from aioice import ice
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription

RATE = 48000
SOURCES: set[str] = set()

_orig_received = ice.StunProtocol.datagram_received


def _recording_received(self: Any, data: Any, addr: tuple[Any, ...]) -> None:
    SOURCES.add(f"{addr[0]}:{addr[1]}")
    _orig_received(self, data, addr)


ice.StunProtocol.datagram_received = _recording_received  # type: ignore[method-assign]


class ToneTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, freq: float) -> None:
        super().__init__()
        self.freq = freq
        self.pts = 0
        self.start: float | None = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        delay = self.start + self.pts / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # real-time pacing of a media source
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
            if not chunk:
                raise ConnectionError("control channel closed")
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out


def dominant_hz(pcm: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm))))
    return float(np.argmax(spectrum) * RATE / len(pcm))


async def call(args: argparse.Namespace) -> dict[str, Any]:
    pc = RTCPeerConnection()
    pc.addTrack(ToneTrack(args.freq))
    got: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        got.set_result(track)

    await pc.setLocalDescription(await pc.createOffer())
    sid = uuid.uuid4().hex
    host, port = args.candidate.rsplit(":", 1)
    resp = await asyncio.to_thread(control, args.control, {
        "op": "create", "session_id": sid, "offer": pc.localDescription.sdp, "agent": "echo",
        "candidates": [[host, int(port)]]})
    if not resp.get("ok"):
        return {"ok": False, "error": resp}
    answer = resp["answer"]
    print(json.dumps({"event": "answered", "session_id": sid}), flush=True)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    track = await asyncio.wait_for(got, 10)
    loop = asyncio.get_running_loop()
    start = loop.time()
    per_second: list[list[np.ndarray]] = []
    while loop.time() < start + args.seconds:
        frame = await asyncio.wait_for(track.recv(), 5)
        channels = len(frame.layout.channels)
        second = int(loop.time() - start)
        while len(per_second) <= second:
            per_second.append([])
        per_second[second].append(frame.to_ndarray().reshape(-1)[::channels])
    await pc.close()
    seconds = []
    for chunks in per_second:
        pcm = np.concatenate(chunks).astype(np.float64) if chunks else np.zeros(RATE)
        seconds.append({"rms": float(np.sqrt(np.mean(pcm ** 2))), "hz": dominant_hz(pcm)})
    return {
        "ok": True, "session_id": sid,
        "answer_candidates": [line for line in answer.splitlines()
                              if line.startswith("a=candidate")],
        "sources": sorted(SOURCES), "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--control", required=True)
    p.add_argument("--candidate", required=True, help="HOST:PORT of the global relay")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--freq", type=float, default=440.0)
    args = p.parse_args()
    result = asyncio.run(call(args))
    print(json.dumps({"event": "result", **result}), flush=True)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
