"""Outbound packetiser: seq/timestamp/marker, pacing, continuity through silence."""

from __future__ import annotations

import pytest

from appliance.transceiver.packetizer import Packetizer


def test_first_packet_sets_marker_and_initial_values() -> None:
    pk = Packetizer(0x1234, 111, initial_seq=65535, initial_timestamp=2**32 - 960)
    assert pk.ready(0.0)
    assert pk.next_header(0.0) == (65535, 2**32 - 960, True)
    assert not pk.ready(0.01)
    assert pk.poll_timeout() == pytest.approx(0.02)
    # Wrap-around of both counters; no marker inside a talkspurt.
    assert pk.next_header(0.02) == (0, 0, False)
    assert pk.next_header(0.04) == (1, 960, False)


def test_silence_keeps_timestamp_on_wall_clock_and_marks_talkspurt() -> None:
    pk = Packetizer(1, 111, initial_seq=10, initial_timestamp=0)
    pk.next_header(0.0)
    pk.next_header(0.02)
    seq, ts, marker = pk.next_header(1.02)  # 1 s of silence after the packet at 0.02
    assert (seq, marker) == (12, True)
    assert ts == 960 + 48_000
    assert pk.talkspurts == 2


def test_small_lag_is_caught_up_without_a_new_talkspurt() -> None:
    pk = Packetizer(1, 111, initial_seq=0, initial_timestamp=0)
    pk.next_header(0.0)
    # The agent stalled 40 ms, then delivered three frames at once at t=0.06.
    headers = []
    t = 0.06
    for backlog in (2, 1, 0):
        assert pk.ready(t)
        headers.append(pk.next_header(t, backlog))
    assert [h[1] for h in headers] == [960, 1920, 2880]
    assert not any(h[2] for h in headers)
    assert not pk.ready(t)  # caught up: the schedule is back at wall time
    assert pk.poll_timeout() == pytest.approx(0.08)


def test_never_runs_ahead_of_real_time() -> None:
    pk = Packetizer(1, 111)
    t = 0.0
    sent = 0
    while t < 1.0:
        while pk.ready(t):
            pk.next_header(t)
            sent += 1
        t += 0.001
    assert sent == 50


def test_slow_source_does_not_accumulate_lag() -> None:
    """Regression: a source 10% slower than real time built up schedule lag until every
    ~30th frame looked like a new talkspurt (marker + timestamp jump)."""
    pk = Packetizer(1, 111, initial_seq=0, initial_timestamp=0)
    markers = [pk.next_header(i * 0.022)[2] for i in range(200)]
    assert markers[0] and not any(markers[1:])


def test_a_late_frame_does_not_delay_the_frames_after_it() -> None:
    """Regression: a lone late frame re-anchored the schedule at its send time, so every
    delay (a stalled caller, a busy CPU) stayed in the echo for the rest of the call."""
    pk = Packetizer(1, 111, initial_seq=0, initial_timestamp=0)
    pk.next_header(0.0)
    pk.next_header(0.02)
    pk.next_header(0.047)  # 7 ms late, nothing behind it
    assert pk.ready(0.06)  # the next one, on time, leaves at once
    pk.next_header(0.06)
    assert pk.poll_timeout() == pytest.approx(0.08)


def test_a_schedule_far_behind_is_dragged_not_kept() -> None:
    pk = Packetizer(1, 111, initial_seq=0, initial_timestamp=0, max_lag=0.040)
    pk.next_header(0.0)
    pk.next_header(0.075)  # 55 ms late: more than max_lag, less than a new talkspurt
    assert pk.poll_timeout() == pytest.approx(0.075 - 0.040 + 0.020)
    assert pk.talkspurts == 1


def test_a_lone_frame_may_leave_early_and_moves_the_schedule() -> None:
    pk = Packetizer(1, 111, initial_seq=0, initial_timestamp=0, early=0.002)
    pk.next_header(0.0)
    assert not pk.ready(0.0175)
    assert pk.ready(0.0185)  # within `early` of its due time, nothing queued behind it
    assert not pk.ready(0.0185, backlog=1)  # a backlog never leaves ahead of real time
    pk.next_header(0.0185)
    assert pk.poll_timeout(backlog=1) == pytest.approx(0.0385)


def test_lone_frames_pushed_too_fast_are_bounded() -> None:
    pk = Packetizer(1, 111, early=0.002)
    t, sent = 0.0, 0
    while t < 1.0:
        if pk.ready(t):
            pk.next_header(t)
            sent += 1
        t += 0.0005
    assert sent <= 56  # 20 / (20 - 2) ms: at most 1.11 × real time
