"""How much of its time budget a transceiver uses (issue 23): the headroom signal that
signaling admits calls by and the Opus complexity controller degrades by.

A transceiver's media work is periodic: every call needs its packets handled within each
20 ms tick (one Opus frame). Three candidate measures of "how much of the tick is used"
were measured under ``bench/capacity.py`` load (docs/operations.md, "Admission";
docs/performance.md, "Overload"):

* **busy** — CPU seconds of this process per wall second (``time.process_time``: utime +
  stime of every thread, exactly what the capacity benchmark reads from ``/proc``). It
  grows linearly with the calls carried (each PCM call costs the same ~1.2 % of a core at
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
task in server.py): ``handle_tick(now, cpu, lag)`` every tick, read :attr:`busy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

    def to_json(self) -> dict[str, float | None]:
        return {"busy": round(self.busy, 4), "cpu": round(self.cpu, 4),
                "lag_max_ms": round(self.lag_max_ms, 3), "lag_mean_ms": round(self.lag_mean_ms, 3),
                "us_per_packet": None if self.us_per_packet is None else round(self.us_per_packet, 1),
                "window_s": round(self.window_s, 3)}


class LoadMeter:
    """CPU share per window, smoothed; tick lag beside it."""

    __slots__ = ("_cpu0", "_lag_max", "_lag_n", "_lag_sum", "_packets0", "_t0", "behind",
                 "busy", "report", "windows")

    def __init__(self) -> None:
        self._t0 = math.nan  # start of the current window (nan: no tick yet)
        self._cpu0 = 0.0
        self._packets0 = 0
        self._lag_max = 0.0
        self._lag_sum = 0.0
        self._lag_n = 0
        #: smoothed CPU share (lag-saturated windows count as 1.0)
        self.busy = 0.0
        self.windows = 0  # windows completed
        self.behind = 0  # ... whose mean tick lag passed LAG_SATURATED
        self.report = LoadReport(0.0, 0.0, 0.0, 0.0, None, 0.0)

    def handle_tick(self, now: float, cpu: float, lag: float, packets: int = 0) -> bool:
        """One tick at ``now`` (seconds), process CPU seconds ``cpu``, the tick ``lag``
        seconds late, ``packets`` received so far. True when a window just completed."""
        if math.isnan(self._t0):
            self._t0, self._cpu0, self._packets0 = now, cpu, packets
            return False
        lag = max(0.0, lag)
        self._lag_max = max(self._lag_max, lag)
        self._lag_sum += lag
        self._lag_n += 1
        span = now - self._t0
        if span < WINDOW:
            return False
        share = max(0.0, cpu - self._cpu0) / span
        npk = packets - self._packets0
        sample = share
        if self._lag_sum / self._lag_n > LAG_SATURATED:
            self.behind += 1
        # The first window replaces the initial 0: no slow ramp from idle on start.
        self.busy = sample if self.windows == 0 else ALPHA * sample + (1 - ALPHA) * self.busy
        self.windows += 1
        self.report = LoadReport(
            busy=self.busy, cpu=share, lag_max_ms=self._lag_max * 1000,
            lag_mean_ms=self._lag_sum / self._lag_n * 1000,
            us_per_packet=(cpu - self._cpu0) / npk * 1e6 if npk > 0 else None, window_s=span)
        self._t0, self._cpu0, self._packets0 = now, cpu, packets
        self._lag_max = self._lag_sum = 0.0
        self._lag_n = 0
        return True
