"""The pure parts of bench/capacity.py (issue 32 items 2-3): judging an overload row, the
conversational duty cycle, and which CPUs each placement gives each process. The benchmark
itself is run by hand (``--quick`` to validate); nothing here starts a server."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from appliance.loadgen.media import conversational_frames, encode_tone


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "capacity.py"
    spec = importlib.util.spec_from_file_location("capacity", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["capacity"] = mod  # dataclasses look the module up while it loads
    spec.loader.exec_module(mod)
    return mod


cap = _load()
CRIT = cap.Criteria()


def _summary(**kw: Any) -> dict[str, Any]:
    """A load generator summary of an overload step: 50 offered, 30 refused, 20 clean."""
    s: dict[str, Any] = {"requested": 50, "completed": 20, "refused": 30, "loss": 0.001,
                         "loss_worst_session": 0.004, "rtt_p99_ms": 45.0,
                         "refused_p50_ms": 8.0, "refused_p99_ms": 21.0,
                         "refused_codes": {"overloaded": 30}}
    s.update(kw)
    return s


REFUSED = [{"status": 503, "retry_after": "1", "ms": 6.0}] * 3


def _row(summary: dict[str, Any] | None = None, *, fits: int = 20, fit_p99: float = 40.0,
         probes: list[dict[str, Any]] = REFUSED, lg: float = 0.5,
         fit_passed: bool = True) -> dict[str, Any]:
    return cap.overload_row(summary or _summary(), fits=fits, fit_rtt_p99=fit_p99,
                            probes=probes, loadgen_cpu=lg, fit_passed=fit_passed)


def test_overload_row_counts_admitted_as_past_admission() -> None:
    row = _row(_summary(completed=18))
    assert (row["offered"], row["admitted"], row["completed"]) == (50, 20, 18)
    assert row["failed_admitted"] == 2
    assert row["rtt_p99_growth_vs_fit_ms"] == pytest.approx(5.0)


def test_a_row_that_meets_every_criterion_passes() -> None:
    assert cap.judge_overload(_row(), CRIT) == []


@pytest.mark.parametrize(("summary", "kw", "reason"), [
    (_summary(completed=19), {}, "1 admitted failed"),
    (_summary(loss_worst_session=0.01), {}, "worst loss 1.00 %"),  # < 1 %, not ≤
    (_summary(loss_worst_session=None), {}, "worst loss 100.00 %"),
    (_summary(rtt_p99_ms=61.0), {}, "p99 +21 ms vs fit"),
    (_summary(rtt_p99_ms=None), {}, "no RTT"),
    (_summary(refused_p99_ms=50.0), {}, "503 p99 50 ms"),
    (_summary(refused_p99_ms=None), {}, "503 p99 - ms"),
    (_summary(), {"probes": [{"status": 400, "retry_after": None, "ms": 3.0}]},
     "Retry-After unchecked (no probe refused)"),
    (_summary(), {"probes": [*REFUSED, {"status": 503, "retry_after": None, "ms": 4.0}]},
     "503 without Retry-After"),
    # The load generator's own refusals: each must have had it, and when they say, no
    # probe needs to have been refused (the appliance had room again after the ramp).
    (_summary(refused_with_retry_after=29), {}, "503 without Retry-After"),
    (_summary(refused_with_retry_after=29),
     {"probes": [{"status": 400, "retry_after": None, "ms": 3.0}]}, "503 without Retry-After"),
    (_summary(), {"lg": 0.95}, "LG"),
    (_summary(), {"fit_passed": False}, "the fit step (N = 20) failed"),
])
def test_each_criterion_fails_the_row_alone(summary: dict[str, Any], kw: dict[str, Any],
                                            reason: str) -> None:
    assert cap.judge_overload(_row(summary, **kw), CRIT) == [reason]


def test_85_percent_of_what_fits_is_the_admission_floor() -> None:
    # 20 fit: 17 admitted is 85 %; 16 is not. The rest of the 50 were refused cleanly.
    ok = _row(_summary(requested=50, refused=33, completed=17))
    short = _row(_summary(requested=50, refused=34, completed=16))
    assert cap.judge_overload(ok, CRIT) == []
    assert cap.judge_overload(short, CRIT) == ["admitted 16 < 17"]


def test_the_load_generators_refusals_check_retry_after_without_a_refused_probe() -> None:
    row = _row(_summary(refused_with_retry_after=30),
               probes=[{"status": 400, "retry_after": None, "ms": 3.0}])
    assert cap.judge_overload(row, CRIT) == []


def test_no_refusals_needs_no_probe() -> None:
    """Everything offered fitted after all: nothing was refused, so there is no 503 to judge."""
    row = _row(_summary(requested=30, refused=0, completed=30, refused_p99_ms=None),
               probes=[{"status": 400, "retry_after": None, "ms": 3.0}])
    assert cap.judge_overload(row, CRIT) == []


def test_conversational_duty_cycle_is_40_percent_each_way() -> None:
    assert conversational_frames(2.5) == (50, 75)
    for cycle in (1.0, 2.5, 5.0, 10.0):
        tone, silent = conversational_frames(cycle)
        assert tone + silent == round(cycle / 0.020)
        assert tone / (tone + silent) == pytest.approx(0.4, abs=0.5 / (tone + silent))


def test_conversational_stream_has_that_duty_cycle() -> None:
    stream = encode_tone(tone_frames=50, gap_frames=75)
    assert (stream.cycle, stream.tone_frames, stream.gap) == (125, 50, 75)


@pytest.mark.parametrize(("cycle", "shares"), [
    (0.02, (0.4, 0.4, 0.2)),  # one frame: no room for both talk and silence
    (2.5, (0.5, 0.3, 0.2)),  # an echo talks exactly as long as it heard
    (2.5, (0.4, 0.4, 0.3)),  # does not add up to 1
])
def test_conversational_frames_refuses_what_an_echo_cannot_do(
        cycle: float, shares: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        conversational_frames(cycle, shares)


def test_steady_window_is_whole_cycles_for_conversation() -> None:
    assert cap.steady_for("conversational", 8.0, 2.5) == pytest.approx(10.0)
    assert cap.steady_for("conversational", 5.0, 2.5) == pytest.approx(5.0)
    assert cap.steady_for("continuous", 8.0, 2.5) == 8.0


def test_placement_a_gives_the_transceiver_cpu0_alone() -> None:
    a = cap.affinity_plan("a", "appliance", 2)
    assert (a.measured, a.rest, a.loadgen, a.hog) == ({0}, {1}, {1}, None)
    assert (a.core, a.per_core, a.transceivers) == ("transceiver", True, 1)


def test_placement_b_puts_all_of_up_on_cpu0() -> None:
    b = cap.affinity_plan("b", "appliance", 2)
    assert (b.measured, b.rest, b.loadgen, b.hog) == ({0}, {0}, {1}, None)
    assert (b.core, b.per_core, b.transceivers) == ("tree", True, 1)


def test_placement_c_is_unpinned_beside_a_hog() -> None:
    c = cap.affinity_plan("c", "appliance", 2)
    assert (c.measured, c.rest, c.loadgen) == (None, None, None)
    assert c.hog == {cap.HOG_CPU}
    assert not c.per_core and c.transceivers is None  # up's default count
    assert cap.affinity_plan("c", "aiortc", 2) is None


def test_aiortc_has_one_plan_for_a_and_b() -> None:
    """The same CPUs, so the run measures it once and quotes it for both."""
    a, b = cap.affinity_plan("a", "aiortc", 2), cap.affinity_plan("b", "aiortc", 2)
    assert a == b and hash(a) == hash(b)
    assert (a.measured, a.loadgen) == ({0}, {1})


@pytest.mark.parametrize(("placement", "server", "ncpu"), [
    ("d", "appliance", 2), ("a", "janus", 2), ("a", "appliance", 1)])
def test_affinity_plan_refuses_what_it_cannot_place(placement: str, server: str,
                                                    ncpu: int) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        cap.affinity_plan(placement, server, ncpu)


def test_quick_and_lists_on_the_command_line() -> None:
    args = cap.parse_args(["--quick", "--placement", "a,c", "--ramps", "5,15,25",
                           "--overload", "1.5,2.5", "--pattern", "continuous,conversational"])
    assert (args.start, args.max, args.bisect) == (2, 4, 1)
    assert args.placements == ["a", "c"]
    assert args.ramp_list == [5.0, 15.0, 25.0] and args.factors == [1.5, 2.5]
    assert args.patterns == ["continuous", "conversational"]


@pytest.mark.parametrize("argv", [["--placement", "d"], ["--pattern", "turns"],
                                  ["--servers", "janus"], ["--ramps", "fast"]])
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        cap.parse_args(argv)
