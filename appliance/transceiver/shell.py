"""The one trio shell around any call (STYLE.md rules 14 and 20): what every call kind
gets from the transceiver, written once.

::

                      ┌──────────────── CallShell (this file) ───────────────────┐
    server dispatch ─►│ handle_input ─► the core ─► _drain ─► send / events      │
    the pacer ───────►│ pace ─► pipeline.pace ─► _drain                          │
    timer task ──────►│ _timer_loop: sleep to next_deadline, handle_timeout      │
    agent task ──────►│ _run_agent, _agent_event, _output_queued                 │
                      │ stats (on each RTCP report sent), FEC (on each report    │
                      │ received), transcript and turns, teardown, info()        │
                      └───────────────┬──────────────────────────────────────────┘
                                      │ the core interface (below)
              ┌───────────────────────┴──────────────────────────┐
        session.Session: ServerCall                  phone_session.PhoneSession:
        (ICE + DTLS-SRTP, SCTP; call.py)             RtpLeg (plain RTP / SDES-SRTP;
                                                     rtp_leg.py), re-INVITEs, DTMF

Both cores hold one :class:`~.rtcp.RtcpMonitor` and queue the same
:class:`~.rtcp.RemoteReport` / :class:`~.rtcp.ReportSent` outputs, which reach
:meth:`CallShell.remote_report` / :meth:`CallShell.report_sent`: so Opus FEC follows the
far end's reported loss and the agent gets ``stats`` every ~5 s on any leg. The recording
(``recording.py``) hangs off the pipeline's stages, which the server starts for any call
kind once the call has a pipeline.

The core interface a call kind implements (sans-IO below it, synchronous here):

* ``next_deadline()`` / ``handle_timeout(now)``: the core's earliest timer and firing it
  (followed by the drain);
* ``_drain()``: take the core's outputs until None (transmits to ``send``, events acted
  on, the timer poked through :meth:`CallShell._poke_timer`);
* ``_close_core(reason)``: end the core (a DTLS close_notify, an RTCP BYE) and drain it;
  its ``Ended`` output runs :meth:`CallShell._teardown`;
* ``_core_end_reason()``: the reason the core ended with, if it ended first;
* ``_core_teardown(reason)``: the kind's own bookkeeping when the call ends;
* ``_core_info()``: the kind's fields of the session object (appliance/session_info.py);
* ``_rtcp_monitor()`` / ``_packet_counts()``: the leg's RTCP piece (None before a phone
  call has a leg) and its packets in and out, from which the shell takes the figures of
  both the ``stats`` event and the session object — the same meaning on every leg (``loss``:
  what we lost of the far end's stream, ``jitter_ms``: its interarrival jitter);
* ``_agent_op(kind, event)``: an agent event only this kind understands (True: handled).

Anything that escapes a handler or task ends this call only (``internal-error``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from appliance.agents import AgentContext, AgentHost, ResolvedAgent
from appliance.logs import loggable_url
from appliance.session_info import MAX_TRANSCRIPT, MAX_TURNS, SessionInfo, turn_line

from .media import PcmPipeline
from .pacer import Pacer
from .rtcp import RemoteReport, RtcpMonitor
from .stages import NOISE_REDUCTION

log = logging.getLogger(__name__)


class CallShell:
    """The trio tasks and per-call features of one call, whatever its leg (module
    docstring). A subclass is a call kind: it makes its core and implements the core
    interface; everything else is here."""

    #: the word the logs name a call of this kind with
    noun = "call"
    #: the session object's ``kind`` (session_info.KINDS)
    kind = "webrtc"

    def _init_shell(self, *, session_id: str, transceiver: int, agent: ResolvedAgent,
                    on_end: Callable[[Any], None], counters: dict[str, int],
                    pacer: Pacer | None) -> None:
        self.id = session_id
        self.transceiver = transceiver
        self.agent = agent
        self.created_at = time.time()
        self.ended_at: float | None = None
        self._on_end = on_end
        self._counters = counters  # the server's, shared
        self._ended = False  # the shell's teardown ran (the core may have ended first)
        # What the agent said it heard and said (the assistant's transcript events), and
        # each turn's waterfall (``turn.metrics``), for the session object: the dashboard
        # and the end-of-call report take them from there.
        self._transcript: deque[dict[str, Any]] = deque(maxlen=MAX_TRANSCRIPT)
        self._turns: deque[dict[str, Any]] = deque(maxlen=MAX_TURNS)
        self.host = AgentHost(on_event=self._agent_event, on_output=self._output_queued)
        self._on_frame = agent.on_frame  # synchronous frame handler (no agent task), or None
        # The shared pacer (one task per transceiver); a call made without one runs its
        # own in its nursery.
        self._own_pacer = pacer is None
        self.pacer = pacer if pacer is not None else Pacer()
        self.pipeline: PcmPipeline | None = None
        self._agent_due = False  # media can flow: the agent task is to run
        self._agent_started = False
        self._nursery: trio.Nursery | None = None
        self._cancel = trio.CancelScope()
        self._timer_lot = trio.lowlevel.ParkingLot()
        self._timer_at = math.inf

    # -- the core interface (module docstring) ---------------------------------------------

    def next_deadline(self) -> float:
        raise NotImplementedError

    def handle_timeout(self, now: float) -> None:
        raise NotImplementedError

    def _drain(self) -> None:
        raise NotImplementedError

    def _close_core(self, reason: str) -> None:
        raise NotImplementedError

    def _core_end_reason(self) -> str | None:
        raise NotImplementedError

    def _core_teardown(self, reason: str) -> None:
        raise NotImplementedError

    def _core_info(self) -> dict[str, Any]:
        raise NotImplementedError

    def _rtcp_monitor(self) -> RtcpMonitor | None:
        raise NotImplementedError

    def _packet_counts(self) -> tuple[int, int]:
        raise NotImplementedError

    def _agent_op(self, kind: object, event: dict[str, Any]) -> bool:
        return False

    # -- what the RTP session piece reports (both legs, rtcp.py) ---------------------------

    def remote_report(self, report: RemoteReport) -> None:
        """A report block about our stream: more FEC in our packets when they get lost."""
        if self.pipeline is not None:
            self.pipeline.set_expected_loss(report.loss)

    def report_sent(self) -> None:
        """We sent an RTCP report (~every 5 s): the agent's ``stats`` event."""
        self.host.push_event({"type": "stats", **self._figures()})

    def _figures(self) -> dict[str, Any]:
        """RTT, jitter, loss and packets each way: the ``stats`` event's, the session
        object's."""
        rtcp = self._rtcp_monitor()
        packets_in, packets_out = self._packet_counts()
        return {"rtt_ms": rtcp.rtt_ms() if rtcp is not None else None,
                "jitter_ms": rtcp.jitter_ms() if rtcp is not None else None,
                "loss": rtcp.loss() if rtcp is not None else None,
                "packets_in": packets_in, "packets_out": packets_out}

    # -- timers ----------------------------------------------------------------------------

    def _poke_timer(self, at: float | None) -> None:
        """The core's deadline moved to ``at``: wake the timer task if that is sooner."""
        if at is not None and at < self._timer_at:
            self._timer_lot.unpark_all()

    async def _timer_loop(self) -> None:
        while True:
            self._timer_at = self.next_deadline()
            with trio.move_on_at(self._timer_at):
                await self._timer_lot.park()
            self._timer_at = -math.inf  # awake: no pokes needed while we recompute
            now = trio.current_time()
            if now >= self.next_deadline():
                self.handle_timeout(now)

    # -- pacing ----------------------------------------------------------------------------

    def _schedule(self, at: float) -> None:
        self.pacer.schedule(at, self)

    def _output_queued(self) -> None:
        """The agent queued output (called from its task, or from the network loop for a
        synchronous frame handler): send what is due now."""
        pipeline = self.pipeline
        if pipeline is None:
            # No stream to play it on (a data-only session, a phone call waiting for its
            # answer): discarded, so the agent's drain() returns. (Passthrough has no
            # agent output.)
            while self.host.pop_output_frame() is not None:
                pass
            return
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
            log.exception("%s %s: sending failed; ending it", self.noun, self.id)
            self.end("internal-error")

    # -- the agent -------------------------------------------------------------------------

    def _begin_agent(self) -> None:
        """Media can flow: the agent task starts (now, or when :meth:`run` has its
        nursery). A synchronous frame handler and passthrough have no task."""
        if self._on_frame is not None or self.agent.passthrough:
            return
        self._agent_due = True
        if self._nursery is not None and not self._agent_started:
            self._agent_started = True
            self._nursery.start_soon(self._run_agent)

    async def _run_agent(self) -> None:
        try:
            await self.agent.run(self.ctx)
        except Exception:
            log.exception("%s %s: agent %s failed", self.noun, self.id,
                          loggable_url(self.agent.name))
            self.end("agent-error")
            return
        # The agent is done: let its last words play out, then hang up.
        await self.host.wait_drained()
        if not self._ended and self._core_end_reason() is None:
            self.end("agent-done")

    def _agent_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session.end":
            reason = event.get("reason")
            self.end(f"agent: {reason}" if isinstance(reason, str) else "agent-hangup")
        elif kind in ("transcript.user.final", "transcript.agent"):
            text = event.get("text")
            if isinstance(text, str) and text:
                who = "user" if kind == "transcript.user.final" else "agent"
                self._transcript.append({"who": who, "text": text[:1000],
                                         "at": round(time.time(), 3)})
        elif kind == "turn.metrics":
            line = turn_line(event)
            if line is not None:
                self._turns.append(line)
        elif kind == "media.update" and self.pipeline is not None:
            nr = event.get("noise_reduction")  # Realtime session.update (realtime/agent.py)
            if nr is None or nr in NOISE_REDUCTION:
                self.pipeline.stages.set_noise_reduction(nr)
        elif not self._agent_op(kind, event):
            log.debug("%s %s agent event %s", self.noun, self.id, kind)

    # -- lifecycle -------------------------------------------------------------------------

    ctx: AgentContext

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The call's tasks, until it ends. Never raises (except Cancelled)."""
        try:
            with self._cancel:
                # The codec states, now that `create` has answered: the two libopus states
                # cost ~0.1-0.3 ms, and made inside `create` they held up its answer
                # (docs/performance.md, "Setup time").
                if self.pipeline is not None:
                    _ = self.pipeline.decoder, self.pipeline.encoder
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._timer_loop)
                    if self._own_pacer and self.pipeline is not None:
                        nursery.start_soon(self.pacer.run)
                    if self._agent_due:
                        self._begin_agent()
                    task_status.started()
        except Exception:
            log.exception("%s %s crashed", self.noun, self.id)
            self.end("internal-error")
        finally:
            self._nursery = None
            self.end(self._core_end_reason() or "shutdown")

    def end(self, reason: str) -> None:
        """End the call (idempotent): the core closed (close_notify, RTCP BYE), the agent
        told, tasks cancelled."""
        if self._ended:
            return
        try:
            self._close_core(reason)  # its Ended runs _teardown
        except Exception:  # a broken DTLS state must not stop the teardown
            log.exception("%s %s: closing its leg failed", self.noun, self.id)
        self._teardown(self._core_end_reason() or reason)  # (if the core had ended before)

    def _teardown(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        self.ended_at = time.time()
        self._core_teardown(reason)
        self.host.push_event({"type": "session.ended", "reason": reason})
        self.host.close(reason)
        if self.pipeline is not None:
            self.pipeline.close()
        self._cancel.cancel()
        log.info("%s %s ended: %s", self.noun, self.id, reason)
        self._on_end(self)

    # -- the session object ----------------------------------------------------------------

    def info(self) -> SessionInfo:
        return SessionInfo(
            id=self.id, transceiver=self.transceiver, agent=self.agent.name,
            created_at=round(self.created_at, 3),
            ended_at=round(self.ended_at, 3) if self.ended_at else None,
            media=self.pipeline.stages.describe() if self.pipeline is not None else None,
            transcript=tuple(self._transcript) if self._transcript else None,
            turns=tuple(self._turns) if self._turns else None, kind=self.kind,
            **self._figures(), **self._core_info())

    def describe(self) -> dict[str, Any]:
        return self.info().to_json()
