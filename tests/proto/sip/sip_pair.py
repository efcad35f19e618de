"""Two sans-IO SIP endpoints (or an endpoint and a scripted peer) on a virtual network.

``Pair`` moves ``Transmit`` outputs between endpoint ``a`` (127.0.0.1:5060) and ``b``
(127.0.0.2:5062) with seeded loss and duplication and a fixed one-way delay, on a virtual
clock, so every run with the same seed is the same run (the DTLS pair's shape).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from appliance.proto.sip import EndpointConfig, SipEndpoint, Timers, Transmit
from appliance.proto.sip.message import Request, Response, parse_untrusted
from appliance.proto.sip.ua import Event

NOW = 1000.0
A = ("127.0.0.1", 5060)
B = ("127.0.0.2", 5062)
DELAY = 0.01


@dataclass
class Pair:
    seed: int = 0
    loss: float = 0.0
    dup: float = 0.0
    transport: str = "udp"
    timers: Timers = field(default_factory=Timers)
    now: float = NOW

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.a = SipEndpoint(EndpointConfig(host=A[0], port=A[1], timers=self.timers))
        self.b = SipEndpoint(EndpointConfig(host=B[0], port=B[1], timers=self.timers))
        self.events: dict[str, list[Event]] = {"a": [], "b": []}
        #: every datagram sent, as (sender, parsed message)
        self.sent: list[tuple[str, Request | Response]] = []
        self._flight: list[tuple[float, int, str, bytes, tuple[str, int]]] = []
        self._n = 0

    def ep(self, name: str) -> SipEndpoint:
        return self.a if name == "a" else self.b

    def _drain(self) -> None:
        for name, ep, src in (("a", self.a, A), ("b", self.b, B)):
            while (out := ep.poll_output()) is not None:
                if isinstance(out, Transmit):
                    self.sent.append((name, parse_untrusted(out.data)))
                    dst = "b" if out.addr == B else "a"
                    if self.transport == "udp" and self.rng.random() < self.loss:
                        continue
                    copies = 2 if self.transport == "udp" and self.rng.random() < self.dup else 1
                    for _ in range(copies):
                        self._n += 1
                        self._flight.append((self.now + DELAY, self._n, dst, out.data, src))
                else:
                    self.events[name].append(out)

    def run(self, duration: float) -> None:
        """Deliver and fire timers until ``duration`` of virtual time has passed."""
        end = self.now + duration
        while True:
            self._drain()
            due = [t for t in (self.a.poll_timeout(), self.b.poll_timeout()) if t is not None]
            due += [f[0] for f in self._flight]
            nxt = min(due, default=None)
            if nxt is None or nxt > end:
                self.now = end
                return
            self.now = max(self.now, nxt)
            ready = sorted(f for f in self._flight if f[0] <= self.now)
            self._flight = [f for f in self._flight if f[0] > self.now]
            for _, _, dst, data, src in ready:
                self.ep(dst).handle_input(self.now, data, src, self.transport)
            for ep in (self.a, self.b):
                t = ep.poll_timeout()
                if t is not None and t <= self.now:
                    ep.handle_timeout(self.now)

    def run_until(self, cond: object, limit: float = 40.0, step: float = 0.05) -> None:
        """Run in small steps until ``cond()`` holds (or ``limit`` virtual seconds pass)."""
        end = self.now + limit
        while not cond() and self.now < end:  # type: ignore[operator]
            self.run(step)

    def of(self, name: str, kind: type) -> list[Event]:
        return [e for e in self.events[name] if isinstance(e, kind)]

    def sent_by(self, name: str) -> list[Request | Response]:
        return [m for who, m in self.sent if who == name]


def drain(ep: SipEndpoint) -> tuple[list[Transmit], list[Event]]:
    tx: list[Transmit] = []
    ev: list[Event] = []
    while (out := ep.poll_output()) is not None:
        (tx if isinstance(out, Transmit) else ev).append(out)  # type: ignore[arg-type]
    return tx, ev
