"""GPT-Live's WebSocket (``GET /v1/live/sessions``) beside the Realtime WebSocket
(``GET /v1/realtime``) in the same run and server, alternating sample by sample, so the
ratios say what the Live protocol layer costs over the surface it is built on:

* **setup**: Live: WebSocket connect + ``session.start`` -> ``session.started`` read (and
  ``session.start`` -> ``session.started`` alone); Realtime: connect -> ``session.created``.
* **first audio**: the caller's audio streamed at real time (50 ms chunks: silence, a
  phrase spoken by espeak-ng, silence), from the moment the last loud chunk is sent (the end of speech) to the
  first output audio delta read (``session.output_audio.delta`` /
  ``response.output_audio.delta``). Both sessions run the same turn engine (Realtime
  configured ``semantic_vad``, eagerness ``auto``, as Live always is) and the same agent
  (``--agent``, default the echo ``realtime``: the figure is the surface's and the turn
  engine's; ``assistant`` adds Whisper and the TTS).

    .venv/bin/python bench/live_bench.py [--samples 10] [--agent realtime]
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import trio

from appliance.signaling import SignalingConfig, SignalingState, serve_signaling

RATE = 24_000
CHUNK_S = 0.05  # the GPT-Live wire client's 50 ms appends


def _chunks(pcm: bytes) -> list[str]:
    n = int(RATE * CHUNK_S) * 2
    return [base64.b64encode(pcm[i : i + n]).decode() for i in range(0, len(pcm), n)]


_said = 0


def speech(seconds: float = 0.6) -> list[str]:
    """The next of turn_latency's phrases (espeak-ng, trimmed to its voiced span: the
    semantic end of turn judges words, and calls a bare tone unfinished, leaving it to the
    silence bound), or a tone where espeak-ng is missing."""
    global _said
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from speech.speech_support import PHRASES, espeak_pcm48, speech_bounds_ms

        from appliance.realtime.audio import pcm48k_to_24k

        _said += 1
        pcm = espeak_pcm48(PHRASES[_said // 2 % len(PHRASES)])  # each surface says it once
        first, last = speech_bounds_ms(pcm)
        return _chunks(pcm48k_to_24k(pcm[first * 96 : last * 96]))
    except (OSError, ImportError, RuntimeError):
        t = np.arange(int(RATE * seconds)) / RATE
        return _chunks((np.sin(2 * math.pi * 440 * t) * 9000).astype("<i2").tobytes())


QUIET = _chunks(bytes(int(RATE * CHUNK_S) * 2))[0]


def until(ws: Any, kind: str) -> dict[str, Any]:
    while True:
        event: dict[str, Any] = json.loads(ws.recv(timeout=60))
        if event["type"] == kind:
            return event


class Surface:
    """One of the two protocols: how to open a session and how its events are named."""

    def __init__(self, name: str, url: str, agent: str) -> None:
        self.name = name
        ws = url.replace("http", "ws", 1)
        if name == "live":
            self.url = ws + "/v1/live/sessions"
            self.headers = {"X-Agent": agent}
            self.append, self.audio = "session.input_audio.append", "session.output_audio.delta"
        else:
            self.url = ws + f"/v1/realtime?model=bench&agent={agent}"
            self.headers = {}
            self.append, self.audio = "input_audio_buffer.append", "response.output_audio.delta"

    def open(self, out: dict[str, list[float]]) -> Any:
        """A session made ready to talk; its setup time recorded in ``out``."""
        from websockets.sync.client import ClientConnection, connect

        t0 = time.perf_counter()
        # close_timeout: a Realtime socket closed while the server is mid-send answers the
        # close only after the shell's SEND_GRACE (10 s; the same on main): not measured
        # here, and not worth 10 s a sample.
        ws: ClientConnection = connect(self.url, additional_headers=self.headers,
                                       max_size=None, close_timeout=0.5).__enter__()
        if self.name == "live":
            t1 = time.perf_counter()
            ws.send(json.dumps({"type": "session.start", "session": {"model": "bench"}}))
            until(ws, "session.started")
            out["live_start"].append(time.perf_counter() - t1)
        else:
            until(ws, "session.created")
            ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": {
                    "type": "semantic_vad", "eagerness": "auto"}}}}}))
            until(ws, "session.updated")
        out[f"{self.name}_setup"].append(time.perf_counter() - t0)
        return ws

    def turn(self, ws: Any) -> float:
        """Stream silence, speech, silence at real time; the seconds from the last loud
        chunk sent to the first output audio read."""
        ended = threading.Event()
        end_of_speech = [0.0]
        stop = threading.Event()

        def talk() -> None:
            start = time.perf_counter()
            plan = [QUIET] * 6 + speech() + [QUIET] * 60  # 0.3 s, 0.6 s, up to 3 s
            for i, chunk in enumerate(plan):
                if stop.is_set():
                    return
                delay = start + i * CHUNK_S - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # real-time pacing of a media source
                ws.send(json.dumps({"type": self.append, "audio": chunk}))
                if chunk is not QUIET and plan[i + 1] is QUIET:
                    end_of_speech[0] = time.perf_counter()
                    ended.set()

        sender = threading.Thread(target=talk)
        sender.start()
        try:
            until(ws, self.audio)
            got = time.perf_counter()
        finally:
            stop.set()
            sender.join()
        assert ended.is_set(), "audio came back before the speech ended"
        return got - end_of_speech[0]


def measure(url: str, samples: int, agent: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in (
        "live_setup", "live_start", "realtime_setup", "live_audio", "realtime_audio")}
    surfaces = [Surface("live", url, agent), Surface("realtime", url, agent)]
    for i in range(samples):
        for s in surfaces if i % 2 == 0 else surfaces[::-1]:  # alternate who goes first
            with s.open(out) as ws:
                out[f"{s.name}_audio"].append(s.turn(ws))
    return out


def preload_transcription() -> None:
    """Load the speech-to-text model Live sessions transcribe with before measuring (it
    loads at the first session otherwise, on the same CPUs as the turns measured)."""
    from appliance.realtime.transcription import TranscriptionUnavailable, engine_for

    try:
        engine = engine_for(None)
    except TranscriptionUnavailable:
        return  # no speech extra: the sessions report it, the turns are still measured
    preload = getattr(engine, "preload", None)
    if preload is not None:
        preload()


async def bench(samples: int, agent: str = "realtime") -> dict[str, list[float]]:
    await trio.to_thread.run_sync(preload_transcription)
    cfg = SignalingConfig(http=("127.0.0.1", 0), transceivers={}, relays={})
    state = SignalingState(cfg)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve_signaling, cfg, state=state))
        out = await trio.to_thread.run_sync(measure, binds[0], samples, agent)
        nursery.cancel_scope.cancel()
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def report(r: dict[str, list[float]]) -> None:
    for what, live, base in (("setup", "live_setup", "realtime_setup"),
                             ("first audio after end of speech", "live_audio",
                              "realtime_audio")):
        p50, base50 = statistics.median(r[live]), statistics.median(r[base])
        print(f"{what}: live p50 {p50 * 1000:7.1f} ms (max {pct(r[live], 1):7.1f}), "
              f"realtime p50 {base50 * 1000:7.1f} ms (max {pct(r[base], 1):7.1f}), "
              f"ratio {p50 / base50:5.2f}")
    print(f"  of live setup: session.start -> session.started p50 "
          f"{statistics.median(r['live_start']) * 1000:.2f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--agent", default="realtime",
                    help="the agent of both sessions (realtime: the echo; assistant)")
    a = ap.parse_args()
    report(trio.run(bench, a.samples, a.agent))
