"""The GPT-Live trio shell (appliance/live/socket.py over appliance/realtime/ws_session.py)
with a fake socket of memory channels, on trio's autojump clock where time matters: paced
answer audio, barge-in stopping it, expiry, the session's three ends. And the agent
wrapper (appliance/live/agent.py) that speaks a commentary."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest
import trio
import trio.testing

from appliance.live.agent import LiveAgent
from appliance.live.connection import SAY
from appliance.live.socket import PACE_LEAD, LiveSocketSession
from appliance.realtime.echo import EchoRealtime
from appliance.realtime.interface import (
    AudioDelta,
    Delta,
    ResponseRequest,
    TranscriptDelta,
    UserTurn,
)
from appliance.realtime.ws_session import SocketClosed

pytest.importorskip("openai.types.live")
from live.live_shapes import shape_errors  # noqa: E402

PIECE = 0.1  # seconds: the shell paces audio in 100 ms pieces


def pcm48(seconds: float) -> bytes:
    return bytes(2 * int(48_000 * seconds))


def tone24(seconds: float) -> bytes:
    t = np.arange(int(24_000 * seconds)) / 24_000
    return (np.sin(2 * math.pi * 440 * t) * 10_000).astype("<i2").tobytes()


class Speaker:
    """Says each commentary: its text, then ``seconds`` of audio."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds
        self.cancelled = 0  # answers closed before their end (cancelled or cut)

    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        done = False
        try:
            yield TranscriptDelta(str(request.extra.get(SAY, "")))
            yield AudioDelta(pcm48(self.seconds))
            done = True
        finally:
            self.cancelled += not done


class Pipe:
    """Both ends of a fake WebSocket around one LiveSocketSession; every event it sends
    is checked against the SDK's types and stamped with the trio clock."""

    def __init__(self, session: LiveSocketSession) -> None:
        self.session = session
        self._to_server, self._server_in = trio.open_memory_channel[str](1000)
        self.sent: list[tuple[float, dict[str, Any]]] = []
        self._changed = trio.Event()
        self.reason: str | None = None

    async def _receive(self) -> str:
        try:
            return await self._server_in.receive()
        except trio.EndOfChannel:
            raise SocketClosed from None

    async def _send(self, text: str) -> None:
        event = json.loads(text)
        assert shape_errors(event) == [], event
        self.sent.append((trio.current_time(), event))
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        self.reason = await self.session.run(self._receive, self._send)
        self._changed.set()

    async def send(self, **event: Any) -> None:
        await self._to_server.send(json.dumps(event))

    async def hang_up(self) -> None:
        await self._to_server.aclose()

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.sent if e["type"] == kind]

    async def until(self, cond: Callable[[], bool]) -> None:
        while not cond():
            await self._changed.wait()


async def started_pipe(nursery: trio.Nursery, agent: Any, **kw: Any) -> Pipe:
    pipe = Pipe(LiveSocketSession(agent, **kw))
    await nursery.start(pipe.run)
    await pipe.send(type="session.start", session={"model": "gpt-live-1"})
    await pipe.until(lambda: bool(pipe.of("session.started")))
    return pipe


async def test_answer_audio_is_paced_at_real_time_plus_the_lead(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    pipe = await started_pipe(nursery, Speaker(2.0))
    t0 = trio.current_time()
    await pipe.send(type="session.commentary.append", content="Hello.", delegation_id=None)
    await pipe.until(lambda: len(pipe.of("session.output_audio.delta")) == 20)
    times = [t - t0 for t, _ in pipe.of("session.output_audio.delta")]
    # Piece i (100 ms each) leaves when the client has PACE_LEAD s or less left to play.
    assert times == pytest.approx([max(0.0, i * PIECE - PACE_LEAD) for i in range(20)],
                                  abs=1e-6)
    await pipe.until(lambda: bool(pipe.of("session.output_transcript.delta")))
    [(_, said)] = pipe.of("session.output_transcript.delta")
    assert (said["delta"], said["start_ms"], said["end_ms"]) == ("Hello.", 0, 2000)


async def test_barge_in_stops_the_audio_the_client_gets(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    agent = Speaker(10.0)
    pipe = await started_pipe(nursery, agent)
    await pipe.send(type="session.input_audio.append",
                    audio=base64.b64encode(bytes(24_000)).decode())  # 0.5 s of room noise
    await pipe.send(type="session.commentary.append", content="A long story.",
                    delegation_id=None)
    await pipe.until(lambda: len(pipe.of("session.output_audio.delta")) >= 10)
    await pipe.send(type="session.input_audio.append",
                    audio=base64.b64encode(tone24(0.5)).decode())  # the caller talks
    await pipe.until(lambda: agent.cancelled == 1)
    sent = len(pipe.of("session.output_audio.delta"))
    await trio.sleep(5)  # the period under test: nothing more of the cut answer goes out
    assert len(pipe.of("session.output_audio.delta")) == sent < 20


async def test_close_sends_session_closed_last_and_ends(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    pipe = await started_pipe(nursery, Speaker(30.0))
    await pipe.send(type="session.commentary.append", content="Long.", delegation_id=None)
    await pipe.until(lambda: bool(pipe.of("session.output_audio.delta")))
    await pipe.send(type="session.close", event_id="bye")
    await pipe.until(lambda: pipe.reason is not None)
    assert pipe.reason == "close_requested"
    last = pipe.sent[-1][1]
    assert last["type"] == "session.closed" and last["client_event_id"] == "bye"


async def test_the_session_expires(nursery: trio.Nursery,
                                   autojump_clock: trio.testing.MockClock) -> None:
    pipe = await started_pipe(nursery, Speaker(), max_seconds=60)
    t0 = trio.current_time()
    await pipe.until(lambda: pipe.reason is not None)
    assert pipe.reason == "expired"
    [(t, closed)] = pipe.of("session.closed")
    assert closed["reason"] == "expired" and t - t0 == pytest.approx(60)


async def test_a_socket_that_goes_away_is_connection_lost(nursery: trio.Nursery) -> None:
    pipe = await started_pipe(nursery, Speaker())
    await pipe.hang_up()
    await pipe.until(lambda: pipe.reason is not None)
    assert pipe.reason == "connection_lost"
    assert pipe.of("session.closed") == []
    assert pipe.session.live.state.value == "closed"


# -- the agent wrapper ---------------------------------------------------------------------


def _request(**extra: Any) -> ResponseRequest:
    return ResponseRequest(response_id="resp_1", session={}, instructions="",
                           output_modalities=("audio",), voice="marin",
                           turn=UserTurn("item_1", pcm48(0.2)), extra=extra)


async def _all(deltas: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in deltas]


class FakeTts:
    async def synthesize(self, text: str) -> AsyncIterator[bytes]:
        for _ in range(2):
            yield pcm48(0.02)


class Voiced:
    """Shaped like the assistant: engines.tts, and a transcribe() the shell finds."""

    class engines:  # noqa: N801 (an attribute, as AssistantRealtime has it)
        tts = FakeTts()

    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        yield TranscriptDelta("its own answer")

    async def transcribe(self, turn: UserTurn) -> str:
        return "heard"


class OwnVoice:
    async def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        yield TranscriptDelta("x")

    async def say(self, text: str) -> AsyncIterator[Delta]:
        yield TranscriptDelta(text.upper())


async def test_a_commentary_is_spoken_with_the_agents_voice() -> None:
    said = await _all(LiveAgent(Voiced()).respond(_request(**{SAY: "Sunny."})))
    assert said == [TranscriptDelta("Sunny."), AudioDelta(pcm48(0.02)), AudioDelta(pcm48(0.02))]
    assert await _all(LiveAgent(OwnVoice()).respond(_request(**{SAY: "hi"}))) == [
        TranscriptDelta("HI")]
    # No voice at all (the echo agent): the words only.
    assert await _all(LiveAgent(EchoRealtime()).respond(_request(**{SAY: "hi"}))) == [
        TranscriptDelta("hi")]


async def test_everything_else_is_the_agents_own() -> None:
    agent = LiveAgent(Voiced())
    assert await _all(agent.respond(_request())) == [TranscriptDelta("its own answer")]
    assert await agent.transcribe(UserTurn("i")) == "heard"
    assert getattr(LiveAgent(EchoRealtime()), "transcribe", None) is None
