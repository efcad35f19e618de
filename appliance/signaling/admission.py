"""Admission: place a call only where there is headroom for one more (issue 23).

Past its capacity, every call on a transceiver is ruined by the ones beyond it (110
sessions offered to one core: all admitted, 51 % loss each). So signaling decides *before*
it sends a ``create`` — before any SDP, ICE or DTLS work — whether the transceiver can
carry one more call, and a POST nobody can carry gets ``503 overloaded`` with
``Retry-After`` at once (app.py / fastpath.py answer it; the problem code names why).

What a transceiver can carry is read from what it measures (``stats`` → ``load``,
transceiver/headroom.py): ``busy``, the share of its core its loop used over the last
window(s), and the sessions it held. From those the cost of one call is *learned*::

    cost  = (busy - idle) / sessions                (EWMA over reports, clamped)
    now   = max(busy, idle + cost * sessions)       (a report's calls, set up or not)
    next  = now + cost * (placed since the report + creates in flight + 1)
    admit = next <= limit                           (limit: 0.75 of the core by default)

The two counts in ``next`` are what makes a burst right: 100 POSTs at once all arrive
before the next report, and before any of their calls has started to use the CPU. Counted
only from reports, all 100 would be admitted; counted here, the first few that fit are, the
rest are refused (tests/signaling/test_admission.py). "Placed since the report" is exact
across a poll in flight: :meth:`Admission.asked` hands the poller a mark (the placements so
far) when it sends ``stats``, and :meth:`Admission.report` counts from that mark.

Until the first report of a transceiver with calls, ``cost`` is a prior
(``SignalingConfig.admission_call_cost``: about a PCM call at complexity 5).

**Learned from windows with no setup in them (issue 32).** A call's setup (ICE checks, the
DTLS handshake, the SCTP association) costs several times a second of its media and lands
in the window it happens in. Learned from ``cpu`` over the sessions connected *at the poll*,
the cost of six echo calls came out ~3x their media's (0.045 against 0.015 a call:
tests/reliability/test_hog_midrun.py), so under a hog signaling ran out of room while
the transceiver still read its calls as cheap and had not degraded them. Only the
transceiver knows which of its windows held a setup (a session created, ended or still
connecting in it) and how many calls ran through each, so it learns the cost from the
windows that held none (transceiver/headroom.py ``CallCost``) and reports it: ``load`` →
``call_cpu`` (own CPU share per running call, null until a steady window with calls) and
``idle_cpu``. Signaling takes those as ``cost`` and ``idle``. One learner, so the
transceiver's complexity controller projects one more call exactly as this module does
(server.py ``projected``) and takes its first step under 0.80: with a limit at or above
that, a report that leaves signaling no room already shows the calls degraded (the default
limit, 0.75, is under it: refusal first). A transceiver that reports
no ``call_cpu`` (an older version) is learned from here as before: ``cpu`` over the
connected sessions, in windows where most are connected.

What the core has left (issue 32): ``busy`` is no longer the transceiver's own share of a
core it was assumed to have to itself, but its share of what was *available* to it
(transceiver/headroom.py, corestat.py: its own use plus its CPUs' idle time or its fair
share, minus steal; or the delay signal, if its frames were late). The report says how much
that was (``available``, in cores); the learned cost stays a share of a whole core (it is
learned from ``cpu``, the transceiver's own use), so in the projection each call counts
``cost / available``::

    now   = max(busy, (idle + cost * sessions) / available)    if available < 0.95
          = max(busy, window_busy) + cost * (sessions - steady) on a core of its own
    next  = now + cost / available * (placed since the report + creates in flight + 1)

``steady``: the report's ``window_calls``, the calls connected at its end (those that
connected during it are made whole by ``window_joined``, below). On a core of its own what
those cost is measured, and the linear model overstates it: per-call CPU falls as calls are
added (transceiver/corestat.py ``SHARED_BELOW``); only the calls the
window cannot show yet are counted at the learned cost. What they cost is the window's own
busy (``window_busy``), not only the smoothed ``busy``: that weighs the last window half
and the ones before the rest, so in a 25/s ramp it showed the calls that joined a window
ago at half their cost (bench/capacity.py placement a: 0.49 at 48 calls, 43 of them
steady, whose steady figure was 0.78; the 48th admitted on a projection of 0.57). A report
without ``window_calls`` (an older transceiver) is judged by the model.

    admit = next <= min(limit, admit_limit)

Not all of that window's busy is what its calls cost: those that joined in it were set up
in it, and a setup (the ``create``, ICE checks, the DTLS handshake) costs several times a
second of its media, once. The transceiver measures it where it is spent (the media loop's
CPU on ``create`` and on every datagram of a session not yet connected) and reports that
part of the window's busy as ``window_setup``, which is taken off (issue 41 item 1: in a
25/s ramp on one core, placement b, the 55th call was refused on a projection of 0.81 at
the end of the ramp, and the next report, with no setup in its window, projected 0.72).
And the calls that connected in the window count among its ``steady`` though they ran
through part of it only: what their media did not show yet (the share of the window before
each connected, at the learned cost) is ``window_joined``, and is added::

    now   = max(busy, window_busy - window_setup + window_joined)
            + cost * (sessions - steady)

``admit_limit`` is there while the transceiver's complexity controller has its calls
degraded (transceiver/degrade.py): load that grew after admission is met by a cheaper
encoder first and then by refusing new calls, never by loading the calls further.

**Work in worker threads is a per-call cost (issue 41 item 4).** An agent's model
inference (the assistant's Whisper decode per turn) runs in the transceiver's worker
threads; ``busy`` is its media loop's alone, and what the worker threads use is learned by
the transceiver as a cost per call of each agent kind (transceiver/offload.py) and
reported as ``offload_cpu`` (kind -> own CPU share per call), ``offload_calls`` (what its
live calls cost that way, together) and ``agent_kind`` (the kind of a create that names
no agent). Both are own CPU like ``cost``, so they count ``/ available``::

    now  += offload_calls / available
    next  = now + (cost + offload_cpu[kind of the call being placed]) / available
                  * (placed since the report + creates in flight + 1)

so an assistant call costs what its decodes cost averaged over its calls, and one decode's
burst is not a full core. (The pending calls are counted at the placed call's kind: a burst
of POSTs is usually one agent.)

**Our other processes on the same CPUs are a per-call cost too (issue 41 item 1).** On a
small VM where the whole ``appliance up`` shares one core, each call also costs the relay
worker that forwards its packets and the signaling/supervisor process (~0.8 % of the core
a call, against the transceiver's own ~2 %: bench/capacity.py placement b). ``available``
shows what they took *so far*; it cannot show what the calls being placed will make them
take, so a burst of 25/s was priced at the transceiver's cost alone and admitted twice
what fit. :class:`Neighbours` learns each of the appliance's own co-located processes' CPU
per running call, from polls with no placement or ended call since the one before, over its
idle share (health.py samples ``/proc/PID/stat`` and the affinity of the processes the
supervisor started: our processes only, so a hog's load is never taken for a call's — the
trap of issue 23, where a neighbour's load was counted as ours). The part of it that lands
on ``k``'s CPUs (a process's CPU spread evenly over its affinity set) is ``neigh``, and
each call still to show in a report shrinks what ``k`` has by it. And what they use *now* is not
``k``'s to take: ``available`` counts a fair share of CPU that other runnable tasks hold
(corestat.py, for a hog), which on placement b is mostly our own relay, busy with the very
calls being measured (at 49 calls: available 0.88 where own + idle was 0.72, so busy read
0.65 with the core 85 % used, and the 5/s ramp kept admitting at +31 ms p99). So::

    pool  = own + idle of k's CPUs                           (core_idle)
    have  = available - min(available - pool, ours_now)      (0 if pool >= available)
    m     = placed since the report + creates in flight + unsettled sessions + extra
    avail = min(have, max(pool, have) - neigh * m)
    next  = (max(now * available, own) + (cost + offload) * (pending + extra)) / avail

``ours_now``: the co-located processes' CPU over the last sample, the part on ``k``'s CPUs.
With neither (no co-located process of ours, or none sampled: a transceiver on its own
core or host) this is the projection above. On two CPUs the pool stays over a core and the
neighbours' calls cost nothing until it does not.

No I/O: health.py feeds reports and samples in, state.py asks before each create.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..agents.registry import agent_kind
from ..config import ADMISSION_LIMIT

log = logging.getLogger(__name__)

LIMIT = ADMISSION_LIMIT  # busy share of a core up to which calls are admitted (0.75)
#: Share of a core one call is assumed to cost until a transceiver reports calls: a PCM
#: echo call at complexity 5 is ~250 µs x 50 packets/s = 1.25 % (docs/performance.md).
PRIOR_COST = 0.0125
IDLE = 0.01  # busy share of a transceiver with no call, until one reports idle
MIN_COST, MAX_COST = 0.0002, 0.25  # a learned cost outside this is a measurement artefact
LEARN = 0.3  # EWMA weight of a new cost sample
MIN_SESSIONS = 2  # connected sessions a report needs before its cost is learned from
LAG_SATURATED_MS = 5.0  # headroom.LAG_SATURATED (mean lag): such a window says nothing
#                        about the cost of a call
RETRY_AFTER = 2  # seconds, with every 503 overloaded (two report intervals)
MIN_AVAILABLE = 0.01  # transceiver/corestat.py's floor of available cores
SHARED_BELOW = 0.95  # transceiver/corestat.py's: under it the core counts as shared
MAX_OFFLOAD = 2.0  # transceiver/offload.py's MAX_COST: a per-call offload above is bogus
MAX_KINDS = 32  # offload costs kept per transceiver (transceiver/offload.py's MAX_KINDS)
MAX_NEIGHBOUR = 0.05  # a co-located process's CPU per call above this is a setup burst's
MIN_SAMPLE_S = 0.5  # neighbour samples closer than this are too coarse (10 ms CPU ticks)
MAX_NEIGHBOURS = 64  # co-located processes followed at most
MAX_ROOM = 1 << 16  # room() searches no further
NEIGHBOUR_FULL_WEIGHT = 8  # running calls from which a neighbour sample gets LEARN's weight


@dataclass
class _Node:
    busy: float = 0.0
    available: float = 1.0  # cores the transceiver could have used (1.0: a core of its own)
    admit_limit: float | None = None  # reported while its calls are degraded
    sessions: int = 0  # live sessions in the last report
    steady: int | None = None  # of which ran through its whole window (None: not reported)
    window_busy: float = 0.0  # busy over that window alone, unsmoothed (0: not reported)
    window_setup: float = 0.0  # ... of which its calls' setups (0: not reported)
    window_joined: float = 0.0  # ... and what its calls that joined in it did not show yet
    idle: float = IDLE
    cost: float = PRIOR_COST
    learned: bool = False  # cost comes from a report, not the prior
    placed: int = 0  # creates this signaling placed here, ever (monotonic)
    placed_at_report: int = 0  # ... of which the last report had seen
    reports: int = 0
    # Worker-thread work (module docstring): per call by agent kind, the live calls' total,
    # and the kind of a create with no agent (None: an older transceiver, or none reported).
    offload: dict[str, float] = field(default_factory=dict)
    offload_calls: float = 0.0
    agent_kind: str | None = None
    # Co-located processes (module docstring): k's CPUs (None: not on this host, or not
    # known) and own + idle of them in cores (None: not reported).
    cpus: frozenset[int] | None = None
    pool: float | None = None
    own: float = 0.0  # its own CPU share (smoothed), as reported


@dataclass
class _Process:
    cpu_s: float  # CPU seconds used, ever, at ``at``
    at: float
    cpus: frozenset[int]
    share: float = 0.0  # CPU share over the last sample
    idle: float | None = None  # CPU share with no call anywhere (None: not learned yet)
    per_call: float | None = None  # CPU share per running call over idle (learned)


class Neighbours:
    """The appliance's own co-located processes (relay workers, signaling and the
    supervisor): each one's CPU per running call, learned from settled polls, and the part
    of it that lands on a set of CPUs (module docstring)."""

    def __init__(self) -> None:
        self._procs: dict[str, _Process] = {}
        self._last: tuple[int, int] | None = None  # (calls, placed) at the last sample

    def sample(self, now: float, procs: Mapping[str, tuple[float, frozenset[int]]],
               calls: int, placed: int) -> None:
        """``procs``: name -> (CPU seconds used so far, affinity) of each co-located
        process now (a name carries the pid, so a restarted process starts afresh);
        ``calls``: running calls, all transceivers; ``placed``: placements ever."""
        settled = self._last == (calls, placed)
        self._last = (calls, placed)
        for name in [n for n in self._procs if n not in procs]:
            del self._procs[name]  # gone (restarted under a new pid)
        for name, (cpu_s, cpus) in procs.items():
            proc = self._procs.get(name)
            if proc is None or cpu_s < proc.cpu_s or not cpus:
                if len(self._procs) < MAX_NEIGHBOURS or proc is not None:
                    self._procs[name] = _Process(cpu_s, now, frozenset(cpus))
                continue
            elapsed = now - proc.at
            if elapsed < MIN_SAMPLE_S:
                continue
            share = (cpu_s - proc.cpu_s) / elapsed
            proc.cpu_s, proc.at, proc.cpus, proc.share = cpu_s, now, frozenset(cpus), share
            if not settled:
                continue  # setups or hang-ups in it: not what a running call costs
            if calls == 0:
                proc.idle = share if proc.idle is None else LEARN * share + (
                    1 - LEARN) * proc.idle
            elif calls >= MIN_SESSIONS:
                sample = min(max((share - (proc.idle or 0.0)) / calls, 0.0), MAX_NEIGHBOUR)
                if proc.per_call is None:
                    proc.per_call = sample
                else:  # a few calls say little (10 ms CPU ticks, a relay's idle share):
                    # weighed by how many ran, up to NEIGHBOUR_FULL_WEIGHT
                    weight = LEARN * min(1.0, calls / NEIGHBOUR_FULL_WEIGHT)
                    proc.per_call = weight * sample + (1 - weight) * proc.per_call

    def per_call(self, cpus: frozenset[int] | None) -> float:
        """What one more call costs these processes on ``cpus``, in cores (0: unknown)."""
        if not cpus:
            return 0.0
        return sum(p.per_call * len(p.cpus & cpus) / len(p.cpus)
                   for p in self._procs.values() if p.per_call is not None)

    def now_on(self, cpus: frozenset[int] | None) -> float:
        """What these processes used of ``cpus`` over their last samples, in cores."""
        if not cpus:
            return 0.0
        return sum(p.share * len(p.cpus & cpus) / len(p.cpus) for p in self._procs.values())


class Admission:
    """Per transceiver: its last report, its learned call cost, what was placed since."""

    def __init__(self, transceivers: Iterable[int], placing: Mapping[int, int], *,
                 limit: float = LIMIT, prior_cost: float = PRIOR_COST,
                 retry_after: int = RETRY_AFTER) -> None:
        if not 0 < limit <= 1 or not MIN_COST <= prior_cost <= MAX_COST:
            raise ValueError("0 < limit <= 1 and a plausible prior cost")
        self.limit = limit
        self.prior_cost = prior_cost
        self.retry_after = retry_after
        self._placing = placing  # Placement.placing: creates sent and not answered
        self._nodes = {k: _Node(cost=prior_cost) for k in transceivers}
        self.refused = 0  # POSTs refused because no transceiver had room
        self.neighbours = Neighbours()

    def _node(self, k: int) -> _Node:
        node = self._nodes.get(k)
        if node is None:
            node = self._nodes[k] = _Node(cost=self.prior_cost)
        return node

    # -- what reports say ------------------------------------------------------------------

    def asked(self, k: int) -> int:
        """A ``stats`` poll is being sent to ``k``: the mark to hand back to :meth:`report`."""
        return self._node(k).placed

    def report(self, k: int, stats: Mapping[str, Any], mark: int) -> None:
        """``k`` answered ``stats`` (the poll sent at ``mark``). A transceiver that reports
        no ``load`` (an older version) keeps being judged by counts and the prior."""
        load = stats.get("load")
        if not isinstance(load, Mapping):
            return
        busy, sessions = _num(load.get("busy")), _num(load.get("sessions"))
        if busy is None or sessions is None:
            return
        node = self._node(k)
        node.busy, node.sessions = min(max(busy, 0.0), 1.0), int(max(sessions, 0))
        steady = _num(load.get("window_calls"))
        node.steady = None if steady is None else min(int(max(steady, 0)), node.sessions)
        window_busy = _num(load.get("window_busy"))
        node.window_busy = 0.0 if window_busy is None else min(max(window_busy, 0.0), 1.0)
        window_setup = _num(load.get("window_setup"))
        node.window_setup = (0.0 if window_setup is None
                             else min(max(window_setup, 0.0), node.window_busy))
        window_joined = _num(load.get("window_joined"))
        node.window_joined = 0.0 if window_joined is None else min(max(window_joined, 0.0), 1.0)
        node.placed_at_report = min(max(mark, node.placed_at_report), node.placed)
        node.reports += 1
        available = _num(load.get("available"))
        node.available = 1.0 if available is None else min(max(available, MIN_AVAILABLE), 1.0)
        limit = _num(load.get("admit_limit"))
        node.admit_limit = None if limit is None else min(max(limit, 0.0), 1.0)
        node.offload, node.offload_calls, node.agent_kind = _offload(load)
        own, idle = _num(load.get("own")), _num(load.get("core_idle"))
        node.own = 0.0 if own is None else min(max(own, 0.0), 1.0)
        node.pool = None if own is None or idle is None else node.own + max(idle, 0.0)
        cpu = _num(load.get("cpu"))
        lag = _num(load.get("lag_mean_ms")) or 0.0
        by_state = stats.get("sessions_by_state")
        connected = (_num(by_state.get("connected", 0)) if isinstance(by_state, Mapping)
                     else None)
        if "call_cpu" in load:  # the transceiver learns it from windows with no setup
            idle, cost = _num(load.get("idle_cpu")), _num(load.get("call_cpu"))
            if idle is not None:
                node.idle = min(max(idle, 0.0), 0.2)
            if cost is not None:
                node.cost, node.learned = min(max(cost, MIN_COST), MAX_COST), True
            return
        if cpu is None or lag > LAG_SATURATED_MS:
            return  # a saturated window measures the saturation, not the calls
        if node.sessions == 0:
            node.idle = min(cpu, 0.2)
            return
        n = int(connected) if connected is not None else node.sessions
        if n < MIN_SESSIONS or n < node.sessions // 2:
            return  # mostly calls still setting up: their media cost is not in cpu yet
        sample = min(max((cpu - node.idle) / n, MIN_COST), MAX_COST)
        node.cost = sample if not node.learned else LEARN * sample + (1 - LEARN) * node.cost
        node.learned = True

    def forget(self, k: int) -> None:
        """``k`` went down or came back: its reports say nothing about the new process."""
        self._nodes[k] = _Node(cost=self.prior_cost)

    def sampled(self, now: float, procs: Mapping[str, tuple[float, frozenset[int]]],
                cpus: Mapping[int, frozenset[int]]) -> None:
        """The co-located processes' CPU and affinity (:class:`Neighbours`), and each
        transceiver's affinity (one that is not in ``cpus`` is not on this host)."""
        for k, node in self._nodes.items():
            node.cpus = frozenset(cpus[k]) if k in cpus else None
        self.neighbours.sample(now, procs, sum(n.sessions for n in self._nodes.values()),
                               sum(n.placed for n in self._nodes.values()))

    def neighbour_cost(self, k: int) -> float:
        """What one more call on ``k`` costs our other processes on ``k``'s CPUs, cores."""
        return self.neighbours.per_call(self._node(k).cpus)

    # -- decisions -------------------------------------------------------------------------

    def placed(self, k: int) -> None:
        self._node(k).placed += 1

    def pending(self, k: int) -> int:
        """Calls placed on ``k`` that its last report cannot have counted, in flight included."""
        node = self._node(k)
        return node.placed - node.placed_at_report + self._placing.get(k, 0)

    def offload_cost(self, k: int, agent: str | None = None) -> float:
        """What one call of ``agent`` (None: ``k``'s default) costs on ``k`` in worker
        threads, own CPU (module docstring; 0 for a kind ``k`` has not reported)."""
        node = self._node(k)
        kind = node.agent_kind if agent is None else agent_kind(agent)
        return 0.0 if kind is None else node.offload.get(kind, 0.0)

    def projected(self, k: int, extra: int = 1, agent: str | None = None) -> float:
        """``k``'s busy share with what is pending and ``extra`` calls more (of ``agent``;
        None: the transceiver's default)."""
        node = self._node(k)
        # one call's share of what k has: its media loop's, and its worker threads' work
        share = (node.cost + self.offload_cost(k, agent)) / node.available
        if node.available >= SHARED_BELOW and node.steady is not None:
            # A core of its own: the last window's busy is what the calls that ran through
            # it cost (the smoothed busy trails a ramp); the rest (new, still connecting)
            # may not show in it yet.
            settled = node.window_busy - node.window_setup + node.window_joined
            now = max(node.busy, settled) + share * (node.sessions - node.steady)
        else:  # shared: its calls may get less than they need, and busy says less
            now = max(node.busy, (node.idle + node.cost * node.sessions) / node.available)
        now += node.offload_calls / node.available
        added = self.pending(k) + extra
        neigh, have = self.neighbour_cost(k), self._have(k)
        if neigh <= 0 and have >= node.available:
            return now + share * added
        # What our other processes hold is not k's to take, and each call still to show
        # shrinks what k has by their share of it (module docstring).
        unsettled = node.sessions - (node.steady if node.steady is not None else node.sessions)
        pool = have if node.pool is None else max(node.pool, have)
        avail = min(have, max(pool - neigh * (added + unsettled), MIN_AVAILABLE))
        return (max(now * node.available, node.own)
                + (node.cost + self.offload_cost(k, agent)) * added) / avail

    def _have(self, k: int) -> float:
        """``available`` less the fair share our co-located processes hold (docstring)."""
        node = self._node(k)
        if node.pool is None or node.pool >= node.available:
            return node.available
        taken = min(node.available - node.pool, self.neighbours.now_on(node.cpus))
        return max(node.available - taken, MIN_AVAILABLE)

    def limit_of(self, k: int) -> float:
        """The busy share ``k`` is admitted up to: :attr:`limit`, or less while ``k``'s
        calls are degraded (its ``admit_limit``)."""
        node = self._node(k)
        return self.limit if node.admit_limit is None else min(self.limit, node.admit_limit)

    def admits(self, k: int, agent: str | None = None) -> bool:
        projected, limit = self.projected(k, 1, agent), self.limit_of(k)
        if log.isEnabledFor(logging.DEBUG):  # what each decision saw (bench/capacity.py)
            node = self._node(k)
            log.debug("admit %s k=%d next=%.4f limit=%.3f cost=%.5f offload=%.5f "
                      "pending=%d sessions=%d steady=%s busy=%.4f available=%.3f have=%.3f "
                      "pool=%s own=%.3f neigh=%.5f reports=%d", projected <= limit, k,
                      projected, limit, node.cost, self.offload_cost(k, agent),
                      self.pending(k), node.sessions, node.steady, node.busy, node.available,
                      self._have(k), None if node.pool is None else round(node.pool, 3),
                      node.own, self.neighbour_cost(k), node.reports)
        return projected <= limit

    def room(self, k: int) -> int:
        """How many more calls ``k`` would be given now."""
        node = self._node(k)
        limit = self.limit_of(k)
        if self.neighbour_cost(k) <= 0 and self._have(k) >= node.available:  # linear
            free = limit - self.projected(k, 0)
            share = (node.cost + self.offload_cost(k)) / node.available
            return max(0, math.floor(free / share + 1e-9))
        lo, hi = 0, 1  # projected() grows with extra: the most that still fit
        while hi < MAX_ROOM and self.projected(k, hi) <= limit + 1e-9:
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.projected(k, mid) <= limit + 1e-9 else (lo, mid)
        return lo

    def view(self, k: int) -> dict[str, Any]:
        """For the health view (the dashboard), /readyz and /metrics: the figures admission
        decides on."""
        node = self._node(k)
        limit = self.limit_of(k)
        return {"headroom": round(max(0.0, limit - self.projected(k, 0)), 4),
                "room": self.room(k), "call_cost": round(node.cost, 5),
                "call_cost_learned": node.learned, "pending": self.pending(k),
                "limit": limit, "busy": round(node.busy, 4),
                "available": round(node.available, 4), "degraded": node.admit_limit is not None,
                "offload_calls": round(node.offload_calls, 5),
                "offload_cost": round(self.offload_cost(k), 5),
                "neighbour_cost": round(self.neighbour_cost(k), 5),
                "reports": node.reports}


def _offload(load: Mapping[str, Any]) -> tuple[dict[str, float], float, str | None]:
    """A report's worker-thread costs (module docstring), bounded and clamped; none from a
    transceiver that does not report them."""
    costs: dict[str, float] = {}
    raw = load.get("offload_cpu")
    if isinstance(raw, Mapping):
        for kind, value in raw.items():
            cost = _num(value)
            if isinstance(kind, str) and cost is not None and len(costs) < MAX_KINDS:
                costs[kind] = min(max(cost, 0.0), MAX_OFFLOAD)
    calls = _num(load.get("offload_calls"))
    kind = load.get("agent_kind")
    return (costs, 0.0 if calls is None else min(max(calls, 0.0), 1.0),
            kind if isinstance(kind, str) else None)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
