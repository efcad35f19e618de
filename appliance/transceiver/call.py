"""``ServerCall``: what one call *is* on the transceiver — ICE-lite, DTLS, SRTP, RTCP and
the flows the relay presented it on — as one sans-IO object (STYLE.md rule 14; the server
side of :class:`appliance.client.peer.ClientPeer`).

Why here and not in ``appliance/proto/``: it joins protocol cores that must not know each
other (rule 8: "the objects that join them live in ``transceiver/``") and speaks the
transceiver's own relay leg (PROXY v2 flows). Like ``proto/`` it does no I/O: no trio, no
clock (``now`` is passed in; NTP wall time is ``now + wall_offset``), no sockets, no logging
set-up. ``tests/transceiver/test_call_purity.py`` checks the imports.

Verbs (rule 2), str0m's ``Rtc`` shape: one input, one output.
``handle_input(now, data, source)`` takes every client datagram, whatever its kind;
``handle_timeout(now)`` runs the timers; ``poll_output()`` yields, until None,
:class:`Transmit` (a datagram for a flow), the call's events (and the data-channel
endpoint's, unwrapped) and a :class:`Timeout` when the earliest deadline may have moved;
``poll_timeout()`` says when ``handle_timeout`` is due. User operations are methods:
:meth:`ServerCall.send_rtp` (the :class:`~.leg.MediaLeg` the media slot is given),
:meth:`ServerCall.close`, :meth:`ServerCall.restart_ice`; a channel message is queued on
the ``sctp`` slot and leaves at the next ``poll_output``. After any of them the shell
drains ``poll_output``.

Inside one call::

    datagram ─► RFC 7983 first byte
      STUN ─► IceLiteAgent   an authenticated check makes its source a Flow (≤ 8)
                             as DTLS client: a fresh one starts/releases our flight
      DTLS ─► admission (a ClientHello while waiting for one: cookies under load?)
             DtlsConnection handshake → SRTP keyed from the exporter (RFC 5764 §4.2)
                             application data ─► sctp slot (RFC 8261) — None: dropped
      RTP  ─► SRTP unprotect → header fields → RtcpMonitor ─► media slot
      RTCP ─► SRTP unprotect → RtcpMonitor (RTT, remote jitter/loss)
    media slot ─► send_rtp() ─► RTP header (proto/rtp) → SRTP protect ─► poll_output
    sctp slot (polled in poll_output) ─► DTLS application data ─► poll_output
                                      ─► its events ─► poll_output, unwrapped

Two slots hold what a call carries beyond its transport; both are sans-IO objects the
shell plugs in:

* ``media`` (:class:`~.leg.MediaStream`): the audio pipeline (``media.py``: jitter →
  decode → VAD → agent, and pacer → packetizer → encode back) or the passthrough rewriter
  (``passthrough.py``), given the call as its :class:`~.leg.MediaLeg` (``send_rtp``,
  ``can_send``, ``close``: the leg.py seam, so the pipeline does not know it is WebRTC).
  RTP reaches it by a direct call, not an event per packet: the echo path is the hot path
  (docs/performance.md, "Transceiver") and an event object per packet is an allocation it
  does not need.
* ``sctp`` (:class:`SctpAssociation`): a data-channel endpoint (dcSCTP-shaped verbs,
  ``appliance/proto/sctp``). None until data channels are negotiated in SDP; while None,
  DTLS application data is counted and dropped as before. The call connects it when DTLS
  is up and polls it; it never calls back into the call.

A :class:`Transmit` is ``(payload, flow)``: the client datagram and the :class:`Flow`
(client address, public relay address, relay internal address and its PROXY v2 header) to
send it on; the shell sends ``flow.header + payload`` to ``flow.relay`` — and the call, as
it hands a Transmit out, keeps the payload in ``flow.unconfirmed`` until a datagram of the
flow has come back through that relay and a few newer ones were sent (:meth:`Flow.heard`).

When the relay that forwards a flow changes (a relay worker died and its successor, or
another worker, now carries the client: issue 41 item 2), what we sent to the old one
since we last heard from it (and just before) may have died with it: the echo of the client's last packets, paced
frames, sent in the tens of ms before the successor's first word reached us. Lost, they are
holes in our RTP sequence, and a receiver whose jitter buffer waits for every sequence
number turns one hole into a long silence (aiortc's audio buffer: 16 packets, so ~320 ms,
the value issue 41 saw repeat). So a move re-sends them through the new relay first
(:meth:`Flow.move`: at most :data:`UNCONFIRMED`, oldest first); a receiver that did get one
drops the copy (SRTP and DTLS replay protection, RFC 3711 §3.3.2, RFC 6347 §4.1.2.6).

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
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from appliance.proto.dtls import (
    ApplicationData,
    ConnectionClosed,
    DtlsConnection,
    FalseStart,
    HandshakeComplete,
    Role,
)
from appliance.proto.dtls import State as DtlsState
from appliance.proto.dtls.record import is_client_hello
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
from appliance.proto.sctp import Connected as SctpConnected
from appliance.proto.sctp.datachannel import EndpointEvent, carries_channel_message
from appliance.proto.sdp import Answer
from appliance.proto.srtp import SrtpError, SrtpSession
from appliance.session_info import TIMELINE_STEPS

from .admission import DtlsGate
from .flight_budget import FlightBudget
from .leg import MediaStream
from .rtcp import RTCP_INTERVAL, RemoteReport, ReportSent, RtcpMonitor

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
class Ended:
    reason: str  # "consent-expired", "dtls-closed", "ice-timeout", "deleted", …


@dataclass(frozen=True, slots=True)
class SendReady:
    """DTLS 1.2 client with False Start (RFC 7918): our Finished is out, keys are final, so
    DTLS application data (the SCTP INIT) may go now, half a round trip before the peer's
    Finished makes the call :class:`Connected` (docs/sctp.md "Setup latency")."""


#: The call's own events and, passed out unwrapped, the data-channel endpoint's (typed
#: frozen events of ``appliance.proto.sctp``: channel opened/message/closed/buffered-low,
#: association connected/closed).
CallEvent = (FlowNominated | Connected | SendReady | RemoteReport | ReportSent | Ended
             | EndpointEvent)


@dataclass(frozen=True, slots=True)
class Timeout:
    """The call's earliest deadline may have moved earlier: ``handle_timeout`` is due at
    ``at`` (None: no timer). Yielded once at the end of a drain that changed it."""

    at: float | None


# -- the slots --------------------------------------------------------------------------------


class SctpAssociation(Protocol):
    """What the ``sctp`` slot holds: an SCTP association over DTLS (RFC 8261), with the
    dcSCTP-shaped verbs of ``appliance/proto/sctp`` (a ``DataChannelEndpoint``). Each
    ``handle_input`` gets one DTLS application-data record (one SCTP packet, RFC 8261 §5);
    each ``poll_transmit`` result leaves as one record. The call connects it once DTLS is
    up and polls it in :meth:`ServerCall.poll_output`, so whatever the shell queued on it
    (an agent's message) goes out at the next drain: the slot never calls back."""

    def connect(self, now: float) -> None: ...

    def handle_input(self, now: float, packet: bytes) -> None: ...

    def poll_transmit(self) -> bytes | None: ...

    def poll_event(self) -> EndpointEvent | None: ...

    def poll_timeout(self) -> float | None: ...

    def handle_timeout(self, now: float) -> None: ...


# -- flows ------------------------------------------------------------------------------------


#: Datagrams a flow keeps that were sent since it last heard from its relay (module
#: docstring): 320 ms of 20 ms audio, more than a relay takeover's bound (250 ms).
UNCONFIRMED = 16
#: ... and the newest it keeps even then: a relay heard from a moment ago may still hold
#: what we sent it in its socket (a worker killed mid-batch, or descheduled on a loaded
#: host: with "everything before the last datagram heard" 2 of 320 call-events still lost
#: one, issue 41 item 2). 60 ms of 20 ms audio; the copies cost a receiver a replay drop.
CONFIRM_LAG = 3


class Flow:
    """One client address as the relay presented it: the PROXY header for replies, the
    internal address of the relay that last forwarded a packet of this flow, and what was
    sent through that relay since (module docstring)."""

    __slots__ = ("client", "public", "relay", "header", "unconfirmed")

    def __init__(self, client: Addr, public: Addr, relay: Addr) -> None:
        self.client = client
        self.public = public
        self.relay = relay
        # An ICE-TCP client (a StreamAddr key) is answered with a STREAM header: the relay
        # frames those back onto its connection (DESIGN.md, RFC 6544).
        self.header = encode_header(client, public, b"", transport_of(client))
        #: payloads handed out (poll_output) for ``relay`` after the last datagram heard
        #: through it, and the newest CONFIRM_LAG before
        self.unconfirmed: deque[bytes] = deque(maxlen=UNCONFIRMED)

    def heard(self) -> None:
        """A datagram of this flow came through its relay: what was sent before went
        through a relay that was alive, but for the newest :data:`CONFIRM_LAG`."""
        unconfirmed = self.unconfirmed
        while len(unconfirmed) > CONFIRM_LAG:
            unconfirmed.popleft()

    def move(self, relay: Addr) -> list[bytes]:
        """Reply through ``relay`` from now on; the payloads sent since the old relay was
        last heard from, oldest first, to send again through the new one (they may have
        been lost with the old: module docstring)."""
        self.relay = relay
        again = list(self.unconfirmed)
        self.unconfirmed.clear()
        return again


class Transmit(NamedTuple):
    """One datagram out: ``payload`` to the client over ``flow``; the shell sends
    ``flow.header + payload`` to ``flow.relay``. A (frozen) named tuple, built with
    ``tuple.__new__`` on the echo path: one allocation per packet, as before."""

    payload: bytes
    flow: Flow


_tuple_new = tuple.__new__

#: What :meth:`ServerCall.poll_output` yields.
CallOutput = Transmit | Timeout | CallEvent

#: Timeline steps a call with data channels adds (ms after the offer, like the others):
#: our INIT out, the association up, and the first packet with a channel message of ours
#: handed to DTLS (with a pre-negotiated channel that is our COOKIE ECHO's packet, before
#: ``sctp_established``; docs/sctp.md "Setup latency").
SCTP_STEPS = ("sctp_init_sent", "sctp_established", "first_channel_message_out")
_DTLS_DONE = (DtlsState.ESTABLISHED, DtlsState.CLOSED)




class ServerCall:
    """One call, server side: ICE-lite, DTLS (and its admission), SRTP/SRTCP, RTCP and the
    SCTP slot behind one input and one output (str0m's ``Rtc`` shape):

    * ``handle_input(now, data, source)``: every client datagram, whatever its kind (the
      RFC 7983 demux is here); ``handle_timeout(now)`` at ``poll_timeout()``.
    * ``poll_output()`` until None: :class:`Transmit`, the call's events (and the
      data-channel endpoint's, unwrapped), and a :class:`Timeout` when its deadline moved.
    * operations: :meth:`send_rtp` (the :class:`~.leg.MediaLeg` the media slot is given),
      :meth:`close`, :meth:`restart_ice`; channel messages are queued on the ``sctp`` slot
      by the shell and leave at the next ``poll_output``.

    ``counters`` is the transceiver's shared dict of drop counters (``drop_unknown_flow``,
    ``drop_srtp``, ``drop_rtp_before_dtls``, ``drop_rtp_payload_type``, ``drop_kind``,
    ``flows_forgotten``, and with a ``gate`` the ``dtls_*`` admission counters)."""

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
        gate: DtlsGate | None = None,
    ) -> None:
        remote = answer.transport  # the audio's, or a data-only session's application
        self.answer = answer
        self.state = CallState.NEW
        self.end_reason: str | None = None
        self.local_ufrag = local_ufrag
        self.ice = IceLiteAgent(local_ufrag, local_pwd, remote.ice_ufrag, remote.ice_pwd,
                                consent_timeout=consent_timeout)
        self.dtls = dtls
        self._gate = gate
        # As DTLS client (answer a=setup:active) our own flights are budgeted by checks.
        self.flight_budget = FlightBudget() if dtls.role is Role.CLIENT else None
        self._dtls_started = False
        self.srtp: SrtpSession | None = None
        self.srtp_profile: str | None = None
        self.cipher_suite: str | None = None
        self.ssrc = ssrc
        #: The RTP payload type of our stream and of what the media slot gets (MediaLeg).
        #: None for a data-only session: no RTP is ours then (every packet is dropped by
        #: payload type, no SRTP is keyed, no RTCP is sent).
        self.payload_type = answer.opus_pt
        self.audio = answer.plan is not None
        # at the negotiated codec's RTP clock: Opus 48000, PCMU/PCMA 8000 (an offer with no
        # Opus), so jitter and SR timestamps are in the stream's own units
        self.rtcp = RtcpMonitor(ssrc, cname, wall_offset=wall_offset, interval=rtcp_interval,
                                rng=rng, clock_rate=answer.plan.opus.clock_rate
                                if answer.plan is not None else 48_000)
        self.flows: dict[Addr, Flow] = {}
        self.media_flow: Flow | None = None
        self.media: MediaStream | None = None
        self.sctp: SctpAssociation | None = None
        self._sctp_tapping = True  # until our first channel message is out (the timeline)
        self.packets_in = self.packets_out = self.bytes_in = self.bytes_out = 0
        self._counters = counters
        self._t0 = now
        self._setup_deadline = now + setup_timeout
        self._setup_timeout = setup_timeout
        self.timeline: dict[str, float | None] = dict.fromkeys(TIMELINE_STEPS)
        self.timeline["offer_received"] = 0.0
        if answer.application is not None:
            for step in SCTP_STEPS:
                self.timeline.setdefault(step, None)
        self._out: deque[CallOutput] = deque()
        #: The deadline last yielded as a Timeout (inf: none yet), and whether it may have
        #: moved since (recomputed at the end of the drain).
        self._told = float("inf")
        self._timer_dirty = True

    # -- small helpers -----------------------------------------------------------------

    def _fire(self, inp: _Input) -> None:
        self.state = _TRANSITIONS.get((self.state, inp), self.state)

    def _mark(self, step: str, now: float) -> None:
        if step in self.timeline and self.timeline[step] is None:
            self.timeline[step] = round((now - self._t0) * 1000, 2)

    def mark_answer_sent(self, now: float) -> None:
        """The answer is on its way: the setup deadline counts from now."""
        self._setup_deadline = now + self._setup_timeout
        self._mark("answer_sent", now)
        self._timer_dirty = True

    # -- the verbs -----------------------------------------------------------------------

    def handle_input(self, now: float, data: bytes, source: Source) -> None:
        """One client datagram (PROXY header already removed) and where it came from."""
        # RTP first, tested inline (the echo path, docs/performance.md): RFC 7983's
        # 128..191 and, RFC 5761 §4, a second byte that is no RTCP packet type.
        if len(data) > 1 and 127 < data[0] < 192 and not 191 < data[1] < 224:
            self._rtp(now, data, source[0], source[2])
            return
        kind = classify(data)
        self._timer_dirty = True
        if kind is Kind.STUN:
            self._stun(now, data, source)
        elif kind is Kind.DTLS:
            self._dtls(now, data, source[0], source[2])
        elif kind is Kind.RTCP:
            self._rtcp(now, data, source[0], source[2])
        else:
            self._counters["drop_kind"] += 1

    def poll_output(self) -> CallOutput | None:
        """The next output, or None once everything is out. What the ``sctp`` slot queued
        since (the shell's channel operations) is pulled through DTLS first; the last
        output of a drain that may have moved the deadline is a :class:`Timeout`."""
        out = self._out
        if out or (self.sctp is not None and self.state is not CallState.ENDED
                   and self._pull_sctp()):
            first = out.popleft()
            if type(first) is Transmit:
                # The shell sends it now, through flow.relay: kept until that relay is
                # heard from (module docstring).
                first[1].unconfirmed.append(first[0])
            return first
        if self._timer_dirty:
            self._timer_dirty = False
            at = self.poll_timeout()
            self._told = float("inf") if at is None else at
            return Timeout(at)
        return None

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
        self._timer_dirty = True
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
                self._now = now
                self._pull_sctp()
        if self.rtcp.due(now):
            self._send_rtcp(now)

    # -- STUN ------------------------------------------------------------------------------

    def _flow(self, client: Addr, public: Addr, relay: Addr) -> Flow:
        flow = self.flows.get(client)
        if flow is None or flow.public != public:
            flow = Flow(client, public, relay)
        elif flow.relay != relay:
            # The relay that forwards this flow changed (relay restart, another worker):
            # reply through the internal address the flow's last packet came from, and
            # send again what may have been lost with the old one (module docstring).
            self._resend(flow, flow.move(relay))
        else:
            flow.heard()
        return flow

    def _resend(self, flow: Flow, payloads: list[bytes]) -> None:
        """What the flow sent through a relay it has just left, again through its new one
        (:meth:`Flow.move`), ahead of anything else of its own."""
        for payload in payloads:
            self._out.append(Transmit(payload, flow))

    def _stun(self, now: float, data: bytes, source: Source) -> None:
        client, public, relay = source
        ice = self.ice
        before = ice.checks_ok
        ice.handle_input(now, data, client)
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
            self._out.append(Transmit(data_out, f))
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
                self._out.append(FlowNominated(ev.addr))
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
        self._timer_dirty = True

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
                self._out.extend(Transmit(d, flow) for d in held)
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
            self._out.extend(Transmit(d, flow) for d in flight)
        else:
            budget.held = flight  # the newest retransmission supersedes an older one
            budget.held_count += 1

    def _dtls(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        if flow.relay != relay:  # moved (module docstring)
            self._resend(flow, flow.move(relay))
        else:
            flow.heard()
        if self.media_flow is None:
            self.media_flow = flow  # DTLS may start before USE-CANDIDATE arrives
        dtls, gate = self.dtls, self._gate
        if gate is None:
            dtls.handle_datagram(now, data)
        elif dtls.awaiting_client_hello and is_client_hello(data):
            # DTLS admission (admission.py): cookie mode decided per ClientHello, the cookie
            # bound to the address the ClientHello came from.
            c = self._counters
            c["dtls_client_hellos"] += 1
            cookies = gate.policy.client_hello(now)
            dtls.require_cookies(gate.cookie_secret if cookies else None,
                                 f"{client[0]}:{client[1]}".encode())
            hvr = dtls.counters.hello_verify_requests
            dtls.handle_datagram(now, data)
            c["dtls_hello_verify"] += dtls.counters.hello_verify_requests - hvr
            if not dtls.awaiting_client_hello and self.state is not CallState.ENDED:
                c["dtls_handshakes_started"] += 1
                gate.policy.started(self)
        else:
            dtls.handle_datagram(now, data)
            if dtls.state in _DTLS_DONE:
                gate.policy.finished(self)
        self._drain_dtls(now)

    def _drain_dtls(self, now: float) -> None:
        dtls = self.dtls
        flow = self.media_flow
        while (out := dtls.poll_transmit()) is not None:
            if flow is not None:
                self._out.append(Transmit(out, flow))
        while (ev := dtls.poll_event()) is not None:
            if isinstance(ev, ApplicationData):
                sctp = self.sctp
                if sctp is None:  # no data channel negotiated: nobody to give it to
                    continue
                sctp.handle_input(now, ev.data)
                self._now = now
                self._pull_sctp()
            elif isinstance(ev, HandshakeComplete):
                self._on_handshake(now, ev)
            elif isinstance(ev, FalseStart) and self.dtls.role is Role.CLIENT:
                self._out.append(SendReady())
                self._connect_sctp(now)
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
            self._out.append(Connected(None, ev.cipher_suite.name))
            self._connect_sctp(now)
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
        self._out.append(Connected(profile.name, ev.cipher_suite.name))
        self._connect_sctp(now)

    # -- SCTP (the sctp slot, over DTLS application data) ----------------------------------

    #: The time of the input that is feeding the slot (its packets' timeline marks); the
    #: shell's operations on the slot between inputs are marked with the last one.
    _now = 0.0

    def _connect_sctp(self, now: float) -> None:
        """DTLS is up (or, as a False Start client, our keys are final): our INIT goes (the
        peer's may cross it; the association resolves both, RFC 9260 §5.2.1). Connected
        after SendReady connects again, which the association ignores."""
        sctp = self.sctp
        if sctp is None:
            return
        sctp.connect(now)
        self._mark("sctp_init_sent", now)
        self._now = now
        self._pull_sctp()

    def _pull_sctp(self) -> bool:
        """The slot's packets out as DTLS records, its events out as ours; True if any
        output was queued."""
        sctp = self.sctp
        assert sctp is not None
        out = self._out
        n = len(out)
        dtls, flow = self.dtls, self.media_flow
        sent = False
        while (packet := sctp.poll_transmit()) is not None:
            if self._sctp_tapping and carries_channel_message(packet):
                self._mark("first_channel_message_out", self._now)
                self._sctp_tapping = False  # marked once: no more looking at packets
            dtls.send_application_data(packet)
            sent = True
        if sent:
            self._timer_dirty = True  # SCTP's T3-rtx for what was sent
            while (rec := dtls.poll_transmit()) is not None:
                if flow is not None:
                    out.append(Transmit(rec, flow))
        while (ev := sctp.poll_event()) is not None:
            if isinstance(ev, SctpConnected):
                self._mark("sctp_established", self._now)
            out.append(ev)
        return len(out) != n

    # -- RTP / RTCP in ---------------------------------------------------------------------

    def _rtp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        if flow.relay != relay:  # moved (module docstring)
            self._resend(flow, flow.move(relay))
        else:
            flow.heard()
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
            rx = self.rtcp.rx = ReceptionStats(ssrc, clock_rate=self.rtcp.clock_rate)
        rx.update(seq, ts, now)
        if self.timeline["first_rtp_in"] is None:
            self._mark("first_rtp_in", now)
        media = self.media
        if media is not None:
            media.handle_rtp(now, plain, ssrc, seq, ts, marker, off, end)
            # The only deadline an RTP packet can move is the media slot's (a jitter-buffer
            # hole): the whole poll_timeout is not recomputed per packet.
            at = media.poll_timeout()
            if at is not None and at < self._told:
                self._timer_dirty = True

    def _rtcp(self, now: float, data: bytes, client: Addr, relay: Addr) -> None:
        srtp = self.srtp
        if srtp is None:
            self._counters["drop_rtp_before_dtls"] += 1
            return
        flow = self.flows.get(client)
        if flow is None:
            self._counters["drop_unknown_flow"] += 1
            return
        if flow.relay != relay:  # moved (module docstring)
            self._resend(flow, flow.move(relay))
        else:
            flow.heard()
        try:
            packets = parse_rtcp_untrusted(srtp.unprotect_rtcp_untrusted(data))
        except (SrtpError, RtpError):
            self._counters["drop_srtp"] += 1
            return
        rtcp = self.rtcp
        if rtcp.on_rtcp(now, packets):
            self._out.append(rtcp.remote_report())

    # -- out (the MediaLeg) ----------------------------------------------------------------

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
        self._out.append(_tuple_new(Transmit, (packet, flow)))

    def _send_rtcp(self, now: float) -> None:
        srtp = self.srtp
        plain = self.rtcp.report(now)
        flow = self.media_flow
        if srtp is not None and flow is not None:
            self._out.append(Transmit(srtp.protect_rtcp(plain), flow))
        self._out.append(ReportSent())

    def close(self, reason: str) -> None:
        """End the call (idempotent): DTLS close_notify queued, ICE closed, :class:`Ended`."""
        if self.state is CallState.ENDED:
            return
        self._fire(_Input.END)
        self.end_reason = reason
        self._timer_dirty = True
        if self._gate is not None:
            self._gate.policy.finished(self)  # a handshake abandoned, if one was running
        flow = self.media_flow
        try:
            self.dtls.close()
            while (out := self.dtls.poll_transmit()) is not None:
                if flow is not None:
                    self._out.append(Transmit(out, flow))
        finally:  # a broken DTLS state must not stop the teardown (the shell logs it)
            self.ice.close()
            self._out.append(Ended(reason))
