"""A phone call's media on a transceiver: :class:`PhoneSession`, the call kind on the one
shell (``shell.py``) whose core is a sans-IO :class:`~.rtp_leg.RtpLeg`, with the same
:class:`~.media.PcmPipeline` and agent a WebRTC :class:`~.session.Session` runs (issue 28
items 2-3, docs/sip.md "Media"). Timers, pacing, the agent task, ``stats``, FEC from the
far end's RTCP, teardown and the session object are the shell's, shared with WebRTC calls
(issue 39); what is the phone's own is below: the leg's making and replacing (re-INVITEs),
latching, DTMF both ways, the PROXY headers for the relay, the leg counters.

::

    relay ── PROXY v2(src=trunk, dst=public) + RTP ──► Transceiver.dispatch
        by_client miss ─► phone_for(client): the call whose vouch rule takes it
        (phone.vouches: the signalled address, or any port of the SIP source's IP)
        ─► PhoneSession.handle_input ─► RtpLeg (latching, SRTP, RTCP, RFC 4733)
              ─► PcmPipeline (G.711 8 kHz ↔ 48 kHz, or Opus) ─► agent (unchanged)
    leg.poll_output(): Transmit ─► PROXY(src=dest, dst=public) + RTP ─► that relay
                       Latched ─► the transceiver's client table follows the latch
                       Dtmf    ─► agent event {"type": "dtmf"} + an event for signaling
                       Ended   ─► teardown (the transceiver's "ended" event for signaling)

A session is created **answering** (``create``, leg ``phone``, with :class:`PhoneParams`:
media starts at once) or **pending** (a phone ``create`` without params: our own offer went out in
an outbound INVITE; nothing runs until a ``patch`` with ``answered: true`` brings the far
end's answer as params). A ``patch`` without it (a re-INVITE) changes the direction in
place; a new remote, codec or key makes a new leg (the leg's latch never moves for plain
RTP: docs/adr-sip-media.md).

Sending needs a relay: our RTP goes to the relay internal address the call's last datagram
(or the relay's vouch query) came from, with the PROXY header naming the leg's destination
and the relay's public address. Until the trunk's first packet arrives there is none, and
what the pipeline would send is dropped (counted ``drop_phone_no_relay``): a trunk sends
as soon as it has our answer, so this is the first 20-40 ms of the call at most.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import trio

from appliance.agents import AgentContext, AgentIdentity, ResolvedAgent
from appliance.logs import redact
from appliance.phone_params import PhoneParams
from appliance.proto.errors import LocalProtocolError
from appliance.proto.proxy import encode_header
from appliance.session_info import RelayFlow

from . import rtp_leg
from .call import Addr
from .media import PcmPipeline
from .pacer import Pacer
from .phone import leg_config, vouches
from .rtcp import RemoteReport, ReportSent, RtcpMonitor
from .rtp_leg import Dtmf, Ended, Latched, RtpLeg, Transmit
from .shell import CallShell
from .stages import MediaConfig

log = logging.getLogger(__name__)

SendFn = Callable[[bytes, Addr], None]
#: No RTP or RTCP for this long (while not on hold) ends the call: signaling then sends
#: the BYE. Read when a leg is made, so tests can shorten it.
MEDIA_TIMEOUT = rtp_leg.MEDIA_TIMEOUT
#: RTCP report interval of a leg (the agent's ``stats`` event comes with each report), read
#: when a leg is made like ``session.RTCP_INTERVAL`` for a WebRTC call, so tests can shorten it.
RTCP_INTERVAL = rtp_leg.RTCP_INTERVAL
#: DTMF digits an agent may send (RFC 4733 §3.2 events 0-15)
DIGITS = frozenset("0123456789*#ABCD")
#: The leg counters (rtp_leg.LegCounters) summed into the transceiver's counters as
#: ``phone_<name>`` (signaling's /metrics: ``appliance_transceiver_phone_<name>_total``):
#: RTP/RTCP each way, drops by cause (``stray``: a source the latch refused), SRTP
#: authentication failures. Folded every FOLD_EVERY drains (about a second of a call's
#: packets) and when a leg closes, so the hot path pays one increment and one test.
LEG_COUNTERS = ("rtp_in", "rtcp_in", "stray", "learning", "wrong_pt", "wrong_ssrc",
                "malformed", "auth_failed", "rtp_out", "dtmf_out", "rtcp_out")
FOLD_EVERY = 64


def _codec_label(params: PhoneParams) -> str:
    return "opus/48000/2" if params.codec == "opus" else f"{params.codec}/8000"


class PhoneSession(CallShell):
    """One phone call's media and agent (module docstring). ``on_event`` gets the
    events for signaling (``dtmf``; its end is the transceiver's ``ended``); ``on_latched`` tells the transceiver a new
    source address is this call's (its client table)."""

    kind = "phone"
    noun = "phone"

    def __init__(
        self,
        *,
        session_id: str,
        call_id: str,
        transceiver: int,
        agent: ResolvedAgent,
        params: PhoneParams | None,
        send: SendFn,
        now: float,
        on_end: Callable[[PhoneSession], None],
        on_event: Callable[[dict[str, Any]], None],
        on_latched: Callable[[PhoneSession, Addr], None],
        counters: dict[str, int],
        pacer: Pacer,
        opus_complexity: int,
        session_params: dict[str, Any] | None = None,
        media: MediaConfig | None = None,
    ) -> None:
        if agent.passthrough:
            raise ValueError("a passthrough agent cannot answer phone calls (no SRTP to echo)")
        self._init_shell(session_id=session_id, transceiver=transceiver, agent=agent,
                         on_end=on_end, counters=counters, pacer=pacer)
        self.call_id = call_id
        self.params = params
        self.end_reason: str | None = None
        self._send = send
        self._on_event = on_event
        self._on_latched = on_latched
        self._opus_complexity = opus_complexity
        self._media = (media or MediaConfig()).with_(opus_complexity=opus_complexity)
        self._wall_offset = self.created_at - now
        self.ssrc = secrets.randbits(32)
        self.ctx = AgentContext(self.host, AgentIdentity(
            agent.name, session_id, transceiver,
            {"codec": _codec_label(params) if params else None, "transport": "sip",
             "call_id": call_id},
            params=dict(session_params or {})))
        self.leg: RtpLeg | None = None
        #: the relay the latest datagram came through, and the public address it reached
        self.relay: Addr | None = None
        self.public: Addr | None = None
        self._headers: dict[tuple[Addr, Addr], bytes] = {}
        self._started = False
        self.packets_in = self.packets_out = self.bytes_in = self.bytes_out = 0
        self.dtmf_digits = 0
        #: what of each leg's counters is already in the transceiver's (by leg identity)
        self._folded: dict[RtpLeg, dict[str, int] | None] = {}  # None: folded for good
        self._drains = 0
        for name in LEG_COUNTERS:  # present (at 0) once the transceiver has had a phone call
            counters.setdefault(f"phone_{name}", 0)
        counters.setdefault("phone_dtmf_in", 0)
        if params is not None:
            self._start_leg(params, now)

    # -- state -----------------------------------------------------------------------------

    @property
    def state(self) -> str:
        if self._ended:
            return "ended"
        return "connected" if self.leg is not None else "new"

    @property
    def pending(self) -> bool:
        return self.leg is None and not self._ended

    @property
    def latched(self) -> Addr | None:
        return self.leg.latched if self.leg is not None else None

    def vouches_for(self, src: Addr) -> bool:
        """The relay's look-up rule for this call (transceiver/phone.py)."""
        if self.params is None or self._ended:
            return False
        return vouches(self.params, self.latched, src)

    # -- the leg and the pipeline ----------------------------------------------------------

    def _start_leg(self, params: PhoneParams, now: float) -> None:
        cfg = leg_config(params, self.ssrc)  # ValueError: the op answers 400
        cfg = replace(cfg, wall_offset=self._wall_offset, cname=self.id[:32],
                      media_timeout=MEDIA_TIMEOUT, rtcp_interval=RTCP_INTERVAL)
        leg = RtpLeg(cfg, now)
        leg.set_direction(params.direction)  # our answer's (the offer's reversed)
        old = self.leg
        self.leg, self.params = leg, params
        codec = "opus" if params.codec == "opus" else params.codec.lower()
        if self.pipeline is not None and self.pipeline.codec == codec:
            self.pipeline.leg = leg  # same codec: the pipeline (its agent queues) carries on
        else:
            if self.pipeline is not None:
                self.pipeline.close()
            self.pipeline = PcmPipeline(leg, self.host, self.ctx, on_frame=self._on_frame,
                                        schedule=self._schedule, agent_name=self.agent.name,
                                        codec=codec, config=self._media)
        leg.media = self.pipeline
        if old is not None and not old.closed:
            old.media = None
            old.close("replaced")
            self._drain_leg(old)
        if old is not None:
            self._fold(old, final=True)
        if not self._started:
            self._started = True
            self.host.push_event({"type": "session.started", "session_id": self.id,
                                  "sample_rate": 48000, "frame_samples": 960,
                                  "transport": "sip", "call_id": self.call_id})
            self._begin_agent()
        self._poke_timer(leg.poll_timeout())

    def answered(self, params: PhoneParams, now: float) -> None:
        """``patch`` with ``answered: true``: the far end's answer to our offer (a pending
        session)."""
        if not self.pending:
            raise ValueError("this phone session is not waiting for an answer")
        self._start_leg(params, now)
        self._drain()

    def update(self, params: PhoneParams, now: float) -> None:
        """``patch`` (a re-INVITE's leg options): the direction in place, anything else a
        new leg."""
        if self._ended:
            raise ValueError("this phone session has ended")
        old = self.params
        if old is not None and params.remote[0] in ("0.0.0.0", "::"):
            # RFC 2543 hold (c=0.0.0.0): a direction change, not a new address
            params = replace(params, remote=old.remote, remote_rtcp=old.remote_rtcp)
        if self.leg is None or old is None:
            self._start_leg(params, now)
        elif _same_media(old, params):
            self.params = params
            self.leg.set_direction(params.direction)  # our answer's (the offer's reversed)
        else:
            self._start_leg(params, now)
        self._drain()

    def send_dtmf(self, now: float, digits: str, duration: float = 0.1) -> None:
        if self.leg is None:
            raise ValueError("no media yet")
        for d in digits:
            if d not in DIGITS:
                raise ValueError(f"not a DTMF digit: {d!r}")
        try:
            for d in digits:
                self.leg.send_dtmf(now, d, duration)
        except LocalProtocolError as exc:
            raise ValueError(str(exc)) from None
        self._drain()

    def dtmf_from_signaling(self, digit: str, duration_ms: int) -> None:
        """A digit from SIP INFO (signaling's ``dtmf`` op): to the agent, like RFC 4733."""
        self.dtmf_digits += 1
        self._counters["phone_dtmf_in"] = self._counters.get("phone_dtmf_in", 0) + 1
        self.host.push_event({"type": "dtmf", "digit": digit, "duration_ms": duration_ms,
                              "source": "sip-info"})

    # -- input from the socket loop ----------------------------------------------------------

    def handle_input(self, now: float, data: bytes, source: tuple[Addr, Addr, Addr]) -> None:
        client, public, relay = source
        self.relay, self.public = relay, public
        leg = self.leg
        if leg is None:
            self._counters["drop_phone_pending"] = self._counters.get("drop_phone_pending", 0) + 1
            return
        self.packets_in += 1
        self.bytes_in += len(data)
        leg.handle_input(now, data, client)
        self._drain()

    def via_relay(self, public: Addr, relay: Addr) -> None:
        """A relay's vouch query for one of our sources: its return traffic goes there."""
        self.public, self.relay = public, relay

    def _drain(self) -> None:
        if self.leg is not None:
            self._drain_leg(self.leg)
            self._poke_timer(self.leg.poll_timeout())
            self._drains += 1
            if self._drains % FOLD_EVERY == 0:
                self._fold(self.leg)

    def _fold(self, leg: RtpLeg, *, final: bool = False) -> None:
        """Add what ``leg``'s counters grew by since the last fold to the transceiver's
        (LEG_COUNTERS); ``final``: the leg is done (folded once more, then never)."""
        if leg in self._folded and self._folded[leg] is None:
            return  # already folded for good
        seen = self._folded.get(leg) or dict.fromkeys(LEG_COUNTERS, 0)
        c, total = leg.counters, self._counters
        for name in LEG_COUNTERS:
            now = getattr(c, name)
            grew = now - seen[name]
            if grew:
                total[f"phone_{name}"] = total.get(f"phone_{name}", 0) + grew
                seen[name] = now
        self._folded[leg] = None if final else seen

    def _drain_leg(self, leg: RtpLeg) -> None:
        while (out := leg.poll_output()) is not None:
            if type(out) is Transmit:
                self._transmit(out.payload, out.addr)
            elif isinstance(out, Latched):
                log.info("phone %s latched %s to %s", self.id, "RTCP" if out.rtcp else "RTP",
                         redact(f"{out.addr[0]}:{out.addr[1]}"))
                self._on_latched(self, out.addr)
            elif isinstance(out, Dtmf):
                if out.digit is None:
                    continue
                self.dtmf_digits += 1
                self._counters["phone_dtmf_in"] = self._counters.get("phone_dtmf_in", 0) + 1
                ms = round(out.duration * 1000)
                self.host.push_event({"type": "dtmf", "digit": out.digit, "duration_ms": ms,
                                      "source": "rfc4733"})
                self._on_event({"type": "dtmf", "call_id": self.call_id,
                                "session_id": self.id, "digit": out.digit, "duration_ms": ms})
            elif isinstance(out, ReportSent):
                if leg is self.leg:
                    self.report_sent()  # (the shell: the agent's stats event)
            elif isinstance(out, RemoteReport):
                if leg is self.leg:
                    self.remote_report(out)  # (the shell: Opus FEC follows the loss)
            elif isinstance(out, Ended):
                if leg is self.leg:
                    self._teardown(out.reason)

    def _transmit(self, payload: bytes, dest: Addr) -> None:
        relay, public = self.relay, self.public
        if relay is None or public is None:
            self._counters["drop_phone_no_relay"] = \
                self._counters.get("drop_phone_no_relay", 0) + 1
            return
        key = (dest, public)
        header = self._headers.get(key)
        if header is None:
            if len(self._headers) > 16:
                self._headers.clear()
            header = self._headers[key] = encode_header(dest, public)
        self.packets_out += 1
        self.bytes_out += len(payload)
        self._send(header + payload, relay)

    # -- timers, pacing, the agent -----------------------------------------------------------

    def next_deadline(self) -> float:
        t = self.leg.poll_timeout() if self.leg is not None else None
        return math.inf if t is None else t

    def handle_timeout(self, now: float) -> None:
        if self.leg is not None:
            self.leg.handle_timeout(now)
            self._drain()

    # -- the rest of the core interface (shell.py) -----------------------------------------

    def _agent_op(self, kind: object, event: dict[str, Any]) -> bool:
        if kind != "dtmf.send":
            return False
        # an agent pressing keys (an IVR on the far end)
        digits = event.get("digits")
        if isinstance(digits, str) and 0 < len(digits) <= 32 and self.leg is not None:
            try:
                self.send_dtmf(trio.current_time(), digits)
            except ValueError as exc:
                log.info("phone %s: dtmf.send refused: %s", self.id, exc)
        return True

    def _rtcp_monitor(self) -> RtcpMonitor | None:
        return self.leg.rtcp if self.leg is not None else None

    def _packet_counts(self) -> tuple[int, int]:
        return self.packets_in, self.packets_out

    def _close_core(self, reason: str) -> None:
        if self.leg is not None:
            self.leg.close(reason)  # an RTCP BYE when RTCP is in use
            self._drain_leg(self.leg)  # its Ended runs _teardown

    def _core_end_reason(self) -> str | None:
        return self.end_reason

    def _core_teardown(self, reason: str) -> None:
        self.end_reason = reason
        if self.leg is not None:
            self._fold(self.leg, final=True)
        # (its "ended" event is the transceiver's, for every call: server.py _on_end)

    # -- the session object ------------------------------------------------------------------

    def _core_info(self) -> dict[str, Any]:
        leg = self.leg
        dest = leg.destination if leg is not None else None
        return dict(
            state=self.state, end_reason=self.end_reason,
            client_address=_fmt(dest) if dest is not None else None,
            relay_flow=RelayFlow(_fmt(self.public), _fmt(self.relay))
            if self.public is not None and self.relay is not None else None,
            codec=_codec_label(self.params) if self.params is not None else None,
            srtp_profile=self.params.srtp.suite if self.params and self.params.srtp else None,
            bytes_in=self.bytes_in, bytes_out=self.bytes_out,
        )

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        leg = self.leg
        out["phone"] = {
            "call_id": self.call_id, "pending": self.pending,
            "latched": _fmt(leg.latched) if leg is not None and leg.latched else None,
            "dtmf_digits": self.dtmf_digits,
            "leg": None if leg is None else asdict(leg.counters),
        }
        return out


def _same_media(a: PhoneParams, b: PhoneParams) -> bool:
    return (a.codec, a.payload_type, a.clock_rate, a.dtmf_payload_type, a.remote, a.rtcp_mux,
            a.remote_rtcp, a.srtp) == (b.codec, b.payload_type, b.clock_rate,
                                       b.dtmf_payload_type, b.remote, b.rtcp_mux,
                                       b.remote_rtcp, b.srtp)


def _fmt(addr: Addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
