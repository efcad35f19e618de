"""``ctx.transcripts()``: the caller's turns and words, in order, from the call's frames."""

from __future__ import annotations

from concurrent.futures import Future

import trio
from speech.speech_support import espeak_pcm48, frames, silence

from appliance.agents import AgentContext, AgentHost, AgentIdentity, Frame
from appliance.speech import (
    TranscriptFinal,
    TranscriptPartial,
    TurnConfig,
    UserSpeechStarted,
    UserSpeechStopped,
    make_stt,
)


async def test_ctx_transcripts_yields_turns_and_words() -> None:
    host = AgentHost(max_inbound_frames=10_000)  # all frames queued up front
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    audio = (silence(0.5) + espeak_pcm48("turn on the lights") + silence(1.0)
             + espeak_pcm48("thank you very much") + silence(1.0))
    for i, f in enumerate(frames(audio)):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    got = []
    with trio.fail_after(120):
        async for ev in ctx.transcripts():
            got.append(ev)
    kinds = [type(e) for e in got]
    assert kinds == [UserSpeechStarted, UserSpeechStopped, TranscriptFinal] * 2
    finals = [e for e in got if isinstance(e, TranscriptFinal)]
    assert "lights" in finals[0].text.lower() and "thank" in finals[1].text.lower()
    assert finals[0].audio_end_ms < finals[1].audio_start_ms


async def test_streaming_engine_gives_partials_first() -> None:
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    for i, f in enumerate(frames(silence(0.3) + espeak_pcm48("good morning everybody")
                                 + silence(1.0))):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    with trio.fail_after(120):
        got = [ev async for ev in ctx.transcripts(turn=TurnConfig(vad="energy"),
                                                  stt=make_stt("pocketsphinx"))]
    assert isinstance(got[0], UserSpeechStarted)
    assert any(isinstance(e, TranscriptPartial) for e in got)
    assert isinstance(got[-1], TranscriptFinal)


class SureEndpoint:
    """A stand-in for Smart Turn that calls every pause complete, answered at once."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def submit(self, pcm16_16k: bytes) -> Future[float]:
        self.asked.append(len(pcm16_16k))
        answer: Future[float] = Future()
        answer.set_result(1.0)
        return answer


async def test_semantic_turn_ends_at_the_models_verdict_not_the_bound() -> None:
    """The shell hands the detector's query to the endpoint and its verdict back: the turn
    ends ~200 ms into the pause (plus a frame), not at the 1000 ms silence bound."""
    host = AgentHost(max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("t", "s1"))
    for i, f in enumerate(frames(silence(0.3) + espeak_pcm48("turn on the lights")
                                 + silence(1.5))):
        host.push_frame(Frame(f, i * 0.02, i * 0.02, speech=False))
    host.close("done")
    endpoint = SureEndpoint()
    with trio.fail_after(120):
        got = [ev async for ev in ctx.transcripts(
            turn=TurnConfig.semantic_vad("auto"), endpoint=endpoint)]  # type: ignore[arg-type]
    (stop,) = [e for e in got if isinstance(e, UserSpeechStopped)]
    assert len(endpoint.asked) == 1
    assert stop.at - stop.audio_end_ms / 1000 < 0.3  # the silence bound would be 0.98
    assert isinstance(got[-1], TranscriptFinal)
