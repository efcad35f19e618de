"""The shared pacer: one task calls every session back at its due time, in order."""

from __future__ import annotations

import trio
import trio.testing

from appliance.agents import resolve
from appliance.agents.context import AgentContext, AgentHost, AgentIdentity, Frame
from appliance.transceiver.pacer import Pacer


class Recorder:
    def __init__(self, name: str, log: list[tuple[str, float, float]]) -> None:
        self.name = name
        self.log = log

    def pace(self, now: float, at: float) -> None:
        self.log.append((self.name, now, at))


async def _callbacks_in_due_order() -> None:
    log: list[tuple[str, float, float]] = []
    pacer = Pacer()
    a, b = Recorder("a", log), Recorder("b", log)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pacer.run)
        t0 = trio.current_time()
        pacer.schedule(t0 + 0.04, a)
        pacer.schedule(t0 + 0.02, b)
        await trio.sleep(0.01)
        pacer.schedule(t0 + 0.015, a)  # earlier than anything queued: wakes the pacer
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert [(name, round(at - t0, 3)) for name, _, at in log] == [
        ("a", 0.015), ("b", 0.02), ("a", 0.04)]
    assert all(now >= at for _, now, at in log)
    assert pacer.callbacks == 3 and len(pacer) == 0


def test_builtin_echo_is_a_synchronous_frame_handler() -> None:
    agent = resolve("echo")
    assert agent.on_frame is not None
    sent = []
    host = AgentHost(on_output=lambda: sent.append(1))
    ctx = AgentContext(host, AgentIdentity("echo", "s"))
    frame = Frame(b"\x01\x00" * 960, 0.0, 0.0, True)
    for _ in range(5):
        agent.on_frame(ctx, frame)
    # Three frames (60 ms) queued, the fourth is queued while 60 ms are, the fifth dropped.
    assert host.queued_frames == 4 and len(sent) == 4


def test_callbacks_in_due_order_from_one_task() -> None:
    trio.run(_callbacks_in_due_order, clock=trio.testing.MockClock(autojump_threshold=0))
