"""The WebSocket bridge against in-test agents (no transceiver): negotiation, resampling,
events both ways, interrupt, back-pressure and every way a call ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio
from trio_websocket import WebSocketConnection, WebSocketRequest, serve_websocket

from appliance.agents import (
    FRAME_BYTES,
    AgentContext,
    AgentHost,
    AgentIdentity,
    Frame,
    resolve,
)
from appliance.agents import ws as ws_mod
from appliance.audio.resample import Resampler

Handler = Callable[[WebSocketConnection], Awaitable[None]]


@asynccontextmanager
async def agent_server(handler: Handler) -> AsyncIterator[str]:
    async def on_request(request: WebSocketRequest) -> None:
        await handler(await request.accept())

    async with trio.open_nursery() as nursery:
        server = await nursery.start(
            partial(serve_websocket, on_request, "127.0.0.1", 0, ssl_context=None))
        yield f"ws://127.0.0.1:{server.port}/agent"
        nursery.cancel_scope.cancel()


class Call:
    """A fake session: the AgentHost plus what the agent asked of the transceiver."""

    def __init__(self, **kw: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.host = AgentHost(on_event=self.on_event, **kw)
        self.ctx = AgentContext(self.host, AgentIdentity("ws-test", "s1"))
        self.ended = trio.Event()
        self.n = 0

    def on_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["type"] == "session.end":
            self.end(f"agent: {event['reason']}")

    def end(self, reason: str) -> None:
        if not self.host.closed:
            self.host.push_event({"type": "session.ended", "reason": reason})
            self.host.close(reason)
        self.ended.set()

    def push(self, pcm: bytes, speech: bool = True) -> None:
        self.host.push_frame(Frame(pcm, self.n * 0.02, trio.current_time(), speech))
        self.n += 1

    async def run(self, url: str, limit: float = 5) -> None:
        with trio.fail_after(limit):
            await resolve(url).run(self.ctx)


def sine(freq: float, n: int, rate: int = 48_000) -> bytes:
    t = np.arange(n) / rate
    return (np.sin(2 * np.pi * freq * t) * 10_000).astype("<i2").tobytes()


def dominant(pcm: bytes, rate: int) -> float:
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.argmax(np.abs(np.fft.rfft(x * np.hanning(len(x))))) * rate / len(x))


async def accept(ws: WebSocketConnection, rate: int | None = None) -> dict[str, Any]:
    start = json.loads(await ws.get_message())
    msg: dict[str, Any] = {"type": "session.accept"}
    if rate is not None:
        msg["sample_rate"] = rate
    await ws.send_message(json.dumps(msg))
    return dict(start)


def test_resampler_is_a_real_filter() -> None:
    """The bridge's resampler (appliance/audio/resample.py, the default design): 1 kHz
    survives 48k→16k→48k; 10 kHz (above 8 kHz Nyquist) is removed, not aliased."""
    down = Resampler(48_000, 16_000)
    up = Resampler(16_000, 48_000)
    low = down.process(sine(1000, 48_000))
    assert abs(len(low) // 2 - 16_000) < 64
    assert dominant(low[2000:], 16_000) == pytest.approx(1000, abs=5)
    back = up.process(low)
    assert dominant(back[6000:], 48_000) == pytest.approx(1000, abs=5)
    hi = Resampler(48_000, 16_000).process(sine(10_000, 48_000))
    rms = np.sqrt(np.mean(np.frombuffer(hi[2000:], "<i2").astype(float) ** 2))
    assert rms < 100  # 10_000-amplitude input; sample dropping would alias it to 6 kHz


@pytest.mark.parametrize("rate", [48_000, 24_000, 16_000])
async def test_negotiation_audio_and_events(rate: int) -> None:
    got: dict[str, Any] = {"bin": [], "text": []}
    call = Call()

    async def agent(ws: WebSocketConnection) -> None:
        got["start"] = await accept(ws, rate)
        await ws.send_message(json.dumps({"type": "hello", "x": 1}))
        await ws.send_message(sine(440, rate // 5, rate))  # 200 ms of our own audio
        while len(got["bin"]) < 25:
            msg = await ws.get_message()
            (got["bin"] if isinstance(msg, bytes) else got["text"]).append(msg)
        await ws.send_message(json.dumps({"type": "session.end", "reason": "bye",
                                          "after_playback": True}))
        await ws.get_message()  # session.ended
        got["goodbye"] = True

    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        call.host.push_event({"type": "session.started", "session_id": "s1"})
        nursery.start_soon(call.run, url)
        for i in range(30):
            call.push(sine(1000, 960 * 30)[i * FRAME_BYTES:(i + 1) * FRAME_BYTES], i >= 5)
        out = []
        while not call.ended.is_set():
            await trio.sleep(0.005)
            while (f := call.host.pop_output_frame()) is not None:
                out.append(f)
    start = got["start"]
    assert start["type"] == "session.start" and start["session_id"] == "s1"
    assert start["sample_rates"] == [48_000, 24_000, 16_000] and start["encoding"] == "pcm16le"
    assert all(len(b) == rate // 50 * 2 for b in got["bin"])  # 20 ms frames at its rate
    assert dominant(b"".join(got["bin"][5:]), rate) == pytest.approx(1000, abs=rate / 960)
    texts = [json.loads(t)["type"] for t in got["text"]]
    assert "session.started" in texts and "speech.started" in texts
    assert {"type": "hello", "x": 1} in call.events  # custom events reach the transceiver
    played = b"".join(out)
    assert abs(len(played) // 2 - 9600) <= 960  # 200 ms at 48 kHz, whatever its rate
    assert dominant(played, 48_000) == pytest.approx(440, abs=10)
    assert call.host.end_reason == "agent: bye" and got.get("goodbye")


async def test_interrupt_and_back_pressure() -> None:
    """The agent blasts audio: the queue stays bounded and the bridge stops reading, so the
    agent's sends block; an interrupt drops what is queued."""
    call = Call(max_output_seconds=0.5)
    state: dict[str, Any] = {"sent": 0, "stop": False}

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        chunk = bytes(FRAME_BYTES * 10)  # 200 ms
        while state["sent"] < 2000 and not state["stop"]:  # 400 s, if nobody pushed back
            await ws.send_message(chunk)
            state["sent"] += 1
        await ws.send_message(json.dumps({"type": "interrupt"}))
        await trio.sleep_forever()

    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        nursery.start_soon(call.run, url, 20)
        with trio.fail_after(10):
            while call.host.queued_frames < call.host.max_output_frames:  # noqa: ASYNC110
                await trio.sleep(0.01)  # a poll interval: until the queue fills
            last = -1
            while state["sent"] != last:  # until the agent's sends stall
                last = state["sent"]
                # The period under test: with the queue full and nobody playing, the
                # agent's sends must stop. A starved agent can only end it early, and the
                # assertions below hold either way.
                await trio.sleep(0.3)
        assert call.host.queued_frames <= call.host.max_output_frames  # 25 frames
        assert state["sent"] < 2000  # TCP pushed back: only socket buffers' worth sent
        state["stop"] = True
        # "Play" fast so the bridge works through the socket backlog to the interrupt.
        with trio.fail_after(10):
            while call.host.interrupts == 0:
                while call.host.pop_output_frame() is not None:
                    pass
                await trio.sleep(0.001)  # a poll interval: the loop checks the state
        # The reader handles one message at a time: the interrupt empties the queue in
        # the same step that counts it, and the agent sends nothing after it.
        assert call.host.queued_samples == 0
        call.end("test over")
    assert call.host.interrupts == 1


async def test_playout_acknowledgements_say_exactly_what_was_sent() -> None:
    """``output.cleared`` answers an interrupt with the seconds played and dropped, and
    ``output.idle`` says when the queue ran dry and how much had been played: an agent
    truncates its utterance at the transceiver's count, not at a model of it."""
    call = Call()
    got: list[dict[str, Any]] = []
    queued, go = trio.Event(), trio.Event()

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws, 24_000)
        await ws.send_message(bytes(24_000))  # 0.5 s at 24 kHz
        await go.wait()
        await ws.send_message(json.dumps({"type": "interrupt"}))
        await ws.send_message(bytes(4_800))  # 0.1 s more, after the interrupt
        while len(got) < 2:
            msg = await ws.get_message()
            if isinstance(msg, str) and json.loads(msg)["type"].startswith("output."):
                got.append(json.loads(msg))
        queued.set()
        await trio.sleep_forever()

    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        nursery.start_soon(call.run, url, 20)
        async def output_until(done: Callable[[], bool]) -> None:
            while not done():  # woken by each queued chunk (the host's on_output hook)
                queued_now = trio.Event()
                call.host.on_output = queued_now.set
                await queued_now.wait()

        with trio.fail_after(10):
            await output_until(lambda: call.host.queued_samples >= 24_000 - 64)  # less the
            # resampler's tail
        for _ in range(10):  # "play" 200 ms
            assert call.host.pop_output_frame() is not None
        go.set()
        with trio.fail_after(10):
            await output_until(
                lambda: call.host.interrupts > 0 and call.host.queued_samples >= 4_800 - 64)
            while call.host.pop_output_frame() is not None:
                pass
            await queued.wait()
        call.end("test over")
    cleared, idle = got
    assert cleared["type"] == "output.cleared" and idle["type"] == "output.idle"
    assert cleared["played"] == pytest.approx(0.2)  # the pacer's count, exactly
    assert cleared["dropped"] == pytest.approx(0.3, abs=0.002)  # less the resampler's tail
    assert idle["played"] == pytest.approx(0.3, abs=0.002)
    assert call.ctx.played_seconds == pytest.approx(idle["played"], abs=1e-6)


async def test_agent_disconnect_ends_the_call_with_a_reason() -> None:
    call = Call()

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        await ws.aclose(4000, "out of tokens")

    async with agent_server(agent) as url:
        await call.run(url)
    assert call.host.end_reason == "agent: disconnected: 4000 out of tokens"


async def test_clean_close_plays_out_first() -> None:
    call = Call()

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        await ws.send_message(bytes(FRAME_BYTES * 3))
        await ws.aclose(1000, "done")

    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        nursery.start_soon(call.run, url)
        popped = 0
        while not call.ended.is_set():
            await trio.sleep(0.01)
            popped += call.host.pop_output_frame() is not None
    assert popped == 3 and call.host.end_reason == "agent: closed: done"


async def test_unreachable_timeout_and_protocol_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call = Call()
    with trio.socket.socket() as s:  # a port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await call.run(f"ws://127.0.0.1:{port}/x")
    assert call.host.end_reason is not None
    assert call.host.end_reason.startswith("agent: unreachable:")

    monkeypatch.setattr(ws_mod, "ACCEPT_TIMEOUT", 0.2)

    async def silent(ws: WebSocketConnection) -> None:
        await ws.get_message()
        await trio.sleep_forever()  # silent until the server is torn down

    call = Call()
    async with agent_server(silent) as url:
        await call.run(url)
    assert call.host.end_reason == "agent: timeout: no session.accept"

    for bad, why in [
        (lambda ws: ws.send_message("not json"), "text frames must be JSON"),
        (lambda ws: ws.send_message(b"\x00\x01\x02"), "even number of bytes"),
        (lambda ws: ws.send_message('{"no": "type"}'), "string 'type'"),
    ]:
        closed: dict[str, Any] = {}
        seen_close = trio.Event()

        async def rude(ws: WebSocketConnection, bad: Any = bad,
                       closed: dict[str, Any] = closed, seen_close: trio.Event = seen_close,
                       ) -> None:
            await accept(ws)
            await bad(ws)
            try:
                while True:
                    await ws.get_message()
            except Exception:
                closed["code"] = ws.closed.code if ws.closed else None
                seen_close.set()

        call = Call()
        async with agent_server(rude) as url:
            await call.run(url)
            with trio.fail_after(10):  # a hang guard: the agent sees the close frame
                await seen_close.wait()
        assert call.host.end_reason is not None and why in call.host.end_reason
        assert call.host.end_reason.startswith("agent: protocol-error:")
        assert closed["code"] == 1002

    async def wrong_rate(ws: WebSocketConnection) -> None:
        await accept(ws, 44_100)
        await trio.sleep_forever()  # the bridge must end the call, not the agent

    call = Call()
    async with agent_server(wrong_rate) as url:
        await call.run(url)
    assert call.host.end_reason is not None and "sample_rate" in call.host.end_reason


async def test_session_end_tells_the_agent_why() -> None:
    got: list[Any] = []
    accepted, gone = trio.Event(), trio.Event()

    async def agent(ws: WebSocketConnection) -> None:
        await accept(ws)
        got.append(await ws.get_message())  # session.started: the bridge is in session
        accepted.set()
        try:
            while True:
                got.append(await ws.get_message())
        except Exception:
            got.append(ws.closed)
            gone.set()

    call = Call()
    call.host.push_event({"type": "session.started", "session_id": "s1"})
    async with agent_server(agent) as url, trio.open_nursery() as nursery:
        nursery.start_soon(call.run, url)
        with trio.fail_after(10):  # a hang guard
            await accepted.wait()
        call.end("dtls-closed")  # the caller hung up; the session's scope is cancelled
        nursery.cancel_scope.cancel()
        with trio.fail_after(10):  # a hang guard: until the agent sees its socket close
            await gone.wait()
    texts = [json.loads(m) for m in got if isinstance(m, str)]
    assert {"type": "session.ended", "reason": "dtls-closed"} in texts
