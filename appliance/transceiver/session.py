"""The trio tasks that drive one call: the shell around a sans-IO
:class:`~appliance.transceiver.call.ServerCall` (STYLE.md rule 14).

What a call *is* — ICE-lite, DTLS, SRTP, RTCP, its flows and lifecycle — lives in
``call.py``; the audio pipeline in ``media.py``, the passthrough rewriter in
``passthrough.py``. A :class:`Session` owns what needs trio or the wall clock:

* the **timer** task, sleeping until the call's earliest deadline
  (:meth:`ServerCall.poll_timeout`: ICE consent, DTLS retransmission, jitter-buffer hole,
  RTCP report, setup reaping) and firing it;
* the **agent** task, started when DTLS completes (media can flow from then on) — unless
  the agent is a synchronous frame handler (the built-in ``echo``), which the pipeline calls
  from the network loop for each decoded frame instead;
* the hook-up to the transceiver's shared :class:`~appliance.transceiver.pacer.Pacer` (the
  pacer calls :meth:`Session.pace`; the agent's queued output calls back here);
* the agent's events (``session.started``, ``stats``, ``session.ended``), logs, and the
  session object (:meth:`Session.describe`, appliance/session_info.py).

One drive-and-drain loop, str0m style: whatever feeds the call — a datagram handed in
synchronously by the server's socket loop (:meth:`Session.handle_input`), a timer, the
pacer, an agent's task — is followed by :meth:`Session._drain`, which takes
``poll_output`` until None: a transmit goes to the server's ``send``, an event is acted
on, a :class:`~.call.Timeout` re-arms the timer. What an event handler queues (a
synchronous agent's echo of a channel message) is taken by the same loop, so nothing
re-enters it from below.

Anything that escapes a handler or task ends this session only (``internal-error``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from appliance.agents import AgentContext, AgentHost, AgentIdentity, ResolvedAgent
from appliance.logs import loggable_url, redact
from appliance.proto.dtls import DtlsConnection, Role
from appliance.proto.sdp import Answer
from appliance.session_info import MAX_TRANSCRIPT, MAX_TURNS, RelayFlow, SessionInfo, turn_line

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
    RemoteReport,
    ReportSent,
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
from .rtcp import RTCP_INTERVAL
from .stages import NOISE_REDUCTION, MediaConfig

log = logging.getLogger(__name__)

#: ``send(datagram_with_proxy_header, internal_relay_address)``
SendFn = Callable[[bytes, Addr], None]
CODEC = "opus/48000/2"

__all__ = ["RTCP_INTERVAL", "SETUP_TIMEOUT", "EndedSession", "Flow", "Session"]


class Session:
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
        self.id = session_id
        self.transceiver = transceiver
        self.agent = agent
        self.candidates = candidates  # our advertised (relay public) addresses
        self.created_at = time.time()
        self.ended_at: float | None = None
        # The module's constants are read here (not in call.py) so tests can shorten them.
        self.call = ServerCall(
            answer=answer, local_ufrag=local_ufrag, local_pwd=local_pwd, dtls=dtls,
            ssrc=ssrc, cname=cname, now=now, wall_offset=self.created_at - now,
            counters=counters, setup_timeout=SETUP_TIMEOUT, rtcp_interval=RTCP_INTERVAL,
            gate=gate)
        self._send = send
        self._on_end = on_end
        self._counters = counters  # the server's, shared
        self.passthrough = agent.passthrough
        self._ended = False  # the shell's teardown ran (the call may have ended first)
        # What the agent said it heard and said (the assistant's transcript events), for
        # the session object (the dashboard shows it per call).
        self._transcript: deque[dict[str, Any]] = deque(maxlen=MAX_TRANSCRIPT)
        # Each turn's waterfall the agent reported (``turn.metrics``): signaling takes the
        # end-of-call report's ``turns`` and the appliance_turn_* histograms from these.
        self._turns: deque[dict[str, Any]] = deque(maxlen=MAX_TURNS)
        # Agent.
        self.host = AgentHost(on_event=self._agent_event, on_output=self._output_queued)
        self._on_frame = agent.on_frame  # synchronous frame handler (no agent task), or None
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
        # The shared pacer (one task per transceiver); a session made without one runs its
        # own in its nursery.
        self._own_pacer = pacer is None
        self.pacer = pacer if pacer is not None else Pacer()
        # Media: passthrough sessions never touch the codec (no libopus state at all); the
        # others get theirs from run(), once the answer is on its way: the two libopus
        # states cost ~0.1-0.3 ms, and made inside `create` they held up this answer and
        # every create queued behind it on the control connection (docs/performance.md,
        # "Setup time").
        self.pipeline: PcmPipeline | None = None
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
        # Tasks.
        self._nursery: trio.Nursery | None = None
        self._cancel = trio.CancelScope()
        self._timer_lot = trio.lowlevel.ParkingLot()
        self._timer_at = math.inf

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

    def info(self) -> SessionInfo:
        call = self.call
        flow = call.media_flow
        rtcp = call.rtcp
        return SessionInfo(
            id=self.id,
            state=call.state.value,
            end_reason=call.end_reason,
            transceiver=self.transceiver,
            agent=self.agent.name,
            client_address=_fmt(flow.client) if flow else None,
            relay_flow=RelayFlow(_fmt(flow.public), _fmt(flow.relay)) if flow else None,
            codec=self.codec,
            srtp_profile=call.srtp_profile,
            cipher_suite=call.cipher_suite,
            created_at=round(self.created_at, 3),
            ended_at=round(self.ended_at, 3) if self.ended_at else None,
            packets_in=call.packets_in,
            packets_out=call.packets_out,
            bytes_in=call.bytes_in,
            bytes_out=call.bytes_out,
            rtt_ms=rtcp.rtt_ms(),
            jitter_ms=rtcp.jitter_ms(),
            loss=rtcp.loss(),
            timeline=dict(call.timeline),
            datachannels=self.channels.stats() if self.channels is not None else None,
            media=self.pipeline.stages.describe() if self.pipeline is not None else None,
            transcript=tuple(self._transcript) if self._transcript else None,
            turns=tuple(self._turns) if self._turns else None,
        )

    def describe(self) -> dict[str, Any]:
        return self.info().to_json()

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
                at = out.at
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
            if self._nursery is not None and not self.passthrough and self._on_frame is None:
                self._nursery.start_soon(self._run_agent)  # with or without audio
        elif isinstance(ev, RemoteReport):
            if self.pipeline is not None:  # more FEC in our packets when they get lost
                self.pipeline.set_expected_loss(ev.loss)
        elif isinstance(ev, ReportSent):
            self.host.push_event({"type": "stats", **self._stats_event()})
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

    def _stats_event(self) -> dict[str, Any]:
        call = self.call
        return {"rtt_ms": call.rtcp.rtt_ms(), "jitter_ms": call.rtcp.jitter_ms(),
                "loss": call.rtcp.loss(), "packets_in": call.packets_in,
                "packets_out": call.packets_out}

    # -- timers ---------------------------------------------------------------------------

    def next_deadline(self) -> float:
        t = self.call.poll_timeout()
        return math.inf if t is None else t

    def handle_timeout(self, now: float) -> None:
        self.call.handle_timeout(now)
        self._drain()

    async def _timer_loop(self) -> None:
        while True:
            self._timer_at = self.next_deadline()
            with trio.move_on_at(self._timer_at):
                await self._timer_lot.park()
            self._timer_at = -math.inf  # awake: no pokes needed while we recompute
            now = trio.current_time()
            if now >= self.next_deadline():
                self.handle_timeout(now)

    # -- pacing ---------------------------------------------------------------------------

    def _schedule(self, at: float) -> None:
        self.pacer.schedule(at, self)

    def _output_queued(self) -> None:
        """The agent queued output (called from its task, or from the network loop for a
        synchronous frame handler): send what is due now."""
        pipeline = self.pipeline
        if pipeline is None:
            if not self.audio:  # data-only: no stream to play it on, so drain() returns
                while self.host.pop_output_frame() is not None:
                    pass
            return  # passthrough has no agent output
        if pipeline.pace_at is not None:
            return  # the pacer calls back anyway
        pipeline.pump(trio.current_time(), False)  # (PcmPipeline.output_queued, inlined)
        if self._on_frame is None:
            # From the agent's task: nobody else drains what it queued. (A synchronous
            # frame handler queues from inside handle_input/handle_timeout, which drain.)
            self._drain()

    def pace(self, now: float, at: float) -> None:
        """The shared pacer's call-back (see :meth:`Pacer.schedule`)."""
        if self.pipeline is None or self._ended:
            return
        try:
            self.pipeline.pace(now, at)
            self._drain()
        except Exception:
            self._counters["session_errors"] += 1
            log.exception("session %s: sending failed; ending it", self.id)
            self.end("internal-error")

    async def _run_agent(self) -> None:
        try:
            await self.agent.run(self.ctx)
        except Exception:
            log.exception("session %s: agent %s failed", self.id, loggable_url(self.agent.name))
            self.end("agent-error")
            return
        # The agent is done: let its last words play out, then hang up.
        await self.host.wait_drained()
        if self.call.end_reason is None:
            self.end("agent-done")

    def _agent_event(self, event: dict[str, Any]) -> None:
        if event.get("type") == "session.end":
            reason = event.get("reason")
            self.end(f"agent: {reason}" if isinstance(reason, str) else "agent-hangup")
        elif event.get("type") in ("transcript.user.final", "transcript.agent"):
            text = event.get("text")
            if isinstance(text, str) and text:
                who = "user" if event["type"] == "transcript.user.final" else "agent"
                self._transcript.append({"who": who, "text": text[:1000],
                                         "at": round(time.time(), 3)})
        elif event.get("type") == "turn.metrics":
            line = turn_line(event)
            if line is not None:
                self._turns.append(line)
        elif event.get("type") == "media.update" and self.pipeline is not None:
            nr = event.get("noise_reduction")  # Realtime session.update (realtime/agent.py)
            if nr is None or nr in NOISE_REDUCTION:
                self.pipeline.stages.set_noise_reduction(nr)
        else:
            log.debug("session %s agent event %s", self.id, event.get("type"))

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The session's tasks, until it ends. Never raises (except Cancelled)."""
        try:
            with self._cancel:
                # The codec states, now that `create` has answered (see __init__).
                if self.pipeline is not None:
                    _ = self.pipeline.decoder, self.pipeline.encoder
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._timer_loop)
                    if self.pipeline is not None and self._own_pacer:
                        nursery.start_soon(self.pacer.run)
                    task_status.started()
        except Exception:
            log.exception("session %s crashed", self.id)
            self.end("internal-error")
        finally:
            self._nursery = None
            self.end(self.call.end_reason or "shutdown")

    def end(self, reason: str) -> None:
        """End the session (idempotent): close_notify, agent told, tasks cancelled."""
        if self._ended:
            return
        try:
            self.call.close(reason)
        except Exception:  # a broken DTLS state must not stop the teardown
            log.exception("session %s: DTLS close failed", self.id)
        self._drain()  # close_notify out; the call's Ended runs _teardown
        self._teardown(self.call.end_reason or reason)  # (if the call had ended before)

    def _teardown(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        self.ended_at = time.time()
        self.host.push_event({"type": "session.ended", "reason": reason})
        self.host.close(reason)
        if self.pipeline is not None:
            self.pipeline.close()
        self._cancel.cancel()
        log.info("session %s ended: %s", self.id, reason)
        self._on_end(self)


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
