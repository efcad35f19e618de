"""Placement: least loaded first, creates in flight counted as load, equal loads
alternate; and SignalingState's order over the up transceivers and live sessions."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from appliance.control import ControlError
from appliance.signaling.placement import Answer, Placement, Refused
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


class _Peer:
    """A transceiver's endpoint whose control client answers from a script (an exception
    is raised, a dict answered) and records the requests."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.sent: list[dict[str, Any]] = []
        self.last_error: str | None = None
        self.client = self

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        self.sent.append(req)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


BUSY = {"ok": False, "status": 503, "code": "draining", "detail": "draining"}


async def test_place_skips_the_silent_and_the_busy_and_counts_the_one_that_took_it() -> None:
    """The one placement loop (WebRTC sessions and phone calls): no answer and 503 go to the
    next transceiver; the first ok is placed and counted; each attempt gets build(k)'s own
    request; a transceiver that filled up meanwhile (admission) is not asked."""
    p = Placement([0, 1, 2, 3])
    peers = {0: _Peer(ControlError("gone")), 1: _Peer(BUSY),
             2: _Peer({"ok": True}),  # never asked: admits() says no
             3: _Peer({"ok": True, "answer": "v=0"})}
    got = await p.place([0, 1, 2, 3], admits=lambda k: k != 2, peers=peers,
                        build=lambda k: {"op": "create", "session_id": f"s{k}"})
    assert isinstance(got, Answer) and got.k == 3 and got.response["answer"] == "v=0"
    assert got.request == {"op": "create", "session_id": "s3"}
    assert [len(peers[k].sent) for k in range(4)] == [1, 1, 0, 1]
    assert peers[0].last_error == "gone" and peers[1].last_error is None
    assert p.assigned == {0: 0, 1: 0, 2: 0, 3: 1} and p.placing == dict.fromkeys(range(4), 0)


async def test_place_stops_at_a_final_refusal_without_counting_it() -> None:
    p = Placement([0, 1])
    bad = {"ok": False, "status": 400, "code": "bad-offer", "detail": "no audio"}
    peers = {0: _Peer(bad), 1: _Peer({"ok": True})}
    got = await p.place([0, 1], admits=lambda k: True, peers=peers, build=lambda k: {})
    assert isinstance(got, Answer) and got.k == 0 and got.response == bad
    assert peers[1].sent == [] and p.created_total() == 0


async def test_place_refused_says_what_each_tried_transceiver_said() -> None:
    p = Placement([0, 1, 2])
    peers = {0: _Peer(BUSY), 1: _Peer(ControlError("timeout")), 2: _Peer(BUSY)}
    got = await p.place([2, 0, 1], admits=lambda k: True, peers=peers, build=lambda k: {})
    assert got == Refused((BUSY, BUSY, None))  # in the order tried
    assert await p.place([0, 1], admits=lambda k: False, peers=peers,
                         build=lambda k: {}) == Refused(())
    assert p.created_total() == 0 and p.placing == {0: 0, 1: 0, 2: 0}
