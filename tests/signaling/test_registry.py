"""The session registry's bookkeeping: the live index counts only live sessions, the record
cap forgets ended ones (oldest first) and never a live one, retention sweeps are
rate-limited, a lost transceiver's sessions end."""

from __future__ import annotations

import pytest

from appliance.signaling import registry as R


def _registry(clock: list[float]) -> R.SessionRegistry:
    return R.SessionRegistry(lambda: clock[0])


def _rec(i: int, k: int, created: float) -> R.SessionRecord:
    return R.SessionRecord(id=f"s{i}", transceiver=k, etag="e", created_at=created,
                           created_mono=0.0)


def test_active_counts_live_sessions_only() -> None:
    reg = _registry([1000.0])
    recs = [_rec(i, 0, 1000.0 + i) for i in range(3)]
    for r in recs:
        reg.add(r)
    reg.add(_rec(9, 1, 1000.0))
    assert reg.active_counts() == {0: 3, 1: 1}
    recs[0].end_reason = recs[1].end_reason = "deleted"  # ended outside the index's sight
    recs[2].last = {"state": "ended"}  # seen ended by a poll, not yet marked
    assert reg.active_counts() == {1: 1}


def test_cap_forgets_oldest_ended_never_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(R, "MAX_RECORDS", 10)
    clock = [1000.0]
    reg = _registry(clock)
    live = _rec(0, 0, 999.0)  # the oldest of all, but still live
    reg.add(live)
    for i in range(1, 12):
        r = _rec(i, 0, 1000.0 + i)
        reg.add(r)
        r.end_reason, r.ended_at = "deleted", 1000.0 + i
    assert len(reg.sessions) <= 10
    assert "s0" in reg.sessions and "s11" in reg.sessions and "s1" not in reg.sessions


def test_retention_sweep_is_rate_limited_on_add() -> None:
    clock = [1000.0]
    reg = _registry(clock)
    old = _rec(1, 0, 1000.0)
    reg.add(old)
    old.end_reason, old.ended_at = "deleted", 1000.0
    clock[0] += R.ENDED_RETENTION + 0.5
    reg.add(_rec(2, 0, clock[0]))  # first sweep since startup: forgets it
    assert "s1" not in reg.sessions
    old2 = _rec(3, 0, clock[0])
    reg.add(old2)
    old2.end_reason, old2.ended_at = "deleted", clock[0] - R.ENDED_RETENTION - 1
    reg.add(_rec(4, 0, clock[0]))  # within PURGE_EVERY of the last sweep: kept for now
    assert "s3" in reg.sessions
    reg.purge()  # an explicit sweep (list/get) always runs
    assert "s3" not in reg.sessions


def test_transceiver_lost_ends_only_its_live_sessions() -> None:
    clock = [1000.0]
    reg = _registry(clock)
    mine, other, done = _rec(1, 0, 1000.0), _rec(2, 1, 1000.0), _rec(3, 0, 999.0)
    done.end_reason, done.ended_at = "deleted", 999.5
    for r in (mine, other, done):
        reg.add(r)
    clock[0] = 1005.0
    assert reg.transceiver_lost(0) == 1
    assert (mine.end_reason, mine.ended_at) == (R.LOST, 1005.0)
    assert other.end_reason is None and done.end_reason == "deleted"
    assert reg.sessions_lost == 1
    assert mine.view()["state"] == "ended" and mine.view()["end_reason"] == R.LOST


async def test_reconcile_ends_unlisted_adopts_unknown_and_observes_steps() -> None:
    """Async only for trio's clock: an adopted record is stamped with trio time."""
    clock = [1000.0]
    reg = _registry(clock)
    listed, unlisted, newer = _rec(1, 0, 1000.0), _rec(2, 0, 1000.0), _rec(3, 0, 1000.0)
    newer.created_mono = 5.0  # created after the poll was sent: not judged by it
    for r in (listed, unlisted, newer):
        reg.add(r)
    reg.reconcile(0, [{"id": "s1", "state": "connected", "timeline": {"answer_sent": 12.0}},
                      {"id": "adopted", "state": "new", "created_at": 990.0}], asked_at=1.0)
    assert listed.last is not None and listed.last["state"] == "connected"
    assert unlisted.end_reason == "gone" and newer.end_reason is None
    assert reg.sessions["adopted"].created_at == 990.0
    assert reg.setup_hist["answer_sent"].count == 1
    reg.reconcile(0, [{"id": "s1", "timeline": {"answer_sent": 12.0}}], asked_at=1.0)
    assert reg.setup_hist["answer_sent"].count == 1  # once per session and step
    assert [v["id"] for v in reg.views()] == ["adopted", "s1", "s2", "s3"]


@pytest.mark.parametrize("sid", ["", "a/b", "x" * 65, "s1 "])
def test_lookup_refuses_malformed_ids(sid: str) -> None:
    reg = _registry([1000.0])
    reg.add(_rec(1, 0, 1000.0))
    assert reg.get(sid) is None
    with pytest.raises(R.Problem) as exc:
        reg.lookup(sid)
    assert exc.value.status == 404


#: A turn's session-object line (session_info.py): the caller spoke 1.3 s, the VAD paused
#: 520 ms before the end of turn was decided, and the reply's first frame went out 31.2 ms
#: after it.
TURN = {"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0, "transcript_ms": 2.1,
        "stt_ms": 2.0, "first_token_ms": -60.3, "first_audio_ms": 31.0, "first_sent_ms": 31.2}


def test_turn_spans_are_timed_from_the_callers_end_of_speech() -> None:
    spans = R.turn_spans(TURN)
    assert spans == pytest.approx({"speech": 1.32, "end_of_turn": 0.52, "transcript": 0.5221,
                                   "first_token": 0.4597, "first_audio": 0.551,
                                   "first_sent": 0.5512})
    assert set(spans) == set(R.TURN_SPANS)
    # A turn without the VAD's pause (an agent that reports less) is timed by nothing; one
    # cut short before its reply went out has no first_sent.
    assert R.turn_spans({**TURN, "speech_end_ms": None}) == {}
    assert set(R.turn_spans({**TURN, "first_sent_ms": None})) == set(R.TURN_SPANS) - {
        "first_sent"}


def test_each_turn_is_observed_once() -> None:
    reg = _registry([1000.0])
    rec = _rec(1, 0, 1000.0)
    reg.add(rec)
    second = {**TURN, "turn": 2, "first_sent_ms": 980.0}
    reg.observe(rec, {"state": "connected", "turns": [TURN]})
    reg.observe(rec, {"state": "connected", "turns": [TURN, second]})  # a poll later
    reg.observe(rec, {"state": "ended", "turns": [TURN, second, "junk", {"turn": "3"}]})
    sent = reg.turn_hist["first_sent"]
    assert sent.count == 2 and sent.sum == pytest.approx(0.5512 + 1.5)
    # The turn buckets: 0.5512 s is past 0.5 and within 0.6; 1.5 s within 1.5.
    assert dict(zip(sent.bounds, sent.counts, strict=True))[0.6] == 1
    assert dict(zip(sent.bounds, sent.counts, strict=True))[1.5] == 1
    assert reg.turn_hist["speech"].count == 2
