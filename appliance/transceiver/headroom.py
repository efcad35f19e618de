"""How much of its time budget a transceiver uses (issue 23): the headroom signal that
signaling admits calls by and the Opus complexity controller degrades by.

A transceiver's media work is periodic: every call needs its packets handled within each
20 ms tick (one Opus frame). Three candidate measures of "how much of the tick is used"
were measured under ``bench/capacity.py`` load (docs/operations.md, "Admission";
docs/performance-history.md, "Overload"):

* **busy** — CPU seconds of the media loop's thread per wall second (``time.thread_time``
  on that thread; until issue 41 ``time.process_time``, every thread: see "Offload" below).
  It grows linearly with the calls carried (each PCM call costs the same ~1.2 % of a core at
  complexity 5), long before anything goes wrong, so signaling can *extrapolate* it: busy
  now + cost per call x calls about to arrive. **This is the admission signal.**
* **loop lag** — how late a 20 ms tick task wakes up. Flat near 0 until the core
  saturates, then a knee to tens of ms; it says "too late" rather than "how close", so it
  is no basis for admitting one more call. It would catch what busy cannot — a core
  shared with other processes, where ours gets less than a whole core — but on such a host
  it is high *whatever this process does*: on the shared 2-vCPU test machine at load
  13-20 an idle transceiver's mean tick lag passed 5 ms in about a quarter of its windows,
  and counting those as full made `appliance up` refuse every call (2026-12-01, an
  earlier version of this module). **Reported, not decided on**; a window whose mean lag
  passes :data:`LAG_SATURATED` is only flagged (signaling learns no call cost from it).
* **µs per packet** — CPU ÷ datagrams received. Per-call cost in disguise, but it changes
  with the batching of the receive loop (it *falls* as load rises, docs/performance.md
  "Passthrough") and with the agent kind; reported for operators, not used to decide.

:class:`LoadMeter` is sans-IO (times and CPU seconds are passed in, from the shell's tick
task in load.py): ``handle_tick(now, cpu, lag)`` every tick, read :attr:`busy`.

**Offload (issue 41 item 4).** ``cpu`` is the media loop thread's CPU; what the process's
other threads used (``offload=``, cumulative seconds: an agent's model inference in
``trio.to_thread`` workers) is reported per window (``offload``, a share of a core) and
decided on nowhere here: one Whisper decode read as a full window of a core that could not
keep its calls, and degraded an idle transceiver (offload.py says what it is counted as
instead: the learned per-call cost of the calls that asked for it).

**Issue 32: what the core has left.** ``busy`` assumed a core of its own. Now, when the
shell passes what it read at a window's end (:meth:`LoadMeter.window_due` says when:
``/proc/stat`` and the affinity set, parsed by :func:`.corestat.parse_proc_stat_untrusted`)
and how many datagrams it has sent, each window's figure is

    busy  = own / (1 - steal)  +  (own / available  -  own / (1 - steal)) x late

(:func:`.corestat.decide`) where ``own`` is the CPU share above, ``steal`` the share of its
CPUs the hypervisor took (capacity gone for sure), ``available`` how much of a core this
process could have had (its own use + its CPUs' idle time, at least a fair share against
the runnable tasks, minus steal: :func:`.corestat.available_cores`) and ``late`` the delay
signal in 0..1 (:func:`.corestat.lateness_busy`: the 90th percentile of the window's tick
lags and pacer call-back lateness, above a 10 ms floor, full at 40 ms) — counted only in
windows where the transceiver sent media, so an idle transceiver on a loaded host is never
busy (the trap above). Other processes' CPU counts against us in proportion to the harm
they are seen to do: a neighbour using the idle time of a core we are on time on is no
reason to refuse a call, one that makes our frames late is. On a core of its own ``busy`` is ``own`` as before. ``available`` is reported as
``own / busy`` — what one unit of own CPU costs in busy units at the harm seen now —
because signaling divides its learned per-call cost (own CPU) by it to project one more
call (signaling/admission.py); ``core_available`` is the raw /proc/stat figure. Without
``/proc/stat`` (another OS, a sandbox) ``available`` stays 1.0.

**Backlog (issue 41 item 1).** The receive loop yields to the rest of the loop every 2 ms
of work however many datagrams wait (server.py ``YIELD_AFTER``), so its 20 ms tick and the
pacer fire on time while a standing queue builds in the socket in front of them: with the
whole ``appliance up`` on one core (``bench/capacity.py`` placement b), 44 calls at
Opus complexity 0 ran with every tick's lateness p90 at 4.4 ms and a round trip of 730 ms
p50, 6.9 % lost. So each tick also passes how long the receive loop has been behind
(``backlog``: since the wake-up that began the batch run that has not yet found the socket
empty; 0 once it has), and the tick's lateness sample is the larger of the two. A loop that
keeps up drains its socket at every wake-up and adds nothing; one that is behind adds the
age of its backlog, which is the wait of the datagrams it has not read yet.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .corestat import (
    LATE_PERCENTILE,
    MAX_CORES,
    MIN_AVAILABLE,
    CoreSample,
    ProcStat,
    ProcStatError,
    available_cores,
    core_sample,
    decide,
    lateness_busy,
    parse_proc_stat_untrusted,
    percentile,
    steal_ceiling,
)

# What the headroom counts (``--headroom``; appliance/config.py parses the flag): ``core``
# what the CPUs this process may run on have left (issue 32, above), ``own`` only its own
# CPU — the meter before issue 32, right for a transceiver with a core to itself (pinned,
# ``isolcpus``, a dedicated VM), and for hosts whose other load is not the transceiver's
# concern (a test machine running other suites beside it: issue 33). With ``own`` the
# meter reads no ``/proc/stat`` and decides on no lateness (both are still reported as
# far as they are known: the lag and the ``late_p90_ms`` of windows that sent media).

#: The tick of the measurement task: one Opus frame.
TICK = 0.020
#: Seconds per busy window (a busy figure is the CPU/wall ratio over one window).
WINDOW = 0.5
#: Smoothing of successive windows (EWMA weight of the newest): ~1 s to settle.
ALPHA = 0.5
#: Mean tick lag over a window past which the loop counts as behind (flagged, see above).
LAG_SATURATED = 0.005


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What ``stats`` reports under ``load`` (docs/control-protocol.md)."""

    busy: float  # smoothed CPU share of one core, 0..~1
    cpu: float  # the last window's raw CPU share
    lag_max_ms: float  # worst tick lag in the last window
    lag_mean_ms: float
    us_per_packet: float | None  # CPU per datagram received in the last window
    window_s: float
    # Issue 32 (module docstring): what the core had left over the last window.
    own: float = 0.0  # smoothed own CPU share (``busy`` before issue 32)
    available: float = MAX_CORES  # cores' worth a unit of busy stands for (smoothed)
    core_available: float = MAX_CORES  # cores it could have had, from /proc/stat (raw)
    core_idle: float | None = None  # the affinity set's idle and stolen time, in cores
    core_steal: float | None = None
    cpus: int | None = None  # CPUs in the affinity set
    late_p90_ms: float | None = None  # the decided percentile of tick/pacer lateness
    late: float = 0.0  # the delay signal as a busy share (0 unless sending and late)
    offload: float = 0.0  # the last window's CPU share of the process's other threads
    backlog_max_ms: float = 0.0  # the oldest receive backlog a tick found (issue 41 item 1)
    #: the last window's decided share, unsmoothed: ``busy`` shows a call that started
    #: one window ago at half its cost (EWMA), this at its whole (issue 41 item 1)
    window_busy: float = 0.0

    def to_json(self) -> dict[str, float | None]:
        def r(v: float | None, n: int) -> float | None:
            return None if v is None else round(v, n)
        return {"busy": round(self.busy, 4), "cpu": round(self.cpu, 4),
                "lag_max_ms": round(self.lag_max_ms, 3), "lag_mean_ms": round(self.lag_mean_ms, 3),
                "us_per_packet": r(self.us_per_packet, 1), "window_s": round(self.window_s, 3),
                "own": round(self.own, 4), "available": round(self.available, 4),
                "core_available": round(self.core_available, 4),
                "core_idle": r(self.core_idle, 4), "core_steal": r(self.core_steal, 4),
                "cpus": self.cpus, "late_p90_ms": r(self.late_p90_ms, 3),
                "late": round(self.late, 4), "offload": round(self.offload, 4),
                "backlog_max_ms": round(self.backlog_max_ms, 3),
                "window_busy": round(self.window_busy, 4)}


class LoadMeter:
    """CPU share per window, smoothed; tick lag beside it; with issue 32's inputs, what the
    core had left and the delay signal (module docstring)."""

    __slots__ = ("_avail", "_backlog_max", "_cpu0", "_lag_max", "_lag_n", "_lag_sum", "_late",
                 "_offload0", "_own", "_packets0", "_runnable", "_sent0", "_stat", "_t0",
                 "behind", "busy", "offload_s", "own_only", "report", "windows")

    def __init__(self, *, own_only: bool = False) -> None:
        #: ``--headroom own`` (:data:`HEADROOM_MODES`): busy is the own CPU share alone
        self.own_only = own_only
        self._t0 = math.nan  # start of the current window (nan: no tick yet)
        self._cpu0 = 0.0
        self._offload0: float | None = None
        #: the last window's offload CPU seconds (other threads; offload.py learns from it)
        self.offload_s = 0.0
        self._packets0 = 0
        self._sent0: int | None = None
        self._lag_max = 0.0
        self._backlog_max = 0.0  # this window's oldest receive backlog seen by a tick
        self._lag_sum = 0.0
        self._lag_n = 0
        self._late: list[float] = []  # this window's lateness samples (ticks, pacer)
        self._stat: ProcStat | None = None  # the last /proc/stat read (window start)
        self._own = 0.0  # smoothed own share
        self._avail = MAX_CORES  # smoothed available cores
        self._runnable: float | None = None  # smoothed other runnable tasks on our CPUs
        #: smoothed decided share (issue 32: own / available, or the delay signal)
        self.busy = 0.0
        self.windows = 0  # windows completed
        self.behind = 0  # ... whose mean tick lag passed LAG_SATURATED
        self.report = LoadReport(0.0, 0.0, 0.0, 0.0, None, 0.0)

    def window_due(self, now: float) -> bool:
        """Would a tick at ``now`` complete a window (or start the first)? The shell reads
        ``/proc/stat`` only then, and passes it to that tick."""
        return math.isnan(self._t0) or now - self._t0 >= WINDOW

    def add_lateness(self, samples: Iterable[float]) -> None:
        """Lateness samples (seconds) of this window from elsewhere: the pacer's call-backs
        (pacer.py, :meth:`~.pacer.Pacer.take_lateness`)."""
        self._late.extend(samples)

    def handle_tick(self, now: float, cpu: float, lag: float, packets: int = 0, *,
                    sent: int | None = None, stat: ProcStat | None = None,
                    affinity: frozenset[int] | None = None, offload: float | None = None,
                    backlog: float = 0.0) -> bool:
        """One tick at ``now`` (seconds), the media loop thread's CPU seconds ``cpu``, the
        tick ``lag`` seconds late, ``packets`` received so far, ``sent`` datagrams sent so
        far, ``offload`` CPU seconds of the process's other threads so far (module
        docstring); at a window's edge (:meth:`window_due`) the shell's ``/proc/stat`` read
        and affinity set; ``backlog``: how long the receive loop has been behind its socket
        (seconds, 0 when it last drained it: module docstring, "Backlog"). True when a
        window just completed."""
        if math.isnan(self._t0):
            self._t0, self._cpu0, self._packets0, self._sent0 = now, cpu, packets, sent
            self._offload0 = offload
            if stat is not None:
                self._stat = stat
            self._late.clear()
            return False
        lag = max(0.0, lag)
        self._lag_max = max(self._lag_max, lag)
        self._lag_sum += lag
        self._lag_n += 1
        backlog = max(0.0, backlog)
        self._backlog_max = max(self._backlog_max, backlog)
        # One sample per tick: how late it fired, or how old a backlog it found, whichever
        # is more (a loop that yields between batches fires its ticks on time while the
        # datagrams behind them wait).
        self._late.append(max(lag, backlog))
        span = now - self._t0
        if span < WINDOW:
            return False
        own_share = max(0.0, cpu - self._cpu0) / span
        # Reported, not decided on (module docstring, "Offload").
        self.offload_s = (max(0.0, offload - self._offload0)
                          if offload is not None and self._offload0 is not None else 0.0)
        npk = packets - self._packets0
        if self._lag_sum / self._lag_n > LAG_SATURATED:
            self.behind += 1
        # What the core had left (issue 32): the affinity set's idle and steal over the
        # window, and the runnable tasks that a fair share is counted against.
        sample: CoreSample | None = None
        if self.own_only:
            stat = None  # own CPU only: what the core has left is not counted
        if stat is not None and self._stat is not None and affinity:
            sample = core_sample(self._stat, stat, affinity)
            if sample is not None and stat.procs_running is not None:
                # procs_running is machine-wide and counts us (we are running): the others,
                # scaled to our share of the machine's CPUs.
                others = max(stat.procs_running - 1, 0) * sample.cpus / max(len(stat.cpus), 1)
                self._runnable = (others if self._runnable is None
                                  else ALPHA * others + (1 - ALPHA) * self._runnable)
        if stat is not None:
            self._stat = stat
        available = available_cores(own_share, sample, self._runnable)
        # The delay signal, only over a window in which this transceiver sent media (an idle
        # one's ticks are late on a loaded host whatever it does: the trap of issue 23).
        sending = sent is not None and self._sent0 is not None and sent > self._sent0
        late = lateness_busy(self._late) if sending and not self.own_only else 0.0
        late_p90 = percentile(self._late, LATE_PERCENTILE) if sending else None
        decided = decide(own_share, available, steal_ceiling(sample), late)
        # What a unit of own CPU costs in busy units now: signaling divides its learned
        # per-call cost (own CPU) by this ``available`` to project one more call at the
        # harm seen now (the raw figure from /proc/stat is reported as core_available).
        effective = (min(max(own_share / decided, MIN_AVAILABLE), MAX_CORES)
                     if decided > 0 and own_share > 0 else min(available, steal_ceiling(sample)))
        first = self.windows == 0  # the first window replaces the initial 0: no slow ramp
        self.busy = decided if first else ALPHA * decided + (1 - ALPHA) * self.busy
        self._own = own_share if first else ALPHA * own_share + (1 - ALPHA) * self._own
        self._avail = effective if first else ALPHA * effective + (1 - ALPHA) * self._avail
        self.windows += 1
        self.report = LoadReport(
            busy=self.busy, cpu=own_share, lag_max_ms=self._lag_max * 1000,
            lag_mean_ms=self._lag_sum / self._lag_n * 1000,
            us_per_packet=(cpu - self._cpu0) / npk * 1e6 if npk > 0 else None, window_s=span,
            own=self._own, available=self._avail, core_available=available,
            core_idle=None if sample is None else sample.idle,
            core_steal=None if sample is None else sample.steal,
            cpus=None if sample is None else sample.cpus,
            late_p90_ms=None if late_p90 is None else late_p90 * 1000, late=late,
            offload=self.offload_s / span, backlog_max_ms=self._backlog_max * 1000,
            window_busy=decided)
        self._t0, self._cpu0, self._packets0, self._sent0 = now, cpu, packets, sent
        self._offload0 = offload
        self._lag_max = self._lag_sum = self._backlog_max = 0.0
        self._lag_n = 0
        self._late.clear()
        return True


#: What one call costs is learned (:class:`CallCost`) as an EWMA with this weight per window.
LEARN = 0.3
#: Calls a window needs before its CPU says what one costs (one call's cost is mostly noise).
MIN_CALLS = 2
#: A per-call cost outside this (share of a core) is a measurement artefact.
MIN_COST, MAX_COST = 0.0002, 0.25
#: Own CPU share of a transceiver with no call, until a window with none says.
IDLE = 0.01


class CallCost:
    """What one running call costs in own CPU (a share of a core), learned only from
    windows with no call setup in them (issue 32; signaling's admission takes it from the
    report: ``load`` -> ``call_cpu``, ``idle_cpu``).

    Why only those: a call's setup (ICE checks, the DTLS handshake's ECDHE and signatures,
    the SCTP association) costs several times what a second of its media does, and lands in
    the window it happens in. Learned from windows that held setups, the cost of six echo
    calls came out ~3x the media's (0.045 against 0.015 a call; tests/reliability/
    test_hog_midrun.py), and admission ran out of room long before the calls were
    degraded. So the shell (load.py) says per window how many calls ran through it
    (connected at its start and its end) and how many sessions were *not* steady in it
    (created, ended, or still connecting at some point): a window with any of the latter
    teaches nothing, one with none is ``idle + cost x calls`` exactly. A window the loop
    was behind in (mean tick lag past :data:`LAG_SATURATED`), or whose frames were late
    (the delay signal above its floor, a receive backlog included, issue 41 item 1: with
    datagrams waiting the tick still fires on time, and the window shows the CPU the calls
    *got*), measures the saturation, not the calls, and teaches nothing either (load.py
    passes both as ``behind``).

    Sans-IO: :meth:`handle_window` with each window's figures."""

    __slots__ = ("cost", "idle", "samples")

    def __init__(self) -> None:
        self.cost: float | None = None  # None: no steady window with calls yet
        self.idle = IDLE
        self.samples = 0  # windows learned from (idle ones included)

    def handle_window(self, cpu: float, calls: int, unsteady: int, *, behind: bool) -> bool:
        """One meter window: own CPU share ``cpu``, ``calls`` calls connected throughout,
        ``unsteady`` sessions created, ended or connecting in it, ``behind`` the loop
        saturated. True when it was learned from."""
        if unsteady > 0 or behind or not math.isfinite(cpu) or cpu < 0:
            return False
        if calls == 0:
            self.idle = min(cpu, 0.2)
        elif calls < MIN_CALLS:
            return False
        else:
            sample = min(max((cpu - self.idle) / calls, MIN_COST), MAX_COST)
            self.cost = sample if self.cost is None else LEARN * sample + (1 - LEARN) * self.cost
        self.samples += 1
        return True


def read_core_stat(path: str = "/proc/stat") -> tuple[ProcStat | None, frozenset[int] | None]:
    """The shell's part (the meter's tick in load.py, once per window): ``/proc/stat``
    parsed and this process's affinity set; (None, None) where either cannot be had (not
    Linux, a sandbox without /proc): the meter then assumes a core of its own."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            stat = parse_proc_stat_untrusted(f.read(1 << 20))
        affinity = frozenset(os.sched_getaffinity(0))
    except (OSError, ProcStatError, AttributeError):
        return None, None
    return stat, affinity
