"""A whole call on a virtual clock, no sockets: a :class:`ClientPeer` and a
:class:`ServerCall` wired back to back through a simulated network (str0m's
``tests/common.rs`` + netem; trio's "terrible network" DTLS test).

Every datagram gets a delay (``delay`` plus up to ``jitter``); with probability ``loss`` it
is dropped, ``duplicate`` it arrives twice (the copy with its own delay), ``reorder`` it is
held back by another ``hold``. All randomness comes from ``seed``, so a seed is a run.
``drop(direction, data)`` lets a test discard chosen datagrams ("c2s" or "s2c").
``relay`` is the relay internal address the client's datagrams reach the server through
(a test moves it: a relay worker's successor); what the server sends to an address in
``dead`` is lost (``lost_to_dead`` keeps it), as it is to a relay worker killed.

DTLS roles: the client offers ``a=setup:actpass`` and the answer makes the server the DTLS
client (``a=setup:active``); ``offer_setup="active"`` munges the offer (as a browser test
munges its SDP) so the server falls back to passive. ``versions`` are both sides' DTLS
versions.

The loop (:meth:`CallPair.step`) is the shell's contract (STYLE.md rule 2): after every
``handle_*``, drain the client's ``poll_transmit``/``poll_event`` and the server's
``poll_output``; then jump the clock to the earliest of the next delivery, either side's
``poll_timeout`` and the media tick.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from appliance.client.peer import ClientEvent, ClientPeer
from appliance.proto.dtls import Certificate, DtlsConnection, Role
from appliance.proto.sctp import datachannel as dc
from appliance.proto.sdp import build_answer, parse_offer_untrusted
from appliance.transceiver.call import CallEvent, ServerCall, Timeout, Transmit
from appliance.transceiver.datachannels import DTLS_RECORD_OVERHEAD
from appliance.transceiver.passthrough import PassthroughStream

CLIENT = ("203.0.113.7", 53211)
PUBLIC = ("198.51.100.1", 3478)
RELAY = ("10.0.0.2", 4000)
WALL = 1_700_000_000.0  # the wall clock at virtual time 0
SERVER_SSRC = 0x5E77E7
_CERTS: dict[str, Certificate] = {}


def cert(name: str) -> Certificate:
    """Certificates are slow-ish to make: one per name for the whole run."""
    if name not in _CERTS:
        _CERTS[name] = Certificate.generate(WALL)
    return _CERTS[name]


@dataclass
class Netem:
    delay: float = 0.010
    jitter: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    hold: float = 0.030


@dataclass
class Delivery:
    at: float
    order: int
    to_server: bool
    data: bytes


@dataclass
class CallPair:
    seed: int = 0
    net: Netem = field(default_factory=Netem)
    passthrough: bool = True
    drop: Callable[[str, bytes], bool] | None = None
    #: ``audio=False, datachannel=True`` is a data-only call. With ``datachannel`` the
    #: server's ``sctp`` slot holds a real DataChannelEndpoint, connected when DTLS is up,
    #: and ``on_server_channel`` (if set) sees each of its events (an echo, say).
    audio: bool = True
    datachannel: bool = False
    on_server_channel: Callable[[float, object], None] | None = None
    offer_setup: str = "actpass"
    versions: frozenset[str] = frozenset({"1.2"})
    false_start: bool = False  # the client's (as DTLS 1.3 server: 0.5-RTT media)
    server_false_start: bool = False  # the transceiver's, as DTLS 1.2 client (server.py)
    relay: tuple[str, int] = RELAY  # the relay the client's datagrams come through
    dead: set[tuple[str, int]] = field(default_factory=set)  # relays whose input is lost

    def __post_init__(self) -> None:
        self.now = 0.0
        self.rng = random.Random(self.seed)
        self.client = ClientPeer(cert("client"), rng=random.Random(self.seed + 1),
                                 audio=self.audio, datachannel=self.datachannel,
                                 dtls_versions=self.versions, false_start=self.false_start)
        offer = parse_offer_untrusted(
            self.client.offer().replace("a=setup:actpass", f"a=setup:{self.offer_setup}"))
        self.server_ufrag, self.server_pwd = "srvufrag" + str(self.seed), "p" * 24
        self.answer = build_answer(
            offer, ice_ufrag=self.server_ufrag, ice_pwd=self.server_pwd,
            fingerprint=cert("server").fingerprint, candidates=[PUBLIC], ssrc=SERVER_SSRC,
            cname="pair", session_id=1, datachannel=self.datachannel)
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.server = ServerCall(
            answer=self.answer, local_ufrag=self.server_ufrag, local_pwd=self.server_pwd,
            dtls=DtlsConnection(Role.CLIENT if self.answer.dtls_client else Role.SERVER,
                                cert("server"), versions=self.versions,
                                false_start=self.server_false_start and self.answer.dtls_client,
                                remote_fingerprints=[str(f) for f in self.answer.transport.fingerprints]),
            ssrc=SERVER_SSRC, cname="pair", now=self.now, wall_offset=WALL,
            counters=self.counters, rng=random.Random(self.seed + 2))
        if self.passthrough and self.answer.plan is not None:
            self.server.media = PassthroughStream(self.server)
        self.server_channels: dc.DataChannelEndpoint | None = None
        if self.answer.application is not None:
            self.server_channels = dc.DataChannelEndpoint(
                dtls_client=False, remote_port=self.answer.application.sctp_port,
                mtu=self.server.dtls.mtu - DTLS_RECORD_OVERHEAD, rng=random.Random(self.seed + 3))
            self.server.sctp = self.server_channels
        self.server.mark_answer_sent(self.now)
        self.client_events: list[ClientEvent] = []
        self.server_events: list[CallEvent] = []
        self.sent: dict[str, int] = {"c2s": 0, "s2c": 0}
        self.dropped: dict[str, int] = {"c2s": 0, "s2c": 0}
        self.lost_to_dead: list[bytes] = []
        self._heap: list[tuple[float, int, bool, bytes]] = []
        self._order = itertools.count()
        # A periodic hook (the client's microphone, say): tick(now) every `tick_every` s.
        self.tick: Callable[[float], None] | None = None
        self.tick_every = 0.020
        self._next_tick: float | None = None
        self.client.accept_answer(self.answer.text, self.now)
        self._collect()

    # -- the network -------------------------------------------------------------------

    def _send(self, to_server: bool, data: bytes) -> None:
        direction = "c2s" if to_server else "s2c"
        self.sent[direction] += 1
        if self.drop is not None and self.drop(direction, data):
            self.dropped[direction] += 1
            return
        net, rng = self.net, self.rng
        if rng.random() < net.loss:
            self.dropped[direction] += 1
            return
        copies = 2 if rng.random() < net.duplicate else 1
        for _ in range(copies):
            at = self.now + net.delay + rng.random() * net.jitter
            if rng.random() < net.reorder:
                at += net.hold
            heapq.heappush(self._heap, (at, next(self._order), to_server, data))

    def _collect(self) -> None:
        """Drain both sides' transmits and events (the shell's half of rule 2)."""
        moved = True
        while moved:
            moved = False
            while (t := self.client.poll_transmit()) is not None:
                data, addr = t
                assert addr == PUBLIC  # the answer's one candidate
                self._send(True, data)
                moved = True
            while (ev := self.client.poll_event()) is not None:
                self.client_events.append(ev)
            while (out := self.server.poll_output()) is not None:
                if isinstance(out, Transmit):
                    payload, flow = out
                    assert flow.client == CLIENT and flow.public == PUBLIC
                    if flow.relay in self.dead:
                        self.lost_to_dead.append(payload)
                    else:
                        assert flow.relay == self.relay, (flow.relay, self.relay)
                        self._send(False, payload)
                elif not isinstance(out, Timeout):
                    self.server_events.append(out)
                    self._on_server_event(out)
                moved = True

    def _on_server_event(self, ev: CallEvent) -> None:
        """What the transceiver's session does with the data-channel endpoint's events
        (which the call passes out unwrapped): hand them to ``on_server_channel``; what it
        queues on the endpoint leaves at the next ``poll_output``."""
        if self.server_channels is not None and self.on_server_channel is not None:
            self.on_server_channel(self.now, ev)

    # -- the clock -----------------------------------------------------------------------

    def step(self, until: float) -> None:
        """Advance to the next thing that happens (no later than ``until``) and do it."""
        if self.tick is None:
            self._next_tick = None
        elif self._next_tick is None:
            self._next_tick = self.now  # a new hook: first tick now
        times = [until]
        if self._heap:
            times.append(self._heap[0][0])
        for t in (self.client.poll_timeout(), self.server.poll_timeout(), self._next_tick):
            if t is not None:
                times.append(max(t, self.now))
        self.now = max(self.now, min(times))
        now = self.now
        while self._heap and self._heap[0][0] <= now:
            _, _, to_server, data = heapq.heappop(self._heap)
            if to_server:
                self.server.handle_input(now, data, (CLIENT, PUBLIC, self.relay))
            else:
                self.client.handle_datagram(now, data, PUBLIC)
            self._collect()
        for side in (self.client, self.server):
            t = side.poll_timeout()
            if t is not None and t <= now:
                side.handle_timeout(now)
                self._collect()
        if self.tick is not None and self._next_tick is not None and now >= self._next_tick:
            self._next_tick += self.tick_every
            self.tick(now)
            self._collect()

    def run_until(self, done: Callable[[], bool], within: float) -> bool:
        """Step until ``done()`` or ``within`` virtual seconds pass; True if done."""
        deadline = self.now + within
        for _ in range(1_000_000):
            if done():
                return True
            if self.now >= deadline:
                return False
            self.step(deadline)
        raise AssertionError("the virtual clock stopped moving")

    def run_for(self, seconds: float) -> None:
        self.run_until(lambda: False, seconds)
