"""``GET /v1/realtime`` (WebSocket sessions in signaling) on loopback: session setup and a
turn's first audio byte, against baselines measured in the same run and server.

* **setup**: WebSocket connect -> ``session.created`` read; baseline: ``GET /healthz`` on a
  fresh TCP connection (what any request to this server costs).
* **first audio**: ``input_audio_buffer.commit`` + ``response.create`` (0.5 s of audio,
  manual commit) -> the first ``response.output_audio.delta`` read; baseline: an event
  round trip through the same machine (``input_audio_buffer.clear`` -> ``cleared``).
* **memory**: RSS growth per open idle session (n sessions held open at once).

    .venv/bin/python bench/realtime_ws.py [--samples 50] [--sessions 50]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import resource
import statistics
import time
from functools import partial

import trio

from appliance.signaling import SignalingConfig, SignalingState, serve_signaling

AUDIO = base64.b64encode(bytes(24_000)).decode()  # 0.5 s of 24 kHz PCM16


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def until(ws: object, kind: str) -> dict[str, object]:
    while True:
        ev = json.loads(ws.recv(timeout=30))  # type: ignore[attr-defined]
        if ev["type"] == kind:
            return ev  # type: ignore[no-any-return]


def measure(url: str, samples: int, sessions: int) -> dict[str, list[float]]:
    from websockets.sync.client import connect

    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    ws_url = url.replace("http", "ws", 1) + "/v1/realtime?model=bench"
    out: dict[str, list[float]] = {k: [] for k in ("healthz", "setup", "event", "audio")}
    for _ in range(samples):
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        conn.close()
        out["healthz"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with connect(ws_url) as ws:
            until(ws, "session.created")
            out["setup"].append(time.perf_counter() - t0)
            ws.send(json.dumps({"type": "session.update", "session": {
                "audio": {"input": {"turn_detection": None}}}}))
            until(ws, "session.updated")
            t0 = time.perf_counter()
            ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            until(ws, "input_audio_buffer.cleared")
            out["event"].append(time.perf_counter() - t0)
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": AUDIO}))
            t0 = time.perf_counter()
            ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            ws.send(json.dumps({"type": "response.create"}))
            until(ws, "response.output_audio.delta")
            out["audio"].append(time.perf_counter() - t0)
            until(ws, "response.done")
    before = rss_kib()
    held = [connect(ws_url) for _ in range(sessions)]
    for ws in held:
        until(ws, "session.created")
    out["rss_kib_per_session"] = [(rss_kib() - before) / max(1, sessions)]
    for ws in held:
        ws.close()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


async def main(samples: int, sessions: int) -> None:
    cfg = SignalingConfig(http=("127.0.0.1", 0), transceivers={}, relays={})
    state = SignalingState(cfg)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve_signaling, cfg, state=state))
        r = await trio.to_thread.run_sync(measure, binds[0], samples, sessions)
        nursery.cancel_scope.cancel()
    for name, base in (("setup", "healthz"), ("audio", "event")):
        print(f"{name:6s} p50 {pct(r[name], .5):7.2f} ms  p99 {pct(r[name], .99):7.2f} ms   "
              f"baseline {base} p50 {pct(r[base], .5):6.2f} ms  ratio "
              f"{statistics.median(r[name]) / statistics.median(r[base]):5.2f}")
    print(f"memory ~{r['rss_kib_per_session'][0]:.0f} KiB RSS per open session "
          f"(this process holds both ends)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--sessions", type=int, default=50)
    a = ap.parse_args()
    trio.run(main, a.samples, a.sessions)
