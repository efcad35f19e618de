"""The Opus complexity controller (issue 23, degrade.py) on a fake clock: steps down under
load after a dwell, back up when load falls after a longer one, hysteresis between the two
thresholds, a minimum dwell after every change, and the configured quality at rest."""

from __future__ import annotations

import random

import pytest

from appliance.transceiver.degrade import ComplexityChanged, ComplexityController


def run(ctl: ComplexityController, start: float, end: float, busy: float,
        step: float = 0.5) -> list[ComplexityChanged]:
    """Feed ``busy`` every ``step`` seconds over [start, end); return the changes."""
    out: list[ComplexityChanged] = []
    t = start
    while t < end:
        ctl.handle_load(t, busy)
        while (ev := ctl.poll_event()) is not None:
            out.append(ev)
        t += step
    return out


def test_the_ladder_skips_4_and_starts_at_the_configured_complexity() -> None:
    assert ComplexityController(5).steps == (5, 3, 2, 1, 0)
    assert ComplexityController(10, floor=3).steps == (10, 9, 8, 7, 6, 5, 3)
    assert ComplexityController(4).steps == (4, 3, 2, 1, 0)
    assert ComplexityController(5, enabled=False).steps == (5,)


def test_with_room_to_spare_the_default_quality_stays() -> None:
    ctl = ComplexityController(5)
    assert run(ctl, 0, 600, 0.65) == []  # just under HIGH, for ten minutes
    assert ctl.complexity == 5


def test_steps_down_one_at_a_time_with_a_dwell_between() -> None:
    ctl = ComplexityController(5, high=0.7, low=0.5, dwell=2.0, dwell_up=5.0)
    changes = run(ctl, 0, 1.5, 0.75)
    assert changes == []  # high, but not for a whole dwell yet
    changes = run(ctl, 1.5, 2.5, 0.75)
    assert [(c.at, c.previous, c.complexity) for c in changes] == [(2.0, 5, 3)]
    # Still high: the next step comes a full dwell later, not at the next report.
    changes = run(ctl, 2.5, 10.0, 0.75)
    # (The load must be seen again for a whole dwell at the new step: from 2.5 on.)
    assert [(c.at, c.complexity) for c in changes] == [(4.5, 2), (7.0, 1), (9.5, 0)]
    assert run(ctl, 10.0, 30.0, 0.99) == []  # the floor: nothing lower to go to
    assert ctl.complexity == 0


def test_hysteresis_between_low_and_high_nothing_moves() -> None:
    ctl = ComplexityController(5, high=0.7, low=0.5, dwell=2.0, dwell_up=5.0)
    run(ctl, 0, 2.5, 0.75)
    assert ctl.complexity == 3
    assert run(ctl, 2.5, 300, 0.6) == []  # between the thresholds: stay at 3
    assert ctl.complexity == 3


def test_steps_back_up_after_the_longer_dwell_and_back_to_the_default() -> None:
    ctl = ComplexityController(5, high=0.7, low=0.5, dwell=2.0, dwell_up=5.0)
    run(ctl, 0, 5.0, 0.75)
    assert ctl.complexity == 2
    changes = run(ctl, 5.0, 9.5, 0.3)
    assert changes == []  # low for 4.5 s < dwell_up
    changes = run(ctl, 9.5, 40.0, 0.3)
    assert [(c.at, c.previous, c.complexity) for c in changes] == [(10.0, 2, 3), (15.5, 3, 5)]
    assert ctl.complexity == 5
    assert ctl.changes == 4


def test_a_dip_resets_the_dwell() -> None:
    """Load must stay past a threshold for the whole dwell: one low report restarts it."""
    ctl = ComplexityController(5, high=0.7, low=0.5, dwell=2.0, dwell_up=5.0)
    run(ctl, 0, 1.5, 0.75)
    run(ctl, 1.5, 2.0, 0.6)  # a dip below HIGH
    assert run(ctl, 2.0, 3.5, 0.75) == []  # 1.5 s of high again: not yet
    assert [c.complexity for c in run(ctl, 3.5, 4.5, 0.75)] == [3]


def test_minimum_dwell_after_a_change_even_if_load_swings() -> None:
    ctl = ComplexityController(5, high=0.7, low=0.5, dwell=2.0, dwell_up=0.0)
    run(ctl, 0, 2.5, 0.75)  # down at t=2
    # Low at once, and dwell_up 0: still nothing before the minimum dwell after the change.
    changes = run(ctl, 2.5, 5.0, 0.1)
    assert [c.at for c in changes] == [4.0]


def test_disabled_never_changes() -> None:
    ctl = ComplexityController(5, enabled=False)
    assert run(ctl, 0, 60, 1.0) == []
    assert ctl.complexity == 5


@pytest.mark.parametrize("kwargs", [{"floor": 6}, {"low": 0.8, "high": 0.7}, {"dwell": -1}, {"high": 0.9, "urgent": 0.8}])
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"."):
        ComplexityController(5, **kwargs)  # type: ignore[arg-type]


def test_a_nearly_full_core_takes_the_first_step_at_once_and_only_one() -> None:
    """Issue 32: load from elsewhere that fills the core within one window. The first step
    comes with that report (a report that shows the core nearly full shows the calls already
    degraded: the controller acts before admission refuses); the next ones keep the dwell,
    one step for every call each time, never the whole ladder at once."""
    ctl = ComplexityController(5, high=0.7, low=0.5, urgent=0.8, dwell=2.0, dwell_up=5.0)
    assert run(ctl, 0, 10, 0.3) == []
    changes = run(ctl, 10, 10.5, 0.95)
    assert [(c.at, c.previous, c.complexity) for c in changes] == [(10.0, 5, 3)]
    assert ctl.degraded and ctl.admit_limit(0.85) == 0.5
    changes = run(ctl, 10.5, 16.5, 0.95)
    assert [(c.at, c.complexity) for c in changes] == [(12.5, 2), (15.0, 1)]
    assert ctl.complexity == 1  # 0 is still to come: a step per dwell


@pytest.mark.parametrize("seed", range(20))
def test_no_report_past_urgent_shows_the_calls_undegraded(seed: int) -> None:
    """Whatever the load does (random walks with jumps), after each report: busy past
    ``urgent`` means some step is taken; and steps are neighbours on the ladder."""
    rng = random.Random(seed)
    ctl = ComplexityController(5)
    busy, t = 0.3, 0.0
    for _ in range(2000):
        busy = min(1.0, max(0.0, busy + rng.gauss(0, 0.05) + (0.5 if rng.random() < 0.01
                                                                else 0.0)))
        before = ctl.complexity
        ctl.handle_load(t, busy)
        while ctl.poll_event() is not None:
            pass
        if busy >= ctl.urgent:
            assert ctl.degraded, (t, busy)
        steps = ctl.steps
        assert abs(steps.index(ctl.complexity) - steps.index(before)) <= 1
        t += 0.5


def test_the_first_step_is_taken_when_one_more_call_would_not_fit() -> None:
    """``call`` (one more call's share, server.py's call_cost): busy 0.6 plus a call of 0.25
    leaves no room under ``urgent``: the first step at once; only the first."""
    ctl = ComplexityController(5, high=0.7, low=0.5, urgent=0.8, dwell=2.0)
    ctl.handle_load(0.0, 0.6, 0.1)
    assert not ctl.degraded
    ctl.handle_load(0.5, 0.6, 0.25)
    assert ctl.complexity == 3 and ctl.changed_at == 0.5
    ctl.handle_load(1.0, 0.6, 0.25)
    assert ctl.complexity == 3  # not urgent again: the dwell rules from here
