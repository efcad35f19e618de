"""The histograms /metrics shows: counts per Prometheus bucket, kept by the registry
(registry.py: one per setup step, one per turn span) and written out by metrics.py.

Its own module so that what records an observation and what renders it both depend on it
rather than on each other.
"""

from __future__ import annotations

#: Upper bounds (seconds) of the ``appliance_session_setup_seconds`` buckets; ``+Inf`` is
#: implicit (the count).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: The ``appliance_turn_*_seconds`` buckets: finer where a reply's latency is judged (issue
#: 38's bounds are 500 ms at p50 and 800 ms at p99, a person's gap between turns ~200 ms),
#: and up to 30 s for the caller's own speech.
TURN_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # non-cumulative; cumulated when rendered
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
