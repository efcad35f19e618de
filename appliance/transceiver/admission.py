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

Sans-IO: time is passed in. Each call consults it (``ServerCall``, through its
:class:`DtlsGate`) when a ClientHello reaches its connection; :class:`DtlsSetup` is where the
transceiver gets a call's DTLS connection and the shared gate, so that ``server.py`` routes
datagrams without knowing DTLS.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Hashable
from dataclasses import dataclass

from appliance.proto.dtls import Certificate, DtlsConnection, Role
from appliance.proto.ratelimit import Gcra
from appliance.proto.sdp import Answer

CERT_LIFETIME = 24 * 3600.0  # a fresh DTLS certificate per day; sessions keep theirs


class DtlsAdmission:
    """The "cookies on?" decision and its counters. ``keys`` are the transceiver's calls."""

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


@dataclass(frozen=True, slots=True)
class DtlsGate:
    """The transceiver-wide half of admission a call consults when a ClientHello reaches
    its connection while it waits for one: the shared policy and the secret its
    HelloVerifyRequest cookies are made with."""

    policy: DtlsAdmission
    cookie_secret: bytes


class DtlsSetup:
    """Where a transceiver's calls get their DTLS: its certificate (a fresh one every
    ``lifetime`` seconds of wall time, passed in), the versions and False Start setting of
    its config, and the admission gate every call shares."""

    def __init__(self, *, wall: float, versions: frozenset[str], false_start: bool,
                 lifetime: float = CERT_LIFETIME) -> None:
        self.versions = versions
        self.false_start = false_start
        self.lifetime = lifetime
        self._cert = Certificate.generate(wall)
        self._cert_at = wall
        self.admission = DtlsAdmission()
        self.gate = DtlsGate(self.admission, secrets.token_bytes(32))

    def fingerprint(self, wall: float) -> str:
        """The fingerprint the next answer carries (rotating the certificate when due)."""
        if wall - self._cert_at > self.lifetime:
            self._cert, self._cert_at = Certificate.generate(wall), wall
        return str(self._cert.fingerprint)

    def connection(self, answer: Answer) -> DtlsConnection:
        """The one place a call's DTLS connection is made, in the role the answer's
        a=setup chose, with the certificate :meth:`fingerprint` last named. The
        ClientHello's supported_versions (RFC 9147 §5.3, RFC 8446 §4.2.1) negotiates within
        ``versions``: 1.3 when both list it, else 1.2 with the RFC 8446 §4.1.3 downgrade
        sentinel (proto/dtls/versioned.py)."""
        return DtlsConnection(
            Role.CLIENT if answer.dtls_client else Role.SERVER, self._cert,
            remote_fingerprints=[str(fp) for fp in answer.transport.fingerprints],
            versions=self.versions,
            false_start=self.false_start and answer.dtls_client,
        )
