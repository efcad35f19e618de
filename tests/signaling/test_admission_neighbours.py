"""Our other processes on a transceiver's CPUs are a per-call cost (issue 41 item 1).

Regression: with the whole ``appliance up`` on one core (bench/capacity.py placement b), a
burst of calls at 25/s was priced at the transceiver's own cost alone (~2 % a call) while
the relay worker and signaling took another ~0.8 % a call of the same core: 41-44 calls
were admitted where 16-20 fit, and the core saturated (p99 delay +107..+869 ms).
Admission now learns each co-located process's CPU per running call (only our own
processes, the supervisor's pids) and shrinks what the transceiver has by it for every
call still to show. Sans-IO: samples and reports are made up, the clock is an argument."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import trio

from appliance.signaling.admission import MAX_NEIGHBOUR, Admission, Neighbours
from appliance.signaling.health import ProcessHealth, process_cpu

ZERO, BOTH = frozenset({0}), frozenset({0, 1})


def load(own: float, sessions: int, *, core_idle: float, call_cpu: float = 0.02,
         idle_cpu: float = 0.01, available: float | None = None) -> dict[str, Any]:
    if available is None:
        available = min(own + core_idle, 1.0)
    return {"load": {"busy": own / available, "cpu": own, "own": own, "sessions": sessions,
                     "lag_mean_ms": 0.5, "available": available, "core_idle": core_idle,
                     "call_cpu": call_cpu, "idle_cpu": idle_cpu, "window_calls": sessions,
                     "window_unsettled": 0},
            "sessions_by_state": {"connected": sessions}}


def learned(relay_cpus: frozenset[int], *, idle: float = 0.02,
            per_call: float = 0.004) -> Admission:
    """One transceiver on CPU 0 that has run 20 calls while a relay worker (on
    ``relay_cpus``) used ``idle`` with no call and ``per_call`` more for each."""
    adm = Admission([0], {0: 0}, limit=0.85)
    cpus = {0: ZERO}
    relay = 0.0

    def sample(t: float) -> None:
        adm.sampled(t, {"relay 0 100": (relay, relay_cpus)}, cpus)

    adm.report(0, load(0.01, 0, core_idle=0.95), adm.asked(0))
    sample(0.0)
    relay += idle
    sample(1.0)  # settled, no call: the idle share
    for _ in range(20):
        adm.placed(0)
    adm.report(0, load(0.41, 20, core_idle=0.47), adm.asked(0))
    relay += idle + 20 * per_call
    sample(2.0)  # calls placed since the last sample: not learned from
    relay += idle + 20 * per_call
    sample(3.0)  # settled, 20 calls
    return adm


def test_a_colocated_processs_per_call_cpu_shrinks_the_room_on_its_core() -> None:
    adm = learned(ZERO)
    assert adm.neighbour_cost(0) == pytest.approx(0.004)
    # Without it: (0.85 - 0.41 / 0.88) / (0.02 / 0.88) = 16.9 -> 16 calls more. With it,
    # each call also takes 0.004 of the 0.88 the transceiver has:
    # (0.41 + 0.02 m) / (0.88 - 0.004 m) <= 0.85  ->  m <= 14.4.
    assert adm.room(0) == 14
    for _ in range(14):
        assert adm.admits(0)
        adm.placed(0)
    assert not adm.admits(0)
    assert adm.view(0)["neighbour_cost"] == pytest.approx(0.004)


def test_the_burst_from_idle_that_was_admitted_twice_over() -> None:
    """Placement b's burst: an idle transceiver (the relay and signaling take 4 % of the
    core) that has learned 2 % a call and 0.8 % for our other processes."""
    adm = learned(ZERO, idle=0.04, per_call=0.008)
    adm.report(0, load(0.01, 0, core_idle=0.95), adm.asked(0))  # the 20 calls hung up
    # (0.01 + 0.02 m) / (0.96 - 0.008 m) <= 0.85  ->  m <= 30.2; priced at the
    # transceiver's cost alone it was 40 (0.01 + 0.02 m <= 0.85 x 0.96).
    assert adm.room(0) == 30
    placed = 0
    while adm.admits(0):
        adm.placed(0)
        placed += 1
    assert placed == 30


def test_the_fair_share_our_relay_holds_is_not_the_transceivers_to_take() -> None:
    """``available`` counts a fair share of what other runnable tasks hold (for a hog,
    corestat.py); on one core those are mostly our relay, busy with these calls. Placement
    b's 5/s ramp admitted 49 calls at +31 ms p99 reading busy 0.65 with the core 85 % used."""
    adm = learned(ZERO)  # the relay used 0.10 over its last sample
    # own 0.41 + idle 0.31 = 0.72, but a fair share makes available 0.88: of the 0.16 over
    # own + idle, the relay holds 0.10, so the transceiver has 0.78;
    # (0.41 + 0.02 m) / (0.78 - 0.004 m) <= 0.85  ->  m <= 10.8.
    adm.report(0, load(0.41, 20, core_idle=0.31, available=0.88), adm.asked(0))
    assert adm.room(0) == 10
    # A fair share held by someone else (a hog: not a process of ours) is still counted.
    other = learned(frozenset({1}))
    other.report(0, load(0.41, 20, core_idle=0.31, available=0.88), other.asked(0))
    assert other.room(0) == 16  # (0.85 - 0.41 / 0.88) / (0.02 / 0.88)


def test_a_process_on_other_cpus_costs_nothing_and_one_on_both_costs_half() -> None:
    assert learned(frozenset({1})).neighbour_cost(0) == 0.0
    assert learned(frozenset({1})).room(0) == 16  # the projection without neighbours
    assert learned(BOTH).neighbour_cost(0) == pytest.approx(0.002)


def test_a_pool_of_two_cpus_has_room_for_the_neighbours() -> None:
    """Everything on two CPUs: own + idle is more than the one core a transceiver can
    use, so the neighbours' calls take nothing from it until the pool is below a core."""
    adm = learned(ZERO)
    adm.report(0, load(0.41, 20, core_idle=1.2), adm.asked(0))  # pool 1.61, available 1.0
    # (0.85 - 0.41) / 0.02 = 22 as without neighbours: 1.61 - 0.004 x 22 > 1.
    assert adm.room(0) == 22


def test_setups_restarts_and_implausible_samples_teach_nothing() -> None:
    nb = Neighbours()
    procs = {"relay 0 100": (10.0, ZERO)}
    nb.sample(0.0, procs, calls=0, placed=0)
    nb.sample(1.0, {"relay 0 100": (10.02, ZERO)}, calls=0, placed=0)
    # A burst of setups: 0.5 of the core for 10 calls, placed in the interval: not learned.
    nb.sample(2.0, {"relay 0 100": (10.52, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == 0.0
    # Settled, but a sample closer than half a second is too coarse: skipped.
    nb.sample(2.2, {"relay 0 100": (10.6, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == 0.0
    # Settled: (0.05 - 0.02) / 10 over 0.8 s... measured from the last used sample (2.0).
    nb.sample(3.0, {"relay 0 100": (10.57, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == pytest.approx(0.003)
    # A huge share (a flood on the relay) is clamped, not taken as calls' cost.
    nb.sample(4.0, {"relay 0 100": (11.57, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) <= MAX_NEIGHBOUR
    # The worker restarted (a new pid): the old one is forgotten, the new one not learned.
    nb.sample(5.0, {"relay 0 200": (0.5, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == 0.0
    # A process whose CPU went backwards (pid reuse) starts afresh too.
    nb.sample(6.0, {"relay 0 200": (0.6, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == pytest.approx(0.01)
    nb.sample(7.0, {"relay 0 200": (0.1, ZERO)}, calls=10, placed=10)
    assert nb.per_call(ZERO) == 0.0


def test_process_cpu_reads_a_real_process_and_none_for_a_gone_one() -> None:
    with subprocess.Popen([sys.executable, "-c", "sum(range(3 * 10**7)); input()"],
                          stdin=subprocess.PIPE) as p:
        affinity = os.sched_getaffinity(p.pid)
        first = process_cpu(p.pid)
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    assert first is not None and first[0] >= 0 and first[1] == affinity
    assert process_cpu(p.pid) is None  # reaped


async def test_health_samples_the_supervisors_processes_on_each_poll() -> None:
    """Under the supervisor, each refresh hands admission this process's and each relay
    worker's CPU and affinity (by the pids the supervisor reported), and each
    transceiver's affinity; an endpoint with no pid (not ours to read) is left out."""
    seen: list[tuple[dict[str, Any], dict[int, frozenset[int]]]] = []

    class Observer:
        def asked(self, k: int) -> int:
            return 0

        def report(self, k: int, stats: dict[str, Any], mark: int) -> None:
            pass

        def forget(self, k: int) -> None:
            pass

        def sampled(self, now: float, procs: Any, cpus: Any) -> None:
            seen.append((dict(procs), dict(cpus)))

    health = ProcessHealth({0: "/nonexistent/t0.sock", 1: "/nonexistent/t1.sock"},
                           {"0": "/nonexistent/r0.sock", "1": "/nonexistent/r1.sock"},
                           control_timeout=0.1, managed=True, clock=trio.current_time,
                           on_transceiver_lost=lambda k: None)
    health.observer = Observer()
    relay = await trio.lowlevel.open_process([sys.executable, "-c", "input()"],
                                             stdin=subprocess.PIPE)
    health.process_info("relay", "0", pid=relay.pid)
    health.process_info("transceiver", "0", pid=relay.pid)  # any live pid will do
    await health.refresh()
    assert relay.stdin is not None
    await relay.stdin.aclose()
    await relay.wait()
    (procs, cpus), = seen
    assert set(procs) == {f"signaling {os.getpid()}", f"relay 0 {relay.pid}"}
    assert all(cpu_s >= 0 and affinity for cpu_s, affinity in procs.values())
    assert cpus == {0: frozenset(os.sched_getaffinity(0))}
    await health.aclose()
