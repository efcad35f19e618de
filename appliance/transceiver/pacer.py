"""One pacing task for every session of a transceiver.

A session sends an outbound frame the moment it is queued *if it is due* (from whatever
task queued it: the network loop for the built-in echo, the agent's task otherwise), so in
steady state no task wakes up per frame at all. Only a frame that is queued before its due
time (a burst from the agent, a producer faster than real time) is left for later: the
session asks the pacer to call it back at that time (:meth:`Pacer.schedule`), and this one
task, sleeping until the earliest such time of *all* sessions, calls each one back.

Before, every session had a pacer task of its own that woke once per frame — two task
switches per echoed packet with the echo agent's task (docs/performance.md, "Transceiver").

Lateness (issue 32, measurement only): each call-back's ``now - at`` — how late a paced
frame goes out against its due time — is kept (bounded, :data:`MAX_LATENESS` samples) for
the headroom meter, which takes them once per window (:meth:`Pacer.take_lateness`). A core
shared with other processes makes it late however little this process uses.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from typing import Protocol

import trio

log = logging.getLogger(__name__)

#: Lateness samples kept between two takes (one meter window: 50 sessions x 25 frames).
MAX_LATENESS = 4096


class Paced(Protocol):
    def pace(self, now: float, at: float) -> None:
        """Called back at (or just after) ``at``, the time passed to :meth:`Pacer.schedule`."""


class Pacer:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Paced]] = []
        self._order = itertools.count()  # ties: first scheduled, first called
        self._lot = trio.lowlevel.ParkingLot()
        self._wake_at = math.inf
        self.callbacks = 0  # for tests and stats: how often a session was called back
        self._lateness: list[float] = []  # now - at of each call-back since the last take

    def take_lateness(self) -> list[float]:
        """The call-backs' lateness (seconds) since the last take, and forget them."""
        out, self._lateness = self._lateness, []
        return out

    def schedule(self, at: float, who: Paced) -> None:
        """Call ``who.pace(now, at)`` at ``at``. A session that reschedules before that
        leaves a stale entry; it recognises it by ``at`` and ignores the call."""
        heapq.heappush(self._heap, (at, next(self._order), who))
        if at < self._wake_at:
            self._lot.unpark_all()

    def __len__(self) -> int:
        return len(self._heap)

    async def run(self) -> None:
        heap = self._heap
        while True:
            self._wake_at = heap[0][0] if heap else math.inf
            with trio.move_on_at(self._wake_at):
                await self._lot.park()
            self._wake_at = -math.inf  # awake: no wake-ups needed while we work
            now = trio.current_time()
            lateness = self._lateness
            while heap and heap[0][0] <= now:
                at, _, who = heapq.heappop(heap)
                self.callbacks += 1
                if len(lateness) < MAX_LATENESS:
                    lateness.append(now - at)
                try:
                    who.pace(now, at)
                except Exception:  # one session's failure must not stop the others' audio
                    log.exception("pacer: callback failed")
