"""The Realtime shells' pause work (appliance/realtime/turns.py): one Smart Turn inference
and one speculation in flight per session, whatever a client appends at once."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from appliance.realtime import turns
from appliance.realtime.agent import id_source
from appliance.realtime.machine import JudgeTurn, RealtimeConnection, SpeculateTurn


class SlowAgent:
    def __init__(self) -> None:
        self.asked: list[int] = []
        self.release = trio.Event()

    async def speculate(self, item_id: str, pause: int, audio: bytes) -> None:
        self.asked.append(pause)
        await self.release.wait()


async def test_a_burst_of_pauses_runs_one_inference_and_one_speculation_at_a_time(
        monkeypatch: Any) -> None:
    judged: list[int] = []
    verdict = trio.Event()

    async def fake_judge(action: JudgeTurn, machine: Any, drain: Any) -> None:
        judged.append(action.query_id)
        await verdict.wait()

    monkeypatch.setattr(turns, "judge", fake_judge)
    machine = RealtimeConnection(session_id="s", ids=id_source("t"))
    agent = SlowAgent()
    work = turns.PauseWork(machine, agent, lambda: None)
    async with trio.open_nursery() as nursery:
        for q in (1, 2, 3):
            work.start(JudgeTurn(q, b""), nursery)
            work.start(SpeculateTurn("item", q, b""), nursery)
        await trio.testing.wait_all_tasks_blocked()
        assert judged == [1] and agent.asked == [1] and work.skipped == 4
        verdict.set()
        agent.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert not work.judging and not work.speculating
        work.start(JudgeTurn(4, b""), nursery)  # the next pause's work runs again
        await trio.testing.wait_all_tasks_blocked()
        assert judged == [1, 4]
