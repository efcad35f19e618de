"""Signaling's per-call cost comes from the transceiver's ``call_cpu`` (learned there only
from windows with no call setup in them, transceiver/headroom.py ``CallCost``; issue 32).

Regression: learned here from ``cpu`` over the sessions connected at the poll, a window
that held six calls' ICE/DTLS handshakes taught ~3x the media's cost (0.045 against 0.015),
and under a hog signaling had no room while the transceiver had not yet degraded its calls.
Sans-IO: reports are made up, nothing depends on time."""

from __future__ import annotations

from typing import Any

import pytest

from appliance.signaling.admission import MAX_COST, Admission


def load(busy: float, sessions: int, *, cpu: float, call_cpu: float | None,
         idle_cpu: float = 0.01, unsettled: int = 0, available: float = 1.0) -> dict[str, Any]:
    return {"load": {"busy": busy, "cpu": cpu, "sessions": sessions, "lag_mean_ms": 0.5,
                     "available": available, "call_cpu": call_cpu, "idle_cpu": idle_cpu,
                     "window_calls": sessions - unsettled, "window_unsettled": unsettled},
            "sessions_by_state": {"connected": sessions - unsettled,
                                  "connecting": unsettled}}


def test_a_setup_window_does_not_teach_the_cost_of_a_call() -> None:
    adm = Admission([0], {0: 0}, limit=0.85, prior_cost=0.0125)
    # Six calls, four connected, their handshakes in the window: 0.28 of the core. The old
    # rule would learn (0.28 - 0.01) / 4 = 6.75 % a call; the transceiver has no cost yet.
    adm.report(0, load(0.28, 6, cpu=0.28, call_cpu=None, unsettled=2), adm.asked(0))
    view = adm.view(0)
    assert not view["call_cost_learned"] and view["call_cost"] == 0.0125
    # A steady window: the transceiver's figure is taken as is, not cpu / sessions.
    adm.report(0, load(0.10, 6, cpu=0.10, call_cpu=0.015), adm.asked(0))
    view = adm.view(0)
    assert view["call_cost_learned"] and view["call_cost"] == pytest.approx(0.015)
    # (0.85 - max(0.10, 0.01 + 6 x 0.015)) / 0.015 = 50 calls more.
    assert adm.room(0) == 50
    # A seventh call's setup next: busy up, cost kept (the transceiver kept it).
    adm.report(0, load(0.16, 7, cpu=0.16, call_cpu=0.015, unsettled=1), adm.asked(0))
    assert adm.view(0)["call_cost"] == pytest.approx(0.015)


def test_the_projection_divides_the_learned_cost_by_what_is_available() -> None:
    """Under a hog (``available`` 0.2): the calls' whole need counts, over what is left."""
    adm = Admission([0], {0: 0}, limit=0.85)
    adm.report(0, load(0.55, 6, cpu=0.05, call_cpu=0.015, available=0.2), adm.asked(0))
    # now = max(0.55, (0.01 + 0.09) / 0.2 = 0.5); one call 0.075: (0.85 - 0.55) / 0.075 = 4
    assert adm.projected(0, 0) == pytest.approx(0.55)
    assert adm.room(0) == 4


def test_implausible_or_missing_figures_are_clamped_or_ignored() -> None:
    adm = Admission([0], {0: 0}, prior_cost=0.0125)
    adm.report(0, load(0.1, 6, cpu=0.1, call_cpu=3.0, idle_cpu=-1.0), adm.asked(0))
    view = adm.view(0)
    assert view["call_cost"] == MAX_COST  # clamped, not believed
    assert adm.projected(0, 0) >= 0.1
    bad: dict[str, Any] = load(0.1, 6, cpu=0.1, call_cpu=None)
    bad["load"]["call_cpu"] = "0.01"  # not a number: the cost learned so far stands
    adm.report(0, bad, adm.asked(0))
    assert adm.view(0)["call_cost"] == MAX_COST
