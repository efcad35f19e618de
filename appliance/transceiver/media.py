"""The PCM media pipeline of one call: the ``media`` slot of the call's media leg
(:class:`~appliance.transceiver.leg.MediaLeg`: ICE + DTLS-SRTP's
:class:`~appliance.transceiver.call.ServerCall`, or a phone call's
:class:`~appliance.transceiver.rtp_leg.RtpLeg`) for every agent that takes audio; it does
not know which.

::

    in:   RTP payload ─► JitterBuffer ─► Opus decode (FEC / PLC for holes) ─► 20 ms frames
                         ─► in stages ─► EnergyVad ─► agent (a synchronous frame handler,
                            or the queue its task reads)
    out:  agent output queue ─► pump: Packetizer (20 ms schedule) ─► out stages
                         ─► Opus encode ─► leg.send_rtp (RTP header, SRTP)

The stages (recorder tap, echo canceller, noise suppressor, level meter: stages/) and the
VAD's knobs and codec complexity come from the call's one :class:`MediaConfig`. An empty
chain is skipped with one truth test per packet, so the bare echo path pays nothing for it.

Outbound frames leave the moment they are queued *if they are due*, from the task that
queued them (the network loop, for the built-in echo whose frame handler runs inside
:meth:`PcmPipeline.handle_rtp`); an early frame is left to the transceiver's shared pacer
(``schedule(at)``, supplied by the shell), which calls back :meth:`PcmPipeline.pace` at its
due time. So the echo path — decode, agent, encode, send — runs without a task switch per
packet (docs/performance.md, "Transceiver").

The codec states are made on first use (:attr:`decoder`, :attr:`encoder`): the shell
makes them once the answer is on its way, not while ``create`` holds up the answers queued
behind it (docs/performance.md, "Setup time").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from appliance.agents import AgentContext, AgentHost, EnergyVad, Frame
from appliance.agents.registry import FrameFn
from appliance.audio import g711
from appliance.logs import loggable_url

from .jitter import JitterBuffer
from .leg import MediaLeg
from .opus import FRAME_BYTES, Decoder, Encoder, OpusDecoder, OpusEncoder
from .packetizer import Packetizer
from .stages import CallStages, MediaConfig

log = logging.getLogger(__name__)

#: A lone outbound frame may leave this much before its due time (packetizer.py: lets the
#: schedule settle on the source's phase instead of making early arrivals wait).
EARLY = 0.002
SAMPLE_RATE = 48_000
#: PCM16 mono bytes per second (``Frame.pts`` steps of a sample are 1/96 000 s of bytes).
_BYTES_PER_SECOND = 2 * SAMPLE_RATE


class PcmPipeline:
    """Jitter → decode → VAD → agent in; pacer pump → packetizer → encode out."""

    def __init__(
        self,
        leg: MediaLeg,
        host: AgentHost,
        ctx: AgentContext,
        *,
        on_frame: FrameFn | None,
        schedule: Callable[[float], None],
        agent_name: str = "",
        config: MediaConfig | None = None,
        codec: str = "opus",
    ) -> None:
        config = config if config is not None else MediaConfig()
        self.config = config
        self.leg = leg
        self.host = host
        self.ctx = ctx
        self._on_frame = on_frame  # a synchronous frame handler (no agent task), or None
        self._schedule_at = schedule
        self._agent_name = agent_name
        # "opus", or a G.711 law ("pcmu"/"pcma", g711.py) when the offer had no Opus: its
        # RTP clock is 8 kHz, so timestamps step 160 per 20 ms packet instead of 960.
        self.codec = codec
        self._clock = SAMPLE_RATE if codec == "opus" else g711.RATE
        step = self._clock // 50
        self.jitter = JitterBuffer(samples_per_frame=step)
        # The call asks after every RTP packet (its jitter-hole deadline): the buffer's own
        # method, one Python call instead of two (same answer as the method below).
        self.poll_timeout = self.jitter.poll_timeout  # type: ignore[method-assign]
        self.vad: EnergyVad = config.vad.make()
        #: The call's two stage chains (``stages.inbound`` / ``stages.outbound``).
        self.stages = CallStages(config, label=ctx.session_id)
        assert leg.payload_type is not None, "a data-only call has no audio pipeline"
        self.packetizer = Packetizer(leg.ssrc, leg.payload_type, early=EARLY, samples_per_frame=step)
        self._opus_complexity = config.opus_complexity
        self._decoder: Decoder | None = None
        self._encoder: Encoder | None = None
        self._first_media_ts: int | None = None
        self.pace_at: float | None = None  # when the pacer is due to call us back

    @property
    def decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = OpusDecoder() if self.codec == "opus" else g711.G711Decoder(self.codec)
        return self._decoder

    @decoder.setter
    def decoder(self, value: Decoder) -> None:  # benchmarks stub the codec
        self._decoder = value

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            self._encoder = (OpusEncoder(complexity=self._opus_complexity) if self.codec == "opus"
                             else g711.G711Encoder(self.codec))
        return self._encoder

    @encoder.setter
    def encoder(self, value: Encoder) -> None:
        self._encoder = value

    # -- in (the MediaStream slot) ---------------------------------------------------------

    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None:
        self.jitter.push(now, seq, ts, plain[off:end])
        self._drain_jitter(now)

    def poll_timeout(self) -> float | None:
        return self.jitter.poll_timeout()

    def handle_timeout(self, now: float) -> None:
        self.jitter.handle_timeout(now)
        self._drain_jitter(now)

    def set_complexity(self, complexity: int) -> None:
        """The transceiver's complexity controller stepped (degrade.py): the encoder, or the
        one made on first use, encodes at ``complexity`` from the next frame on."""
        self._opus_complexity = complexity
        if self._encoder is not None:
            self._encoder.set_complexity(complexity)

    def set_expected_loss(self, loss: float) -> None:
        """The client's reported loss (RTCP): more in-band FEC in our packets when high."""
        self.encoder.set_expected_loss(round(loss * 100))

    def _drain_jitter(self, now: float) -> None:
        jb = self.jitter
        host = self.host
        decoder = self._decoder if self._decoder is not None else self.decoder
        on_frame = self._on_frame
        vad = self.vad
        ctx = self.ctx
        chain = self.stages.inbound
        run_stages = chain.run if chain.stages else None  # empty: not even a call per frame
        while (item := jb.poll()) is not None:
            if item.payload is None:
                # Opus FEC when the next packet is already here (its in-band copy of this
                # frame), Opus PLC otherwise.
                nxt = jb.peek()
                fec = nxt.payload if nxt is not None and nxt.seq == item.seq + 1 else None
                pcm = decoder.conceal(fec)
                concealed = True
            else:
                pcm = decoder.decode(item.payload)
                concealed = False
            if self._first_media_ts is None:
                self._first_media_ts = item.timestamp
            base = ((item.timestamp - self._first_media_ts) & 0xFFFFFFFF) / self._clock
            if len(pcm) == FRAME_BYTES:  # WebRTC's 20 ms ptime: one frame, no slicing
                chunks: Iterable[tuple[int, bytes]] = ((0, pcm),)
            else:  # longer packets (40-120 ms) come out as several 20 ms frames
                chunks = ((i, pcm[i : i + FRAME_BYTES])
                          for i in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES))
            for i, chunk in chunks:
                if run_stages is not None:
                    chain.media_time = base + i / _BYTES_PER_SECOND
                    chunk = run_stages(chunk, now)
                speech = vad.update(chunk)
                frame = Frame(chunk, base + i / _BYTES_PER_SECOND, now, speech, vad.last_level,
                              concealed)
                if on_frame is None:
                    host.push_frame(frame)
                    continue
                try:
                    on_frame(ctx, frame)
                except Exception:
                    log.exception("session %s: agent %s failed", ctx.session_id,
                                  loggable_url(self._agent_name))
                    self.leg.close("agent-error")
                    return

    # -- out ---------------------------------------------------------------------------------

    def send_frame(self, now: float, pcm: bytes, backlog: int = 0) -> None:
        """Encode and send one 20 ms frame now (the pump decided it is due)."""
        if self.leg.can_send():
            self._send_frame(now, pcm, backlog)

    def _send_frame(self, now: float, pcm: bytes, backlog: int) -> None:
        """:meth:`send_frame` once the caller has seen ``can_send()`` (the pump checks it
        once per call, not once more per frame)."""
        leg = self.leg
        if self.stages.outbound.stages:
            pcm = self.stages.outbound.run(pcm, now)
        seq, ts, marker = self.packetizer.next_header(now, backlog)
        leg.send_rtp(now, seq, ts, marker, self.encoder.encode(pcm))

    def output_queued(self, now: float) -> None:
        """The agent queued output: send what is due now (unless the pacer is calling back
        anyway)."""
        if self.pace_at is None:
            self.pump(now, False)

    def pace(self, now: float, at: float) -> None:
        """The shared pacer's call-back (see :meth:`Pacer.schedule`)."""
        if at != self.pace_at or not self.leg.can_send():
            return  # stale: rescheduled since, or over
        self.pace_at = None
        self.pump(now, True)

    def pump(self, now: float, from_pacer: bool) -> None:
        """Send every queued frame that is due at ``now``; have the pacer call back for the
        next one. A trailing partial frame is sent (zero-padded) only from the pacer's
        call-back, so a producer that queues a frame in pieces gets to finish it."""
        host = self.host
        pk = self.packetizer
        if not self.leg.can_send():
            return  # agents start on connection; nothing is sent before or after
        while host.has_output():
            whole = host.queued_frames
            backlog = whole - 1 if whole else 0
            if not pk.ready(now, backlog):
                due = pk.poll_timeout(backlog)
                assert due is not None
                self._schedule(due)
                return
            if not whole and not from_pacer:
                self._schedule(now)
                return
            pcm = host.pop_output_frame()
            if pcm is None:  # pragma: no cover - has_output() said there was some
                return
            self._send_frame(now, pcm, host.queued_frames)

    def close(self) -> None:
        """The call ended: the stages free their native state (the recorder ring stays
        readable through :attr:`stages`)."""
        self.stages.close()

    def _schedule(self, at: float) -> None:
        if self.pace_at is not None and self.pace_at <= at:
            return
        self.pace_at = at
        self._schedule_at(at)
