"""Admission (issue 23): signaling places a call only where one more fits, refuses the rest
with 503 ``overloaded`` + Retry-After before any create is sent, and /readyz turns unready
when every transceiver is full.

The headroom signal is driven deterministically: the fake transceivers report a made-up
``load`` (what a real one measures, transceiver/headroom.py), and the tests call
``refresh()`` themselves, so nothing here depends on timing."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from signaling.conftest import MakeEnv
from signaling.fakes import OFFER

from appliance.signaling.admission import Admission

SDP = {"Content-Type": "application/sdp"}


def load(busy: float, sessions: int, *, cpu: float | None = None,
         lag_mean_ms: float = 0.1) -> dict[str, Any]:
    return {"busy": busy, "cpu": busy if cpu is None else cpu, "sessions": sessions,
            "lag_max_ms": 2 * lag_mean_ms, "lag_mean_ms": lag_mean_ms}


# -- the decision, sans-IO ----------------------------------------------------------------


def test_cost_is_learned_from_reports_and_calls_fit_under_the_limit() -> None:
    placing = {0: 0}
    adm = Admission([0], placing, limit=0.85, prior_cost=0.0125)
    adm.report(0, {"load": load(0.01, 0)}, adm.asked(0))  # idle: 1 % of the core
    # 20 connected calls at 41 % of the core: (0.41 - 0.01) / 20 = 2 % a call.
    adm.report(0, {"load": load(0.41, 20), "sessions_by_state": {"connected": 20}},
               adm.asked(0))
    assert adm.view(0)["call_cost"] == pytest.approx(0.02)
    assert adm.view(0)["call_cost_learned"]
    assert adm.room(0) == 22  # (0.85 - 0.41) / 0.02 = 22
    for _ in range(22):
        assert adm.admits(0)
        adm.placed(0)
    assert not adm.admits(0)
    assert adm.room(0) == 0


def test_creates_in_flight_count_before_they_are_answered() -> None:
    placing = {0: 0}
    adm = Admission([0], placing, limit=0.5, prior_cost=0.1)
    adm.report(0, {"load": load(0.0, 0, cpu=0.0)}, adm.asked(0))
    assert adm.room(0) == 5
    placing[0] = 4  # four creates sent, none answered yet
    assert adm.room(0) == 1
    assert adm.admits(0)
    placing[0] = 5
    assert not adm.admits(0)


def test_placements_during_a_poll_are_not_lost_when_its_answer_arrives() -> None:
    """The report of a poll sent before three placements cannot have counted them."""
    adm = Admission([0], {0: 0}, limit=0.5, prior_cost=0.1)
    adm.report(0, {"load": load(0.0, 0, cpu=0.0)}, adm.asked(0))
    adm.placed(0)
    mark = adm.asked(0)  # the poll leaves now: it will count that one
    for _ in range(3):
        adm.placed(0)  # ... but not these
    adm.report(0, {"load": load(0.0, 1, cpu=0.0)}, mark)
    assert adm.pending(0) == 3
    # now = idle(0) + 0.1 x 1 session; + 3 pending + 1 = 0.5: one more still fits.
    assert adm.admits(0)
    adm.placed(0)
    assert not adm.admits(0)


def test_a_saturated_window_teaches_no_cost_and_forget_resets() -> None:
    adm = Admission([0], {0: 0}, prior_cost=0.0125)
    adm.report(0, {"load": load(1.0, 40, cpu=0.6, lag_mean_ms=12.0),
                   "sessions_by_state": {"connected": 40}}, adm.asked(0))
    assert not adm.view(0)["call_cost_learned"]  # mean lag past 5 ms: saturated
    assert not adm.admits(0)  # but busy 1.0 is full
    adm.forget(0)  # the process was restarted
    assert adm.admits(0)
    assert adm.view(0)["pending"] == 0


def test_reports_without_load_keep_the_prior() -> None:
    """An older transceiver (no ``load`` in stats): judged by placements and the prior."""
    adm = Admission([0], {0: 0}, limit=0.1, prior_cost=0.02)
    adm.report(0, {"counters": {}}, adm.asked(0))
    assert adm.room(0) == 4  # (0.1 - idle 0.01) / 0.02 = 4.5


# -- through the HTTP API -------------------------------------------------------------------


async def post(client: Any) -> Any:
    return await client.post("/v1/sessions", data=OFFER, headers=SDP)


async def test_burst_of_100_posts_admits_what_fits_and_refuses_the_rest(
        make_env: MakeEnv) -> None:
    """The issue's scenario: 100 POSTs at once, none of whose calls has started yet. Each
    transceiver reports 50.5 % busy with 10 calls; at the prior 2 % a call, 12 more fit
    under the default 75 % on each ((0.75 - 0.505) / 0.02 = 12.25): 24 admitted, 76
    refused."""
    env = await make_env(admission_call_cost=0.02)
    for fake in env.fakes.values():
        fake.load = load(0.505, 10)
    await env.state.refresh()
    client = env.client()
    statuses: list[int] = []
    refusals: list[Any] = []

    async def one() -> None:
        r = await post(client)
        statuses.append(r.status_code)
        if r.status_code == 503:
            refusals.append(r)

    async with trio.open_nursery() as nursery:
        for _ in range(100):
            nursery.start_soon(one)
    assert statuses.count(201) == 24
    assert statuses.count(503) == 76
    creates = {k: sum(1 for q in f.requests if q["op"] == "create") for k, f in env.fakes.items()}
    assert creates == {0: 12, 1: 12}  # refused ones never reached a transceiver
    body = await refusals[0].get_json()
    assert body["code"] == "overloaded"
    assert body["status"] == 503
    assert refusals[0].headers["Retry-After"] == "2"
    assert refusals[0].headers["Content-Type"] == "application/problem+json"
    assert env.state.admission.refused == 76


async def test_refused_before_any_create_and_admitted_again_when_load_falls(
        make_env: MakeEnv) -> None:
    env = await make_env()
    for fake in env.fakes.values():
        fake.load = load(0.9, 50)
    await env.state.refresh()
    client = env.client()
    r = await post(client)
    assert r.status_code == 503
    assert (await r.get_json())["code"] == "overloaded"
    assert not any(q["op"] == "create" for f in env.fakes.values() for q in f.requests)
    env.fakes[1].load = load(0.3, 20)  # calls ended on transceiver 1
    await env.state.refresh()
    r = await post(client)
    assert r.status_code == 201
    assert [q["op"] for q in env.fakes[1].requests].count("create") == 1


async def test_a_transceiver_refusing_overloaded_passes_503_with_retry_after(
        make_env: MakeEnv) -> None:
    """Defence in depth: signaling admitted, both transceivers refused (their own check)."""
    env = await make_env()
    for fake in env.fakes.values():
        fake.create_error = {"ok": False, "status": 503, "code": "overloaded",
                             "detail": "no headroom for another call"}
    r = await post(env.client())
    assert r.status_code == 503
    assert (await r.get_json())["code"] == "overloaded"
    assert r.headers["Retry-After"] == "2"
    creates = [q for f in env.fakes.values() for q in f.requests if q["op"] == "create"]
    assert len(creates) == 2  # each was tried once


async def test_readyz_turns_unready_when_every_transceiver_is_full(make_env: MakeEnv) -> None:
    env = await make_env()
    client = env.client()
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert "full" not in await r.get_json()
    env.fakes[0].load = load(0.95, 60)
    r = await client.get("/readyz")  # one full, one with room: still ready
    assert r.status_code == 200
    assert (await r.get_json())["full"] == ["0"]
    env.fakes[1].load = load(0.99, 70)
    r = await client.get("/readyz")
    assert r.status_code == 503
    body = await r.get_json()
    assert body["reason"] == "overloaded"
    assert body["full"] == ["0", "1"]
    # The figures it decided on are in the body (issue 32): busy, room, headroom, limit.
    assert body["headroom"]["1"]["busy"] == 0.99 and body["headroom"]["1"]["room"] == 0
    assert body["headroom"]["1"]["headroom"] == 0
    env.fakes[0].load = load(0.2, 10)
    r = await client.get("/readyz")
    assert r.status_code == 200
    # A transceiver degrading its calls (load from elsewhere) and with half a core left:
    # /readyz shows the lower limit and what was available.
    env.fakes[0].load = {**load(0.45, 10), "available": 0.5, "admit_limit": 0.5}
    body = await (await client.get("/readyz")).get_json()
    view = body["headroom"]["0"]
    assert view["degraded"] is True and view["limit"] == 0.5 and view["available"] == 0.5
    assert view["headroom"] == pytest.approx(0.05, abs=0.01)


async def test_metrics_and_health_view_show_headroom_per_transceiver(make_env: MakeEnv) -> None:
    env = await make_env()
    env.fakes[0].load = {**load(0.4, 10), "opus_complexity": 3}
    await env.state.refresh()
    text = await (await env.client().get("/metrics")).get_data(as_text=True)
    assert 'appliance_transceiver_busy_ratio{transceiver="0"} 0.4' in text
    assert 'appliance_transceiver_opus_complexity{transceiver="0"} 3' in text
    assert 'appliance_transceiver_loop_lag_max_seconds{transceiver="0"} 0.0002' in text
    assert 'appliance_transceiver_headroom_ratio{transceiver="0"} 0.35' in text  # 0.75 - 0.4
    assert 'appliance_transceiver_room_calls{transceiver="1"}' in text
    assert "appliance_admission_refused_total 0" in text
    view = {p["id"]: p for p in env.state.health_view() if p["role"] == "transceiver"}
    assert view["0"]["load"]["busy"] == 0.4
    assert view["0"]["admission"]["headroom"] == pytest.approx(0.35)


def test_on_a_core_of_its_own_busy_is_the_calls_cost_not_the_linear_model() -> None:
    """bench/capacity.py, placement (a), 2026-12-02: a cost learned at 32 calls (0.0158 a
    call) times 64 calls read 1.0 while the 64 calls' busy was 0.58 (per-call CPU falls as
    calls are added), and signaling refused at half a core. On a core of its own busy is
    what the calls that ran through the window cost; only the others count at the cost."""
    def adm_with(available: float, steady: int) -> Admission:
        adm = Admission([0], {0: 0}, limit=0.85, prior_cost=0.0125)
        adm.report(0, {"load": {**load(0.58, 64), "available": available, "call_cpu": 0.0158,
                                "idle_cpu": 0.02, "window_calls": steady}}, adm.asked(0))
        return adm

    own = adm_with(1.0, 64)
    assert own.projected(0, 0) == pytest.approx(0.58)
    assert own.room(0) == 17  # (0.85 - 0.58) / 0.0158
    # Eight of them still connecting: busy cannot show them yet, they count at the cost.
    assert adm_with(1.0, 56).projected(0, 0) == pytest.approx(0.58 + 8 * 0.0158)
    # A shared core: the calls may get less than they need; the model is the guide.
    shared = adm_with(0.5, 64)
    assert shared.projected(0, 0) == pytest.approx((0.02 + 64 * 0.0158) / 0.5)
    assert shared.room(0) == 0
