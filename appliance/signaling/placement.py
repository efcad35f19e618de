"""Placement: which transceiver gets the next ``create``.

Least loaded first, where load is the live sessions a transceiver holds *plus the creates
sent to it and not answered yet*; ties go to the one that was given fewest sessions ever,
then the lowest id, so equal loads alternate.

Why the creates in flight count: a burst of POSTs (20 callers at once) is placed before any
answer comes back. Counted only once answered, every one of them saw the same loads and
went to the same transceiver, which then set up all 20 on its one core while the other
idled (docs/performance.md, "Setup time"; tests/signaling/test_placement.py).

No I/O and no knowledge of sessions: the caller says which transceivers are up (health.py)
and how many live sessions each holds (registry.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


class Placement:
    def __init__(self, transceivers: Iterable[int]) -> None:
        keys = list(transceivers)
        self.assigned: dict[int, int] = dict.fromkeys(keys, 0)  # sessions ever created on k
        self.placing: dict[int, int] = dict.fromkeys(keys, 0)  # creates sent to k, unanswered

    def order(self, up: Iterable[int], active: Mapping[int, int]) -> list[int]:
        """The transceivers of ``up`` to try, best first, given ``active`` live sessions
        per transceiver."""
        placing = self.placing
        return sorted(up, key=lambda k: (active.get(k, 0) + placing.get(k, 0),
                                         self.assigned.get(k, 0), k))

    @contextmanager
    def in_flight(self, k: int) -> Iterator[None]:
        """Count a create sent to ``k`` as load for as long as its answer is awaited."""
        self.placing[k] = self.placing.get(k, 0) + 1
        try:
            yield
        finally:
            self.placing[k] -= 1

    def placed(self, k: int) -> None:
        """``k`` took a session."""
        self.assigned[k] = self.assigned.get(k, 0) + 1

    def created_total(self) -> int:
        return sum(self.assigned.values())
