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

    async def fake_judge(action: JudgeTurn, machine: Any, drain: Any, agent: Any) -> None:
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


class WordsAgent:
    """An agent whose transcript of a pause is ready when asked (the assistant's hook)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def pause_words(self, item_id: str, pause: int) -> str | None:
        self.asked.append((item_id, pause))
        await trio.lowlevel.checkpoint()
        return "I would like to..."


async def test_the_verdict_goes_back_with_the_pauses_words(monkeypatch: Any) -> None:
    """``judge`` hands the machine the model's P(complete) and the agent's transcript of the
    same pause (``JudgeTurn.item_id``/``pause``), as listen.py does for the ctx loop."""
    from appliance.speech import endpoint

    class Model:
        def probability(self, audio16k: bytes) -> float:
            return 0.97

    monkeypatch.setattr(endpoint, "SmartTurn", Model)
    got: list[tuple[int, float, str | None]] = []

    class Machine:
        def handle_verdict(self, query_id: int, p: float, words: str | None = None) -> None:
            got.append((query_id, p, words))

    agent = WordsAgent()
    await turns.judge(JudgeTurn(7, b"", "item_1", 3), Machine(), lambda: None,  # type: ignore[arg-type]
                      agent)
    assert got == [(7, 0.97, "I would like to...")] and agent.asked == [("item_1", 3)]
    await turns.judge(JudgeTurn(8, b""), Machine(), lambda: None, agent)  # type: ignore[arg-type]
    assert got[-1] == (8, 0.97, None) and len(agent.asked) == 1  # no pause: model alone
