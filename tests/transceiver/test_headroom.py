"""Headroom (issue 23): the transceiver's load meter, its report on the control channel, its
own refusal of a create it cannot carry (defence in depth behind signaling's admission),
the complexity controller's steps reaching the live calls' encoders, and signaling in
front of a real transceiver that reports full.

The load is made up: the meter's tick task is off (``measure_load``, off in process) and the tests
call :meth:`TransceiverLoad.handle_tick` with CPU seconds of their choosing, so nothing depends
on how fast this machine is or what else runs on it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from transceiver.support import make_offer

from appliance.control import control_request
from appliance.proto.dtls import Certificate
from appliance.signaling import SignalingConfig, SignalingState
from appliance.signaling.problems import Problem
from appliance.transceiver.headroom import LAG_SATURATED, LoadMeter
from appliance.transceiver.opus import _LibOpusEncoder
from appliance.transceiver.server import (
    TransceiverAddresses,
    TransceiverConfig,
    serve_transceiver,
)

SECRETS = (b"routing-secret-for-tests-0123456",)
CANDIDATES = [["198.51.100.1", 3478]]
CERT = Certificate.generate(time.time())


# -- the meter, sans-IO ---------------------------------------------------------------------


def test_busy_is_cpu_per_wall_second_smoothed_over_windows() -> None:
    m = LoadMeter()
    assert not m.handle_tick(10.0, 5.0, 0.0, packets=0)  # the first tick starts a window
    done = False
    for i in range(1, 26):  # 0.5 s of 20 ms ticks at 40 % of a core, 1000 packets/s
        done = m.handle_tick(10.0 + i / 50, 5.0 + i * 0.008, 0.001, packets=i * 20)
    assert done and m.windows == 1
    assert m.busy == pytest.approx(0.4)  # the first window is taken as is
    assert m.report.cpu == pytest.approx(0.4)
    assert m.report.lag_max_ms == pytest.approx(1.0)
    assert m.report.us_per_packet == pytest.approx(400.0)  # 0.2 s CPU / 500 packets
    for i in range(1, 26):  # the next window at 80 %: EWMA halfway
        m.handle_tick(10.5 + i / 50, 5.2 + i * 0.016, 0.0, packets=500)
    assert m.windows == 2
    assert m.busy == pytest.approx(0.6)
    assert m.report.window_busy == pytest.approx(0.8)  # the last window alone (issue 41)


def test_tick_lag_is_reported_and_flagged_but_is_not_busy() -> None:
    """A core shared with other processes: the loop is late on every tick though it uses
    little CPU. That is reported (and flagged), not counted as busy: on a shared host it
    would refuse every call whatever this process does."""
    m = LoadMeter()
    m.handle_tick(0.0, 0.0, 0.0)
    m.handle_tick(0.3, 0.05, LAG_SATURATED * 1.5)
    m.handle_tick(0.6, 0.1, LAG_SATURATED * 1.5)  # every tick late: behind
    assert m.report.cpu == pytest.approx(1 / 6)
    assert m.busy == pytest.approx(1 / 6)
    assert m.behind == 1
    assert m.report.lag_mean_ms == pytest.approx(7.5)
    for i in range(1, 26):  # one tick 20 ms late (a handshake, a GC) among 25
        m.handle_tick(0.6 + i / 50, 0.1 + i * 0.004, 0.020 if i == 1 else 0.0)
    assert m.windows == 2
    assert m.behind == 1  # a mean of 0.8 ms: not behind
    assert m.report.lag_max_ms == pytest.approx(20.0)


# -- the transceiver ------------------------------------------------------------------------


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[TransceiverAddresses]:
    config = TransceiverConfig(id=0, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t0.sock"))
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        yield addrs
        nursery.cancel_scope.cancel()


async def create(control: str, sid: str) -> dict[str, Any]:
    return await control_request(control, {
        "op": "create", "session_id": sid, "candidates": CANDIDATES,
        "offer": make_offer("Clnt", "clientpasswordclientpass", CERT.fingerprint)})


def complexity_of(encoder: object) -> int:
    """OPUS_GET_COMPLEXITY of a session's encoder (libopus through ctypes)."""
    assert isinstance(encoder, _LibOpusEncoder)
    return encoder.complexity


def load_window(tr: Any, t: float, busy: float, *, lag: float = 0.0) -> float:
    """One meter window of 0.5 s at ``busy``, from made-up times; returns its end."""
    cpu = getattr(tr, "_test_cpu", 0.0)
    tr.load.handle_tick(t, cpu, 0.0)
    tr._test_cpu = cpu + busy * 0.5
    tr.load.handle_tick(t + 0.5, tr._test_cpu, lag)
    return t + 0.5


async def test_stats_reports_load_and_a_full_transceiver_refuses_creates(
        running: TransceiverAddresses) -> None:
    tr, control = running.transceiver, running.control
    assert tr is not None and control is not None
    assert (await create(control, "a"))["ok"]
    load_window(tr, 100.0, 0.3)
    stats = await control_request(control, {"op": "stats"})
    assert stats["load"]["busy"] == 0.3
    assert stats["load"]["sessions"] == 1
    assert stats["load"]["opus_complexity"] == 5
    # One call at 30 % (idle included: an over-estimate): 0.3 + 0.3 fits under 0.95.
    assert (await create(control, "b"))["ok"]
    tr.load.meter = LoadMeter()  # a fresh window series, then a full one
    load_window(tr, 200.0, 0.96)
    r = await create(control, "c")
    assert (r["ok"], r["status"], r["code"]) == (False, 503, "overloaded")
    assert tr.counters["sessions_refused_overloaded"] == 1
    assert "c" not in tr.calls


async def test_creates_since_the_last_window_count_against_the_headroom(
        running: TransceiverAddresses) -> None:
    """A burst straight at a transceiver (no signaling in front): each create since the
    meter's last window is charged at the measured cost per call."""
    tr, control = running.transceiver, running.control
    assert tr is not None and control is not None
    for i in range(10):
        assert (await create(control, f"s{i}"))["ok"]
    load_window(tr, 100.0, 0.52)  # 10 calls at 52 %: 5.2 % a call
    admitted = 0
    for i in range(20):
        admitted += (await create(control, f"burst{i}"))["ok"]
    assert admitted == 8  # 0.52 + 0.052 x 8 = 0.936; x 9 = 0.988 > refuse_busy 0.95


async def test_complexity_steps_reach_the_live_calls_encoders(
        running: TransceiverAddresses) -> None:
    tr, control = running.transceiver, running.control
    assert tr is not None and control is not None
    for sid in ["a", *(f"x{i}" for i in range(9))]:  # ten calls
        assert (await create(control, sid))["ok"]
    await trio.testing.wait_all_tasks_blocked()  # the sessions' run() made their codecs
    session = tr.calls["a"]
    assert session.encoder is not None
    t = 0.0
    while tr.load.complexity.complexity == 5 and t < 10:
        t = load_window(tr, t, 0.8)  # past HIGH, for a dwell
    assert tr.load.complexity.complexity == 3
    assert complexity_of(session.encoder) == 3  # libopus says so
    assert tr.counters["complexity_changes"] == 1
    for _ in range(4):
        t = load_window(tr, t, 0.55)  # between the thresholds: complexity 3 stays
    assert tr.load.complexity.complexity == 3
    # Degraded and above the step-up threshold: no new call (issue 32, degrade.py).
    r = await create(control, "refused")
    assert (r["ok"], r["code"]) == (False, "overloaded")
    for _ in range(2):  # under LOW (not yet for DWELL_UP): still at 3, room again
        t = load_window(tr, t, 0.3)
    assert tr.load.complexity.complexity == 3
    assert (await create(control, "b"))["ok"]  # a call made now starts at 3
    await trio.testing.wait_all_tasks_blocked()
    assert complexity_of(tr.calls["b"].encoder) == 3
    while tr.load.complexity.complexity != 5 and t < 60:
        t = load_window(tr, t, 0.2)  # load fell: back up to the default
    assert complexity_of(session.encoder) == 5
    stats = await control_request(control, {"op": "stats"})
    assert stats["load"]["opus_complexity"] == 5


async def test_signaling_refuses_before_create_when_a_real_transceiver_reports_full(
        running: TransceiverAddresses) -> None:
    tr, control = running.transceiver, running.control
    assert tr is not None and control is not None
    state = SignalingState(SignalingConfig(transceivers={0: control}))
    try:
        load_window(tr, 100.0, 0.9)
        await state.refresh()
        with pytest.raises(Problem) as info:
            await state.create_session(make_offer("Clnt", "clientpasswordclientpass",
                                                  CERT.fingerprint), None, None)
        assert (info.value.status, info.value.code) == (503, "overloaded")
        assert info.value.headers["Retry-After"] == "2"
        assert tr.counters["sessions_created"] == 0
        assert tr.counters["sessions_refused_overloaded"] == 0  # it never got the create
        ok, detail = await state.ready()
        assert not ok and detail["full"] == ["0"]
        tr.load.meter = LoadMeter()
        load_window(tr, 200.0, 0.1)
        await state.refresh()
        rec, answer = await state.create_session(
            make_offer("Clnt", "clientpasswordclientpass", CERT.fingerprint), None, None)
        assert rec.transceiver == 0 and "a=ice-lite" in answer
    finally:
        await state.aclose()


async def test_the_tick_task_measures_a_real_process(tmp_path: Path) -> None:
    """``measure_load`` (what the CLI turns on): the meter's own task completes windows and
    stats carries them. Only that it happens is asserted, not any figure (shared machines)."""
    config = TransceiverConfig(id=0, secrets=SECRETS, listen=("127.0.0.1", 0),
                               control=str(tmp_path / "t.sock"), measure_load=True)
    async with trio.open_nursery() as nursery:
        addrs: TransceiverAddresses = await nursery.start(serve_transceiver, config)
        assert addrs.transceiver is not None and addrs.control is not None
        for _ in range(600):  # up to 30 s on a loaded machine; a window is 0.5 s
            if addrs.transceiver.load.meter.windows >= 2:
                break
            await trio.sleep(0.05)
        stats = await control_request(addrs.control, {"op": "stats"})
        assert stats["load"]["windows"] >= 2
        assert stats["load"]["window_s"] >= 0.5
        assert 0.0 <= stats["load"]["busy"] <= 1.0
        nursery.cancel_scope.cancel()
