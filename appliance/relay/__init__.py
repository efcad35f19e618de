"""The relay: one public UDP port, first packet routed by the server ufrag (DESIGN.md).

* :mod:`.core`   — flow table, first-packet routing, rate limits, counters (no I/O).
* :mod:`.server` — the trio shell: :func:`serve_relay` for one worker.
* :mod:`.cli`    — ``appliance relay``: flags, config file, M worker processes.
"""

from __future__ import annotations

from .core import CoreConfig, Counters, Flow, RelayCore, Route, TokenBuckets
from .server import RelayConfig, RelayHandle, serve_relay

__all__ = [
    "CoreConfig",
    "Counters",
    "Flow",
    "RelayConfig",
    "RelayCore",
    "RelayHandle",
    "Route",
    "TokenBuckets",
    "serve_relay",
]
