"""Rate limits, written once: GCRA budgets and token buckets, with time passed in.

Pure (STYLE.md rules 1 and 15): no clock, no I/O — every method takes ``now`` (seconds on
any monotonic clock the caller picks), so the same code serves the relay's hot loop, the
transceiver's shell and the sans-IO cores in ``appliance/proto`` (ICE-lite's check limits),
and tests drive it on a virtual clock.

Three algorithms, because they answer different questions:

* **GCRA** (the Generic Cell Rate Algorithm, ITU-T I.371 "virtual scheduling"): one float
  per budget, the *theoretical arrival time* (TAT) of the next unit. A unit at ``now``
  conforms when ``TAT - now <= tolerance``, where ``tolerance = (burst - 1) * interval``
  and ``interval = 1 / rate``; spending it moves TAT to ``max(TAT, now) + interval``. A
  budget that was never spent (or whose TAT is in the past) is full, which is why a keyed
  table can forget refilled entries (:meth:`GcraTable.sweep`) and why clearing a full table
  is only ever more lenient. :class:`GcraRule` is the arithmetic on a TAT the caller stores
  itself (a slot on a hot-path object); :class:`Gcra` is one budget; :class:`GcraTable`
  is a bounded table of budgets per key.
* **Token bucket**: ``rate`` tokens per second up to ``burst``; starts full; one token per
  unit. The same conformance as GCRA for a single budget, kept where the state is naturally
  "tokens left" (:class:`TokenBucket`) or per source with an LRU cap
  (:class:`TokenBuckets`).
* **Fixed window**: at most ``limit`` units per ``window`` seconds, counted from the first
  unit of each window (:class:`FixedWindow`). Coarser than GCRA (up to ``2 * limit`` units
  can pass within one window's length across a boundary) but it is a hard cap on what one
  window emits, which is what ICE-lite's 401 answers want.

Floating-point: with ``burst`` units spent at one instant, ``TAT - now`` is exactly
``(burst - 1) * interval`` in real numbers but may round a hair above it, so GCRA
tolerances carry ``EPSILON`` — a burst of exactly ``burst`` always conforms.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "EPSILON", "FixedWindow", "Gcra", "GcraRule", "GcraTable", "TokenBucket", "TokenBuckets",
]

K = TypeVar("K", bound=Hashable)

#: Added to GCRA tolerances (seconds): a burst of exactly ``burst`` must not fail on rounding.
EPSILON = 1e-9
#: A TAT that is in the past for any clock (a budget never spent is full).
NEVER = -1e300


def _check(rate: float, burst: float) -> None:
    if not rate > 0 or not burst >= 1:
        raise ValueError("rate must be > 0 and burst >= 1")


@dataclass(frozen=True, slots=True)
class GcraRule:
    """The GCRA arithmetic for ``rate`` units/s with bursts of ``burst``, on a TAT stored by
    the caller (so a hot-path object can keep it in a slot instead of owning a budget)."""

    interval: float
    tolerance: float

    @classmethod
    def of(cls, rate: float, burst: float) -> GcraRule:
        _check(rate, burst)
        interval = 1.0 / rate
        return cls(interval, (burst - 1.0) * interval + EPSILON)

    def over(self, tat: float, now: float) -> bool:
        """Whether a unit at ``now`` would not conform (the budget is spent)."""
        return tat - now > self.tolerance

    def step(self, tat: float, now: float) -> float | None:
        """Spend one unit: the new TAT, or None when it does not conform (nothing spent)."""
        if tat < now:
            tat = now
        elif tat - now > self.tolerance:
            return None
        return tat + self.interval


class Gcra:
    """One GCRA budget (say, a whole worker's budget for a kind of packet)."""

    __slots__ = ("rule", "tat")

    def __init__(self, rate: float, burst: float) -> None:
        self.rule = GcraRule.of(rate, burst)
        self.tat = NEVER

    def allow(self, now: float) -> bool:
        """Spend one unit if it conforms; whether it did."""
        tat = self.rule.step(self.tat, now)
        if tat is None:
            return False
        self.tat = tat
        return True


class GcraTable(Generic[K]):
    """GCRA budgets per key, at most ``cap`` keys.

    A table at its cap is cleared before a new key goes in: every budget then restarts
    full, which is only ever more lenient, and memory stays bounded under any key stream
    (an attacker who can make keys at will gets at most one extra burst per ``cap`` keys).
    Check and spend are separate (:meth:`over`, :meth:`spend`) for callers that must check
    cheaply before an expensive validation and spend only after it (the relay's STUN
    budget: over-budget keys are dropped before the MAC check, and only keys whose MAC
    verified ever enter the table); :meth:`allow` does both.
    """

    __slots__ = ("cap", "rule", "tat")

    def __init__(self, rate: float, burst: float, cap: int) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        self.rule = GcraRule.of(rate, burst)
        self.cap = cap
        #: key -> theoretical arrival time of its next unit
        self.tat: dict[K, float] = {}

    def __len__(self) -> int:
        return len(self.tat)

    def over(self, key: K, now: float) -> bool:
        """Whether ``key``'s budget is spent (an absent key never is)."""
        tat = self.tat.get(key)
        return tat is not None and tat - now > self.rule.tolerance

    def spend(self, key: K, now: float) -> None:
        """Charge one unit to ``key`` (the caller checked :meth:`over` if it cares)."""
        tat = self.tat.get(key)
        if tat is None or tat < now:
            tat = now
            if key not in self.tat and len(self.tat) >= self.cap:
                self.tat.clear()  # bounded; only ever more lenient
        self.tat[key] = tat + self.rule.interval

    def allow(self, key: K, now: float) -> bool:
        """Spend one unit of ``key``'s budget if it conforms; whether it did."""
        if self.over(key, now):
            return False
        self.spend(key, now)
        return True

    def sweep(self, now: float) -> None:
        """Forget budgets that have refilled (they behave like absent ones)."""
        if self.tat:
            for key in [k for k, t in self.tat.items() if t <= now]:
                del self.tat[key]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst``; starts full. Time is passed in."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float) -> None:
        _check(rate, burst)
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = float("-inf")

    def take(self, now: float) -> bool:
        """Take one token if there is one; whether there was."""
        elapsed = now - self.stamp
        if elapsed > 0:  # a clock that goes backwards refills nothing
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def full_at(self) -> float:
        """When the bucket is full again (it then behaves like a new one)."""
        return self.stamp + (self.burst - self.tokens) / self.rate


class TokenBuckets(Generic[K]):
    """Token buckets per key (a source IP, say), LRU-capped at ``cap`` keys.

    Evicting a bucket forgets that a source spent its tokens, so the cap must be well above
    the number of sources expected to be active within ``burst / rate`` seconds; a forgotten
    source gets at most one extra burst, so memory stays bounded without opening a hole.
    """

    __slots__ = ("_buckets", "burst", "cap", "rate")

    def __init__(self, rate: float, burst: float, cap: int) -> None:
        if rate <= 0 or burst < 1 or cap < 1:
            raise ValueError("rate must be > 0, burst >= 1, cap >= 1")
        self.rate = rate
        self.burst = burst
        self.cap = cap
        self._buckets: OrderedDict[K, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def allow(self, key: K, now: float) -> bool:
        """Take one of ``key``'s tokens if it has one; whether it had."""
        b = self._buckets.get(key)
        if b is None:
            if len(self._buckets) >= self.cap:
                self._buckets.popitem(last=False)
            self._buckets[key] = b = TokenBucket(self.rate, self.burst)
        else:
            self._buckets.move_to_end(key)
        return b.take(now)

    def sweep(self, now: float) -> None:
        """Forget buckets that were last used ``burst / rate`` ago: they have refilled
        completely and behave like new ones."""
        full_after = self.burst / self.rate
        buckets = self._buckets
        while buckets:
            key, b = next(iter(buckets.items()))
            if now - b.stamp < full_after:
                break  # LRU order: every later bucket was used more recently
            del buckets[key]


class FixedWindow:
    """At most ``limit`` units per ``window`` seconds; a window starts at the first unit
    seen ``window`` or more after the previous window's start. ``limit <= 0`` allows
    nothing. Time is passed in; a clock that goes backwards opens no new window."""

    __slots__ = ("count", "limit", "start", "window")

    def __init__(self, limit: int, window: float = 1.0) -> None:
        if not window > 0:
            raise ValueError("window must be > 0")
        self.limit = limit
        self.window = window
        self.start = float("-inf")
        self.count = 0

    def allow(self, now: float) -> bool:
        """Count one unit if this window has room; whether it had."""
        if now - self.start >= self.window:
            self.start = now
            self.count = 0
        if self.count >= self.limit:
            return False
        self.count += 1
        return True
