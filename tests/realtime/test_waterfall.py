"""Each turn's waterfall on the Realtime surfaces (issue 38 item 5): the Realtime assistant
over the ``oai-events`` shell (a WebRTC or phone call) and over the WebSocket (GPT-Live's
socket is the same shell) sends the ctx voice loop's ``turn.metrics`` — the same
``TurnMarks``, so the same session object ``turns`` line, end-of-call report and
``appliance_turn_*_seconds`` histograms. All on trio's mock clock: every mark is exact."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import trio
import trio.testing

from appliance.agents import AgentContext, AgentHost, AgentIdentity
from appliance.agents.context import FRAME_BYTES, Frame
from appliance.realtime.agent import RealtimeShell
from appliance.realtime.interface import AudioDelta, ResponseRequest, TranscriptDelta
from appliance.realtime.ws_session import RealtimeSocketSession, SocketClosed
from appliance.session_info import TURN_MARKS, turn_line
from appliance.signaling.registry import turn_spans
from appliance.speech.llm import BuiltinResponder
from appliance.speech.realtime_assistant import AssistantRealtime

STT_S = 0.05  # the fake STT's decode, after the end of turn
TTS_S = 0.03  # the fake TTS's time to its first frame


class SlowStt:
    """Decodes at the end only (no ``speculate``), taking :data:`STT_S` of the mock clock."""

    name = "slow"

    def stream(self, *, language: str | None = None, prompt: str | None = None) -> Any:
        class Stream:
            cpu_seconds = 0.0

            async def feed(self, pcm: bytes) -> None:
                pass

            async def finish(self) -> str:
                await trio.sleep(STT_S)
                return "what time is it"

            async def aclose(self) -> None:
                pass

        return Stream()


class ToneTts:
    name = "tone"

    async def synthesize(self, text: str) -> Any:
        await trio.sleep(TTS_S)
        for _ in range(5):
            yield b"\x10\x20" * 960  # 20 ms


class Engines:
    stt = SlowStt()
    tts = ToneTts()
    responder = BuiltinResponder()


def tone(seconds: float) -> bytes:
    t = np.arange(int(48_000 * seconds)) / 48_000
    return (np.sin(2 * np.pi * 300 * t) * 8000).astype("<i2").tobytes()


async def _webrtc_call() -> list[tuple[float, dict[str, Any]]]:
    """The Realtime assistant on a call: 1 s of speech (the frames' flag, as the energy VAD
    sets it), then silence; the pacer takes one reply frame per 20 ms."""
    events: list[tuple[float, dict[str, Any]]] = []
    host = AgentHost(on_event=lambda e: events.append((trio.current_time(), e)),
                     max_inbound_frames=10_000)
    ctx = AgentContext(host, AgentIdentity("assistant", "s1", params={"realtime": {}}))
    shell = RealtimeShell(ctx, AssistantRealtime(Engines()))

    async def caller() -> None:
        flags = [False] * 10 + [True] * 50 + [False] * 100
        for i, speech in enumerate(flags):
            host.push_frame(Frame(bytes(FRAME_BYTES), i * 0.02, trio.current_time(), speech))
            host.pop_output_frame()  # the pacer
            await trio.sleep(0.02)
        host.close("done")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(caller)
        await shell.run()
    return events


def test_the_realtime_assistant_on_a_call_reports_each_turns_waterfall() -> None:
    events = trio.run(_webrtc_call, clock=trio.testing.MockClock(autojump_threshold=0))
    (marks,) = [e for _, e in events if e["type"] == "turn.metrics"]
    assert marks["turn"] == 1
    # The flag fell after 50 frames of speech; the energy VAD's 200 ms hangover is already
    # silence, so server_vad's 500 ms ended the turn 15 frames (300 ms) later: the VAD
    # paused 500 ms before the end of turn, and the turn opened at the first speech frame,
    # 50 + 15 - 1 frames before the one that ended it.
    assert marks["speech_end_ms"] == -500.0, marks
    assert marks["speech_start_ms"] == -1280.0, marks
    # The assistant's own marks: it began transcribing at the end of turn (no pause
    # decode: this STT has none), the built-in responder answered at once.
    assert marks["transcript_ms"] == marks["stt_ms"] == STT_S * 1000
    assert marks["first_token_ms"] == STT_S * 1000
    assert marks["first_audio_ms"] == marks["first_queued_ms"] == (STT_S + TTS_S) * 1000
    # The pacer takes a frame each 20 ms tick: sent at the next one.
    assert marks["first_queued_ms"] <= marks["first_sent_ms"] <= marks["first_queued_ms"] + 20
    # The same line as the ctx loop's in the session object, the report and /metrics.
    line = turn_line(marks)
    assert line is not None and all(line[k] is not None for k in TURN_MARKS)
    spans = turn_spans(line)
    assert spans["first_sent"] == (marks["first_sent_ms"] + 500) / 1000


def test_a_reply_cut_before_its_first_frame_went_out_reports_nothing() -> None:
    """The turn's waterfall is what the caller heard: a response cancelled (the caller
    spoke again) while its audio still waits in the queue sends no ``turn.metrics``."""

    async def call() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        host = AgentHost(on_event=events.append, max_inbound_frames=10_000)
        ctx = AgentContext(host, AgentIdentity("assistant", "s1", params={"realtime": {}}))
        shell = RealtimeShell(ctx, AssistantRealtime(Engines()))

        async def caller() -> None:
            # The pacer never runs until the caller speaks again, 100 ms after the end of
            # turn + STT + TTS: the reply is queued, never sent, and cut.
            flags = [True] * 50 + [False] * 15 + [False] * 4 + [True] * 10 + [False] * 60
            for i, speech in enumerate(flags):
                host.push_frame(Frame(bytes(FRAME_BYTES), i * 0.02, trio.current_time(),
                                      speech))
                await trio.sleep(0.02)
            host.close("done")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await shell.run()
        return events

    events = trio.run(call, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not [e for e in events if e["type"] == "turn.metrics"]


class Script:
    """A RealtimeAgent with no hooks of its own: the shell's marks alone."""

    async def respond(self, request: ResponseRequest) -> Any:
        await trio.sleep(0.01)
        yield TranscriptDelta("Hi.")
        await trio.sleep(0.02)
        yield AudioDelta(b"\x10\x20" * 960 * 5)


async def _socket(agent: Any, chunk_s: float) -> tuple[RealtimeSocketSession, list[Any]]:
    """A WebSocket client sending 0.6 s of tone then 1.5 s of silence in ``chunk_s`` appends
    at real time (24 kHz PCM16, the default input format)."""
    seen: list[dict[str, Any]] = []
    sess = RealtimeSocketSession(agent, on_turn=seen.append)
    audio = tone(0.6)[::2] + bytes(2 * 36_000)
    step = int(24_000 * chunk_s) * 2
    messages = [json.dumps({"type": "input_audio_buffer.append",
                            "audio": base64.b64encode(audio[i : i + step]).decode()})
                for i in range(0, len(audio), step)]
    sent: list[tuple[float, dict[str, Any]]] = []

    async def receive() -> str:
        if not messages:
            await trio.sleep(1.0)  # the reply plays out
            raise SocketClosed
        await trio.sleep(chunk_s)
        return messages.pop(0)

    async def send(text: str) -> None:
        await trio.sleep(0.005)  # the socket's write
        sent.append((trio.current_time(), json.loads(text)))

    await sess.run(receive, send)
    return sess, [sent, seen]


def test_a_websocket_session_keeps_its_turns_for_the_report_and_the_histograms() -> None:
    sess, (sent, seen) = trio.run(_socket, Script(), 0.02,
                                  clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(sess.turns) == 1 and seen == list(sess.turns)
    line = sess.turns[0]
    # The tone ended 0.6 s in, in the append that arrived at 0.6 s: the VAD paused there.
    # The energy VAD's flag fell 200 ms later and server_vad's 500 ms (its hangover counted)
    # ended the turn at 1.1 s; the turn opened with the first append, at 0.02 s.
    assert (line["speech_start_ms"], line["speech_end_ms"]) == (-1080.0, -500.0), line
    # "First sent" is when the first audio delta had been written to the socket (each
    # write takes 5 ms here; speech_stopped was written 5 ms after the end of turn).
    stopped = next(t for t, e in sent if e["type"] == "input_audio_buffer.speech_stopped")
    first_audio = next(t for t, e in sent if e["type"] == "response.output_audio.delta")
    assert line["first_sent_ms"] == round((first_audio - stopped + 0.005) * 1000, 1), line
    # No agent hook: the first text delta is the first token; no transcript mark.
    assert line["transcript_ms"] is None
    assert (line["first_token_ms"], line["first_audio_ms"]) == (10.0, 30.0), line
    assert all(v >= 0 for v in turn_spans(line).values())


def test_a_websocket_assistant_reports_its_own_marks() -> None:
    sess, (_sent, _seen) = trio.run(_socket, AssistantRealtime(Engines()), 0.1,
                                    clock=trio.testing.MockClock(autojump_threshold=0))
    (line,) = sess.turns
    assert line["transcript_ms"] == line["stt_ms"] == STT_S * 1000
    assert line["first_token_ms"] == STT_S * 1000
    assert line["first_audio_ms"] == (STT_S + TTS_S) * 1000
    # 100 ms appends: the tone's end came with the append that arrived at 0.6 s.
    assert (line["speech_start_ms"], line["speech_end_ms"]) == (-1000.0, -500.0), line
    assert line["first_sent_ms"] == line["first_audio_ms"] + 5  # its event's write
