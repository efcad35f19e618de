"""An in-memory network between two sans-IO SCTP associations, on a virtual clock.

Copied in shape from ``tests/proto/dtls/dtls_pair.py``: seeded loss, duplication,
reordering, plus a one-way delay so RTT and timers are exercised. Every run with the same
seed is the same run.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from appliance.proto.sctp import Closed, Connected, Event, MessageReceived, SctpAssociation

NOW = 1_700_000_000.0


@dataclass
class Network:
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.005  # one way
    jitter: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def arrivals(self, now: float, packet: bytes) -> list[float]:
        if self.rng.random() < self.loss:
            return []
        times = [now + self.delay + self.rng.random() * self.jitter]
        if self.rng.random() < self.reorder:
            times[0] += self.delay * 3 * self.rng.random()
        if self.rng.random() < self.duplicate:
            times.append(times[0] + self.rng.random() * self.delay)
        return times


class Pair:
    """``a`` is the client (calls connect), ``b`` the server (passive unless both=True)."""

    def __init__(self, network: Network | None = None, *, seed: int = 1,
                 both_connect: bool = False, a: Any = None, b: Any = None,
                 **kwargs: Any) -> None:
        self.now = NOW
        self.network = network or Network()
        # a/b: SctpAssociation or DataChannelEndpoint (the same verbs)
        self.a: Any = a or SctpAssociation(rng=random.Random(seed), **kwargs)
        self.b: Any = b or SctpAssociation(rng=random.Random(seed + 1000), **kwargs)
        self.both_connect = both_connect
        self.events: dict[str, list[Event]] = {"a": [], "b": []}
        self._queue: list[tuple[float, int, str, bytes]] = []
        self._seq = 0
        self.sent = {"a": 0, "b": 0}
        self.blackhole: set[str] = set()  # names whose outgoing packets vanish

    def side(self, name: str) -> Any:
        return self.a if name == "a" else self.b

    def pump(self) -> None:
        """Move every queued packet of both sides onto the network; collect events."""
        for name, src in (("a", self.a), ("b", self.b)):
            while (p := src.poll_transmit()) is not None:
                assert len(p) <= getattr(src, "association", src).mtu
                self.sent[name] += 1
                if name in self.blackhole:
                    continue
                for t in self.network.arrivals(self.now, p):
                    self._seq += 1
                    heapq.heappush(self._queue, (t, self._seq, "b" if name == "a" else "a", p))
            while (e := src.poll_event()) is not None:
                self.events[name].append(e)

    def run(self, duration: float = 30.0, until: Any = None) -> None:
        """Advance the virtual clock, delivering packets and firing timers, for up to
        ``duration`` seconds or until ``until()`` is true."""
        deadline = self.now + duration
        self.pump()
        while self.now < deadline:
            if until is not None and until():
                return
            timers = [t for t in (self.a.poll_timeout(), self.b.poll_timeout()) if t is not None]
            if self._queue:
                nxt = min([self._queue[0][0], *timers])
            elif timers:
                nxt = min(timers)
            else:
                return
            self.now = max(self.now, nxt)
            if self.now > deadline:
                self.now = deadline
                return
            while self._queue and self._queue[0][0] <= self.now:
                _, _, dst, p = heapq.heappop(self._queue)
                self.side(dst).handle_input(self.now, p)
            for s in (self.a, self.b):
                t = s.poll_timeout()
                if t is not None and t <= self.now:
                    s.handle_timeout(self.now)
            self.pump()

    def connect(self, duration: float = 30.0) -> None:
        self.a.connect(self.now)
        if self.both_connect:
            self.b.connect(self.now)
        self.run(duration, until=lambda: self.connected("a") and self.connected("b"))

    def connected(self, name: str) -> bool:
        return any(isinstance(e, Connected) for e in self.events[name])

    def closed(self, name: str) -> Closed | None:
        return next((e for e in self.events[name] if isinstance(e, Closed)), None)

    def messages(self, name: str) -> list[MessageReceived]:
        return [e for e in self.events[name] if isinstance(e, MessageReceived)]

    def of(self, name: str, kind: type) -> list[Any]:
        return [e for e in self.events[name] if isinstance(e, kind)]


def dc_pair(network: Network | None = None, *, seed: int = 1, **kwargs: Any) -> Pair:
    """Two DataChannelEndpoints: ``a`` is the DTLS client (even ids), ``b`` the server;
    both connect, as browsers do (RFC 8841 §9.3)."""
    from appliance.proto.sctp.datachannel import DataChannelEndpoint

    a = DataChannelEndpoint(dtls_client=True, rng=random.Random(seed), **kwargs)
    b = DataChannelEndpoint(dtls_client=False, rng=random.Random(seed + 1000), **kwargs)
    return Pair(network, a=a, b=b, both_connect=True)
