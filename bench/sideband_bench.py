"""Sideband fan-out latency (``GET /v1/realtime?call_id=…``): a call event reaching the
backends' sockets, against the same event reaching the browser's ``oai-events`` channel,
measured in the same run, the same call and one clock.

``appliance up --agent realtime`` (real relay, transceiver and signaling processes); an
aiortc caller places a call with ``POST /v1/realtime/calls``; 1, then 10, sideband sockets
(``websockets``, observers) attach to it. Each sample: the caller sends a
``conversation.item.create`` on ``oai-events`` at t0; the machine on the transceiver emits
``conversation.item.added``; we time its arrival on the data channel (the baseline: SCTP
over DTLS over UDP through the relay, back to the caller) and on every sideband socket
(control channel long poll -> signaling -> WebSocket). Both include the caller -> transceiver
leg, so the ratio is end to end. Wall time on a shared box: indicative only.

    .venv/bin/python bench/sideband_bench.py [--samples 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import websockets
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_up(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    http, udp = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_DGRAM)
    base = f"http://127.0.0.1:{http}"
    log = open(os.path.join(tmp, "up.log"), "wb")  # noqa: SIM115 (kept for the process)
    proc = subprocess.Popen([sys.executable, "-m", "appliance", "up", "--http",
                             f"127.0.0.1:{http}", "--udp", f"127.0.0.1:{udp}", "--state-dir",
                             os.path.join(tmp, "state"), "--transceivers", "1", "--agent",
                             "realtime"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("appliance up did not become ready")


def post_live(base: str, sdp: str) -> tuple[str, str]:
    body = json.dumps({"session": {"model": "gpt-live-1"},
                       "transport": {"type": "webrtc", "sdp": sdp}}).encode()
    req = urllib.request.Request(base + "/v1/live/sessions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        made = json.loads(r.read())
    return made["session"]["id"], made["transport"]["sdp"]


def post_offer(base: str, sdp: str) -> tuple[str, str]:
    req = urllib.request.Request(base + "/v1/realtime/calls", data=sdp.encode(),
                                 method="POST", headers={"Content-Type": "application/sdp"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers["Location"].rsplit("/", 1)[-1], r.read().decode()


class Arrivals:
    """item_id -> arrival time per receiver (0: the browser, 1..n: sidebands)."""

    def __init__(self) -> None:
        self.at: dict[str, dict[int, float]] = {}
        self.changed = asyncio.Event()

    def add(self, who: int, text: str | bytes) -> None:
        ev = json.loads(text)
        if ev.get("type") == "conversation.item.added":
            key = ev["item"]["id"]
        elif ev.get("type") in ("session.input_audio.muted", "session.input_audio.unmuted"):
            key = ev.get("client_event_id") or ""
        else:
            return
        self.at.setdefault(key, {})[who] = time.perf_counter()
        self.changed.set()


async def run(samples: int, observers: list[int], surfaces: list[str]
              ) -> dict[tuple[str, int], dict[str, list[float]]]:
    tmp = tempfile.mkdtemp(prefix="sideband-bench-")
    proc, base = start_up(tmp)
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    try:
        for n in observers:
            for surface in surfaces:  # side by side, each observer count
                results[surface, n] = await one_call(base, samples, n, surface)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    return results


async def one_call(base: str, samples: int, n: int, surface: str) -> dict[str, list[float]]:
    live = surface == "live"
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio", direction="sendrecv")
    channel = pc.createDataChannel("oai-events")
    arrivals = Arrivals()
    opened = asyncio.Event()
    channel.on("message", lambda m: (arrivals.add(0, m), opened.set()))
    await pc.setLocalDescription(await pc.createOffer())
    call_id, answer = await asyncio.to_thread(post_live if live else post_offer, base,
                                              pc.localDescription.sdp)
    await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
    await asyncio.wait_for(opened.wait(), 30)
    ws = base.replace("http", "ws", 1)
    ws_url = (f"{ws}/v1/live/sessions/{call_id}/attach" if live
              else f"{ws}/v1/realtime?call_id={call_id}&role=observer")
    socks = [await websockets.connect(ws_url, max_queue=None) for _ in range(n)]
    for s in socks:
        await s.recv()  # session.created (Realtime) / the session.started replay (Live)

    async def read(i: int, s: Any) -> None:
        async for m in s:
            arrivals.add(i, m)

    readers = [asyncio.ensure_future(read(i + 1, s)) for i, s in enumerate(socks)]
    out: dict[str, list[float]] = {"oai": [], "sideband": [], "extra": []}
    try:
        for k in range(samples + 5):
            item_id = f"item_bench{n}x{k}"
            t0 = time.perf_counter()
            if live:
                channel.send(json.dumps({"type": "session.input_audio.mute" if k % 2 == 0
                                         else "session.input_audio.unmute",
                                         "event_id": item_id}))
            else:
                channel.send(json.dumps({"type": "conversation.item.create", "item": {
                    "id": item_id, "type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "x"}]}}))
            while len(arrivals.at.get(item_id, {})) < n + 1:
                arrivals.changed.clear()
                await asyncio.wait_for(arrivals.changed.wait(), 30)
            got = arrivals.at[item_id]
            if k >= 5:  # warm-up first
                out["oai"].append(got[0] - t0)
                for i in range(1, n + 1):
                    out["sideband"].append(got[i] - t0)
                    out["extra"].append(got[i] - got[0])
            if not live:
                channel.send(json.dumps({"type": "conversation.item.delete",
                                         "item_id": item_id}))
            await asyncio.sleep(0.02)  # a call's pace, not a flood
    finally:
        for r in readers:
            r.cancel()
        for s in socks:
            await s.close()
        await pc.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--surface", default="realtime,live",
                    help="realtime, live or both (comma-separated; default both)")
    args = ap.parse_args()
    surfaces = [x for x in args.surface.split(",") if x]
    if not surfaces or set(surfaces) - {"realtime", "live"}:
        raise SystemExit("--surface: realtime, live or both")
    results = asyncio.run(run(args.samples, [1, 10], surfaces))
    for (surface, n), r in results.items():
        oai50, sb50 = pct(r["oai"], 0.5), pct(r["sideband"], 0.5)
        print(f"{surface:8s} {n:2d} observer(s): oai-events p50 {oai50:.2f} ms p99 {pct(r['oai'], 0.99):.2f}"
              f" | sideband p50 {sb50:.2f} ms p99 {pct(r['sideband'], 0.99):.2f}"
              f" | ratio p50 {sb50 / oai50:.2f}x"
              f" | sideband after oai-events: median {statistics.median(r['extra']) * 1000:.2f}"
              f" ms ({len(r['oai'])} samples)")


if __name__ == "__main__":
    main()
