#!/usr/bin/env python3
"""A standalone external agent: a WebSocket server the transceiver connects to per call.

No appliance imports -- only the protocol in docs/agent-protocol.md, so it ports to any
language with a WebSocket library. It echoes the caller's audio at the sample rate it
asks for, and logs the events it gets.

    python examples/ws_agent.py --port 8765 --rate 16000
    appliance transceiver --secret-file secret --agent ws://127.0.0.1:8765/agent
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket


async def handle(rate: int, request: WebSocketRequest) -> None:
    ws = await request.accept()
    try:
        start = json.loads(await ws.get_message())  # always the first message
        assert start["type"] == "session.start", start
        if rate not in start["sample_rates"]:
            await ws.aclose(1003, f"need {rate} Hz")
            return
        await ws.send_message(json.dumps({"type": "session.accept", "sample_rate": rate}))
        log(f"session {start['session_id']}: accepted at {rate} Hz")
        while True:
            msg = await ws.get_message()
            if isinstance(msg, bytes):
                await ws.send_message(msg)  # echo: 20 ms of PCM16 at our rate
                continue
            event = json.loads(msg)
            if event["type"] == "speech.started":
                await ws.send_message(json.dumps({"type": "interrupt"}))  # barge-in
            if event["type"] == "session.ended":
                log(f"session {start['session_id']} ended: {event['reason']}")
                return
            if event["type"] != "stats":
                log(f"event {event}")
    except ConnectionClosed:
        log("transceiver went away")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def main(host: str, port: int, rate: int) -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve_websocket, partial(handle, rate), host, port, ssl_context=None))
        print(f"listening on ws://{host}:{server.port}/agent", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0: pick a free port")
    parser.add_argument("--rate", type=int, default=16000, choices=(48000, 24000, 16000))
    args = parser.parse_args()
    try:
        trio.run(main, args.host, args.port, args.rate)
    except KeyboardInterrupt:
        pass
