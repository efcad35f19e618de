"""Issue 32 item 4 with real processes: a relay and a transceiver carrying echo calls, then
CPU hogs pinned to the transceiver's CPU started mid-run (the transceiver and the hogs
share one core, so the test does not depend on what else the machine runs). How many hogs
is derived from the CPU the calls use in the same run (:func:`hogs_for`): enough that the
transceiver's fair share is half of what its calls need, so its frames are late on a fast
box and a slow one alike; they start one per meter window, so the load grows through every
busy share on its way to full.

Asserted on conditions, never on wall-clock figures:

* degrade before refuse: the first report that leaves signaling no room for one more call
  already shows the calls degraded. This failed before the call cost was learned only from
  windows with no setup in them: signaling's cost, learned from windows that held the
  calls' ICE/DTLS handshakes, was ~3x the transceiver's own CPU per call (0.045 against
  0.015), and divided by the ``available`` share under the hogs it made one call ~25 % of
  busy, so signaling had no room at busy ~0.45, before the controller's thresholds. Now the
  transceiver learns the cost (headroom.CallCost) and its controller projects one more call
  as signaling does (server.py ``projected``), its first step under 0.80 and signaling's
  limit here 0.85 (the property holds for a limit at or above the controller's urgent 0.80;
  the default 0.75 refuses first: docs/operations.md);
* the complexity controller steps the calls' encoders down (below ``--opus-complexity``),
  never more than one step of the ladder between two reports;
* a session offered once the headroom is gone is refused with 503 ``overloaded`` and
  ``Retry-After`` before any create reaches the transceiver;
* the calls admitted before the hog keep flowing (every call's received count rises).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from reliability.support import Stack, eventually, open_call, opus_frame
from transceiver.support import make_offer

from appliance.proto.dtls import Certificate
from appliance.signaling import SignalingConfig, SignalingState
from appliance.signaling.problems import Problem

pytestmark = [pytest.mark.slow]

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"
CALLS = 6
#: How many times what its calls need the transceiver's fair share of its core must fall
#: short by, once the hogs run (the hog count is derived from the CPU the calls were seen to
#: use in this run: a fixed count left the share above the need on a quiet box, so nothing
#: was late and nothing degraded; CI, 2026-12-02).
SHORTFALL = 2.0
MAX_HOGS = 64


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack.make(tmp_path)
    try:
        yield s
    finally:
        s.close()


def hogs_for(own: float) -> int:
    """Busy loops to pin beside a process that uses ``own`` of its core, so that its fair
    share, ``1 / (hogs + 1)``, is :data:`SHORTFALL` times less than ``own``."""
    return min(MAX_HOGS, max(4, math.ceil(SHORTFALL / max(own, 1e-3)) - 1))


def start_hogs(cpu: int, n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)]) for _ in range(n)]


async def test_a_hog_mid_run_degrades_first_then_refuses_and_calls_keep_flowing(
        stack: Stack) -> None:
    cpu = max(os.sched_getaffinity(0))
    # What the core has left is the subject here (tests/conftest.py sets `own` for the rest),
    # against a neighbour at the same priority: at the default --nice -11 the hogs would
    # take only what the calls leave (appliance/priority.py), and nothing would degrade.
    await stack.start_transceiver(0, "--opus-complexity", "10", "--headroom", "core",
                                  "--nice", "0")
    await stack.start_relay()
    os.sched_setaffinity(stack.transceivers[0].popen.pid, {cpu})
    payload = opus_frame()
    signaling = SignalingState(SignalingConfig(transceivers={0: stack.tcontrol[0]},
                                               admission_limit=0.85))
    hogs: list[subprocess.Popen[bytes]] = []
    reports: list[dict[str, Any]] = []
    try:
        async with trio.open_nursery() as nursery:
            calls = [await open_call(nursery, stack, 0, f"call-{i}", payload)
                     for i in range(CALLS)]
            await eventually(lambda: all(c.received >= 25 for c in calls), 60,
                             "echo on every call before the hog")
            # Signaling has learned what a call costs from the running calls (not from
            # their setup's handshakes): calls run for a while before load comes from
            # elsewhere, and a cost learned from setup would refuse on its own.
            own = 0.0

            async def settled() -> bool:
                nonlocal own
                await signaling.refresh()
                load = (await stack.ctl(0, op="stats"))["load"]
                view = signaling.admission.view(0)
                own = load["own"]
                return bool(view["call_cost_learned"]) and (
                    view["call_cost"] * CALLS <= load["cpu"] * 1.2)
            with trio.fail_after(60):
                while not await settled():  # noqa: ASYNC110 - bounded polling
                    await trio.sleep(0.2)  # the poll interval of a bounded wait
            # The hogs come one per meter window, up to the derived count: load that grows
            # (the case of issue 32 item 4) passes through every busy share between idle and
            # full, where refusing before degrading could happen; all at once, busy jumps to
            # full within a window or two and both show in the same report.
            target = hogs_for(own)
            hogs.extend(start_hogs(cpu, 1))
            hogged_at = -1  # the meter window the last hog was started after
            before = [c.received for c in calls]
            degraded: dict[str, Any] | None = None
            full: dict[str, Any] | None = None  # signaling's view when it first had no room
            try:
                with trio.fail_after(120):  # a hang guard, not a figure
                    while degraded is None or full is None:
                        await signaling.refresh()
                        load = (await stack.ctl(0, op="stats"))["load"]
                        reports.append(load)
                        if len(hogs) < target and load["windows"] > hogged_at:
                            hogs.extend(start_hogs(cpu, 1))
                            hogged_at = load["windows"]
                        if degraded is None and load["degraded"]:
                            degraded = load
                        if full is None and signaling.admission.room(0) == 0:
                            full = signaling.admission.view(0)
                        await trio.sleep(0.2)  # the poll interval of a bounded wait
            except trio.TooSlowError:
                raise AssertionError(
                    f"{len(hogs)}/{target} hogs beside own={own:.3f}: degraded={degraded is not None} "
                    f"full={full is not None}; last report {reports[-1] if reports else None}; "
                    f"signaling {signaling.admission.view(0)}") from None
            # 0. degrade before refuse: the report that left signaling no room (its view
            #    is of one report) already had the calls degraded
            assert full is not None and full["degraded"], (
                f"signaling had no room before the calls were degraded: {full}; "
                f"transceiver reports since the hog {reports}")
            # 1. the controller reacts: the calls' encoders step down (one step at a time)
            assert degraded["opus_complexity"] < 10 and degraded["admit_limit"] is not None
            complexities = [r["opus_complexity"] for r in reports]
            ladder = degraded["opus_complexity_steps"]
            assert all(abs(ladder.index(a) - ladder.index(b)) <= 1
                       for a, b in zip(complexities, complexities[1:], strict=False))
            # 2. a new session now: refused by signaling, 503 + Retry-After, no create sent
            created = (await stack.ctl(0, op="stats"))["counters"]["sessions_created"]
            with pytest.raises(Problem) as info:
                await signaling.create_session(make_offer(
                    "Clnt", "clientpasswordclientpass",
                    Certificate.generate(time.time()).fingerprint), None, None)
            assert (info.value.status, info.value.code) == (503, "overloaded")
            assert info.value.headers["Retry-After"]
            assert (await stack.ctl(0, op="stats"))["counters"]["sessions_created"] == created
            # 3. the admitted calls keep flowing under the hog
            mark = [c.received for c in calls]
            await eventually(lambda: all(c.received > m + 25 for c, m in zip(
                calls, mark, strict=True)), 60, "media on every call under the hog")
            assert all(c.failed is None for c in calls)
            assert all(m > b for m, b in zip(mark, before, strict=True))
            nursery.cancel_scope.cancel()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        await signaling.aclose()
