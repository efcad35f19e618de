#!/usr/bin/env python3
"""A LiveKit Agents ``AgentSession`` behind the appliance: a tone responder, no models.

When the caller stops talking (the appliance's VAD) the agent "says" 1.5 s of a 660 Hz tone
through ``session.say(..., audio=...)``; talking over it interrupts (``session.interrupt()``)
and the session learns how much was heard from ``on_playback_finished``, which this example
also reports on the caller's data channel as ``{"event": "playback_finished", ...}``. No
LiveKit server, no STT/LLM/TTS: ``AgentSession`` runs on the appliance's audio I/O alone.

    pip install 'appliance[livekit]'
    python examples/livekit_tone.py --port 8766
    appliance up --agent ws://127.0.0.1:8766/
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator

import numpy as np
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice.io import PlaybackFinishedEvent
from websockets.asyncio.server import ServerConnection

from appliance.integrations.livekit_agents import ApplianceIO, run

RATE = 24_000
TONE_HZ = 660
TONE_SECS = 1.5


async def tone() -> AsyncIterator[rtc.AudioFrame]:
    n = RATE // 50  # 20 ms
    for i in range(int(TONE_SECS * 50)):
        t = (np.arange(n) + i * n) / RATE
        pcm = (np.sin(2 * np.pi * TONE_HZ * t) * 8000).astype(np.int16).tobytes()
        yield rtc.AudioFrame(pcm, RATE, 1, n)


async def entry(websocket: ServerConnection) -> None:
    # No pause on our output, so a "false interruption" cannot be resumed: do not try.
    session: AgentSession[None] = AgentSession(
        turn_handling={"interruption": {"resume_false_interruption": False}})

    def speech_started() -> None:
        session.interrupt()  # barge-in: the session calls clear_buffer() on our output

    def speech_stopped() -> None:
        session.say("(a tone)", audio=tone(), allow_interruptions=True,
                    add_to_chat_ctx=False)

    io = ApplianceIO(websocket, sample_rate=RATE, on_speech_started=speech_started,
                     on_speech_stopped=speech_stopped)
    await io.start()
    session.input.audio = io.audio_input
    session.output.audio = io.audio_output

    sending: set[asyncio.Task[None]] = set()

    def finished(ev: PlaybackFinishedEvent) -> None:
        report = {"event": "playback_finished", "position": round(ev.playback_position, 3),
                  "interrupted": ev.interrupted}
        task = asyncio.get_running_loop().create_task(io.send_message(report))
        sending.add(task)  # the loop holds tasks weakly
        task.add_done_callback(sending.discard)

    io.audio_output.on("playback_finished", finished)
    await session.start(Agent(instructions="a tone responder"), record=False)
    try:
        await io.run()
    finally:
        await session.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766, help="0: pick a free port")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    run(entry, args.host, args.port, ready=lambda url: print(f"listening on {url}", flush=True))


if __name__ == "__main__":
    main()
