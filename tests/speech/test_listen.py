"""``ctx.transcripts()``: the caller's turns and words, in order, from the call's frames."""

from __future__ import annotations

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
