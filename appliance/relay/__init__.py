"""The relay: one public UDP port, first packet routed by the server ufrag (DESIGN.md).

Where things go:

* :mod:`.core`        — flow table, first-packet routing, rate limits (no I/O; every decision,
  including the two tables the hot path applies without calling it).
* :mod:`.counters`    — the counters ``stats`` reports.
* :mod:`.transport`   — the Transport / ReturnSink seam: a new client transport (ICE-TCP) is a
  listener feeding a drain plus a sink, registered with the core; no routing change.
* :mod:`.fastpath`    — the one routing loop (``make_drain``) and the hot loop over all sockets.
* :mod:`.io`          — its two syscall adapters: ``python`` and ``mmsg``
  (:mod:`appliance.netio._mmsg`).
* :mod:`.filter`      — the public sockets' kernel (BPF) filter.
* :mod:`.resolver`    — transceiver names, resolved off the hot path.
* :mod:`.redis_cache` — the optional Redis flow cache's tasks.
* :mod:`.control`     — the ``{"op": "stats"}`` handlers (one worker, M workers summed).
* :mod:`.server`      — the trio shell: :func:`serve_relay` for one worker.
* :mod:`.argv`        — the one builder of a worker's command line.
* :mod:`.cli`         — ``appliance relay``: flags, config file, M worker processes (run by
  :class:`appliance.children.Supervisor`, as ``appliance up`` runs its children).
"""

from __future__ import annotations

from .core import CoreConfig, Counters, Flow, RelayCore, Route, TokenBuckets
from .server import RelayConfig, RelayHandle, serve_relay
from .transport import ReturnSink, Transport

__all__ = [
    "CoreConfig",
    "Counters",
    "Flow",
    "RelayConfig",
    "RelayCore",
    "RelayHandle",
    "ReturnSink",
    "Route",
    "TokenBuckets",
    "Transport",
    "serve_relay",
]
