"""GPT-Live's ``wake_policy`` / ``idle_timeout_s`` gate (appliance/live/idle.py), sans-IO on a
fake clock: ``now`` is a plain float the test moves in 20 ms frames."""

from __future__ import annotations

import pytest

from appliance.live.idle import (
    FRAME_S,
    GateError,
    Move,
    Paused,
    Phase,
    Resumed,
    WakeGate,
    wake_frames,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def frames(self, gate: WakeGate, n: int, *, speech: bool, busy: bool = False) -> None:
        for _ in range(n):
            self.now += FRAME_S
            gate.handle_input(self.now, speech, busy)


def outputs(gate: WakeGate) -> list[object]:
    out = []
    while (o := gate.poll_output()) is not None:
        out.append(o)
    return out


@pytest.mark.parametrize(("threshold", "frames"), [(0.0, 1), (0.05, 1), (0.5, 5), (0.55, 6),
                                                    (1.0, 10)])
def test_the_threshold_is_the_length_of_speech_that_wakes(threshold: float,
                                                          frames: int) -> None:
    assert wake_frames(threshold) == frames
    clock = Clock()
    gate = WakeGate(vad_threshold=threshold, now=clock.now)
    clock.frames(gate, frames - 1, speech=True)
    assert not gate.awake and outputs(gate) == []
    clock.frames(gate, 1, speech=True)
    assert gate.awake and outputs(gate) == [Resumed()]


def test_a_gap_restarts_the_evidence() -> None:
    """Four voiced frames, a quiet one, four more: never five in a row at 0.5."""
    clock = Clock()
    gate = WakeGate(now=clock.now)
    for _ in range(3):
        clock.frames(gate, 4, speech=True)
        clock.frames(gate, 1, speech=False)
    assert not gate.awake and outputs(gate) == []


def test_without_an_idle_timeout_it_never_pauses() -> None:
    clock = Clock()
    gate = WakeGate(now=clock.now)
    clock.frames(gate, 5, speech=True)
    assert gate.poll_timeout() is None
    clock.now += 10_000
    gate.handle_timeout(clock.now)
    assert gate.awake and outputs(gate) == [Resumed()]


def test_idle_pauses_after_the_timeout_and_speech_resumes() -> None:
    clock = Clock()
    gate = WakeGate(idle_timeout_s=3, now=clock.now)
    assert gate.poll_timeout() is None  # asleep: nothing to time
    clock.frames(gate, 5, speech=True)
    woke = clock.now
    assert gate.poll_timeout() == pytest.approx(woke + 3)
    clock.frames(gate, 50, speech=False)  # one quiet second
    gate.handle_timeout(clock.now)
    assert gate.awake
    clock.now = woke + 3 - 0.001
    gate.handle_timeout(clock.now)
    assert gate.awake
    clock.now = woke + 3
    gate.handle_timeout(clock.now)
    assert not gate.awake and gate.poll_timeout() is None
    assert outputs(gate) == [Resumed(), Paused()]
    clock.frames(gate, 5, speech=True)
    assert gate.awake and outputs(gate) == [Resumed()]


def test_speech_and_a_busy_agent_are_activity() -> None:
    clock = Clock()
    gate = WakeGate(idle_timeout_s=2, now=clock.now)
    clock.frames(gate, 5, speech=True)
    clock.frames(gate, 75, speech=False, busy=True)  # 1.5 s answering
    clock.frames(gate, 75, speech=True)  # 1.5 s of the caller
    clock.frames(gate, 50, speech=False)  # 1 s quiet
    last = clock.now - 50 * FRAME_S
    assert gate.poll_timeout() == pytest.approx(last + 2)
    gate.handle_timeout(clock.now)
    assert gate.awake
    deadline = gate.poll_timeout()
    assert deadline is not None
    clock.now = deadline
    gate.handle_timeout(clock.now)
    assert not gate.awake


def test_paused_seconds_count_the_time_asleep_before_the_first_wake_too() -> None:
    clock = Clock()
    start = clock.now
    gate = WakeGate(idle_timeout_s=1, now=start)
    clock.frames(gate, 100, speech=False)  # 2 s before anyone speaks
    clock.frames(gate, 5, speech=True)  # awake at start + 2.1
    assert gate.paused_seconds(clock.now) == pytest.approx(2.1)
    clock.now += 1.0
    gate.handle_timeout(clock.now)  # paused at start + 3.1
    clock.now += 4.0
    assert gate.paused_seconds(clock.now) == pytest.approx(6.1)


def test_the_table_refuses_an_illegal_move() -> None:
    clock = Clock()
    gate = WakeGate(now=clock.now)
    with pytest.raises(GateError):
        gate._move(Move.PAUSE, clock.now)  # asleep already
    assert gate.phase is Phase.ASLEEP
