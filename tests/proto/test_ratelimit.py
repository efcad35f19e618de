"""appliance.proto.ratelimit: the one GCRA and token-bucket implementation (pure, time
passed in). Its sans-IO purity is checked with the rest of appliance/proto by
tests/proto/test_sans_io.py; this file checks the arithmetic."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.ratelimit import (
    FixedWindow,
    Gcra,
    GcraRule,
    GcraTable,
    TokenBucket,
    TokenBuckets,
)

# Times on a 1/8 s grid and power-of-two rates keep every float exact, so GCRA and the token
# bucket can be compared decision by decision.
steps = st.lists(st.integers(min_value=0, max_value=16), min_size=1, max_size=200)


@given(steps, st.sampled_from([1.0, 2.0, 4.0, 8.0]), st.integers(min_value=1, max_value=8))
def test_gcra_and_token_bucket_agree(gaps: list[int], rate: float, burst: int) -> None:
    """The two algorithms are the same conformance test (ITU-T I.371): same decisions."""
    g, b = Gcra(rate, burst), TokenBucket(rate, burst)
    now = 0.0
    for gap in gaps:
        now += gap / 8
        assert g.allow(now) == b.take(now)


@given(steps, st.sampled_from([0.5, 1.0, 3.0, 20.0]), st.integers(min_value=1, max_value=40))
def test_gcra_never_exceeds_rate_plus_burst(gaps: list[int], rate: float, burst: int) -> None:
    g = Gcra(rate, burst)
    now, times = 0.0, []
    for gap in gaps:
        now += gap / 8
        if g.allow(now):
            times.append(now)
    for i, t0 in enumerate(times):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - t0) + 1e-6


def test_a_burst_of_exactly_burst_conforms() -> None:
    """Float rounding must not cost the last unit of a burst (20/s: 1/20 is inexact)."""
    g = Gcra(20.0, 40.0)
    assert all(g.allow(5.0) for _ in range(40))
    assert not g.allow(5.0)
    assert g.allow(5.0 + 1 / 20)


def test_rule_on_a_caller_stored_tat() -> None:
    rule = GcraRule.of(5.0, 2.0)
    tat = -1e300
    step1 = rule.step(tat, 10.0)
    assert step1 == pytest.approx(10.2)
    assert step1 is not None
    step2 = rule.step(step1, 10.0)
    assert step2 == pytest.approx(10.4)
    assert step2 is not None
    assert rule.over(step2, 10.0)
    assert rule.step(step2, 10.0) is None  # nothing spent
    assert rule.step(step2, 10.2) == pytest.approx(10.6)


def test_table_check_and_spend_are_separate() -> None:
    t: GcraTable[bytes] = GcraTable(1.0, 2.0, cap=4)
    assert not t.over(b"a", 0.0)  # absent: full
    assert len(t) == 0  # checking does not add a key
    t.spend(b"a", 0.0)
    t.spend(b"a", 0.0)
    assert t.over(b"a", 0.0)
    assert not t.allow(b"a", 0.0)
    assert t.allow(b"a", 1.0)
    t.sweep(10.0)
    assert len(t) == 0  # refilled: forgotten


def test_table_is_bounded_and_clearing_is_lenient() -> None:
    t: GcraTable[int] = GcraTable(1.0, 1.0, cap=3)
    for k in range(3):
        assert t.allow(k, 0.0)
    assert not t.allow(0, 0.0)
    assert t.allow(99, 0.0)  # a new key at the cap clears the table
    assert len(t) == 1
    assert t.allow(0, 0.0)  # ... so key 0 starts full again


def test_token_bucket_ignores_a_clock_going_backwards() -> None:
    b = TokenBucket(1.0, 1.0)
    assert b.take(10.0)
    assert not b.take(5.0)
    assert not b.take(10.5)
    assert b.take(11.0)
    assert b.full_at() == pytest.approx(12.0)


def test_token_buckets_lru_cap_and_sweep() -> None:
    tb: TokenBuckets[str] = TokenBuckets(1.0, 2.0, cap=2)
    assert tb.allow("a", 0.0) and tb.allow("a", 0.0)
    assert not tb.allow("a", 0.0)
    tb.allow("b", 0.0)
    tb.allow("c", 0.0)  # evicts "a", the least recently used
    assert len(tb) == 2
    assert tb.allow("a", 0.0)  # forgotten: a fresh burst
    tb.sweep(1.0)
    assert len(tb) == 2  # not refilled yet
    tb.sweep(2.0)
    assert len(tb) == 0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.5)])
def test_bad_parameters(rate: float, burst: float) -> None:
    makers: list[Callable[[], object]] = [
        lambda: Gcra(rate, burst), lambda: TokenBucket(rate, burst),
        lambda: GcraTable(rate, burst, 1), lambda: TokenBuckets(rate, burst, 1)]
    for make in makers:
        with pytest.raises(ValueError, match="rate"):
            make()
    with pytest.raises(ValueError, match="cap"):
        GcraTable(1.0, 1.0, 0)


def test_fixed_window_caps_each_window() -> None:
    w = FixedWindow(3)
    assert [w.allow(10.0) for _ in range(5)] == [True] * 3 + [False] * 2
    assert not w.allow(10.99)  # same window (it started at 10.0)
    assert not w.allow(9.0)  # a clock going backwards opens no window
    assert w.allow(11.0) and w.allow(11.5) and w.allow(11.9)
    assert not w.allow(11.95)
    assert w.allow(12.5)  # the window that started at 11.0 is over


@given(steps, st.integers(min_value=-1, max_value=6), st.sampled_from([0.5, 1.0, 2.0]))
def test_fixed_window_never_exceeds_limit_per_window(
        gaps: list[int], limit: int, window: float) -> None:
    w = FixedWindow(limit, window)
    now, start, count = 0.0, float("-inf"), 0
    for gap in gaps:
        now += gap / 8
        if now - start >= window:  # a reference model of the same windows
            start, count = now, 0
        ok = w.allow(now)
        assert ok == (count < limit)
        count += ok
        assert count <= max(limit, 0)


def test_fixed_window_needs_a_positive_window() -> None:
    with pytest.raises(ValueError, match="window"):
        FixedWindow(1, 0.0)
