#!/usr/bin/env python3
"""A Pipecat pipeline behind the appliance: a parrot built from Pipecat processors.

No model, no network: the transport's turn frames (from the appliance's VAD) delimit an
utterance, the parrot says it back, and talking over it interrupts (barge-in). Data-channel
messages come back as ``{"echo": <message>}`` (binary ones as they came).

    pip install 'appliance[pipecat]'
    python examples/pipecat_parrot.py --port 8765
    appliance up --agent ws://127.0.0.1:8765/

The pipeline runs at --rate (16 kHz by default): the transport accepts the call at that
rate, and the transceiver resamples to and from the caller's 48 kHz Opus.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    InputTransportMessageFrame,
    OutputAudioRawFrame,
    OutputTransportMessageFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from websockets.asyncio.server import ServerConnection

from appliance.integrations.pipecat import ApplianceParams, ApplianceTransport, run


class Parrot(FrameProcessor):
    """Records the caller between user-started and user-stopped, then plays it back."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.recording: list[bytes] | None = None
        self.rate = 16_000

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            self.rate = frame.sample_rate
            if self.recording is not None:
                self.recording.append(frame.audio)
            return  # the caller's audio stops here: the pipeline answers with its own
        if isinstance(frame, UserStartedSpeakingFrame):
            self.recording = []
        elif isinstance(frame, UserStoppedSpeakingFrame) and self.recording:
            said, self.recording = b"".join(self.recording), None
            # One frame holding the whole utterance: the output transport cuts it into
            # 20 ms chunks and queues them, so an interruption has something to drop.
            await self.push_frame(OutputAudioRawFrame(said, self.rate, 1))
        elif isinstance(frame, InputTransportMessageFrame):
            if direction is FrameDirection.DOWNSTREAM:
                reply = frame.message if isinstance(frame.message, bytes) else {
                    "echo": frame.message}
                await self.push_frame(OutputTransportMessageFrame(message=reply))
            return
        await self.push_frame(frame, direction)


async def bot(websocket: ServerConnection, rate: int) -> None:
    transport = ApplianceTransport(websocket, ApplianceParams(user_turn_frames=True))
    pipeline = Pipeline([transport.input(), Parrot(), transport.output()])
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=rate, audio_out_sample_rate=rate),
        enable_rtvi=False,
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0: pick a free port")
    parser.add_argument("--rate", type=int, default=16_000, help="the pipeline's sample rate")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level=args.log_level)
    async def serve_one(websocket: ServerConnection) -> None:
        await bot(websocket, args.rate)

    run(serve_one, args.host, args.port,
        ready=lambda url: print(f"listening on {url}", flush=True))


if __name__ == "__main__":
    main()
