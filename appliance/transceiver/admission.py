"""When a transceiver makes a new DTLS handshake prove its return address first (issue 9).

DTLS reaches a session only from client addresses that passed an authenticated ICE check
(``Session.flows``; the relay forwards DTLS only on flows a verified STUN request made).
ICE-lite authenticates the *password*, not the *address*: the agent never waits for the
client to receive anything, so whoever knows a session's ICE password (its own client,
which may be hostile) can get any spoofed address accepted, then send ClientHellos "from"
it. Each accepted ClientHello costs the server an ECDHE key pair, an ECDSA signature and a
~1 kB flight sent to that address (amplification towards the spoofed victim), and holds
handshake state until it times out.

The stateless cookie exchange of RFC 6347 §4.2.1 (HelloVerifyRequest) removes both costs —
nothing is committed, and nothing larger than the ClientHello is sent, until the client
echoes a cookie bound to its address — at the price of one round trip for every client.
So it is switched on only under load: :class:`DtlsAdmission` watches the number of
handshakes in progress (a ClientHello accepted, not finished) and the rate of ClientHellos
reaching connections that wait for one (GCRA); past either threshold, every new handshake
gets a cookie exchange first, until ``hold`` seconds after the load was last seen.

Sans-IO: time is passed in; the transceiver's dispatch loop calls it (server.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from appliance.proto.ratelimit import Gcra


class DtlsAdmission:
    """The "cookies on?" decision and its counters. ``keys`` are the transceiver's sessions."""

    __slots__ = ("_handshaking", "_hellos", "_on_until", "hold", "max_handshakes",
                 "switched_on")

    def __init__(self, *, max_handshakes: int = 32, hello_rate: float = 100.0,
                 hello_burst: float = 100.0, hold: float = 5.0) -> None:
        if max_handshakes < 1 or hello_rate <= 0 or hello_burst < 1 or hold < 0:
            raise ValueError("max_handshakes >= 1, hello_rate > 0, hello_burst >= 1, hold >= 0")
        self.max_handshakes = max_handshakes
        self.hold = hold
        self._hellos = Gcra(hello_rate, hello_burst)  # ClientHellos to waiting connections
        self._on_until = -math.inf
        self._handshaking: set[Hashable] = set()
        #: how many times cookie mode was switched on (it was off before)
        self.switched_on = 0

    @property
    def handshakes(self) -> int:
        """Handshakes in progress (a ClientHello accepted, not finished or abandoned)."""
        return len(self._handshaking)

    def active(self, now: float) -> bool:
        """Cookie mode right now (for stats)."""
        return now < self._on_until

    def client_hello(self, now: float) -> bool:
        """A ClientHello reached a connection that waits for one: demand a cookie?"""
        if not self._hellos.allow(now) or len(self._handshaking) >= self.max_handshakes:
            if now >= self._on_until:
                self.switched_on += 1
            self._on_until = now + self.hold
        return now < self._on_until

    def started(self, key: Hashable) -> None:
        """``key``'s connection accepted a ClientHello: a handshake is in progress."""
        self._handshaking.add(key)

    def finished(self, key: Hashable) -> None:
        """``key``'s handshake completed, failed, or its session ended."""
        self._handshaking.discard(key)
