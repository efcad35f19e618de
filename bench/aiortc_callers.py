"""N aiortc calls in a process of their own, for ``bench/relay_failover.py --aiortc N``.

Each call is an aiortc peer (full ICE agent, OpenSSL DTLS, libsrtp, aiortc's jitter buffer
and Opus decoder) set up with ``POST BASE/v1/sessions`` and sending a 440 Hz tone at real
time, as an independent client would; all share one asyncio loop, apart from the bench's own
calls (issue 41 item 2: the ~320 ms gap was seen only by aiortc callers).

Per call it records every RTP packet as aiortc's receiver gets it (before its jitter buffer:
arrival, timestamp, sequence number) and every decoded frame the track hands the
application (what a listener hears: a missing sequence number holds aiortc's audio jitter
buffer, 16 packets, until 16 later ones have come). Prints ``connected`` once every call
is; on SIGTERM writes ``{"rx": {call: [[t, ts, seq], …]}, "heard": {call: [t, …]},
"states": {call: state}}`` to OUT (times on ``time.monotonic()``) and exits.

    python bench/aiortc_callers.py http://127.0.0.1:8080 8 /tmp/rx.json [AGENT]
"""

from __future__ import annotations

import asyncio
import fractions
import json
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

RATE = 48_000


async def main(base: str, n: int, agent: str | None) -> dict[str, Any]:
    import av
    from aiortc import (
        MediaStreamTrack,
        RTCConfiguration,
        RTCPeerConnection,
        RTCSessionDescription,
    )
    from aiortc.rtcrtpreceiver import RTCRtpReceiver

    rx: dict[str, list[tuple[float, int, int]]] = {}
    heard: dict[str, list[float]] = {}
    owner: dict[int, str] = {}
    real = RTCRtpReceiver._handle_rtp_packet

    async def spy(receiver: Any, packet: Any, arrival_time_ms: int) -> None:
        name = owner.get(id(receiver))
        if name is not None:
            rx[name].append((time.monotonic(), packet.timestamp, packet.sequence_number))
        await real(receiver, packet, arrival_time_ms)

    RTCRtpReceiver._handle_rtp_packet = spy  # type: ignore[method-assign]

    class Tone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            t = np.arange(RATE) / RATE
            self.pcm = (0.3 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
            self.pts = 0
            self.t0: float | None = None

        async def recv(self) -> av.AudioFrame:
            loop = asyncio.get_running_loop()
            if self.t0 is None:
                self.t0 = loop.time()
            delay = self.t0 + self.pts / RATE - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # real-time pacing of a media source
            i = self.pts % RATE
            frame = av.AudioFrame.from_ndarray(self.pcm[i : i + 960].reshape(1, -1),
                                               format="s16", layout="mono")
            frame.sample_rate, frame.pts = RATE, self.pts
            frame.time_base = fractions.Fraction(1, RATE)
            self.pts += 960
            return frame

    async def listen(track: Any, name: str) -> None:
        got = heard[name]
        try:
            while True:
                await track.recv()
                got.append(time.monotonic())
        except Exception:  # the track ended with its call
            return

    async def call(name: str) -> RTCPeerConnection:
        rx[name], heard[name] = [], []
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTrack(Tone())
        pc.on("track", lambda track: asyncio.ensure_future(listen(track, name)))
        await pc.setLocalDescription(await pc.createOffer())
        for transceiver in pc.getTransceivers():
            owner[id(transceiver.receiver)] = name
        url = base + "/v1/sessions" + (f"?agent={agent}" if agent else "")
        req = urllib.request.Request(url, data=pc.localDescription.sdp.encode(), method="POST")
        req.add_header("Content-Type", "application/sdp")

        def post() -> bytes:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return bytes(resp.read())

        answer = (await asyncio.to_thread(post)).decode()
        await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        return pc

    pcs = {f"aiortc-{i}": await call(f"aiortc-{i}") for i in range(n)}
    deadline = time.monotonic() + 60
    while not all(pc.connectionState == "connected" for pc in pcs.values()):
        if time.monotonic() > deadline:
            raise SystemExit(f"not connected: { {k: p.connectionState for k, p in pcs.items()} }")
        await asyncio.sleep(0.05)  # a poll interval
    print("connected", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    states = {k: pc.connectionState for k, pc in pcs.items()}
    for pc in pcs.values():
        await pc.close()
    return {"rx": rx, "heard": heard, "states": states}


if __name__ == "__main__":
    recorded = asyncio.run(main(sys.argv[1], int(sys.argv[2]),
                                sys.argv[4] if len(sys.argv) > 4 else None))
    Path(sys.argv[3]).write_text(json.dumps(recorded))
