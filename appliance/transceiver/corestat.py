"""What the cores a transceiver may run on have left (issue 32): the arithmetic, no I/O.

A transceiver's own CPU share (headroom.py, ``busy``) says how much of a core *it* used. It
assumed a core of its own; on a small VM where relay, signaling and the transceiver share
one core, or with noisy neighbours (CPU steal), the process can be 70 % busy while the core
is saturated and every call is late (issue 32: 56 calls admitted, 5.5 % loss each). So the
load report also reads, once per meter window:

* ``/proc/stat``'s per-CPU lines for the CPUs in the process's affinity set
  (``os.sched_getaffinity(0)``): how much of them was *idle* (idle + iowait) and *stolen*
  (the hypervisor ran someone else) over the window; and ``procs_running``, the runnable
  tasks right now;
* a delay signal that sharing cannot fool: how late the transceiver's 20 ms tick and its
  pacer's call-backs fire (headroom.py feeds the samples in).

From those, :func:`available_cores` is how much of a core this process could have used
over the window: its own use plus what nobody used (idle), at most one core (the media
loop is one thread); steal is nobody's to take. A CPU-bound neighbour (a hog) uses every
idle cycle, but the kernel's fair scheduler would still give us a share of the CPUs if we
asked for it: ``fair = cpus / (other runnable tasks + 1)``, so what is left is at least
``fair - own``. :func:`core_busy` is then ``own / available``: the share of the capacity
*available to us* that we use — exactly ``own`` on a core of our own, 1.0 when others took
all the rest, and what an extrapolation by cost per call (signaling's admission) needs,
once the per-call cost is also divided by ``available`` (signaling/admission.py).

Whether others' CPU is *taken from us* the counters cannot say: on a host loaded by
processes that mostly sleep (the shared 2-vCPU test machine at load 16: nothing idle, 18
tasks runnable) a transceiver with 20 calls used more than its "fair" 0.1 core and its
frames were on time. So :func:`decide` counts steal for sure and the contended part only
as far as the delay signal shows harm (measured 2026-12-01 on that machine: an idle trio
loop's 20 ms tick late p50 3.1 ms, p90 7.7 ms, p99 21.7 ms).

The trap found before (headroom.py's docstring, 2026-12-01): on the shared test machine an
*idle* transceiver's tick lag was high in a quarter of its windows, and deciding on it made
``appliance up`` refuse every call. Here: the fair share keeps an idle transceiver on a
saturated box at ``own / fair`` (a few per cent), never "full"; and the delay signal
(:func:`lateness_busy`) counts only in windows where the transceiver sent media, above a
floor (:data:`LATE_FLOOR`: scheduling noise no call hears), and as a high percentile (one
late tick is not a trend).

Everything here takes its inputs as arguments (texts, numbers) and returns numbers; the
shell (load.py's meter tick) reads ``/proc/stat`` and the affinity mask.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ..proto.errors import RemoteProtocolError

#: Tick or pacer lateness at or below this counts as on time (scheduling noise a jitter
#: buffer absorbs: an *idle* trio loop's 20 ms tick on the shared 2-vCPU test machine at
#: load 16 was late p90 7.7 ms, 2026-12-01).
LATE_FLOOR = 0.010
#: ... and this much (at the percentile below) counts as saturated: frames two frame times
#: late are audio a caller hears as glitches or as growing delay.
LATE_FULL = 0.040
#: The percentile of a window's lateness samples that is decided on.
LATE_PERCENTILE = 0.90
#: Fewer samples than this in a window say nothing (an idle transceiver's few ticks).
LATE_MIN_SAMPLES = 10
#: The most of a core one transceiver can use (its media loop is one thread).
MAX_CORES = 1.0
#: Available capacity is never taken as less than this (a division guard, and a transceiver
#: that used nothing on a fully stolen core still reads as full, not as infinity).
MIN_AVAILABLE = 0.01
#: Available capacity at or above which the core counts as the transceiver's own: its calls
#: get what they need, so the measured busy share is what they cost. Below it (a hog, steal,
#: a neighbour making frames late) the calls may get less than they need and the learned
#: per-call cost times the calls is the better guide (admission's ``now``). A linear model
#: is no guide on a core of its own: per-call CPU falls as calls are added (the receive
#: loop's batches grow: 387 -> 255 us per packet from 16 to 64 calls, docs/performance.md),
#: so cost x calls learned at 32 calls read 0.98 at 64 calls whose busy was 0.58, and
#: bench/capacity.py's placement (a) was refused at half a core (2026-12-02).
SHARED_BELOW = 0.95
#: /proc/stat lines kept at most (a machine with more CPUs is read in part).
MAX_CPUS = 4096


class ProcStatError(RemoteProtocolError):
    """``/proc/stat`` text that is not what the kernel writes."""


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One ``cpuN`` line, in clock ticks since boot."""

    total: int  # every field but guest/guest_nice (already inside user/nice)
    idle: int  # idle + iowait: time nobody wanted this CPU
    steal: int  # time the hypervisor gave this virtual CPU's core to someone else


@dataclass(frozen=True, slots=True)
class ProcStat:
    """What one read of ``/proc/stat`` says (per-CPU lines and the runnable tasks)."""

    cpus: Mapping[int, CpuTimes]
    procs_running: int | None


@dataclass(frozen=True, slots=True)
class CoreSample:
    """The affinity set over one interval, in cores (1.0 = one CPU for the whole time)."""

    cpus: int  # CPUs of the affinity set that were seen in both reads
    idle: float  # cores' worth of idle time
    steal: float  # cores' worth of stolen time
    used: float  # cores' worth of time someone (us included) ran


def parse_proc_stat_untrusted(text: str) -> ProcStat:
    """The ``cpuN`` lines and ``procs_running`` of ``/proc/stat`` (proc(5)).

    ``cpuN user nice system idle iowait irq softirq steal guest guest_nice``: kernels
    before 2.6.11 have fewer fields (missing ones read as 0), guest time is already counted
    in user/nice. Raises :class:`ProcStatError` for anything else on a ``cpu`` line."""
    cpus: dict[int, CpuTimes] = {}
    running: int | None = None
    for line in text.splitlines():
        if line.startswith("cpu") and not line.startswith("cpu "):
            name, _, rest = line.partition(" ")
            index = name[3:]
            if not index.isascii() or not index.isdigit() or len(index) > 6:
                raise ProcStatError(f"bad cpu line name {name[:16]!r}")
            fields = rest.split()
            if not 4 <= len(fields) <= 10:
                raise ProcStatError(f"{name}: {len(fields)} fields")
            try:
                values = [int(f) for f in fields]
            except ValueError:
                raise ProcStatError(f"{name}: a field is not a number") from None
            if min(values) < 0:
                raise ProcStatError(f"{name}: a negative field")
            values += [0] * (10 - len(values))
            user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
            total = user + nice + system + idle + iowait + irq + softirq + steal
            if len(cpus) < MAX_CPUS:
                cpus[int(index)] = CpuTimes(total, idle + iowait, steal)
        elif line.startswith("procs_running "):
            value = line.split()[1] if len(line.split()) == 2 else ""
            if not value.isascii() or not value.isdigit():
                raise ProcStatError("bad procs_running line")
            running = int(value)
    return ProcStat(cpus, running)


def core_sample(before: ProcStat, after: ProcStat, affinity: Collection[int]) -> CoreSample | None:
    """The affinity set's idle, steal and used time between two reads, in cores. None when
    no CPU of the set is in both reads or no time passed (the counters did not move)."""
    total = idle = steal = 0
    n = 0
    for cpu in affinity:
        a, b = before.cpus.get(cpu), after.cpus.get(cpu)
        if a is None or b is None:
            continue
        dt = b.total - a.total
        if dt <= 0:
            continue  # a CPU that went offline and back, or a read within one tick
        n += 1
        total += dt
        idle += min(max(b.idle - a.idle, 0), dt)
        steal += min(max(b.steal - a.steal, 0), dt)
    if n == 0 or total <= 0:
        return None
    idle = min(idle, total)
    steal = min(steal, total - idle)
    # Each CPU's ticks over the interval are the same wall time: n CPUs' worth in total.
    scale = n / total
    return CoreSample(n, idle * scale, steal * scale, (total - idle - steal) * scale)


def available_cores(own: float, sample: CoreSample | None, runnable: float | None = None) -> float:
    """How much of a core this process could have used over the interval (module
    docstring): its own use plus the idle time of its CPUs, at least its fair share against
    ``runnable`` *other* runnable tasks on them, at most :data:`MAX_CORES`. Without a sample
    (no ``/proc/stat``): a core of its own, as before issue 32."""
    own = max(own, 0.0)
    if sample is None:
        return MAX_CORES
    left = sample.idle
    if runnable is not None and runnable >= 0:
        fair = sample.cpus / (runnable + 1.0)
        left = max(left, fair - own)
    # Steal is never ours to take, even on a fair share: it was not the kernel's to give.
    ceiling = max(MAX_CORES - sample.steal / sample.cpus, MIN_AVAILABLE)
    return min(max(own + left, MIN_AVAILABLE), ceiling, MAX_CORES)


def steal_ceiling(sample: CoreSample | None) -> float:
    """The most of a core left to anyone once the hypervisor took its steal."""
    if sample is None:
        return MAX_CORES
    return min(max(MAX_CORES - sample.steal / sample.cpus, MIN_AVAILABLE), MAX_CORES)


def decide(own: float, available: float, ceiling: float, late: float) -> float:
    """The busy share a window is decided on (headroom.py): own use of what steal leaves
    (certain), plus the part of what *other processes* took that the delay signal ``late``
    (0..1) shows to hurt — all of it once frames are a frame time late. Saturated lateness
    alone (no /proc/stat, or a neighbour the CPU figures miss) reads as full."""
    base = core_busy(own, ceiling)
    contended = max(core_busy(own, available), base)
    late = min(max(late, 0.0), 1.0)
    busy = base + (contended - base) * late
    return 1.0 if late >= 1.0 else min(busy, 1.0)


def core_busy(own: float, available: float) -> float:
    """The share of what was available that this process used (0..1)."""
    return min(max(own, 0.0) / max(available, MIN_AVAILABLE), 1.0)


def percentile(values: Iterable[float], p: float) -> float | None:
    """The ``p`` quantile (0..1) of ``values``, nearest rank; None for no values."""
    s = sorted(values)
    if not s:
        return None
    rank = min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))
    return s[rank]


def lateness_busy(samples: Iterable[float], *, floor: float = LATE_FLOOR,
                  full: float = LATE_FULL, q: float = LATE_PERCENTILE,
                  min_samples: int = LATE_MIN_SAMPLES) -> float:
    """The delay signal as a busy share: 0 while the ``q`` percentile of ``samples``
    (seconds late) is at or below ``floor``, 1.0 from ``full`` on, linear between. Fewer
    than ``min_samples`` samples: 0 (not enough to tell)."""
    values = [max(0.0, s) for s in samples]
    if len(values) < min_samples:
        return 0.0
    late = percentile(values, q)
    assert late is not None
    if late <= floor:
        return 0.0
    return min((late - floor) / (full - floor), 1.0)
