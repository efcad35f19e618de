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
    admit = next <= limit                           (limit: 0.85 of the core by default)

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
(server.py ``projected``) and takes its first step under 0.80, below this limit: a report
that leaves signaling no room already shows the calls degraded. A transceiver that reports
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
          = busy + cost * (sessions - steady)                  on a core of its own
    next  = now + cost / available * (placed since the report + creates in flight + 1)

``steady``: the report's ``window_calls``, the calls that ran through its whole window. On
a core of its own busy is what those cost, and the linear model overstates it: per-call CPU
falls as calls are added (transceiver/corestat.py ``SHARED_BELOW``); only the calls busy
cannot show yet are counted at the learned cost. A report without ``window_calls`` (an
older transceiver) is judged by the model.
    admit = next <= min(limit, admit_limit)

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

No I/O: health.py feeds reports in, state.py asks before each create.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..agents.registry import agent_kind

LIMIT = 0.85  # busy share of a core up to which calls are admitted
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


@dataclass
class _Node:
    busy: float = 0.0
    available: float = 1.0  # cores the transceiver could have used (1.0: a core of its own)
    admit_limit: float | None = None  # reported while its calls are degraded
    sessions: int = 0  # live sessions in the last report
    steady: int | None = None  # of which ran through its whole window (None: not reported)
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
        node.placed_at_report = min(max(mark, node.placed_at_report), node.placed)
        node.reports += 1
        available = _num(load.get("available"))
        node.available = 1.0 if available is None else min(max(available, MIN_AVAILABLE), 1.0)
        limit = _num(load.get("admit_limit"))
        node.admit_limit = None if limit is None else min(max(limit, 0.0), 1.0)
        node.offload, node.offload_calls, node.agent_kind = _offload(load)
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
            # A core of its own: busy is what the calls that ran through the window cost;
            # the rest (new, still connecting) may not show in it yet.
            now = node.busy + share * (node.sessions - node.steady)
        else:  # shared: its calls may get less than they need, and busy says less
            now = max(node.busy, (node.idle + node.cost * node.sessions) / node.available)
        now += node.offload_calls / node.available
        return now + share * (self.pending(k) + extra)

    def limit_of(self, k: int) -> float:
        """The busy share ``k`` is admitted up to: :attr:`limit`, or less while ``k``'s
        calls are degraded (its ``admit_limit``)."""
        node = self._node(k)
        return self.limit if node.admit_limit is None else min(self.limit, node.admit_limit)

    def admits(self, k: int, agent: str | None = None) -> bool:
        return self.projected(k, 1, agent) <= self.limit_of(k)

    def room(self, k: int) -> int:
        """How many more calls ``k`` would be given now."""
        node = self._node(k)
        free = self.limit_of(k) - self.projected(k, 0)
        share = (node.cost + self.offload_cost(k)) / node.available
        return max(0, math.floor(free / share + 1e-9))

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
