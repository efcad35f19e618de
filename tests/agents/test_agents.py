"""The in-process agent interface: frames in, paced audio out, interrupt, events, registry."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import trio
import trio.testing
from agents.sample_agents import ClassAgent, fn_agent

from appliance.agents import (
    FRAME_BYTES,
    AgentContext,
    AgentError,
    AgentHost,
    AgentIdentity,
    EnergyVad,
    Frame,
    SessionEnded,
    register,
    register_scheme,
    resolve,
)


def make(**kw: Any) -> tuple[AgentHost, AgentContext]:
    host = AgentHost(**kw)
    return host, AgentContext(host, AgentIdentity("test", "s1"))


def frame(i: int) -> Frame:
    return Frame(pcm=bytes([i % 256]) * FRAME_BYTES, timestamp=i * 0.02, received_at=0.0,
                 speech=False)


async def test_echo_adds_no_buffering_beyond_one_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Each frame is available to the pacer in the same instant it was pushed."""
    host, ctx = make()
    agent = resolve("echo")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run, ctx)
        for i in range(20):
            t0 = trio.current_time()
            host.push_frame(frame(i))
            await host.wait_output()
            assert trio.current_time() == t0
            out = host.pop_output_frame()
            assert out == frame(i).pcm
            assert host.pop_output_frame() is None  # nothing else queued
            await trio.sleep(0.02)
        host.close("done")


async def test_send_any_length_is_cut_into_frames() -> None:
    host, ctx = make()
    await ctx.send(b"\x01\x00" * 1000)  # 1000 samples = 1 frame + 40 samples
    assert host.queued_samples == 1000
    assert host.pop_output_frame() == b"\x01\x00" * 960
    last = host.pop_output_frame()
    assert last is not None and len(last) == FRAME_BYTES
    assert last[:80] == b"\x01\x00" * 40 and last[80:] == bytes(FRAME_BYTES - 80)
    with pytest.raises(ValueError, match="even"):
        await ctx.send(b"\x01")


async def test_bounded_queue_applies_back_pressure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, ctx = make(max_output_seconds=0.1)  # 5 frames
    done = trio.Event()

    async def producer() -> None:
        await ctx.send(bytes(FRAME_BYTES * 8))
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(1)
        assert not done.is_set()
        assert host.queued_samples == 5 * 960  # bounded
        for _ in range(3):
            assert host.pop_output_frame() is not None
        await trio.sleep(1)
        assert done.is_set()
        assert host.queued_samples == 5 * 960


async def test_interrupt_drops_queued_and_pending_output(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host, ctx = make(max_output_seconds=0.1)
    returned = trio.Event()

    async def producer() -> None:
        await ctx.send(bytes(FRAME_BYTES * 50))  # one second of "speech"
        returned.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(0.5)
        assert ctx.queued_seconds == pytest.approx(0.1)
        ctx.interrupt()
        assert host.pop_output_frame() is None
        await trio.sleep(0.1)
        assert returned.is_set()  # the blocked send returned, its remainder dropped
        assert host.pop_output_frame() is None
        await ctx.send(bytes(FRAME_BYTES))  # the queue works again afterwards
        assert host.queued_samples == 960


async def test_played_past_returns_when_the_first_frame_of_a_send_goes_out() -> None:
    """What the assistant's ``first_sent`` mark waits on: read where a send's audio starts,
    then wait until the pacer has taken its first frame (not the backlog before it)."""
    host, ctx = make()
    await ctx.send(bytes(FRAME_BYTES * 2))  # a backlog of two frames
    start = ctx.played_seconds + ctx.queued_seconds
    await ctx.send(b"\x01" * FRAME_BYTES)
    done: list[bool] = []

    async def wait() -> None:
        done.append(await ctx.played_past(start))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        for _ in range(2):
            assert host.pop_output_frame() == bytes(FRAME_BYTES)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []  # the backlog went out: not yet
        assert host.pop_output_frame() == b"\x01" * FRAME_BYTES
    assert done == [True]
    # Interrupted (or the call ended) before it went out: False, at once.
    start = ctx.played_seconds + ctx.queued_seconds
    await ctx.send(bytes(FRAME_BYTES))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        ctx.interrupt()
    assert done == [True, False]


async def test_inbound_frames_drop_oldest_when_agent_lags() -> None:
    host, ctx = make(max_inbound_frames=3)
    for i in range(5):
        host.push_frame(frame(i))
    host.close("bye")
    got = [f.timestamp async for f in ctx.frames()]
    assert got == [0.04, 0.06, 0.08]
    assert host.frames_dropped == 2
    assert ctx.ended and ctx.end_reason == "bye"
    with pytest.raises(SessionEnded):
        await ctx.send(bytes(FRAME_BYTES))


async def test_events_both_ways() -> None:
    seen: list[dict[str, Any]] = []
    host, ctx = make(on_event=seen.append)
    host.push_event({"type": "session.started"})
    host.close("done")
    assert [e async for e in ctx.events()] == [{"type": "session.started"}]
    await ctx.send_event({"type": "transcript", "text": "hi"})
    assert seen == [{"type": "transcript", "text": "hi"}]
    with pytest.raises(ValueError, match="type"):
        await ctx.send_event({"no": "type"})


async def test_unread_stats_events_do_not_accumulate() -> None:
    """Soak regression: a session whose agent never reads events() (passthrough, echo's
    frame handler) got a stats dict per RTCP interval, kept up to max_events (~40 KB a
    call). An unread stats event is replaced by the newer one; other events are kept."""
    host, ctx = make()
    host.push_event({"type": "session.started"})
    for i in range(1000):
        host.push_event({"type": "stats", "packets_in": i})
        if i == 500:
            host.push_event({"type": "transcript", "text": "kept"})
    assert len(host._events_in) == 3
    assert host.events_coalesced == 999 and host.events_dropped == 0
    host.push_event({"type": "session.ended"})
    host.close("done")
    assert [e async for e in ctx.events()] == [
        {"type": "session.started"}, {"type": "transcript", "text": "kept"},
        {"type": "stats", "packets_in": 999}, {"type": "session.ended"}]


async def test_registry_resolves_every_form() -> None:
    assert resolve(None).name == "echo"
    assert resolve("echo").name == "echo"
    for spec in ["agents.sample_agents:ClassAgent", "agents.sample_agents:fn_agent"]:
        host, ctx = make()
        await resolve(spec).run(ctx)
        assert host.queued_samples == 960
    register("mine", ClassAgent)
    host, ctx = make()
    await resolve("mine").run(ctx)
    assert host.queued_samples == 960


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nope", "unknown agent"),
        ("no_such_module_xyz:a", "cannot import"),
        ("agents.sample_agents:missing", "has no"),
        ("agents.sample_agents:not_an_agent", "not an async function"),
        ("gopher://127.0.0.1:9/agent", "no bridge"),
        ("examples/missing.py:x", "no such file"),
    ],
)
def test_registry_rejects_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(AgentError, match=match):
        resolve(spec)


def test_scheme_hook_for_external_agents() -> None:
    calls: list[str] = []

    def factory(spec: str) -> Any:
        calls.append(spec)
        return fn_agent

    register_scheme("test", factory)
    assert resolve("test://x/y").run is fn_agent
    assert calls == ["test://x/y"]


def test_vad_flags_speech_not_silence_or_steady_noise() -> None:
    vad = EnergyVad()
    rng = np.random.default_rng(1)
    noise = (rng.normal(0, 30, 960)).astype(np.int16).tobytes()
    t = np.arange(960) / 48_000
    voice = (np.sin(2 * np.pi * 200 * t) * 8000).astype(np.int16).tobytes()
    assert not any(vad.update(bytes(FRAME_BYTES)) for _ in range(20))
    assert not any(vad.update(noise) for _ in range(50))
    assert vad.update(voice)
    flags = [vad.update(noise) for _ in range(20)]
    assert flags[:10] == [True] * 10 and not any(flags[10:])  # 200 ms hangover
