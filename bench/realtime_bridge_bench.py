"""Latency the upstream Realtime bridge adds (appliance/realtime/bridge.py), in process.

The bridge runs as it does in a transceiver (a real AgentHost and ChannelHub), connected over
loopback to the test suite's Realtime WebSocket server (tests/realtime/rt_server.py):

* **up**: a 20 ms mic frame handed to the agent -> its ``input_audio_buffer.append`` read by
  the upstream (resample 48k->24k, base64, JSON, WebSocket send, loopback, server parse);
* **down**: the upstream writes one ``response.output_audio.delta`` (20 ms of 24 kHz) ->
  its audio in the playout queue at 48 kHz (read, parse, base64, resample, queue) — the
  pacer then sends it in the next 20 ms tick, as for any agent.

Baseline, same run and sockets: the same messages between a plain trio-websocket client and
the server (what any WebSocket client pays on loopback). One measurement at a time, 20 ms
apart (the mic's rate), so neither queueing nor batching flatters the figures.

    .venv/bin/python bench/realtime_bridge_bench.py [--samples 300]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import trio
from trio_websocket import open_websocket_url

from appliance.agents import FRAME_BYTES, AgentContext, AgentHost, AgentIdentity, Frame, resolve
from appliance.agents.channels import ChannelInfo, ChannelOpened

HERE = Path(__file__).resolve().parent


def _load_server() -> Any:
    path = HERE.parent / "tests" / "realtime" / "rt_server.py"
    spec = importlib.util.spec_from_file_location("rt_server", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rt_server"] = mod
    spec.loader.exec_module(mod)
    return mod


rt = _load_server()


class Port:
    """A data-channel port that takes everything (the bench measures audio, not events)."""

    def send(self, channel_id: int, data: str | bytes) -> None:
        pass

    def open(self, label: str, **kw: Any) -> ChannelInfo:
        return ChannelInfo(kw.get("negotiated_id") or 1, label)

    def close(self, channel_id: int) -> None:
        pass

    def buffered_amount(self, channel_id: int) -> int:
        return 0


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1e3:6.3f} ms  p90 {xs[int(0.9 * len(xs))] * 1e3:6.3f}"
            f"  max {xs[-1] * 1e3:6.3f}")


async def _wait(up: Any, cond: Any) -> None:
    with trio.fail_after(5):
        await up.wait_for(cond)


async def bench(samples: int) -> dict[str, list[float]]:
    up = rt.Upstream()
    out: dict[str, list[float]] = {"up": [], "down": [], "up_base": [], "down_base": []}
    frame = (np.sin(np.arange(960) / 48_000 * 2 * np.pi * 440) * 8000).astype("<i2").tobytes()
    assert len(frame) == FRAME_BYTES
    async with rt.serving(up) as (_, port):
        url = f"ws://127.0.0.1:{port}/v1/realtime?model=x"
        queued: list[float] = []
        host = AgentHost(on_output=lambda: queued.append(trio.current_time()))
        host.channels.port = Port()
        ctx = AgentContext(host, AgentIdentity("bench", "s1"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(resolve("realtime+" + url).run, ctx)
            host.channels.push(ChannelOpened(ChannelInfo(1, "oai-events")))
            await _wait(up, lambda: "session.update" in up.kinds())
            ws = up.connections[0]
            # up: one frame, then wait for its append
            for i in range(samples + 5):
                n = len(up.received)
                t0 = trio.current_time()
                host.push_frame(Frame(frame, i * 0.02, t0, True))
                await _wait(up, lambda n=n: len(up.received) > n)
                if i >= 5:  # the resampler's first output is short: warm-up
                    out["up"].append(up.received[-1][0] - t0)
                await trio.sleep(0.02)  # the mic's rate, not synchronisation
            # down: one 20 ms delta, then wait for its audio in the playout queue
            delta = rt.tone(0.02)
            for i in range(samples + 5):
                host.interrupt()  # keep the queue short: the next frame is ours
                queued.clear()
                got = trio.Event()
                host.on_output = lambda got=got: (queued.append(trio.current_time()), got.set())
                t0 = trio.current_time()
                await ws.send_message(json.dumps({
                    "type": "response.output_audio.delta", "event_id": f"e{i}",
                    "response_id": "resp_b", "item_id": "item_b", "output_index": 0,
                    "content_index": 0, "delta": base64.b64encode(delta).decode()}))
                with trio.fail_after(5):
                    await got.wait()
                if i >= 5:
                    out["down"].append(queued[0] - t0)
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        # Baseline: the same messages over a plain WebSocket client, same server.
        append = json.dumps({"type": "input_audio_buffer.append",
                             "audio": base64.b64encode(frame[: FRAME_BYTES // 2]).decode()})
        async with open_websocket_url(url) as client:
            await client.get_message()  # session.created
            server = up.connections[-1]
            for _ in range(samples):
                n = len(up.received)
                t0 = trio.current_time()
                await client.send_message(append)
                await _wait(up, lambda n=n: len(up.received) > n)
                out["up_base"].append(up.received[-1][0] - t0)
                t0 = trio.current_time()
                await server.send_message(json.dumps({
                    "type": "response.output_audio.delta", "delta":
                    base64.b64encode(delta).decode()}))
                msg = await client.get_message()
                json.loads(msg)
                out["down_base"].append(trio.current_time() - t0)
                await trio.sleep(0.02)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=300)
    args = p.parse_args()
    r = trio.run(bench, args.samples)
    load = os.getloadavg()
    print(f"realtime bridge latency, {args.samples} samples each "
          f"(load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    for leg in ("up", "down"):
        added = statistics.median(r[leg]) - statistics.median(r[leg + "_base"])
        print(f"  {leg:4} bridge   {ms(r[leg])}")
        print(f"  {leg:4} baseline {ms(r[leg + '_base'])}   "
              f"(bridge adds {added * 1e3:.3f} ms at p50, "
              f"{statistics.median(r[leg]) / statistics.median(r[leg + '_base']):.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
