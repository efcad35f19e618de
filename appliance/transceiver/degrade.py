"""Graceful degradation before refusal (issue 23): lower the Opus encoder complexity of a
transceiver's calls step by step as its headroom shrinks, raise it again when load falls.

libopus's encoder is most of a PCM call's CPU (docs/performance.md, "Where the CPU goes":
~61 %), and its complexity setting trades CPU for quality in steps (bench/opus_complexity.py,
PESQ-WB per step in docs/performance-history.md, "Overload"). So when the core fills up, giving
every call a little less quality keeps all of them free of loss, where one more call at
full quality would make every call late.

:class:`ComplexityController` is sans-IO: ``handle_load(now, busy)`` with the headroom
meter's figure (headroom.py), then ``poll_event()`` until None; each
:class:`ComplexityChanged` tells the shell to apply the new complexity to its calls.

The rules (a table would be larger than the two comparisons):

* at rest it sits at the configured complexity (``--opus-complexity``, default 5): with room
  to spare nothing changes, the default quality stays;
* ``busy >= high`` for ``dwell`` seconds at the current step: one step down (cheaper);
* ``busy <= low`` for ``dwell_up`` seconds at the current step: one step up — unless
  ``busy + call >= urgent`` (below), which would take the first step again at once;
* ``low`` is well under ``high`` times the CPU saving of a step (hysteresis), so stepping
  up after a fall does not by itself push the load back over ``high`` and oscillate;
* after any change, nothing else changes for ``dwell`` seconds (minimum dwell): the meter
  needs about a second to see the effect of a step (headroom.py, ``WINDOW`` and ``ALPHA``);
* except the *first* step down: at the configured complexity, ``busy + call >= urgent``
  (0.80; ``call`` is what one more call would
  add, the shell's per-call share — on a core shared with a hog one call is a large share
  of what is left) takes it at once, without a dwell. So, with signaling's admission limit
  at or above urgent (``--admission-limit``; the default 0.75 is under it and refuses
  first), a load report that leaves no room for one more call shows the calls already
  degraded: the
  complexity controller acts before admission refuses (issue 32, below), even when a
  neighbour fills the core within one window.

Load that grows *after* calls were admitted (issue 32: a neighbour, a CPU hog, steal; the
meter's ``busy`` counts what the core has left, headroom.py) is handled in this order:

1. the controller steps down — the first step at once if the core is nearly full, then
   one step per ``dwell`` — every call a little cheaper, no call dropped, never the whole
   ladder at once (every call's encoder takes the same one step; no call is singled out
   and none is taken down several steps in one go);
2. while any step is taken (:attr:`ComplexityController.degraded`) new calls are admitted
   only up to ``low`` (:meth:`ComplexityController.admit_limit`, reported as ``load`` →
   ``admit_limit``; signaling's admission and the transceiver's own check both use it):
   a transceiver whose calls already pay in quality for the load takes no call that
   would keep it from stepping back up. Without degradation the usual limits stand
   (signaling 0.75, the transceiver's own 0.95).

So under a growing outside load the first reaction is a cheaper encoder, the next is a
``503`` for new calls, and the calls in progress keep their audio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Complexities the controller steps through, best first. 4 is missing on purpose: with
#: libopus 1.3.1 it encodes bit-identically to 5 (docs/performance-history.md, "Opus complexity"),
#: so the step would cost nothing and save nothing.
LADDER = (10, 9, 8, 7, 6, 5, 3, 2, 1, 0)
#: Busy share at or above which the controller steps down...
HIGH = 0.70
#: ...and at or below which it steps back up.
LOW = 0.50
#: Busy share at or above which the first step down is taken without a dwell: under
#: an ``--admission-limit`` at or above it, so degradation comes first there (the default
#: limit, 0.75, is under it: refusal first, and this step meets load from elsewhere).
URGENT = 0.80
DWELL = 2.0  # seconds at a step before stepping down again (and after any change)
DWELL_UP = 5.0  # seconds of low load before stepping back up: slow to take quality back


@dataclass(frozen=True, slots=True)
class ComplexityChanged:
    """Apply ``complexity`` to every call's encoder (and to calls made from now on)."""

    at: float
    complexity: int
    previous: int
    busy: float


class ComplexityController:
    """Steps down the :data:`LADDER` from ``ceiling`` under load, back up as it falls."""

    __slots__ = ("_events", "_high_since", "_low_since", "_steps", "_i", "changed_at",
                 "changes", "dwell", "dwell_up", "high", "low", "urgent")

    def __init__(self, ceiling: int, *, floor: int = 0, high: float = HIGH, low: float = LOW,
                 urgent: float = URGENT, dwell: float = DWELL, dwell_up: float = DWELL_UP,
                 enabled: bool = True) -> None:
        if not 0 <= floor <= ceiling <= 10:
            raise ValueError("0 <= floor <= ceiling <= 10")
        if not 0 < low < high <= urgent:
            raise ValueError("0 < low < high <= urgent")
        if dwell < 0 or dwell_up < 0:
            raise ValueError("dwell >= 0")
        steps = [ceiling, *(c for c in LADDER if floor <= c < ceiling)]
        # Disabled: one step, the configured complexity, forever.
        self._steps = tuple(steps) if enabled else (ceiling,)
        self._i = 0
        self.high, self.low, self.urgent = high, low, urgent
        self.dwell, self.dwell_up = dwell, dwell_up
        self.changed_at = -math.inf
        self._high_since: float | None = None
        self._low_since: float | None = None
        self._events: list[ComplexityChanged] = []
        self.changes = 0

    @property
    def complexity(self) -> int:
        """The complexity calls should encode at now."""
        return self._steps[self._i]

    @property
    def steps(self) -> tuple[int, ...]:
        return self._steps

    @property
    def degraded(self) -> bool:
        """Calls encode below the configured complexity (some step was taken)."""
        return self._i > 0

    def admit_limit(self, default: float) -> float:
        """The busy share up to which new calls may be admitted: ``low`` while degraded
        (see the module docstring), else ``default``."""
        return self.low if self._i > 0 else default

    def handle_load(self, now: float, busy: float, call: float = 0.0) -> None:
        """The headroom meter's latest figure (call it each time it completes a window);
        ``call``: what one more call would add to it (the shell's per-call share), so the
        first step is taken as soon as one more call would not fit under ``urgent``."""
        # How long the load has been past each threshold, continuously.
        self._high_since = (self._high_since if self._high_since is not None else now) \
            if busy >= self.high else None
        self._low_since = (self._low_since if self._low_since is not None else now) \
            if busy <= self.low else None
        if self._i == 0 and busy + max(call, 0.0) >= self.urgent and len(self._steps) > 1:
            self._step(now, +1, busy)  # the core nearly full: the first step at once
            return
        if now - self.changed_at < self.dwell:
            return  # minimum dwell after a change
        if (self._high_since is not None and now - self._high_since >= self.dwell
                and self._i + 1 < len(self._steps)):
            self._step(now, +1, busy)
        elif (self._low_since is not None and now - self._low_since >= self.dwell_up
              and self._i > 0 and busy + max(call, 0.0) < self.urgent):
            # (Not back up while one more call would not fit under urgent: at the ceiling
            # that would take the first step again at once, and a report between the two
            # would show calls undegraded with no room for another.)
            self._step(now, -1, busy)

    def _step(self, now: float, by: int, busy: float) -> None:
        before = self.complexity
        self._i += by
        self.changed_at = now
        self.changes += 1
        # The load that justified this step does not justify the next one: it must be seen
        # again, for a whole dwell, at the new step.
        self._high_since = self._low_since = None
        self._events.append(ComplexityChanged(now, self.complexity, before, busy))

    def poll_event(self) -> ComplexityChanged | None:
        return self._events.pop(0) if self._events else None
