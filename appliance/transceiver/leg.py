"""The media-leg seam: what carries a call's RTP, as the PCM pipeline (and passthrough)
sees it. The pipeline does not know whether the audio arrives over ICE + DTLS-SRTP (a
WebRTC call, :class:`~appliance.transceiver.call.ServerCall`) or over plain RTP /
SDES-keyed SRTP on a given remote address (a SIP trunk's leg); it talks to a
:class:`MediaLeg` outward and is a :class:`MediaStream` inward.

::

                         ┌──────────────────── a MediaLeg ─────────────────────┐
    network datagram ──► │ transport (ICE+DTLS, or a fixed remote address)     │
                         │ unprotect (SRTP keyed by DTLS-SRTP / SDES, or none) │
                         │ RTP header fields, payload type == payload_type,    │
                         │ reception stats (RTCP)                              │
                         └──────┬──────────────────────────────▲───────────────┘
            media.handle_rtp(now, plain, ssrc, seq, ts,        │ leg.send_rtp(now, seq, ts,
                             marker, off, end)                 │              marker, payload)
                   (a direct call per packet, no event object) │ only while leg.can_send()
                                ▼                              │
                         ┌─────────────── a MediaStream (the leg's media slot) ─┐
                         │ PcmPipeline: jitter → decode → … → agent → … → encode │
                         │ or PassthroughStream                                 │
                         └──────────────────────────────────────────────────────┘
                            on a fatal agent error: leg.close("agent-error")

Contract of a leg (every implementation, sans-IO: no I/O, no clock, ``now`` passed in):

* ``ssrc`` and ``payload_type``: our outbound stream's SSRC and the RTP payload type of
  the negotiated audio codec (Opus's dynamic pt, or 0/8 for G.711). ``payload_type`` is
  None only for a leg that carries no audio (a data-only WebRTC session); a pipeline is
  never built on such a leg.
* ``can_send()``: True when a packet given to ``send_rtp`` now would go out: keys are in
  place (or the leg is unencrypted), there is a destination, and the leg has not ended.
  The pipeline checks it before encoding so no codec work is wasted.
* ``send_rtp(now, seq, ts, marker, payload)``: one packet of our stream; the leg writes the
  plain 12-byte RTP header (``ssrc``, ``payload_type``), protects it if keyed, counts it for
  RTCP and queues it for its shell. When ``can_send()`` is False it drops it silently.
* ``close(reason)``: end the call (idempotent); the reason reaches the session object.
* Inbound: each authenticated RTP packet of ``payload_type`` is handed, decrypted, to the
  leg's ``media`` slot by a direct :meth:`MediaStream.handle_rtp` call; the leg drives the
  slot's timer (:meth:`MediaStream.poll_timeout` / :meth:`MediaStream.handle_timeout`) from
  its own. Packets of other payload types (telephone-event, CN) are counted and dropped.
"""

from __future__ import annotations

from typing import Protocol


class MediaStream(Protocol):
    """What a leg's ``media`` slot holds. ``handle_rtp`` gets each authenticated RTP packet
    of the leg's payload type, decrypted: ``plain[off:end]`` is the payload. It answers with
    :meth:`MediaLeg.send_rtp` (now, or later from the shell's pacer)."""

    def handle_rtp(self, now: float, plain: bytes, ssrc: int, seq: int, ts: int,
                   marker: bool, off: int, end: int) -> None: ...

    def poll_timeout(self) -> float | None: ...

    def handle_timeout(self, now: float) -> None: ...


class MediaLeg(Protocol):
    """What carries one call's RTP, as its media slot sees it (see the module docstring).
    ``media`` is the slot the shell plugs the pipeline into (None: inbound RTP is counted
    and dropped)."""

    media: MediaStream | None

    @property
    def ssrc(self) -> int: ...

    @property
    def payload_type(self) -> int | None: ...

    def can_send(self) -> bool: ...

    def send_rtp(self, now: float, seq: int, ts: int, marker: bool, payload: bytes) -> None: ...

    def close(self, reason: str) -> None: ...
