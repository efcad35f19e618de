"""The setup-time histogram: counts per Prometheus bucket, kept by the registry
(registry.py, one per setup step) and written out by metrics.py.

Its own module so that what records an observation and what renders it both depend on it
rather than on each other.
"""

from __future__ import annotations

#: Upper bounds (seconds) of the ``appliance_session_setup_seconds`` buckets; ``+Inf`` is
#: implicit (the count).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histogram:
    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * len(BUCKETS)  # non-cumulative; cumulated when rendered
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
                break
