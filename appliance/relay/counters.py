"""The relay's counters: what ``{"op": "stats"}`` reports and signaling's metrics export.

The names are part of the relay's interface (Prometheus series are built from them), so
they do not change; drops are counted separately, by reason (the reasons are the core's
and the hot path's: ``no-flow``, ``stun-budget``, ``proxy-malformed``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Every counter the relay keeps (drops are separate, by reason).
COUNTER_NAMES = (
    "packets_in",
    "bytes_in",
    "packets_out",
    "bytes_out",
    "flows_created",
    "flows_expired",
    "flows_evicted",
    "flows_recovered",
    "reroutes",
    "stun_answered",
    "redis_lookups",
    "redis_writes",
    "wakeups",
    "coalesced",
    "flows_answered",
    "tcp_accepted",
    "tcp_established",
    "tcp_closed",
    "tcp_https",
    "tcp_turn_tls",
    "tcp_proxied",
    "flows_vouched",
    "vouch_queries",
    "redis_errors",
    "redis_reconnects",
    "packets_held",
    "held_released",
)


@dataclass(slots=True)
class Counters:
    packets_in: int = 0
    bytes_in: int = 0
    packets_out: int = 0
    bytes_out: int = 0
    flows_created: int = 0
    flows_expired: int = 0
    flows_evicted: int = 0
    flows_recovered: int = 0
    reroutes: int = 0
    stun_answered: int = 0
    redis_lookups: int = 0
    redis_writes: int = 0
    #: flows that became established (their transceiver answered them)
    flows_answered: int = 0
    #: flows installed because a transceiver vouched for them (reseed.py) and the queries
    #: sent for them (one per unknown client and transceiver)
    flows_vouched: int = 0
    vouch_queries: int = 0
    #: failed Redis operations (each once, however many writes it carried) and recoveries
    redis_errors: int = 0
    redis_reconnects: int = 0
    #: hot-loop wake-ups (packets_in / wakeups = datagrams handled per event-loop round trip)
    wakeups: int = 0
    #: wake-ups after which the hot loop waited to gather a batch (server.coalesce_wait)
    coalesced: int = 0
    #: ICE-TCP connections (relay/tcp.py): accepted, that made a flow, closed (open =
    #: accepted - closed); their frames are in packets_in/out, refusals in drops (tcp-*)
    tcp_accepted: int = 0
    tcp_established: int = 0
    tcp_closed: int = 0
    #: shared-port mode: TLS connections relayed to the HTTPS backend (relay/tcp.py)
    tcp_https: int = 0
    #: TLS connections the split gave to TURN/TLS (relay/tls.py)
    tcp_turn_tls: int = 0
    tcp_proxied: int = 0  # connections whose client a front proxy's header named
    #: datagrams of clients being looked up, held (issue 32), and of those forwarded once
    #: the look-up installed the flow (the rest expired; they are in drops *-pending)
    packets_held: int = 0
    held_released: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    #: counters of optional parts, by name (TURN's ``turn_*``, relay/turn.py): reported
    #: beside the fixed ones, and summed over workers like them
    extra: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n

    def add(self, name: str, n: int = 1) -> None:
        self.extra[name] = self.extra.get(name, 0) + n

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {name: getattr(self, name) for name in COUNTER_NAMES}
        out.update(self.extra)
        out["drops"] = dict(self.drops)
        return out
