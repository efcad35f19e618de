"""IceClient (controlling, one pair) against IceLiteAgent over an in-memory network on a
virtual clock with seeded loss, duplication and reordering (STYLE.md rule 10 ``pair()``)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice import (
    CheckFailed,
    CheckSucceeded,
    ClientState,
    ConnectFailed,
    ConsentExpired,
    IceClient,
    IceEvent,
    IceLiteAgent,
    IceState,
    Nominated,
)
from appliance.proto.stun import Message, binding_error, verify_integrity

SRV = ("192.0.2.10", 3478)
CLI = ("198.51.100.7", 50000)
SUFRAG, SPWD = "srvU", "server-password-0123456789"
CUFRAG, CPWD = "cliU", "client-password-0123456789"


@dataclass
class Pair:
    """Moves datagrams between a client and a lite agent. Each datagram is lost with
    probability ``loss``, duplicated with ``dup``, and delayed by a random 10-60 ms (which
    reorders). ``cli_addr`` is the client's address as the server sees it (NAT)."""

    client: IceClient
    server: IceLiteAgent
    rng: random.Random
    loss: float = 0.0
    dup: float = 0.0
    now: float = 0.0
    cli_addr: tuple[str, int] = CLI
    inflight: list[tuple[float, int, str, bytes]] = field(default_factory=list)
    client_events: list[IceEvent] = field(default_factory=list)
    server_events: list[IceEvent] = field(default_factory=list)
    _seq: int = 0

    def _send(self, to: str, data: bytes) -> None:
        if self.rng.random() < self.loss:
            return
        copies = 2 if self.rng.random() < self.dup else 1
        for _ in range(copies):
            self._seq += 1
            self.inflight.append((self.now + self.rng.uniform(0.01, 0.06), self._seq, to, data))

    def _drain(self) -> None:
        while (t := self.client.poll_transmit()) is not None:
            assert t[1] == SRV
            self._send("server", t[0])
        while (t := self.server.poll_transmit()) is not None:
            assert t[1] == self.cli_addr
            self._send("client", t[0])
        while (e := self.client.poll_event()) is not None:
            self.client_events.append(e)
        while (e := self.server.poll_event()) is not None:
            self.server_events.append(e)

    def run_until(self, end: float) -> None:
        """Advance the virtual clock to ``end``, delivering datagrams and firing timers."""
        self._drain()
        while True:
            candidates = [t for t in (self.client.poll_timeout(), self.server.poll_timeout())]
            candidates += [p[0] for p in self.inflight]
            nxt = min((t for t in candidates if t is not None), default=None)
            if nxt is None or nxt > end:
                self.now = end
                return
            self.now = max(self.now, nxt)
            due = sorted(p for p in self.inflight if p[0] <= self.now)
            self.inflight = [p for p in self.inflight if p[0] > self.now]
            for _, _, to, data in due:
                if to == "server":
                    self.server.handle_input(self.now, data, self.cli_addr)
                else:
                    self.client.handle_input(self.now, data, SRV)
            self.client.handle_timeout(self.now)
            self.server.handle_timeout(self.now)
            self._drain()


def make_pair(seed: int, loss: float = 0.0, dup: float = 0.0) -> Pair:
    rng = random.Random(seed)
    client = IceClient(CUFRAG, CPWD, SUFRAG, SPWD, SRV, rng=random.Random(seed + 1))
    server = IceLiteAgent(SUFRAG, SPWD, CUFRAG, CPWD)
    p = Pair(client, server, rng, loss=loss, dup=dup)
    client.start(0.0)
    return p


def test_clean_network_nominates_quickly() -> None:
    p = make_pair(1)
    p.run_until(1.0)
    assert p.client.state is ClientState.NOMINATED
    assert p.server.state is IceState.NOMINATED
    assert p.server.selected == CLI
    assert p.client.mapped == CLI
    assert Nominated(SRV) in p.client_events
    assert Nominated(CLI) in p.server_events
    ok = [e for e in p.client_events if isinstance(e, CheckSucceeded)]
    assert ok[0].mapped == CLI and 0.02 <= ok[0].rtt <= 0.12
    assert p.client.retransmits == 0


@pytest.mark.parametrize("seed", range(20))
def test_lossy_network_completes_nomination(seed: int) -> None:
    # 20% loss each way: a check round trip succeeds with p = 0.64, so Rc = 7 attempts all
    # fail with p < 0.001 (seeded, so deterministic either way).
    p = make_pair(seed, loss=0.2, dup=0.1)
    p.run_until(40.0)
    assert p.client.state is ClientState.NOMINATED, p.client_events
    assert p.server.selected == CLI
    # Consent kept alive by periodic checks across the 30 s window despite loss.
    assert p.server.state is IceState.NOMINATED
    assert p.client.checks_sent >= 7  # consent checks every ~5 s


def test_consent_runs_for_minutes_without_expiry() -> None:
    p = make_pair(7, loss=0.1)
    p.run_until(300.0)
    assert p.client.state is ClientState.NOMINATED
    assert p.server.state is IceState.NOMINATED
    assert 300 / 6 <= p.server.checks_ok <= 300 / 4 + 10


def test_total_loss_fails_connect_after_rfc8489_schedule() -> None:
    p = make_pair(3, loss=1.0)
    p.run_until(100.0)
    assert p.client.state is ClientState.FAILED
    assert p.client_events == [ConnectFailed()]
    # Rc = 7 transmissions at 0, .5, 1.5, 3.5, 7.5, 15.5, 31.5 s; give up at 39.5 s.
    assert p.client.checks_sent == 7


def test_client_retransmission_times() -> None:
    c = IceClient(CUFRAG, CPWD, SUFRAG, SPWD, SRV, rng=random.Random(0))
    c.start(0.0)
    assert c.poll_transmit() is not None
    times = [0.0]
    while (t := c.poll_timeout()) is not None:
        c.handle_timeout(t)
        if c.poll_transmit() is not None:
            times.append(t)
    assert times == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5]
    assert c.state is ClientState.FAILED


def test_server_going_away_expires_client_consent() -> None:
    p = make_pair(5)
    p.run_until(2.0)
    assert p.client.state is ClientState.NOMINATED
    p.loss = 1.0
    p.run_until(60.0)
    assert p.client.state is ClientState.CLOSED
    assert ConsentExpired() in p.client_events
    # The lite agent saw the checks stop too.
    assert p.server.state is IceState.CLOSED
    assert ConsentExpired() in p.server_events


def test_wrong_server_password_never_nominates() -> None:
    rng = random.Random(0)
    client = IceClient(CUFRAG, CPWD, SUFRAG, "not-the-password", SRV, rng=random.Random(1))
    server = IceLiteAgent(SUFRAG, SPWD, CUFRAG, CPWD)
    p = Pair(client, server, rng)
    client.start(0.0)
    p.run_until(50.0)
    assert server.selected is None
    assert server.auth_failures >= 1
    # The 401s carry no MESSAGE-INTEGRITY, so the client discards them (RFC 8489 §9.1.4).
    assert client.responses_rejected >= 1
    assert client.state is ClientState.FAILED


def test_nat_rebinding_during_session() -> None:
    p = make_pair(11)
    p.run_until(3.0)
    p.cli_addr = ("198.51.100.7", 61000)
    p.client.restart(CUFRAG, CPWD, SUFRAG, SPWD, p.now)  # re-nominate on the new mapping
    p.run_until(5.0)
    assert p.server.selected == ("198.51.100.7", 61000)
    assert p.client.mapped == ("198.51.100.7", 61000)
    assert Nominated(("198.51.100.7", 61000)) in p.server_events


def test_ice_restart_end_to_end() -> None:
    p = make_pair(12)
    p.run_until(3.0)
    p.server.restart("srv2", "server-password-2-abcdefgh", "cli2", "client-password-2")
    p.client.restart("cli2", "client-password-2", "srv2", "server-password-2-abcdefgh", p.now)
    p.run_until(45.0)
    assert p.server.state is IceState.NOMINATED
    assert p.client.state is ClientState.NOMINATED
    assert [e for e in p.server_events if isinstance(e, Nominated)] == [
        Nominated(CLI),
        Nominated(CLI),
    ]


def test_client_ignores_spoofed_and_stray_responses() -> None:
    c = IceClient(CUFRAG, CPWD, SUFRAG, SPWD, SRV, rng=random.Random(0))
    c.start(0.0)
    req, _ = c.poll_transmit() or (b"", SRV)
    tid = Message.parse_untrusted(req).transaction_id
    assert verify_integrity(req, SPWD.encode())
    # An unauthenticated 401 with the right tid does not end the transaction.
    c.handle_input(0.1, binding_error(tid, 401), SRV)
    # A correctly signed answer from the wrong address is rejected too.
    c.handle_input(0.1, binding_error(tid, 487, integrity_key=SPWD.encode()), CLI)
    c.handle_input(0.1, binding_error(bytes(12), 487, integrity_key=SPWD.encode()), SRV)
    c.handle_input(0.1, b"junk", SRV)
    assert c.responses_rejected == 2 and c.stray == 1 and c.malformed == 1
    assert c.state is ClientState.CHECKING
    # A signed 487 from the server is reported and fails the nomination.
    c.handle_input(0.2, binding_error(tid, 487, integrity_key=SPWD.encode()), SRV)
    assert c.poll_event() == CheckFailed(SRV, 487, "Role Conflict")
    assert c.state is ClientState.FAILED


def test_client_request_shape() -> None:
    c = IceClient(CUFRAG, CPWD, SUFRAG, SPWD, SRV, rng=random.Random(0), tie_breaker=77)
    c.start(0.0)
    raw, dest = c.poll_transmit() or (b"", SRV)
    msg = Message.parse_untrusted(raw)
    assert dest == SRV
    assert msg.username == f"{SUFRAG}:{CUFRAG}"
    assert msg.ice_controlling == 77
    assert msg.use_candidate
    assert msg.priority is not None
    with pytest.raises(LocalProtocolError):
        c.start(0.0)
