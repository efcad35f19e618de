"""The transceiver's load glue (issues 23, 32, 41): the headroom meter's tick task, what
one more call would cost, the ``create`` refusal under load, Opus complexity as headroom
shrinks, and the ``load`` object of ``stats``.

The pieces are elsewhere and sans-IO: :class:`.headroom.LoadMeter` (busy share, loop lag)
and :class:`.headroom.CallCost` (a running call's own CPU), :class:`.offload.OffloadCost`
(worker-thread work per agent kind), :class:`.degrade.ComplexityController` (the ladder)
and :mod:`.corestat` (what the core has left). :class:`TransceiverLoad` joins them over the
one call table the server keeps (it reads the table; it never changes it): the server tells
it when a call is created or ends (:meth:`~TransceiverLoad.created`,
:meth:`~TransceiverLoad.ended`), and the control ops ask :meth:`~TransceiverLoad.overloaded`
before any SDP or DTLS work. Nothing here is on the datagram path but
:meth:`~TransceiverLoad.add_setup`, for the datagrams of calls still being set up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import trio

from appliance.agents import ResolvedAgent, agent_kind
from appliance.config import HEADROOM_MODES

from .corestat import MIN_AVAILABLE, SHARED_BELOW, ProcStat
from .degrade import ComplexityController
from .headroom import LAG_SATURATED, TICK, CallCost, LoadMeter, read_core_stat
from .offload import OffloadCost
from .pacer import Pacer
from .session import Session
from .shell import CallShell

log = logging.getLogger(__name__)

MIN_CALL_COST = 0.002  # share of a core assumed per call before any is measured


class TransceiverLoad:
    """The meter, the learned costs and the complexity ladder of one transceiver, over its
    call table (``calls``: the server's dict itself, read live) and counters."""

    def __init__(self, calls: Mapping[str, CallShell], counters: dict[str, int], pacer: Pacer,
                 *, agent: str, headroom: str, opus_complexity: int, adaptive_complexity: bool,
                 refuse_busy: float) -> None:
        if headroom not in HEADROOM_MODES:
            raise ValueError(f"headroom must be one of {HEADROOM_MODES}, not {headroom!r}")
        self.calls = calls
        self.counters = counters
        self.pacer = pacer
        self.agent = agent  # the transceiver's default agent spec (a create without one)
        self.headroom = headroom
        self.refuse_busy = refuse_busy
        # Headroom (issue 23): the meter's tick task (measure_loop) feeds both.
        self.meter = LoadMeter(own_only=headroom == "own")
        #: When the receive loop (server.py) woke to a socket it has not found empty since;
        #: None while it keeps up (it drained the socket). The meter's tick samples its age
        #: (headroom.py, "Backlog").
        self.behind_since: float | None = None
        self.complexity = ComplexityController(opus_complexity, enabled=adaptive_complexity)
        self._created_in_window = 0  # creates since the meter's last window
        # What one running call costs, learned only from windows with no setup in them
        # (headroom.CallCost, issue 32): per window, the sessions created or ended in it
        # and those still connecting when it began (with the ones connecting at its end,
        # each one was created in it or connecting at its start).
        self.call_cpu = CallCost()
        # What calls cost in worker threads (model inference), per agent kind (offload.py,
        # issue 41 item 4): a per-call cost, not a window's busy.
        self.offload = OffloadCost()
        self._churn_in_window = 0  # sessions and phones created or ended since the last window
        self._connecting_at_window_start = 0
        self.window_calls = 0  # calls connected at the last window's end
        self.window_unsettled = 0  # sessions created, ended or connecting in it
        # The media loop's CPU spent setting calls up (their ``create`` and every datagram
        # of a session not yet connected: ICE checks, the DTLS handshake), measured where
        # it is spent (:meth:`add_setup`), and the part of the last window's busy it was
        # (issue 41 item 1): a 25/s ramp's handshakes are not what its calls will cost.
        self._setup_s = 0.0
        self.window_setup = 0.0
        # ... and the other side of the same window: the calls that connected in it ran
        # through part of it only (they count as ``window_calls`` all the same), so their
        # media shows in its busy in part; what did not show, at the learned cost.
        self._joined: dict[str, float] = {}  # session id -> when it connected, this window
        self.window_joined = 0.0

    def created(self) -> None:
        """A call of either kind joined the table."""
        self._created_in_window += 1
        self._churn_in_window += 1

    def ended(self) -> None:
        """A call of either kind left the table."""
        self._churn_in_window += 1

    def add_setup(self, cpu_s: float) -> None:
        """``cpu_s`` seconds of the media loop's CPU went to setting a call up."""
        self._setup_s += max(0.0, cpu_s)

    def joined(self, session_id: str, now: float) -> None:
        """A call connected at ``now`` (its setup is over: its media starts)."""
        self._joined[session_id] = now

    async def measure_loop(self) -> None:
        """The headroom meter's 20 ms tick (headroom.py): its own lateness is the loop lag."""
        deadline = trio.current_time() + TICK
        while True:
            await trio.sleep_until(deadline)
            now = trio.current_time()
            # What the core has left (issue 32): /proc/stat once per window, not per tick.
            # (Not at all with --headroom own: the meter would not use it.)
            due = self.meter.window_due(now) and not self.meter.own_only
            stat, cpus = read_core_stat() if due else (None, None)
            # The media loop is this thread; the rest of the process's CPU is its worker
            # threads' (offload.py: an agent's inference is its calls' cost, not the loop's).
            loop = time.thread_time()
            self.handle_tick(now, loop, now - deadline, stat, cpus,
                             offload=max(0.0, time.process_time() - loop))
            deadline += TICK
            if deadline <= now:  # missed ticks are not made up in a burst
                deadline = now + TICK

    def handle_tick(self, now: float, cpu: float, lag: float, stat: ProcStat | None = None,
                    cpus: frozenset[int] | None = None, *, offload: float | None = None) -> None:
        """One meter tick (``cpu``: the media loop thread's CPU seconds, ``offload`` the
        other threads'; at a window's edge ``/proc/stat`` and the affinity set, headroom.py);
        tests drive it with made-up load."""
        self.meter.add_lateness(self.pacer.take_lateness())
        behind = self.behind_since
        if not self.meter.handle_tick(now, cpu, lag, self.counters["datagrams_in"],
                                      sent=self.counters["datagrams_out"], stat=stat,
                                      affinity=cpus, offload=offload,
                                      backlog=0.0 if behind is None else now - behind):
            return
        connecting = sum(1 for c in self.calls.values()
                         if type(c) is Session and c.state != "connected")
        self.window_unsettled = self._churn_in_window + self._connecting_at_window_start
        self.window_calls = len(self.calls) - connecting
        self._connecting_at_window_start = connecting
        self._created_in_window = self._churn_in_window = 0
        report = self.meter.report
        # The setups' part of the window's busy: their share of its own CPU (busy is own CPU
        # over what was available, or the delay signal; either way in proportion).
        setup = min(self._setup_s / report.window_s, report.cpu) if report.window_s > 0 else 0.0
        self.window_setup = report.window_busy * setup / report.cpu if report.cpu > 0 else 0.0
        self._setup_s = 0.0
        # The share of the window each call that connected in it (and is still here) was
        # not yet running, at what a running call costs in busy units.
        start = now - report.window_s
        missing = sum(min(max((t - start) / report.window_s, 0.0), 1.0)
                      for sid, t in self._joined.items() if sid in self.calls
                      ) if report.window_s > 0 else 0.0
        cost = self.call_cpu.cost
        self.window_joined = (0.0 if cost is None else
                              missing * cost / max(report.available, MIN_AVAILABLE))
        self._joined.clear()
        # A window the loop was behind in, or whose frames were late (the delay signal: a
        # receive backlog included), measured the CPU the calls got, not what they need.
        self.call_cpu.handle_window(report.cpu, self.window_calls, self.window_unsettled,
                                    behind=report.lag_mean_ms > LAG_SATURATED * 1000
                                    or report.late > 0)
        # The worker threads' CPU, charged to the steady calls that can have asked for it.
        tasks: dict[str, int] = {}
        for kind in self._task_kinds(connected_only=True):
            tasks[kind] = tasks.get(kind, 0) + 1
        self.offload.handle_window(self.meter.offload_s, report.window_s, tasks,
                                   unsettled=self.window_unsettled)
        ctl = self.complexity
        # The first step is taken as soon as one more call would not fit under urgent, by
        # signaling's own projection of this report (projected): so, with an admission
        # limit at or above urgent, a report that leaves signaling no room already shows
        # the calls degraded (issue 32 item 4); under it (the default 0.75) refusal comes
        # first, and the step meets load from elsewhere.
        ctl.handle_load(now, self.meter.busy, self.projected(1) - self.meter.busy)
        while (ev := ctl.poll_event()) is not None:
            self.counters["complexity_changes"] += 1
            log.info("busy %.0f %%: Opus complexity %d -> %d for %d session(s)",
                     100 * ev.busy, ev.previous, ev.complexity, len(self.calls))
            for call in self.calls.values():
                if call.pipeline is not None:
                    call.pipeline.set_complexity(ev.complexity)

    def _task_kinds(self, *, connected_only: bool = False) -> list[str]:
        """The agent kind of each call whose agent runs as a task (offload.py: only those
        can send work to a thread; ``echo`` is a frame handler on this loop)."""
        def runs_task(agent: ResolvedAgent) -> bool:
            return agent.on_frame is None and not agent.passthrough
        # (a phone call counts from its creation: its agent may run before media flows)
        return [agent_kind(c.agent.name) for c in self.calls.values()
                if runs_task(c.agent) and not (connected_only and type(c) is Session
                                               and c.state != "connected")]

    def window_settled(self) -> float:
        """The last window's busy as its calls will cost running: its setups taken off,
        and the part of the window the calls that connected in it had not run yet added
        (signaling/admission.py counts the same from ``stats``)."""
        return max(0.0, self.meter.report.window_busy - self.window_setup + self.window_joined)

    def offload_need(self) -> float:
        """What the live calls' worker-thread work costs by the learned per-call costs of
        their kinds (offload.py), a share of a core."""
        return self.offload.need(self._task_kinds())

    def _calls_in_window(self) -> int:
        """The calls the meter's last window can have measured."""
        return len(self.calls) - self._created_in_window

    def call_cost(self) -> float:
        """One more call's share of what this transceiver has (busy units): the learned
        own CPU of a running call (:class:`.headroom.CallCost`) divided by what a unit of own
        CPU costs now (the meter's ``available``), as signaling's admission counts it; until
        a steady window has taught the cost, busy per call (idle cost included: an over-
        rather than an under-estimate)."""
        cost = self.call_cpu.cost
        if cost is not None:
            return max(MIN_CALL_COST, cost / max(self.meter.report.available, MIN_AVAILABLE))
        n = self._calls_in_window()
        return max(MIN_CALL_COST, self.meter.busy / n) if n > 0 else MIN_CALL_COST

    def projected(self, extra: int, agent: str | None = None) -> float:
        """The busy share with ``extra`` calls more (of ``agent``'s kind; None: the
        default agent), the way signaling's admission projects it from this report
        (signaling/admission.py): once a call's cost is learned, the calls' whole need
        counts (``idle + cost x calls`` over ``available``: under a hog they get less CPU
        than they need, and ``busy`` alone would say they cost less), and the live calls'
        worker-thread work at its learned per-call cost (offload.py), not as it bursts."""
        busy = self.meter.busy
        cost = self.call_cpu.cost
        available = max(self.meter.report.available, MIN_AVAILABLE)
        if cost is not None:
            if available >= SHARED_BELOW:  # a core of its own (corestat.py): what the
                # calls that ran through the last window cost in it (busy, smoothed, shows
                # the newest of them at half their cost: a ramp trailed), plus what the
                # calls it knew that did not run through it cannot show yet (those
                # created since: ``extra``, overloaded())
                # The window's setups (a ramp's handshakes) are not what its calls cost
                # once running: they are spent and do not recur (window_settled).
                busy = (max(busy, self.window_settled())
                        + cost * max(0, self._calls_in_window() - self.window_calls))
            else:
                busy = max(busy, (self.call_cpu.idle + cost * self._calls_in_window())
                           / available)
        offload = self.offload.cost(agent_kind(agent or self.agent))
        return (busy + self.offload_need() / available
                + (self.call_cost() + offload / available) * extra)

    def overloaded(self, agent: object = None) -> bool:
        """No headroom for one more call of ``agent`` (the defence-in-depth check of
        ``create``; a spec that is not a string is refused later, as bad)."""
        projected = self.projected(self._created_in_window + 1,
                                   agent if isinstance(agent, str) else None)
        # While the complexity controller has calls degraded, only up to its step-up
        # threshold (degrade.py, issue 32: degrade first, then refuse new calls).
        return projected > self.complexity.admit_limit(self.refuse_busy)

    def view(self) -> dict[str, Any]:
        """``stats``' ``load`` object (docs/control-protocol.md)."""
        return {**self.meter.report.to_json(), "busy": round(self.meter.busy, 4),
                "sessions": len(self.calls),
                "call_cost": round(self.call_cost(), 5),
                "call_cpu": None if self.call_cpu.cost is None else round(self.call_cpu.cost, 6),
                "idle_cpu": round(self.call_cpu.idle, 6),
                "window_calls": self.window_calls, "window_unsettled": self.window_unsettled,
                "window_setup": round(self.window_setup, 4),
                "window_joined": round(self.window_joined, 4),
                # Worker-thread work as a per-call cost by agent kind (offload.py): what
                # one call of each kind costs, what the live calls cost together, and the
                # kind a create without an agent gets (signaling/admission.py).
                "offload_cpu": {k: round(v, 6) for k, v in self.offload.costs().items()},
                "offload_calls": round(self.offload_need(), 6),
                "agent_kind": agent_kind(self.agent),
                "opus_complexity": self.complexity.complexity,
                "opus_complexity_steps": list(self.complexity.steps),
                "degraded": self.complexity.degraded,
                "admit_limit": self.complexity.low if self.complexity.degraded else None,
                "refuse_busy": self.refuse_busy, "windows": self.meter.windows,
                "headroom_mode": self.headroom,
                "windows_behind": self.meter.behind}
