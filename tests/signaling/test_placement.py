"""Placement: least loaded first, creates in flight counted as load, equal loads
alternate; and SignalingState's order over the up transceivers and live sessions."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from appliance.signaling.placement import Placement
from appliance.signaling.registry import SessionRecord
from appliance.signaling.state import SignalingConfig, SignalingState


def _state(clock: list[float]) -> SignalingState:
    return SignalingState(SignalingConfig(transceivers={0: "127.0.0.1:1", 1: "127.0.0.1:2"}),
                          clock=lambda: clock[0])


def _rec(i: int, k: int, created: float) -> SessionRecord:
    return SessionRecord(id=f"s{i}", transceiver=k, etag="e", created_at=created,
                         created_mono=0.0)


def test_order_ties_go_to_fewest_assigned_then_lowest_id() -> None:
    p = Placement([0, 1, 2])
    assert p.order([0, 1, 2], {}) == [0, 1, 2]
    p.placed(0)
    assert p.order([0, 1, 2], {}) == [1, 2, 0]
    assert p.order([0, 2], {2: 1}) == [0, 2]  # 1 is down; live load beats history
    with p.in_flight(1):
        assert p.order([0, 1, 2], {}) == [2, 0, 1]
    assert p.placing == {0: 0, 1: 0, 2: 0}
    assert p.created_total() == 1


def test_pick_order_counts_live_sessions_only() -> None:
    clock = [1000.0]
    st = _state(clock)
    recs = [_rec(i, 0, 1000.0 + i) for i in range(3)]
    for r in recs:
        st.registry.add(r)
    st.registry.add(_rec(9, 1, 1000.0))
    assert st.pick_order() == [1, 0]
    recs[0].end_reason = recs[1].end_reason = "deleted"  # ended outside the index's sight
    recs[2].last = {"state": "ended"}  # seen ended by a poll, not yet marked
    assert st.registry.active_counts() == {1: 1}
    assert st.pick_order() == [0, 1]
    st.transceivers[0].up = False
    assert st.pick_order() == [1]


class _HeldTransceiver:
    """A control client whose creates are answered only when the test says so."""

    def __init__(self, k: int, log: list[int], release: trio.Event) -> None:
        self.k, self.log, self.release = k, log, release

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        self.log.append(self.k)
        await self.release.wait()
        return {"ok": True, "answer": "v=0\r\n"}


async def test_concurrent_creates_spread_over_transceivers() -> None:
    """Regression: placement counted a session only once its transceiver had answered, so a
    burst of concurrent POSTs (bench/setup_bench.py: 20 at once) all saw equal loads and all
    went to the same transceiver, which set up every one on its single core while the other
    idled. Creates in flight now count as load: 10 at once split 5/5, then alternate."""
    st = _state([1000.0])
    placed: list[int] = []
    release = trio.Event()
    for k, ep in st.transceivers.items():
        ep.client = _HeldTransceiver(k, placed, release)  # type: ignore[assignment]
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(st.create_session, "offer", None, None)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(placed) == [0] * 5 + [1] * 5
        assert st.placement.placing == {0: 5, 1: 5}
        release.set()
    assert st.placement.placing == {0: 0, 1: 0}
    assert st.registry.active_counts() == {0: 5, 1: 5}
    assert st.pick_order() == [0, 1]
