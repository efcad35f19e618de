"""Pipecat's ``OpenAIRealtimeLLMService`` (the real ``pipecat-ai`` from PyPI, no torch) with
``base_url`` at the appliance's ``GET /v1/realtime``: one text turn, answered by the
built-in echo Realtime agent. Pipecat is asyncio: it runs in a subprocess of its own (its
deprecation warnings are its own, not the suite's)."""

from __future__ import annotations

import json
import sys

import pytest
import trio
from realtime.test_websocket import TIMEOUT, start_server

pytest.importorskip("pipecat.services.openai.realtime.llm")

PIPELINE = r"""
import asyncio, json, sys
from pipecat.frames.frames import Frame, LLMContextFrame, LLMFullResponseEndFrame, LLMTextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

texts, done = [], asyncio.Event()

class Collect(FrameProcessor):
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMTextFrame):
            texts.append(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            done.set()
        await self.push_frame(frame, direction)

async def main():
    llm = OpenAIRealtimeLLMService(
        api_key="unused-on-loopback", base_url=sys.argv[1],
        settings=OpenAIRealtimeLLMService.Settings(
            session_properties=events.SessionProperties(output_modalities=["text"])))
    task = PipelineTask(Pipeline([llm, Collect()]))
    runner = PipelineRunner(handle_sigint=False)

    async def drive():
        await task.queue_frame(LLMContextFrame(LLMContext(
            messages=[{"role": "user", "content": "hello pipecat"}])))
        await asyncio.wait_for(done.wait(), 60)
        await task.cancel()

    await asyncio.gather(runner.run(task), drive())
    print(json.dumps({"text": "".join(texts)}))

asyncio.run(main())
"""


async def test_pipecat_realtime_service_one_turn(nursery: trio.Nursery) -> None:
    url, _ = await start_server(nursery)
    with trio.fail_after(TIMEOUT * 2):
        proc = await trio.run_process(
            [sys.executable, "-W", "ignore::DeprecationWarning", "-c", PIPELINE,
             url.replace("http", "ws", 1) + "/v1/realtime"],
            capture_stdout=True, capture_stderr=True, check=False, cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert out == {"text": "hello pipecat"}  # the echo agent's answer, through Pipecat
