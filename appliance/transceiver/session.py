"""A WebRTC call on the one shell (``shell.py``): :class:`Session` is the call kind
whose core is a sans-IO :class:`~appliance.transceiver.call.ServerCall` (STYLE.md rules 14
and 20).

What a call *is* — ICE-lite, DTLS, SRTP, RTCP, its flows and lifecycle — lives in
``call.py``; the audio pipeline in ``media.py``, the passthrough rewriter in
``passthrough.py``; timers, pacing, the agent task, ``stats``, FEC, teardown and the
session object in ``shell.py``, shared with phone calls. What is WebRTC's own here:

* building the call from its SDP answer (media slot: the PCM pipeline, passthrough, or
  none for a data-only session) and its data channels (``datachannels.py``);
* the drain: ``poll_output`` until None — a transmit goes to the server's ``send`` with
  its flow's PROXY header, an event is acted on (``Connected`` starts the agent), a
  :class:`~.call.Timeout` re-arms the timer. What an event handler queues (a synchronous
  agent's echo of a channel message) is taken by the same loop, so nothing re-enters it
  from below;
* the WebRTC fields of the session object (flows, DTLS, the setup timeline).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from appliance.agents import AgentContext, AgentIdentity, ResolvedAgent
from appliance.logs import redact
from appliance.proto.dtls import DtlsConnection, Role
from appliance.proto.sdp import Answer
from appliance.session_info import RelayFlow

from .admission import DtlsGate
from .call import (
    SETUP_TIMEOUT,
    Addr,
    CallEvent,
    CallState,
    Connected,
    Ended,
    Flow,
    FlowNominated,
    SendReady,
    ServerCall,
    Source,
    Timeout,
    Transmit,
)
from .datachannels import CallChannels
from .media import PcmPipeline
from .opus import DEFAULT_COMPLEXITY, Decoder, Encoder
from .pacer import Pacer
from .passthrough import PassthroughStream
from .rtcp import RTCP_INTERVAL, RemoteReport, ReportSent, RtcpMonitor
from .shell import CallShell
from .stages import MediaConfig

log = logging.getLogger(__name__)

#: ``send(datagram_with_proxy_header, internal_relay_address)``
SendFn = Callable[[bytes, Addr], None]
CODEC = "opus/48000/2"

__all__ = ["RTCP_INTERVAL", "SETUP_TIMEOUT", "EndedSession", "Flow", "Session"]


class Session(CallShell):
    """A WebRTC call (module docstring)."""

    noun = "session"

    def __init__(
        self,
        *,
        session_id: str,
        transceiver: int,
        agent: ResolvedAgent,
        answer: Answer,
        candidates: list[tuple[str, int]],
        local_ufrag: str,
        local_pwd: str,
        dtls: DtlsConnection,
        ssrc: int,
        cname: str,
        send: SendFn,
        now: float,
        on_end: Callable[[Session], None],
        counters: dict[str, int],
        pacer: Pacer | None = None,
        opus_complexity: int = DEFAULT_COMPLEXITY,
        params: dict[str, Any] | None = None,
        media: MediaConfig | None = None,
        gate: DtlsGate | None = None,
    ) -> None:
        self._init_shell(session_id=session_id, transceiver=transceiver, agent=agent,
                         on_end=on_end, counters=counters, pacer=pacer)
        self.candidates = candidates  # our advertised (relay public) addresses
        # The module's constants are read here (not in call.py) so tests can shorten them.
        self.call = ServerCall(
            answer=answer, local_ufrag=local_ufrag, local_pwd=local_pwd, dtls=dtls,
            ssrc=ssrc, cname=cname, now=now, wall_offset=self.created_at - now,
            counters=counters, setup_timeout=SETUP_TIMEOUT, rtcp_interval=RTCP_INTERVAL,
            gate=gate)
        self._send = send
        self.passthrough = agent.passthrough
        #: False for a data-only session (RFC 8841 without audio): no media slot, no codec,
        #: no pacing; the agent still runs and gets the channels, frames() just ends with
        #: the session, and audio it sends is discarded (there is no stream to carry it).
        self.audio = answer.plan is not None
        # Opus, or the G.711 law an offer without Opus got (proto/sdp/answer.py, g711.py).
        codec_name = answer.plan.codec_name if answer.plan is not None else None
        self.codec: str | None = (
            None if codec_name is None
            else CODEC if codec_name == "opus" else f"{codec_name.upper()}/8000")
        self.ctx = AgentContext(
            self.host, AgentIdentity(agent.name, session_id, transceiver, {"codec": self.codec},
                                     params=dict(params or {})))
        # Media: passthrough sessions never touch the codec (no libopus state at all); the
        # others get theirs from run(), once the answer is on its way: the two libopus
        # states cost ~0.1-0.3 ms, and made inside `create` they held up this answer and
        # every create queued behind it on the control connection (docs/performance.md,
        # "Setup time").
        if not self.audio:
            pass  # no media slot: the call drops RTP by payload type
        elif self.passthrough:
            self.call.media = PassthroughStream(self.call)
        else:
            assert codec_name is not None  # self.audio: the answer has an audio plan
            self.pipeline = PcmPipeline(
                self.call, self.host, self.ctx, on_frame=self._on_frame,
                schedule=self._schedule, agent_name=agent.name, codec=codec_name,
                config=(media or MediaConfig()).with_(opus_complexity=opus_complexity))
            self.call.media = self.pipeline
        # Data channels, when the answer served the offer's application section.
        self.channels: CallChannels | None = None
        if answer.application is not None:
            # A synchronous agent's channel operations run inside this session's drain (its
            # handler is called from it), which takes what they queue; an agent task's are
            # followed by a drain of their own.
            sync = agent.on_frame is not None
            self.channels = CallChannels(
                answer.application, self.host.channels, self.ctx,
                dtls_client=dtls.role is Role.CLIENT, mtu=dtls.mtu,
                clock=trio.current_time, flush=None if sync else self._drain,
                on_channel=agent.on_channel if sync else None)
            self.call.sctp = self.channels.endpoint

    # -- the call's state, for the server and the control operations ----------------------

    @property
    def state(self) -> CallState:
        return self.call.state

    @property
    def end_reason(self) -> str | None:
        return self.call.end_reason

    @property
    def flows(self) -> dict[Addr, Flow]:
        return self.call.flows

    @property
    def dtls(self) -> DtlsConnection:
        return self.call.dtls

    @property
    def decoder(self) -> Decoder | None:
        """The Opus decoder (None for passthrough), made on first use if run() has not yet."""
        return self.pipeline.decoder if self.pipeline is not None else None

    @decoder.setter
    def decoder(self, value: Decoder) -> None:  # bench/pcm_path.py --stub-codec
        assert self.pipeline is not None
        self.pipeline.decoder = value

    @property
    def encoder(self) -> Encoder | None:
        """The Opus encoder (None for passthrough), made on first use if run() has not yet."""
        return self.pipeline.encoder if self.pipeline is not None else None

    @encoder.setter
    def encoder(self, value: Encoder) -> None:
        assert self.pipeline is not None
        self.pipeline.encoder = value

    # -- snapshot for the control channel ------------------------------------------------

    def _core_info(self) -> dict[str, Any]:
        call = self.call
        flow = call.media_flow
        return dict(
            state=call.state.value,
            end_reason=call.end_reason,
            client_address=_fmt(flow.client) if flow else None,
            relay_flow=RelayFlow(_fmt(flow.public), _fmt(flow.relay)) if flow else None,
            codec=self.codec,
            srtp_profile=call.srtp_profile,
            cipher_suite=call.cipher_suite,
            bytes_in=call.bytes_in,
            bytes_out=call.bytes_out,
            timeline=dict(call.timeline),
            datachannels=self.channels.stats() if self.channels is not None else None,
        )

    def mark_answer_sent(self, now: float) -> None:
        self.call.mark_answer_sent(now)

    # -- input from the socket loop (synchronous, never blocks) ---------------------------

    def handle_input(self, now: float, data: bytes, source: Source) -> None:
        """One client datagram of this call (any kind), then the drain."""
        self.call.handle_input(now, data, source)
        self._drain()

    # -- what the call queued ----------------------------------------------------------------

    def _drain(self) -> None:
        """Take the call's outputs until there are none: transmits out, events acted on
        (what they queue comes out of the same loop), the timer re-armed."""
        call = self.call
        send = self._send
        while (out := call.poll_output()) is not None:
            if type(out) is Transmit:
                flow = out[1]
                send(flow.header + out[0], flow.relay)
            elif type(out) is Timeout:
                at = out.at  # (CallShell._poke_timer, inlined: once per packet)
                if at is not None and at < self._timer_at:
                    self._timer_lot.unpark_all()
            else:
                self._on_event(out)  # type: ignore[arg-type]

    def _on_event(self, ev: CallEvent) -> None:
        if isinstance(ev, Connected):
            flow = self.call.media_flow
            log.info("session %s connected from %s (%s, %s)", self.id,
                     redact(_fmt(flow.client)) if flow is not None else "-", ev.srtp_profile,
                     ev.cipher_suite)
            self.host.push_event({"type": "session.started", "session_id": self.id,
                                  "sample_rate": 48000, "frame_samples": 960})
            self._begin_agent()  # with or without audio
        elif isinstance(ev, RemoteReport):
            self.remote_report(ev)  # (the shell: Opus FEC follows the loss)
        elif isinstance(ev, ReportSent):
            self.report_sent()  # (the shell: the agent's stats event)
        elif isinstance(ev, FlowNominated):
            # At debug: "connected" names the address a few ms later, and one log line
            # fewer per setup is CPU off the setup path (docs/performance.md).
            log.debug("session %s nominated %s", self.id, redact(_fmt(ev.client)))
        elif isinstance(ev, Ended):
            self._teardown(ev.reason)
        elif isinstance(ev, SendReady):
            pass  # DTLS 1.2 False Start: the call sent our SCTP INIT itself
        elif self.channels is not None:  # the data-channel endpoint's, unwrapped
            self.channels.on_event(ev)

    def _rtcp_monitor(self) -> RtcpMonitor:
        return self.call.rtcp

    def _packet_counts(self) -> tuple[int, int]:
        return self.call.packets_in, self.call.packets_out

    # -- timers ---------------------------------------------------------------------------

    def next_deadline(self) -> float:
        t = self.call.poll_timeout()
        return math.inf if t is None else t

    def handle_timeout(self, now: float) -> None:
        self.call.handle_timeout(now)
        self._drain()

    # -- the rest of the core interface (shell.py) -----------------------------------------

    def _close_core(self, reason: str) -> None:
        self.call.close(reason)
        self._drain()  # close_notify out; the call's Ended runs _teardown

    def _core_end_reason(self) -> str | None:
        return self.call.end_reason

    def _core_teardown(self, reason: str) -> None:
        pass  # the server's _on_end takes the call out of its tables


class EndedSession:
    """What the transceiver keeps of an ended session for ``list``/``get``/``delete``: its
    final :meth:`Session.describe` (a small dict) and nothing else. The :class:`Session`
    itself — Opus encoder/decoder, DTLS, SRTP, jitter buffer, agent queues, ~70 KiB — is
    dropped at once instead of living on for the last ``RECENTLY_ENDED`` calls."""

    __slots__ = ("id", "state", "end_reason", "ended_at", "_info")

    def __init__(self, session: Session) -> None:
        self.id = session.id
        self.state = CallState.ENDED
        self.end_reason = session.end_reason
        self.ended_at = session.ended_at
        self._info = session.describe()

    def describe(self) -> dict[str, Any]:
        return dict(self._info)

    def end(self, reason: str) -> None:
        """Already ended: keeps its own reason (like :meth:`Session.end` on an ended one)."""


def _fmt(addr: Addr) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
