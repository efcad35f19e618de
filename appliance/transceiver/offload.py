"""Work a transceiver's calls send to worker threads: a cost of those calls, not a sign
that the media loop cannot keep them (issue 41 item 4).

An agent may run its heavy work off the media loop, in worker threads (``trio.to_thread``):
the assistant decodes each turn with Whisper (~0.3-0.7 s of one core, speech/stt.py), runs
its turn model and its TTS there. Before this module the headroom meter read the whole
process's CPU (``time.process_time``: every thread) as the loop's use of its one core, so
one Whisper decode filled a 0.5 s window (own 0.89 on the test machine), ``busy`` crossed
the controller's urgent line with one call's worth projected beside it, the calls were
degraded to complexity 3, and signaling admitted up to 50 % for the next five seconds of
quiet — on a transceiver whose loop used 1.5 % of its core and was never late.

Two things are separated now (load.py's meter tick reads both):

* the **media loop** — the thread that receives, decrypts, decodes, encodes and paces: its
  own CPU (``time.thread_time()`` on that thread) and its lateness are the headroom meter's
  ``busy`` (headroom.py), which the complexity controller steps on. Whether the loop keeps
  its calls is a property of that thread: a worker thread's burst that leaves it on time
  says nothing about it, and one that makes its frames late (a shared core, the GIL) shows
  as lateness, which is counted as harm like any neighbour's (corestat.py ``decide``).
* **offload** — CPU of the process's other threads (``process_time - thread_time``). It is
  real work the host must find room for, so it is charged to the calls that caused it, as
  a learned steady cost per call of an agent *kind* (:class:`OffloadCost`): the assistant's
  Whisper decodes, averaged over its calls' lifetimes, make an assistant call cost more than
  an echo call in admission's projection (``load`` -> ``offload_calls``, ``offload_cpu``;
  signaling/admission.py), and a burst is spread over the call-seconds it belongs to instead
  of being read as one window's emergency.

Which calls caused a window's offload is not known from CPU counters (the work carries no
call tag: see the report for the speech/ change that would add one). It is split evenly
among the window's steady calls whose agent runs as a task — a synchronous frame handler
(the built-in ``echo``) runs on the loop and cannot have sent work to a thread, and a
passthrough call has no agent. One kind per transceiver (the usual ``--agent``) is exact;
kinds mixed in every window share their average. Windows with a call set up or ended in
them teach nothing (a model loaded for a new call, ``--preload`` aside, is not a running
call's cost: the rule CallCost follows for setup, headroom.py), and offload with no such
call in the window (a decode finishing after its caller hung up) is nobody's running cost.

The estimator is a ratio of decayed sums: offload CPU seconds over call-seconds of the
kind, both decayed by :data:`HORIZON` call-seconds of that kind (so one call's cost is
learned over its last ~2 minutes, 20 calls' over ~6 s of wall time, and a kind not in use
keeps its figure), and divided by at least :data:`MIN_CALL_SECONDS`: a 0.6 s decode in the
first second of the first call reads as 0.02 of a core, not 1.2, and the figure reaches the
true mean once the kind has that much history.

Sans-IO: :meth:`OffloadCost.handle_window` once per meter window, with numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

#: Call-seconds of a kind over which its offload is averaged (exponential decay).
HORIZON = 120.0
#: Call-seconds a kind's estimate is divided by at least: until it has this much history a
#: burst counts as part of a call of this length, never as the whole of a short window.
MIN_CALL_SECONDS = 30.0
#: Kinds remembered at most (the least recently used is forgotten): bounded memory whatever
#: agent specs arrive in ``create``.
MAX_KINDS = 32
#: A per-call offload cost above this (cores) is a measurement artefact (the work runs in
#: worker threads; more than two cores' worth per call is not one call's need).
MAX_COST = 2.0


class OffloadCost:
    """Per agent kind: CPU its calls' worker threads use, per call (a share of a core)."""

    __slots__ = ("_cpu", "_secs", "samples")

    def __init__(self) -> None:
        # kind -> decayed offload CPU seconds, decayed call-seconds (insertion order = use)
        self._cpu: dict[str, float] = {}
        self._secs: dict[str, float] = {}
        self.samples = 0  # windows learned from

    def handle_window(self, offload: float, span: float, calls: Mapping[str, int], *,
                      unsettled: int) -> bool:
        """One meter window of ``span`` seconds in which the process's worker threads used
        ``offload`` CPU seconds, ``calls`` the steady calls with an agent task by kind, and
        ``unsettled`` sessions were created, ended or connecting. True when learned from."""
        n = sum(c for c in calls.values() if c > 0)
        if (unsettled > 0 or n == 0 or not math.isfinite(offload) or not math.isfinite(span)
                or span <= 0):
            return False
        offload = max(offload, 0.0)
        for kind, count in calls.items():
            if count <= 0:
                continue
            secs = count * span
            keep = math.exp(-secs / HORIZON)
            cpu = self._cpu.pop(kind, 0.0) * keep + offload * count / n
            self._secs[kind] = self._secs.pop(kind, 0.0) * keep + secs
            self._cpu[kind] = cpu  # re-inserted: the most recently used
        while len(self._cpu) > MAX_KINDS:
            oldest = next(iter(self._cpu))
            del self._cpu[oldest], self._secs[oldest]
        self.samples += 1
        return True

    def cost(self, kind: str) -> float:
        """One running call of ``kind``: its worker threads' CPU, a share of a core (0 for
        a kind never seen with offload)."""
        cpu = self._cpu.get(kind)
        if cpu is None:
            return 0.0
        return min(cpu / max(self._secs[kind], MIN_CALL_SECONDS), MAX_COST)

    def need(self, kinds: Iterable[str]) -> float:
        """What the calls of ``kinds`` (one entry per call) cost together."""
        return sum(self.cost(k) for k in kinds)

    def costs(self) -> dict[str, float]:
        """Every kind's cost, for the load report."""
        return {k: self.cost(k) for k in self._cpu}
