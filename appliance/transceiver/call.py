"""``ServerCall``: what one call *is* on the transceiver — ICE-lite, DTLS, SRTP, RTCP and
the flows the relay presented it on — as one sans-IO object (STYLE.md rule 14; the server
side of :class:`appliance.client.peer.ClientPeer`).

Why here and not in ``appliance/proto/``: it joins protocol cores that must not know each
other (rule 8: "the objects that join them live in ``transceiver/``") and speaks the
transceiver's own relay leg (PROXY v2 flows). Like ``proto/`` it does no I/O: no trio, no
clock (``now`` is passed in; NTP wall time is ``now + wall_offset``), no sockets, no logging
set-up. ``tests/transceiver/test_call_purity.py`` checks the imports.

Verbs (rule 2): ``handle_datagram(now, source, data)``, ``handle_timeout(now)``,
``poll_transmit()``, ``poll_event()``, ``poll_timeout()``. After any ``handle_*`` (or
:meth:`ServerCall.send_rtp`, :meth:`ServerCall.close`) the shell drains ``poll_transmit``
and ``poll_event`` and re-arms its timer from ``poll_timeout``.

Inside one call::

    datagram ─► RFC 7983 first byte
      STUN ─► IceLiteAgent   an authenticated check makes its source a Flow (≤ 8)
                             as DTLS client: a fresh one starts/releases our flight
      DTLS ─► DtlsConnection handshake → SRTP keyed from the exporter (RFC 5764 §4.2)
                             application data ─► sctp slot (RFC 8261) — None: dropped
      RTP  ─► SRTP unprotect → header fields → RtcpMonitor ─► media slot
      RTCP ─► SRTP unprotect → RtcpMonitor (RTT, remote jitter/loss)
    media slot ─► send_rtp() ─► RTP header (proto/rtp) → SRTP protect ─► poll_transmit
    sctp slot transmits ─► DTLS application data ─► poll_transmit

Two slots hold what a call carries beyond its transport; both are sans-IO objects the
shell plugs in:

* ``media`` (:class:`MediaStream`): the audio pipeline (``media.py``: jitter → decode →
  VAD → agent, and pacer → packetizer → encode back) or the passthrough rewriter
  (``passthrough.py``). RTP reaches it by a direct call, not an event per packet: the echo
  path is the hot path (docs/performance.md, "Transceiver") and an event object per packet
  is an allocation it does not need.
* ``sctp`` (:class:`SctpAssociation`): a data-channel association (dcSCTP-shaped verbs,
  ``appliance/proto/sctp``). None until data channels are negotiated in SDP; while None,
  DTLS application data is counted and dropped as before.

A transmit is ``(payload, flow)``: the client datagram and the :class:`Flow` (client
address, public relay address, relay internal address and its PROXY v2 header) to send
it on; the shell sends ``flow.header + payload`` to ``flow.relay``.

DTLS role (``dtls.role``, from the answer's ``a=setup``; docs/adr-dtls-active.md): as the
server we wait for the client's ClientHello, as before. As the *client* (we answered
``a=setup:active`` to an ``actpass`` offer) we send the ClientHello as soon as an
authenticated check has shown the client's address, and retransmit on the DTLS core's own
timers — but every flight we send on our own initiative (the first ClientHello, and each
timer retransmission while the call is setting up) is paid for by one fresh
MESSAGE-INTEGRITY-valid check from the address it goes to
(:class:`~.flight_budget.FlightBudget`). What
permits an ICE-lite agent to do this is cited at :meth:`ServerCall._client_check`.

Lifecycle (:class:`CallState`, transitions in ``_TRANSITIONS``): ``new`` (answer sent) →
``connecting`` (first authenticated STUN check) → ``connected`` (DTLS done, SRTP keyed; a
data-only session, ``answer.plan`` None, keys no SRTP and sends no RTCP) →
``ended`` (:class:`Ended` says why). Setup must finish within ``setup_timeout`` of the
answer; consent (RFC 7675) must keep coming every ``consent_timeout`` after.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from appliance.proto.dtls import (
    ApplicationData,
    ConnectionClosed,
    DtlsConnection,
    FalseStart,
    HandshakeComplete,
    Role,
)
from appliance.proto.errors import LocalProtocolError
from appliance.proto.ice import IceLiteAgent
from appliance.proto.ice.events import ConsentExpired, Nominated
from appliance.proto.mux import Kind, classify
from appliance.proto.proxy import encode_header, transport_of
from appliance.proto.rtp import (
    ReceptionStats,
    RtpError,
    parse_rtcp_untrusted,
    rtp_header,
    rtp_header_fields_untrusted,
)
from appliance.proto.sdp import Answer
from appliance.proto.srtp import SrtpError, SrtpSession
from appliance.session_info import TIMELINE_STEPS

from .flight_budget import FlightBudget
from .leg import MediaStream
from .rtcp import RTCP_INTERVAL, RtcpMonitor

Addr = tuple[str, int]
#: Where a datagram came from: (client address, public relay address it was sent to,
#: internal address of the relay that forwarded it) — the PROXY v2 header's two addresses
#: and the datagram's own source.
Source = tuple[Addr, Addr, Addr]

SETUP_TIMEOUT = 30.0  # no ICE (or no DTLS) within 30 s of the answer: reaped
CONSENT_TIMEOUT = 30.0  # RFC 7675 §5.1
MAX_CLIENT_ADDRS = 8  # addresses a call answers checks from (candidate pairs)


class CallState(enum.StrEnum):
    """A str enum: the session object's ``state`` is its value (session_info.STATES)."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    ENDED = "ended"


class _Input(enum.Enum):
    CHECK_OK = enum.auto()  # an authenticated STUN check
    DTLS_DONE = enum.auto()  # handshake complete, SRTP keyed
    END = enum.auto()


# (state, input) -> next state; a pair not in the table leaves the state as it is (a later
# check on a connecting or connected call, say). END from ENDED is not in it: ending twice
# is a no-op that :meth:`ServerCall.close` catches before it gets here.
_TRANSITIONS: dict[tuple[CallState, _Input], CallState] = {
    (CallState.NEW, _Input.CHECK_OK): CallState.CONNECTING,
    (CallState.CONNECTING, _Input.DTLS_DONE): CallState.CONNECTED,
    (CallState.NEW, _Input.END): CallState.ENDED,
    (CallState.CONNECTING, _Input.END): CallState.ENDED,
    (CallState.CONNECTED, _Input.END): CallState.ENDED,
}
_SETTING_UP = (CallState.NEW, CallState.CONNECTING)


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FlowNominated:
    """USE-CANDIDATE (or an ICE restart's first nomination) chose ``client``: media goes
    there from now on."""

    client: Addr


@dataclass(frozen=True, slots=True)
class Connected:
    """DTLS is done and SRTP keyed (``state`` is ``connected``); media may flow. A data-only
    session keys no SRTP: ``srtp_profile`` is None."""

    srtp_profile: str | None
    cipher_suite: str


@dataclass(frozen=True, slots=True)
class RemoteReport:
    """An RTCP report block about our stream: the client's view of it."""

    rtt: float | None  # seconds, None until an SR of ours was echoed
    jitter: float  # seconds
    loss: float  # fraction lost since its previous report, 0..1


@dataclass(frozen=True, slots=True)
class ReportSent:
    """We sent an RTCP report (every ~``rtcp_interval``): a good time to tell the agent the
    call's figures (the ``stats`` event)."""


@dataclass(frozen=True, slots=True)
class SctpEvent:
    """An event of the SCTP association in the ``sctp`` slot, passed on unchanged."""

    event: object


@dataclass(frozen=True, slots=True)
class Ended:
    reason: str  # "consent-expired", "dtls-closed", "ice-timeout", "deleted", …


@dataclass(frozen=True, slots=True)
class SendReady:
    """DTLS 1.2 client with False Start (RFC 7918): our Finished is out, keys are final, so
    DTLS application data (the SCTP INIT) may go now, half a round trip before the peer's
    Finished makes the call :class:`Connected` (docs/sctp.md "Setup latency")."""


CallEvent = (FlowNominated | Connected | SendReady | RemoteReport | ReportSent | SctpEvent
             | Ended)


# -- the slots --------------------------------------------------------------------------------


class SctpAssociation(Protocol):
    """What the ``sctp`` slot holds: an SCTP association over DTLS (RFC 8261), with the
    dcSCTP-shaped verbs of ``appliance/proto/sctp``. Each ``handle_input`` gets one DTLS
    application-data record (one SCTP packet, RFC 8261 §5); each ``poll_transmit`` result
    leaves as one record."""

    def handle_input(self, now: float, packet: bytes) -> None: ...

    def poll_transmit(self) -> bytes | None: ...

    def poll_event(self) -> object | None: ...

    def poll_timeout(self) -> float | None: ...

    def handle_timeout(self, now: float) -> None: ...


# -- flows ------------------------------------------------------------------------------------


class Flow:
    """One client address as the relay presented it: the PROXY header for replies and the
    internal address of the relay that last forwarded a packet of this flow."""

    __slots__ = ("client", "public", "relay", "header")

    def __init__(self, client: Addr, public: Addr, relay: Addr) -> None:
        self.client = client
        self.public = public
        self.relay = relay
        # An ICE-TCP client (a StreamAddr key) is answered with a STREAM header: the relay
        # frames those back onto its connection (DESIGN.md, RFC 6544).
        self.header = encode_header(client, public, b"", transport_of(client))


Transmit = tuple[bytes, Flow]


class ServerCall:
    """One call, server side. ``counters`` is the transceiver's shared dict of drop
    counters (``drop_unknown_flow``, ``drop_srtp``, ``drop_rtp_before_dtls``,
    ``drop_rtp_payload_type``, ``drop_kind``, ``flows_forgotten``)."""

    def __init__(
        self,
        *,
        answer: Answer,
        local_ufrag: str,
        local_pwd: str,
        dtls: DtlsConnection,
        ssrc: int,
        cname: str,
        now: float,
        wall_offset: float,
        counters: dict[str, int],
        setup_timeout: float = SETUP_TIMEOUT,
        consent_timeout: float = CONSENT_TIMEOUT,
        rtcp_interval: float = RTCP_INTERVAL,
        rng: random.Random | None = None,
    ) -> None:
        remote = answer.transport  # the audio's, or a data-only session's application
        self.answer = answer
        self.state = CallState.NEW
        self.end_reason: str | None = None
        self.local_ufrag = local_ufrag
        self.ice = IceLiteAgent(local_ufrag, local_pwd, remote.ice_ufrag, remote.ice_pwd,
                                consent_timeout=consent_timeout)
        self.dtls = dtls
        # As DTLS client (answer a=setup:active) our own flights are budgeted by checks.
        self.flight_budget = FlightBudget() if dtls.role is Role.CLIENT else None
        self._dtls_started = False
        self.srtp: SrtpSession | None = None
        self.srtp_profile: str | None = None
        self.cipher_suite: str | None = None
        self.ssrc = ssrc
        #: None for a data-only session: no RTP is ours then (every packet is dropped by
        #: payload type, no SRTP is keyed, no RTCP is sent).
        self.payload_type = answer.opus_pt
        self.audio = answer.plan is not None
        self.rtcp = RtcpMonitor(ssrc, cname, wall_offset=wall_offset, interval=rtcp_interval,
                                rng=rng)
        self.flows: dict[Addr, Flow] = {}
        self.media_flow: Flow | None = None
        self.media: MediaStream | None = None
        self.sctp: SctpAssociation | None = None
        #: Sees each SCTP packet as it goes to DTLS, while set (the data channels' timeline).
        self.sctp_tap: Callable[[float, bytes], None] | None = None
        self.packets_in = self.packets_out = self.bytes_in = self.bytes_out = 0
        self._counters = counters
        self._t0 = now
        self._setup_deadline = now + setup_timeout
        self._setup_timeout = setup_timeout
        self.timeline: dict[str, float | None] = dict.fromkeys(TIMELINE_STEPS)
        self.timeline["offer_received"] = 0.0
        self._tx: deque[Transmit] = deque()
        self._events: deque[CallEvent] = deque()

    # -- small helpers -----------------------------------------------------------------

    def _fire(self, inp: _Input) -> None:
        self.state = _TRANSITIONS.get((self.state, inp), self.state)

    def _mark(self, step: str, now: float) -> None:
        if self.timeline[step] is None:
            self.timeline[step] = round((now - self._t0) * 1000, 2)

    def mark(self, step: str, now: float) -> None:
        """A step the shell sees (data channels' SCTP milestones), first time only; the
        step must be one of the timeline's keys."""
        self._mark(step, now)

    def mark_answer_sent(self, now: float) -> None:
        """The answer is on its way: the setup deadline counts from now."""
        self._setup_deadline = now + self._setup_timeout
        self._mark("answer_sent", now)

    # -- the verbs -----------------------------------------------------------------------

    def handle_datagram(self, now: float, source: Source, data: bytes) -> None:
        """One client datagram (PROXY header already removed). The per-kind methods below
        are what this dispatches to; the transceiver's dispatcher, which classifies anyway
        to route, calls them directly."""
        client, public, relay = source
        kind = classify(data)
        if kind is Kind.STUN:
            self.handle_stun(now, data, client, public, relay)
        elif kind is Kind.RTP:
            self.handle_rtp(now, data, client, relay)
        elif kind is Kind.DTLS:
            self.handle_dtls(now, data, client, relay)
        elif kind is Kind.RTCP:
            self.handle_rtcp(now, data, client, relay)
        else:
            self._counters["drop_kind"] += 1

    def poll_transmit(self) -> Transmit | None:
        return self._tx.popleft() if self._tx else None

    def poll_event(self) -> CallEvent | None:
        return self._events.popleft() if self._events else None

    def poll_timeout(self) -> float | None:
        if self.state is CallState.ENDED:
            return None
        best = self._setup_deadline if self.state in _SETTING_UP else None
        for t in (self.ice.poll_timeout(), self.dtls.poll_timeout(), self.rtcp.next_report,
                  self.media.poll_timeout() if self.media is not None else None,
                  self.sctp.poll_timeout() if self.sctp is not None else None):
            if t is not None and (best is None or t < best):
                best = t
        return best

    def handle_timeout(self, now: float) -> None:
        if self.state is CallState.ENDED:
            return
        if self.state in _SETTING_UP and now >= self._setup_deadline:
            self.close("ice-timeout" if self.state is CallState.NEW else "setup-timeout")
            return
        self.ice.handle_timeout(now)
        self._drain_ice(now)
        if self.end_reason is not None:  # consent expired
            return
        self.dtls.handle_timeout(now)
        if self.flight_budget is not None and self.state in _SETTING_UP:
            self._own_flight(now)  # a retransmission: paid for by a check, or held
        self._drain_dtls(now)
        if self.end_reason is not None:  # retransmissions ran out
            return
        media = self.media
        if media is not None:
            deadline = media.poll_timeout()
            if deadline is not None and now >= deadline:
                media.handle_timeout(now)
        sctp = self.sctp
        if sctp is not None:
            deadline = sctp.poll_timeout()
            if deadline is not None and now >= deadline:
                sctp.handle_timeout(now)
                self._drain_sctp(now)
        if self.rtcp.due(now):
            self._send_rtcp(now)

    # -- STUN ------------------------------------------------------------------------------

    def _flow(self, client: Addr, public: Addr, relay: Addr) -> Flow:
        flow = self.flows.get(client)
        if flow is None:
            flow = Flow(client, public, relay)
        elif flow.relay != relay or flow.public != public:
            # The relay that forwards this flow changed (relay restart, another worker):
            # reply through the internal address the flow's last packet came from.
            if flow.public != public:
                flow = Flow(client, public, relay)
            else:
                flow.relay = relay
        return flow

    def handle_stun(self, now: float, data: bytes, client: Addr, public: Addr,
                    relay: Addr) -> None:
        ice = self.ice
        before = ice.checks_ok
        ice.handle_datagram(now, data, client)
        flow = self.flows.get(client)
        if ice.checks_ok != before:
            # Authenticated: this address may now carry DTLS/RTP for this call.
            if self.state is CallState.NEW:
                self._fire(_Input.CHECK_OK)
                self._mark("first_stun", now)
            flow = self._flow(client, public, relay)
            if client not in self.flows and len(self.flows) >= MAX_CLIENT_ADDRS:
                oldest = next(iter(self.flows))
                if self.media_flow is None or oldest != self.media_flow.client:
                    self.flows.pop(oldest, None)
                    self._counters["flows_forgotten"] += 1
            self.flows[client] = flow
        self._drain_ice(now)
        # 401s and other answers go to the requester even if it has no flow yet.
        while (out := ice.poll_transmit()) is not None:
            data_out, addr = out
            f = self.flows.get(addr) or (flow if flow and flow.client == addr else None)
            if f is None:
                f = Flow(addr, public, relay)
            self._tx.append((data_out, f))
        if (self.flight_budget is not None and ice.checks_ok != before and flow is not None
                and self.state in _SETTING_UP):
            # After the check's answer, so the client sees its check succeed first.
            self._client_check(now, data[8:20], flow)

    def _drain_ice(self, now: float) -> None:
        while (ev := self.ice.poll_event()) is not None:
            if isinstance(ev, Nominated):
                flow = self.flows.get(ev.addr)
                if flow is not None:
                    self.media_flow = flow
                self._mark("ice_nominated", now)
                self._events.append(FlowNominated(ev.addr))
            elif isinstance(ev, ConsentExpired):
                self.close("consent-expired")
            # CheckReceived, AuthFailure: counted by the agent; nothing to do here.

    def restart_ice(self, local_ufrag: str, local_pwd: str, remote_ufrag: str | None,
                    remote_pwd: str | None) -> None:
        """RFC 8445 §9: new credentials both ways; media keeps flowing on the old pair until
        the client nominates with the new ones."""
        if self.state is CallState.ENDED:
            raise LocalProtocolError("cannot restart ICE on an ended call")
        self.ice.restart(local_ufrag, local_pwd, remote_ufrag, remote_pwd)
        self.local_ufrag = local_ufrag

    # -- DTLS (and what runs over it) -----------------------------------------------------

    def _client_check(self, now: float, tid: bytes, flow: Flow) -> None:
        """A MESSAGE-INTEGRITY-valid check (``tid``: its transaction id) from ``flow`` while
        we are the DTLS client and setting up: start the handshake, or release a held flight.

        Why an ICE-lite agent may send here, before any nomination:

        * RFC 8445 §2.5 / §6.1.1: a lite agent sends no checks and is always controlled;
          the pairs it may use are those the full agent's checks have validated.
        * RFC 8445 §7.3.1.4 and §12.1.1 (procedures for lite implementations): a valid
          check received makes its pair valid for the lite agent, which may then send data
          on it; data before nomination is allowed on any valid pair (§12.1), and the
          DTLS handshake is such data.
        * RFC 8839 §4.2.3: the ICE role (we are controlled) says nothing about the DTLS
          role; ``a=setup`` decides it. RFC 8842 §5.3: the answerer picks ``active`` or
          ``passive`` for an ``actpass`` offer, and the ``active`` endpoint initiates the
          DTLS handshake (RFC 8842 §5 / RFC 5763 §5: once ICE has a usable pair).
        """
        budget = self.flight_budget
        assert budget is not None
        if not budget.earn(flow.client, tid):
            return  # a retransmitted or replayed check: no new credit
        if self.ice.selected is None:
            # Before a nomination our flights follow the address that last proved the
            # password with a fresh check; afterwards the nominated one (_drain_ice).
            self.media_flow = flow
        if not self._dtls_started:
            self._dtls_started = True
            self.dtls.start(now)
            self._own_flight(now)
            self._drain_dtls(now)
        elif (budget.held is not None and self.media_flow is not None
              and self.media_flow.client == flow.client):
            held, budget.held = budget.held, None
            if budget.spend(flow.client, now):
                self._tx.extend((d, flow) for d in held)
            else:
                budget.held = held

    def _own_flight(self, now: float) -> None:
        """What the DTLS core queued on its own (start, a timer retransmission): out to the
        media flow if the budget pays for it, else held for the next fresh check."""
        budget = self.flight_budget
        assert budget is not None
        flight: list[bytes] = []
        while (out := self.dtls.poll_transmit()) is not None:
            flight.append(out)
        flow = self.media_flow
        if not flight or flow is None:
            return
        if budget.spend(flow.client, now):
            budget.held = None
            self._tx.extend((d, flow) for d in flight)
        else:
            budget.held = flight  # the newest retransmission supersedes an older one
            budget.held_count += 1

    def handle_dtls(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        if self.media_flow is None:
            self.media_flow = flow  # DTLS may start before USE-CANDIDATE arrives
        self.dtls.handle_datagram(now, data)
        self._drain_dtls(now)

    def _drain_dtls(self, now: float) -> None:
        dtls = self.dtls
        flow = self.media_flow
        while (out := dtls.poll_transmit()) is not None:
            if flow is not None:
                self._tx.append((out, flow))
        while (ev := dtls.poll_event()) is not None:
            if isinstance(ev, ApplicationData):
                sctp = self.sctp
                if sctp is None:  # no data channel negotiated: nobody to give it to
                    continue
                sctp.handle_input(now, ev.data)
                self._drain_sctp(now)
            elif isinstance(ev, HandshakeComplete):
                self._on_handshake(now, ev)
            elif isinstance(ev, FalseStart) and self.dtls.role is Role.CLIENT:
                self._events.append(SendReady())
            elif isinstance(ev, ConnectionClosed):
                self.close("dtls-closed" if ev.by_peer else f"dtls-failed: {ev.reason}")

    def _on_handshake(self, now: float, ev: HandshakeComplete) -> None:
        profile = ev.srtp_profile
        self.cipher_suite = ev.cipher_suite.name
        if not self.audio:
            # A data-only session (RFC 8841 without audio): DTLS carries SCTP alone. The
            # peer may still have offered use_srtp (browsers do); nothing is keyed from it,
            # so no RTP or RTCP is accepted or sent, and no RTCP timer runs.
            self._fire(_Input.DTLS_DONE)
            self._mark("dtls_done", now)
            self._events.append(Connected(None, ev.cipher_suite.name))
            return
        if profile is None:
            self.close("dtls-failed: no SRTP profile negotiated")
            return
        self.srtp = SrtpSession.from_exporter(self.dtls.export_keying_material, profile,
                                              self.dtls.role)
        self.srtp_profile = profile.name
        self._fire(_Input.DTLS_DONE)
        self._mark("dtls_done", now)
        self.rtcp.start(now)
        self._events.append(Connected(profile.name, ev.cipher_suite.name))

    def _drain_sctp(self, now: float) -> None:
        """The association's packets out as DTLS records, its events out as ours."""
        sctp = self.sctp
        if sctp is None:
            return
        dtls, flow = self.dtls, self.media_flow
        while (packet := sctp.poll_transmit()) is not None:
            if (tap := self.sctp_tap) is not None:
                tap(now, packet)
            dtls.send_application_data(packet)
        while (out := dtls.poll_transmit()) is not None:
            if flow is not None:
                self._tx.append((out, flow))
        while (ev := sctp.poll_event()) is not None:
            self._events.append(SctpEvent(ev))

    def poll_sctp(self, now: float) -> None:
        """Send what the association queued outside a ``handle_*`` (a message the agent
        sent): the shell calls this after feeding the association."""
        self._drain_sctp(now)

    # -- RTP / RTCP in ---------------------------------------------------------------------

    def handle_rtp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        try:
            plain = srtp.unprotect_untrusted(data)
            pt, seq, ts, ssrc, marker, off, end = rtp_header_fields_untrusted(plain)
        except (SrtpError, RtpError):
            self._counters["drop_srtp"] += 1
            return
        self.packets_in += 1
        self.bytes_in += len(data)
        if pt != self.payload_type:
            self._counters["drop_rtp_payload_type"] += 1  # telephone-event, CN: ignored
            return
        # RtcpMonitor.on_rtp, inlined: one call fewer per packet on the echo path.
        rx = self.rtcp.rx
        if rx is None or rx.ssrc != ssrc:  # first packet, or the client changed SSRC
            rx = self.rtcp.rx = ReceptionStats(ssrc)
        rx.update(seq, ts, now)
        if self.timeline["first_rtp_in"] is None:
            self._mark("first_rtp_in", now)
        media = self.media
        if media is not None:
            media.handle_rtp(now, plain, ssrc, seq, ts, marker, off, end)

    def handle_rtcp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        flow.relay = relay
        try:
            packets = parse_rtcp_untrusted(srtp.unprotect_rtcp_untrusted(data))
        except (SrtpError, RtpError):
            self._counters["drop_srtp"] += 1
            return
        rtcp = self.rtcp
        if rtcp.on_rtcp(now, packets):
            assert rtcp.remote_jitter is not None and rtcp.remote_loss is not None
            self._events.append(RemoteReport(rtcp.rtt, rtcp.remote_jitter, rtcp.remote_loss))

    # -- out ---------------------------------------------------------------------------------

    def can_send(self) -> bool:
        """:class:`~.leg.MediaLeg`: SRTP keyed, a media flow known, not ended."""
        return (self.srtp is not None and self.media_flow is not None
                and self.state is not CallState.ENDED)

    def send_rtp(self, now: float, seq: int, ts: int, marker: bool, payload: bytes) -> None:
        """One RTP packet of our stream (our SSRC and payload type, a plain 12-byte header)
        out on the media flow. Before SRTP is keyed, or with no flow, nothing is sent."""
        srtp = self.srtp
        flow = self.media_flow
        pt = self.payload_type
        if srtp is None or flow is None or pt is None or self.state is CallState.ENDED:
            return
        packet = srtp.protect(rtp_header(pt, seq, ts, self.ssrc, marker) + payload)
        self.rtcp.tx.on_packet(len(payload), ts, now)
        self.packets_out += 1
        self.bytes_out += len(packet)
        if self.packets_out == 1:
            self._mark("first_rtp_out", now)
        self._tx.append((packet, flow))

    def _send_rtcp(self, now: float) -> None:
        srtp = self.srtp
        plain = self.rtcp.report(now)
        flow = self.media_flow
        if srtp is not None and flow is not None:
            self._tx.append((srtp.protect_rtcp(plain), flow))
        self._events.append(ReportSent())

    def close(self, reason: str) -> None:
        """End the call (idempotent): DTLS close_notify queued, ICE closed, :class:`Ended`."""
        if self.state is CallState.ENDED:
            return
        self._fire(_Input.END)
        self.end_reason = reason
        flow = self.media_flow
        try:
            self.dtls.close()
            while (out := self.dtls.poll_transmit()) is not None:
                if flow is not None:
                    self._tx.append((out, flow))
        finally:  # a broken DTLS state must not stop the teardown (the shell logs it)
            self.ice.close()
            self._events.append(Ended(reason))
