"""A call that starts to suffer after admission (issue 32 item 4): load grows from
*outside* the transceiver (a CPU hog on its core) while its calls run. Expected: the calls
in progress are handled by the complexity controller, which steps their encoders down one
step per dwell (never the whole ladder at once, no call dropped); new calls are refused —
by signaling's limit as the core fills, and from the controller's first step on for as long
as calls are degraded above its step-up threshold; when the load goes, complexity and
admission come back.

Everything is synthetic: a fake clock (window times passed in), a model of the core
(the hog's share of it, the calls' cost at each complexity) written as /proc/stat texts, and
the real LoadMeter, ComplexityController and signaling Admission fed from them."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.signaling.admission import Admission
from appliance.transceiver.corestat import parse_proc_stat_untrusted
from appliance.transceiver.degrade import DWELL, ComplexityChanged, ComplexityController
from appliance.transceiver.headroom import WINDOW, LoadMeter

TICKS = 100  # clock ticks per CPU second, as /proc/stat counts
#: CPU per call (share of a core) at each complexity, relative to 5 (bench/opus_complexity.py
#: shape: lower complexity, cheaper encoder)
COST = 0.015
FACTOR = {5: 1.0, 3: 0.85, 2: 0.75, 1: 0.7, 0: 0.6}


class Core:
    """One CPU: our calls, a hog taking ``hog`` of it, /proc/stat counters."""

    def __init__(self) -> None:
        self.busy_ticks = 0.0
        self.idle_ticks = 0.0
        self.cpu = 0.0  # our process CPU seconds

    def lateness(self, own: float, hog: float) -> float:
        """How late our frames are (s, the window's 90th percentile) with the core this
        full: a queue's wait, ``rho / (1 - rho)`` ms, from 0.8 of the core on noticeable."""
        rho = min(own + hog, 0.98)
        return 0.001 * rho / (1 - rho)

    def advance(self, span: float, own: float, hog: float) -> str:
        """``span`` seconds with us at ``own`` and the hog at ``hog`` (shares of the core)."""
        used = min(1.0, own + hog)
        self.busy_ticks += used * span * TICKS
        self.idle_ticks += (1.0 - used) * span * TICKS
        self.cpu += own * span
        running = 1 + (1 if hog > 0 else 0)
        return (f"cpu0 {int(self.busy_ticks)} 0 0 {int(self.idle_ticks)} 0 0 0 0 0 0\n"
                f"procs_running {running}\n")


def report(meter: LoadMeter, ctl: ComplexityController, sessions: int) -> dict[str, Any]:
    """What the transceiver's stats says under ``load`` (server.py load_view's fields)."""
    r = meter.report.to_json()
    return {"load": {**r, "busy": meter.busy, "sessions": sessions,
                     "admit_limit": ctl.low if ctl.degraded else None},
            "sessions_by_state": {"connected": sessions}}


def test_outside_load_degrades_first_then_refuses_then_recovers() -> None:
    meter = LoadMeter()
    ctl = ComplexityController(5)
    adm = Admission([0], {0: 0})
    core = Core()
    calls = 30
    t = 0.0
    meter.handle_tick(t, 0.0, 0.0, sent=0, stat=parse_proc_stat_untrusted(core.advance(0, 0, 0)),
                      affinity=frozenset({0}))
    sent = 0
    events: list[ComplexityChanged] = []
    refused_at: list[tuple[float, bool]] = []
    admitted_during_hog = 0

    def hog_at(now: float) -> float:
        # Nothing for 10 s, then a neighbour's load (a relay, another tenant) growing to
        # half the core over 20 s, staying 20 s, then gone.
        if now < 10 or now >= 50:
            return 0.0
        return min(0.5, (now - 10) / 20 * 0.5)

    while t < 120:
        if t == 60:
            calls = 30  # the calls admitted meanwhile have ended (their callers hung up)
        own = calls * COST * FACTOR[ctl.complexity]
        hog = hog_at(t)
        text = core.advance(WINDOW, own, hog)
        t += WINDOW
        sent += 50 * calls // 2
        # Our frames are late as the core fills (the neighbour's demand is real work).
        assert meter.handle_tick(t, core.cpu, core.lateness(own, hog), sent=sent,
                                 stat=parse_proc_stat_untrusted(text), affinity=frozenset({0}))
        ctl.handle_load(t, meter.busy)
        while (ev := ctl.poll_event()) is not None:
            events.append(ev)
        adm.report(0, report(meter, ctl, calls), adm.asked(0))
        # One new call offered per window while the hog runs.
        if 10 <= t < 50:
            if adm.admits(0):
                # Never a call admitted onto degraded calls above the step-up threshold.
                assert not (ctl.degraded and meter.busy > ctl.low), (t, meter.busy)
                adm.placed(0)
                calls += 1
                admitted_during_hog += 1
            else:
                refused_at.append((t, ctl.degraded))

    downs = [e for e in events if e.complexity < e.previous]
    ups = [e for e in events if e.complexity > e.previous]
    assert downs, "the controller must react to outside load"
    assert refused_at, "new calls must be refused once the core has no room"
    # 1. the calls in progress are handled by the controller (cheaper encoders, none
    #    dropped: the model's call count only grows until the scripted hang-ups), new calls
    #    by refusal — which holds from the first step on, for as long as calls are degraded
    #    above the step-up threshold (the assertion in the loop)
    degraded_refusals = [at for at, degraded in refused_at if degraded]
    assert degraded_refusals and degraded_refusals[0] <= downs[0].at + WINDOW
    # 2. never every call at once down the ladder: one step per dwell at most
    for a, b in zip(events, events[1:], strict=False):
        assert b.at - a.at >= DWELL
        assert abs(b.complexity - a.complexity) <= 2  # neighbours on the ladder (5 -> 3)
    # 3. no call admitted while degraded above the step-up threshold, and some admitted
    #    before the hog filled the core (admission works, it is not just shut)
    assert admitted_during_hog > 0
    # 4. the hog gone (and the extra calls ended): back to the configured complexity, one
    #    step at a time, and admitting again
    assert ups and ctl.complexity == 5
    assert adm.admits(0)


def test_a_degraded_transceiver_admits_only_up_to_the_step_up_threshold() -> None:
    adm = Admission([0], {0: 0})
    stats = {"load": {"busy": 0.55, "cpu": 0.55, "sessions": 20, "available": 1.0,
                      "admit_limit": None, "lag_mean_ms": 0.1},
             "sessions_by_state": {"connected": 20}}
    adm.report(0, stats, adm.asked(0))
    assert adm.admits(0) and adm.view(0)["degraded"] is False
    stats["load"]["admit_limit"] = 0.5  # the controller took a step: degraded
    adm.report(0, stats, adm.asked(0))
    assert not adm.admits(0)
    view = adm.view(0)
    assert view["degraded"] is True and view["limit"] == 0.5 and view["room"] == 0


def test_what_was_available_scales_the_cost_of_one_more_call() -> None:
    """Half a core available (a fair share against a hog): each call is twice the share."""
    adm = Admission([0], {0: 0})
    stats = {"load": {"busy": 0.4, "cpu": 0.2, "sessions": 10, "available": 0.5,
                      "lag_mean_ms": 0.1}, "sessions_by_state": {"connected": 10}}
    adm.report(0, stats, adm.asked(0))
    cost = adm.view(0)["call_cost"]
    assert adm.projected(0, 1) - adm.projected(0, 0) == pytest.approx(cost / 0.5)
    assert adm.view(0)["available"] == 0.5


def test_a_sudden_hog_is_met_by_the_controller_before_any_refusal() -> None:
    """The hog takes most of the core within one window (issue 32 item 4, the mid-run hog
    in the model): the first report that leaves no
    room already shows the calls degraded, and refusal follows; the calls are never taken
    down more than one step per report."""
    meter = LoadMeter()
    ctl = ComplexityController(5)
    adm = Admission([0], {0: 0})
    core = Core()
    calls, t, sent = 30, 0.0, 0
    meter.handle_tick(t, 0.0, 0.0, sent=0, stat=parse_proc_stat_untrusted(core.advance(0, 0, 0)),
                      affinity=frozenset({0}))
    first_step: float | None = None
    first_refusal: float | None = None
    while t < 40:
        own = calls * COST * FACTOR[ctl.complexity]
        hog = 0.6 if t >= 10 else 0.0
        text = core.advance(WINDOW, own, hog)
        t += WINDOW
        sent += 50 * calls // 2
        # The window's ticks and pacer call-backs, as late as the queue makes them.
        meter.add_lateness([core.lateness(own, hog)] * 25)
        meter.handle_tick(t, core.cpu, core.lateness(own, hog), sent=sent,
                          stat=parse_proc_stat_untrusted(text), affinity=frozenset({0}))
        before = ctl.steps.index(ctl.complexity)
        ctl.handle_load(t, meter.busy)
        while (ev := ctl.poll_event()) is not None:
            if first_step is None and ev.complexity < ev.previous:
                first_step = ev.at
        assert ctl.steps.index(ctl.complexity) - before <= 1
        adm.report(0, report(meter, ctl, calls), adm.asked(0))
        if not adm.admits(0) and first_refusal is None:
            first_refusal = t
            assert ctl.degraded, (t, meter.busy)
    assert first_step is not None and first_refusal is not None
    assert first_step <= first_refusal
