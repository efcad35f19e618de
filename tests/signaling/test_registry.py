"""The session registry's bookkeeping: placement counts only live sessions, the record cap
forgets ended ones (oldest first) and never a live one, retention sweeps are rate-limited."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from appliance.signaling import state as S


def _state(clock: list[float]) -> S.SignalingState:
    return S.SignalingState(S.SignalingConfig(transceivers={0: "127.0.0.1:1", 1: "127.0.0.1:2"}),
                            clock=lambda: clock[0])


def _rec(i: int, k: int, created: float) -> S.SessionRecord:
    return S.SessionRecord(id=f"s{i}", transceiver=k, etag="e", created_at=created,
                           created_mono=0.0)


def test_pick_order_counts_live_sessions_only() -> None:
    clock = [1000.0]
    st = _state(clock)
    recs = [_rec(i, 0, 1000.0 + i) for i in range(3)]
    for r in recs:
        st._add(r)
    st._add(_rec(9, 1, 1000.0))
    assert st.pick_order() == [1, 0]
    recs[0].end_reason = recs[1].end_reason = "deleted"  # ended outside the index's sight
    recs[2].last = {"state": "ended"}  # seen ended by a poll, not yet marked
    assert st.active_counts() == {1: 1}
    assert st.pick_order() == [0, 1]


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
        assert st.placing == {0: 5, 1: 5}
        release.set()
    assert st.placing == {0: 0, 1: 0}
    assert st.active_counts() == {0: 5, 1: 5}
    assert st.pick_order() == [0, 1]


def test_cap_forgets_oldest_ended_never_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "MAX_RECORDS", 10)
    clock = [1000.0]
    st = _state(clock)
    live = _rec(0, 0, 999.0)  # the oldest of all, but still live
    st._add(live)
    for i in range(1, 12):
        r = _rec(i, 0, 1000.0 + i)
        st._add(r)
        r.end_reason, r.ended_at = "deleted", 1000.0 + i
    assert len(st.sessions) <= 10
    assert "s0" in st.sessions and "s11" in st.sessions and "s1" not in st.sessions


def test_retention_sweep_is_rate_limited_on_add() -> None:
    clock = [1000.0]
    st = _state(clock)
    old = _rec(1, 0, 1000.0)
    st._add(old)
    old.end_reason, old.ended_at = "deleted", 1000.0
    clock[0] += S.ENDED_RETENTION + 0.5
    st._add(_rec(2, 0, clock[0]))  # first sweep since startup: forgets it
    assert "s1" not in st.sessions
    old2 = _rec(3, 0, clock[0])
    st._add(old2)
    old2.end_reason, old2.ended_at = "deleted", clock[0] - S.ENDED_RETENTION - 1
    st._add(_rec(4, 0, clock[0]))  # within PURGE_EVERY of the last sweep: kept for now
    assert "s3" in st.sessions
    st.purge()  # an explicit sweep (list/get) always runs
    assert "s3" not in st.sessions
