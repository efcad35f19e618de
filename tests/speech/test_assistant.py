"""``--agent assistant`` end to end in-process: espeak-ng speech frames in → VAD turn →
Whisper transcript → built-in (or chat-completions) answer → espeak-ng reply frames out,
and a barge-in cutting the reply.

The harness plays both network sides at simulated real time: each step pushes one 20 ms
caller frame, waits until the agent has taken it, and pops one 20 ms frame of agent output
(the transceiver's pacer). Engines are not timed here (bench/speech_bench.py measures latency)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio
import trio.lowlevel
from speech.fake_openai import KEY, fake_openai
from speech.speech_support import espeak_pcm48, frames, silence

from appliance.agents import AgentContext, AgentError, AgentHost, AgentIdentity, Frame, resolve
from appliance.speech import vad as vad_module
from appliance.speech.assistant import AssistantOptions
from appliance.speech.audio import band_energy_ratio, rms_dbfs
from appliance.speech.tts import default_tts


class Call:
    def __init__(self, spec: str = "assistant") -> None:
        self.events: list[dict[str, Any]] = []
        self.host = AgentHost(on_event=self.events.append)
        self.ctx = AgentContext(self.host, AgentIdentity(spec, "s1"))
        self.agent = resolve(spec)
        self.n = 0
        self.out: list[bytes | None] = []  # one entry per step: the frame the pacer sent

    async def step(self, pcm: bytes) -> bytes | None:
        self.host.push_frame(Frame(pcm, self.n * 0.02, trio.current_time(), speech=False))
        self.n += 1
        # Poll (under the test's overall fail_after): the host has no "frame taken" event,
        # and the agent may be waiting on a transcription thread.
        while self.host._frames:  # noqa: ASYNC110
            await trio.sleep(0.002)
        await trio.lowlevel.checkpoint()  # let the reply task queue what it has
        frame = self.host.pop_output_frame()
        self.out.append(frame)
        return frame

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    async def until(self, cond: Any, max_steps: int) -> None:
        for _ in range(max_steps):
            await self.step(bytes(1920))
            if cond():
                return
        raise AssertionError(f"not after {max_steps} steps: {self.events}")


async def test_assistant_hears_answers_and_speaks() -> None:
    call = Call()
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.agent.run, call.ctx)
            for f in frames(silence(0.5) + espeak_pcm48("what time is it")):
                await call.step(f)
            await call.until(lambda: call.of("transcript.agent"), 400)
            await call.until(lambda: call.host.played_samples > 0
                             and not call.host.has_output(), 1500)
            call.host.close("done")
    final = call.of("transcript.user.final")
    assert len(final) == 1 and "time" in final[0]["text"].lower()
    said = call.of("transcript.agent")
    assert said[0]["text"].startswith("It is ")
    (marks,) = call.of("turn.metrics")  # the turn's waterfall, in order (issue 38 item 5)
    assert marks["turn"] == 1
    assert marks["speech_start_ms"] < marks["speech_end_ms"] < 0, marks  # before the end
    steps = [marks[k] for k in ("transcript_ms", "first_token_ms", "first_audio_ms",
                                "first_queued_ms", "first_sent_ms")]
    assert 0 <= steps[0] and steps == sorted(steps), marks
    reply = b"".join(f for f in call.out if f is not None)
    assert len(reply) / 96_000 > 0.5
    assert rms_dbfs(reply) > -35
    assert band_energy_ratio(reply, 48_000, 100, 4000) > 0.8


async def test_barge_in_cuts_the_reply_at_once() -> None:
    # espeak-ng pinned: this test pops output frames as fast as it can, not at 20 ms, so a
    # reply from piper (synthesised a clause at a time, at ~0.1-0.2x real time) drains the
    # queue between its clauses and the barge-in would find nothing queued to drop.
    call = Call("assistant?tts=espeak")
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call.agent.run, call.ctx)
            for f in frames(silence(0.3) + espeak_pcm48("my name is john")):
                await call.step(f)
            # The built-in answer echoes the words back: a few seconds of speech.
            await call.until(lambda: sum(f is not None for f in call.out) >= 25, 600)
            assert call.host.queued_samples > 0  # still talking
            speech = frames(espeak_pcm48("stop stop please stop"))
            onset = next(i for i, f in enumerate(speech) if rms_dbfs(f) > -40)
            cut_at = None
            for i, f in enumerate(speech):
                before = call.host.interrupts
                out = await call.step(f)
                if call.host.interrupts > before:
                    cut_at = i
                    assert out is None  # nothing more went out in the step it was cut
                    assert call.host.queued_samples == 0
                    break
            assert cut_at is not None, "the reply was not interrupted"
            # Silero needs 60 ms of speech to open a turn; the cut is in the same frame.
            assert (cut_at - onset) * 20 <= 200
            for _ in range(10):
                assert await call.step(bytes(1920)) is None  # and it stays quiet
            call.host.close("done")
    cleared = call.of("output.cleared")
    assert len(cleared) == 1 and cleared[0]["dropped_seconds"] > 0
    assert cleared[0]["played_seconds"] >= 0.5


async def test_assistant_with_a_chat_endpoint_speaks_each_sentence() -> None:
    async with fake_openai() as srv:
        srv.replies.append("Hello there John. Nice to meet you today. Goodbye now.")
        key_file = None
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".key") as kf:
            kf.write(KEY + "\n")
            kf.flush()
            key_file = kf.name
            call = Call(f"assistant?llm={srv.base_url}&model=tiny-llm&key_file={key_file}")
            with trio.fail_after(240):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call.agent.run, call.ctx)
                    for f in frames(silence(0.3) + espeak_pcm48("my name is john")):
                        await call.step(f)
                    await call.until(lambda: len(call.of("transcript.agent")) == 3
                                     and not call.host.has_output(), 2000)
                    call.host.close("done")
    assert [e["text"] for e in call.of("transcript.agent")] == [
        "Hello there John.", "Nice to meet you today.", "Goodbye now."]
    req = srv.chat_requests[0]
    assert req["model"] == "tiny-llm"
    assert "john" in req["messages"][-1]["content"].lower()


def test_options_from_spec_and_env() -> None:
    env = {"APPLIANCE_LLM_URL": "http://llm:8080/v1", "APPLIANCE_LLM_KEY": "k"}
    opts = AssistantOptions.from_spec("assistant", env)
    assert opts.llm == "http://llm:8080/v1" and opts.stt == "whisper-short"
    assert opts.tts == default_tts() and opts.stt == "whisper-short"
    assert AssistantOptions.from_spec("assistant?tts=piper", env).tts == "piper"
    assert AssistantOptions.from_spec("assistant?tts=espeak", env).tts == "espeak"
    assert opts.api_key(env) == "k"
    opts = AssistantOptions.from_spec("assistant?llm=http://x/v1&vad=energy&silence_ms=800", env)
    assert (opts.llm, opts.vad, opts.silence_ms) == ("http://x/v1", "energy", 800)
    for bad, match in [("assistant?colour=red", "unknown option"),
                       ("assistant?vad=webrtc", "silero or energy"),
                       ("assistant?silence_ms=9", "100..5000"),
                       ("assistant?llm=ftp://x", "http"),
                       ("assistant?key=sk-1", "unknown option")]:
        with pytest.raises(AgentError, match=match):
            AssistantOptions.from_spec(bad, {})
    with pytest.raises(AgentError, match="key_file"):
        AssistantOptions.from_spec("assistant?key_file=/nonexistent/k", {}).api_key({})


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vad_module, "_session", None)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(AgentError, match=r"speech.*extra|appliance\[speech\]"):
        resolve("assistant?silence_ms=600")
    assert resolve("echo").name == "echo"  # everything else still resolves


# -- the speculation gate (issue 38 item 3) ----------------------------------------------


class ToneTts:
    """A TTS that answers at once with 100 ms of tone per sentence, noting when it was
    asked (on the trio clock): the gate test needs no real engine and no wall time."""

    name = "tone"

    def __init__(self) -> None:
        self.asked: list[tuple[float, str]] = []

    async def synthesize(self, text: str) -> Any:
        self.asked.append((trio.current_time(), text))
        for _ in range(5):
            await trio.lowlevel.checkpoint()
            yield b"\x10\x20" * 960


async def _gated_call(audio: bytes) -> tuple[list[tuple[float, dict[str, Any]]], ToneTts]:
    """The assistant (energy VAD, 500 ms silence turns, transcripts guessed at each
    200 ms pause) hearing ``audio`` on a 20 ms grid; every event with its trio time."""
    from speech.test_listen import GuessingEngine

    from appliance.speech.assistant import Assistant, Engines
    from appliance.speech.llm import BuiltinResponder

    events: list[tuple[float, dict[str, Any]]] = []
    host = AgentHost(on_event=lambda e: events.append((trio.current_time(), e)),
                     max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("assistant", "s1"))
    tts = ToneTts()
    opts = AssistantOptions.from_spec("assistant?vad=energy&turn=silence")
    assistant = Assistant(opts, Engines(GuessingEngine(), tts, BuiltinResponder(), None))

    async def caller() -> None:
        for i, f in enumerate(frames(audio)):
            host.push_frame(Frame(f, i * 0.02, trio.current_time(), speech=False))
            host.pop_output_frame()  # the pacer: one frame of the reply out per 20 ms
            await trio.sleep(0.02)  # the caller's real-time grid (on the mock clock)
        host.close("done")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await assistant.run(ctx)
    return events, tts


def _first(events: list[tuple[float, dict[str, Any]]], kind: str) -> float:
    return next(t for t, e in events if e["type"] == kind)


def test_a_reply_started_at_the_pause_is_held_until_the_turn_ends_with_its_words() -> None:
    from appliance.speech.listen import speculation

    used, wasted = speculation.replies_used, speculation.replies_wasted
    audio = silence(0.3) + espeak_pcm48("turn on the lights") + silence(1.2)
    events, tts = trio.run(_gated_call, audio, clock=trio.testing.MockClock(autojump_threshold=0))
    final = _first(events, "transcript.user.final")
    # The reply's first audio was made at the pause, ~300 ms before the turn ended ...
    assert tts.asked[0][0] < final - 0.2
    # ... and nothing of it left before the turn ended with the words it answers.
    assert _first(events, "transcript.agent") >= final
    kinds = [e["type"] for _, e in events]
    assert kinds.index("transcript.agent") > kinds.index("transcript.user.final")
    (said,) = [e for _, e in events if e["type"] == "transcript.agent"][:1]
    heard = next(e for _, e in events if e["type"] == "transcript.user.final")["text"]
    assert heard in said["text"]  # the built-in responder says what it heard
    (marks,) = [e for _, e in events if e["type"] == "turn.metrics"]
    assert marks["first_token_ms"] < 0 <= marks["first_queued_ms"]  # work before the end
    # The waterfall on the 20 ms grid: the VAD paused 500 ms (the silence wait) before the
    # end of turn, and the pacer sent the reply's first frame at its next 20 ms tick.
    assert marks["speech_start_ms"] < marks["speech_end_ms"] == -500.0, marks
    assert marks["first_queued_ms"] <= marks["first_sent_ms"] <= marks["first_queued_ms"] + 20
    assert (speculation.replies_used, speculation.replies_wasted) == (used + 1, wasted)


def test_a_caller_who_goes_on_drops_the_held_reply() -> None:
    from appliance.speech.listen import speculation

    used, wasted = speculation.replies_used, speculation.replies_wasted
    first, second = espeak_pcm48("I would like to"), espeak_pcm48("order a pizza")
    audio = silence(0.3) + first[: len(first) * 3 // 4] + silence(0.45) + second + silence(1.2)
    events, tts = trio.run(_gated_call, audio, clock=trio.testing.MockClock(autojump_threshold=0))
    partials = [e["text"] for _, e in events if e["type"] == "transcript.user.partial"]
    heard = next(e for _, e in events if e["type"] == "transcript.user.final")["text"]
    assert len(partials) == 2 and partials[-1] == heard
    # Two replies were begun, one per pause; only the one to the final words was spoken.
    begun = [t for _, t in tts.asked if t.startswith("You said")]
    assert begun == [f"You said: {partials[0]}.", f"You said: {heard}."]
    said = [e["text"] for _, e in events if e["type"] == "transcript.agent"]
    assert said and all(partials[0] not in s for s in said) and heard in said[0]
    assert (speculation.replies_used, speculation.replies_wasted) == (used + 1, wasted + 1)


def test_turn_marks_map_onto_the_session_object_and_the_histograms() -> None:
    """One turn's marks (trio clock) → its ``turn.metrics`` event (ms after the end of the
    turn) → the transceiver's session-object line (session_info.turn_line, which the
    end-of-call report carries) → the /metrics spans (signaling/registry.turn_spans)."""
    from appliance.session_info import turn_line
    from appliance.signaling.registry import turn_spans
    from appliance.speech.assistant import TurnMarks

    marks = TurnMarks(turn=2, end_of_turn=100.0, transcript=100.0021, stt_seconds=0.002,
                      speech_start=98.16, speech_end=99.48, first_token=99.9397,
                      first_audio=100.031, first_queued=100.0311, first_sent=100.0312)
    event = marks.event()
    assert event == {"type": "turn.metrics", "turn": 2, "speech_start_ms": -1840.0,
                     "speech_end_ms": -520.0, "transcript_ms": 2.1, "stt_ms": 2.0,
                     "first_token_ms": -60.3, "first_audio_ms": 31.0, "first_queued_ms": 31.1,
                     "first_sent_ms": 31.2}
    line = turn_line(event)
    assert line is not None and "first_queued_ms" not in line and line["first_sent_ms"] == 31.2
    assert turn_spans(line) == pytest.approx({
        "speech": 1.32, "end_of_turn": 0.52, "transcript": 0.5221, "first_token": 0.4597,
        "first_audio": 0.551, "first_sent": 0.5512})
    # A reply cut short before it was sent: no first_sent, nor a span for it.
    cut = TurnMarks(turn=3, end_of_turn=5.0, transcript=5.01, stt_seconds=0.01,
                    speech_start=3.0, speech_end=4.5).event()
    assert cut["first_sent_ms"] is None and "first_sent" not in turn_spans(turn_line(cut) or {})


def test_hold_ms_sets_the_semantic_hold() -> None:
    """``hold_ms`` (issue 38 item 2): the default holds a complete verdict to 600 ms of
    silence; 0 ends the turn at the verdict (faster, more cut-offs)."""
    from appliance.speech.assistant import Assistant, Engines

    def config(spec: str) -> Any:
        opts = AssistantOptions.from_spec(spec, {})
        return Assistant(opts, Engines(None, None, None, object())).turn_config()  # type: ignore[arg-type]

    assert config("assistant").hold_ms == 600
    # ... at first: the default learns the caller's pace from there (floor 300); a hold
    # given on the spec is fixed.
    assert config("assistant").hold_floor_ms == 300
    assert config("assistant?hold_ms=0").hold_ms == 0
    assert config("assistant?hold_ms=600").hold_floor_ms is None
    assert config("assistant").reask_ms == 0
    assert config("assistant?reask_ms=500").reask_ms == 500
    for bad in ("assistant?hold_ms=-1", "assistant?hold_ms=soon", "assistant?reask_ms=6000"):
        with pytest.raises(AgentError, match="hold_ms|reask_ms"):
            AssistantOptions.from_spec(bad, {})
