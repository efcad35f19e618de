"""When the transceiver, as DTLS client, may send a flight of its own (docs/adr-dtls-active.md).

Sans-IO like ``call.py``, which owns one per call when it answered ``a=setup:active``: time
is passed in, and the GCRA is :mod:`appliance.proto.ratelimit`'s (STYLE.md rule 15).
"""

from __future__ import annotations

from collections import deque

from appliance.proto.ratelimit import Gcra

Addr = tuple[str, int]

#: As DTLS client: flights we send on our own (first ClientHello, timer retransmissions)
#: per second at most, whatever the checks (a per-call ceiling under the per-check credit).
OWN_FLIGHT_RATE = 2.0
OWN_FLIGHT_BURST = 3.0
#: Transaction ids of recent valid checks remembered, so that a retransmitted or replayed
#: check (RFC 8489 §6.2.1: a retransmission keeps its id) buys no second flight.
_TID_MEMORY = 32


class FlightBudget:
    """When we are the DTLS client: which of our own flights may leave now.

    ICE-lite authenticates the *password*, not the address (admission.py says why): a
    hostile holder of the password can send valid checks "from" a victim's address. So
    each flight we send on our own initiative costs one *credit* of the address it goes
    to, and a credit is earned only by a MESSAGE-INTEGRITY-valid check (the ICE-lite
    agent has checked it, FINGERPRINT included) from that address with a transaction id not
    seen before. At most one credit is held per address, and a per-call GCRA
    (``OWN_FLIGHT_RATE``/``OWN_FLIGHT_BURST``, :mod:`appliance.proto.ratelimit`) caps
    flights whatever the checks. A flight the budget refuses is *held*, not dropped: the
    next fresh check from its address releases it (so a lost ClientHello is resent right
    after the proof that the peer is still there). Unauthenticated checks never reach this
    class: the agent answers them 401 at most, and nothing else.
    """

    __slots__ = ("_order", "_tids", "credit", "gcra", "held", "held_count", "sent")

    def __init__(self) -> None:
        self.credit: set[Addr] = set()
        self._tids: set[bytes] = set()
        self._order: deque[bytes] = deque()
        self.gcra = Gcra(OWN_FLIGHT_RATE, OWN_FLIGHT_BURST)
        self.held: list[bytes] | None = None  # the newest refused flight
        self.sent = 0  # own flights sent
        self.held_count = 0  # own flights refused (held) at least once

    def earn(self, addr: Addr, tid: bytes) -> bool:
        """A valid check with transaction id ``tid`` from ``addr``: a credit, unless the id
        was seen (a retransmission or a replay); whether it earned one."""
        if tid in self._tids:
            return False
        self._tids.add(tid)
        self._order.append(tid)
        if len(self._order) > _TID_MEMORY:
            self._tids.discard(self._order.popleft())
        self.credit.add(addr)
        return True

    def spend(self, addr: Addr, now: float) -> bool:
        """Pay for one flight to ``addr`` now; whether it may go."""
        if addr not in self.credit or not self.gcra.allow(now):
            return False
        self.credit.discard(addr)
        self.sent += 1
        return True
