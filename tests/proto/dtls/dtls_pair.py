"""An in-memory network between two sans-IO DTLS connections, on a virtual clock.

``Pair`` moves datagrams between a client and a server with seeded loss, duplication and
reordering (trio's "terrible network" DTLS test, str0m's netem), so every run with the
same seed is the same run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from appliance.proto.dtls import (
    ApplicationData,
    Certificate,
    ConnectionClosed,
    DtlsConnection,
    Event,
    HandshakeComplete,
    Role,
)

NOW = 1_700_000_000.0
_CERTS: dict[str, Certificate] = {}


def cert(name: str) -> Certificate:
    """Certificates are slow-ish to make; share one per name across tests."""
    if name not in _CERTS:
        _CERTS[name] = Certificate.generate(NOW)
    return _CERTS[name]


@dataclass
class Network:
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def shape(self, datagrams: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for d in datagrams:
            if self.rng.random() < self.loss:
                continue
            out.append(d)
            if self.rng.random() < self.duplicate:
                out.append(d)
        if len(out) > 1 and self.rng.random() < self.reorder:
            self.rng.shuffle(out)
        return out


class Pair:
    def __init__(
        self,
        client: DtlsConnection | None = None,
        server: DtlsConnection | None = None,
        network: Network | None = None,
        **server_kwargs: object,
    ) -> None:
        self.now = NOW
        self.client = client or DtlsConnection(
            Role.CLIENT, cert("client"), remote_fingerprints=[cert("server").fingerprint]
        )
        self.server = server or DtlsConnection(
            Role.SERVER,
            cert("server"),
            remote_fingerprints=[cert("client").fingerprint],
            **server_kwargs,  # type: ignore[arg-type]
        )
        self.network = network or Network()
        self.events: dict[str, list[Event]] = {"client": [], "server": []}
        self.datagrams = {"client": 0, "server": 0}

    def _drain(self, name: str, conn: DtlsConnection) -> list[bytes]:
        out = []
        while (d := conn.poll_transmit()) is not None:
            assert len(d) <= conn.mtu
            out.append(d)
        while (e := conn.poll_event()) is not None:
            self.events[name].append(e)
        self.datagrams[name] += len(out)
        return out

    def step(self) -> bool:
        """Deliver everything each side has queued once; return False if nothing moved."""
        moved = False
        for name, src, dst in (
            ("client", self.client, self.server),
            ("server", self.server, self.client),
        ):
            for d in self.network.shape(self._drain(name, src)):
                dst.handle_datagram(self.now, d)
                moved = True
        # Collect events without dropping datagrams queued by the deliveries above.
        for name, conn in (("client", self.client), ("server", self.server)):
            while (e := conn.poll_event()) is not None:
                self.events[name].append(e)
        return moved

    def run(self, max_time: float = 120.0) -> None:
        """Exchange until both sides are established or closed, advancing the clock."""
        if self.client.state.value == "client-idle":
            self.client.start(self.now)
        deadline = self.now + max_time
        while self.now < deadline:
            while self.step():
                pass
            if self.done:
                return
            timeouts = [
                t for t in (self.client.poll_timeout(), self.server.poll_timeout()) if t is not None
            ]
            if not timeouts:
                return
            self.now = max(self.now, min(timeouts))
            self.client.handle_timeout(self.now)
            self.server.handle_timeout(self.now)

    @property
    def done(self) -> bool:
        return all(
            any(isinstance(e, HandshakeComplete | ConnectionClosed) for e in evs)
            for evs in self.events.values()
        )

    def completed(self, name: str) -> HandshakeComplete | None:
        return next((e for e in self.events[name] if isinstance(e, HandshakeComplete)), None)

    def closed(self, name: str) -> ConnectionClosed | None:
        return next((e for e in self.events[name] if isinstance(e, ConnectionClosed)), None)

    def app_data(self, name: str) -> list[bytes]:
        return [e.data for e in self.events[name] if isinstance(e, ApplicationData)]
