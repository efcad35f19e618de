"""The media-leg seam (transceiver/leg.py): the PCM pipeline and passthrough talk to a
``MediaLeg`` only, so a leg that is not a WebRTC call drives them unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from appliance.agents import AgentContext, AgentHost, AgentIdentity, resolve
from appliance.transceiver.call import ServerCall
from appliance.transceiver.leg import MediaLeg, MediaStream
from appliance.transceiver.media import PcmPipeline
from appliance.transceiver.opus import FRAME_BYTES, OpusEncoder
from appliance.transceiver.passthrough import PassthroughStream


@dataclass
class FakeLeg:
    """A leg with no transport at all: what it is asked to send is recorded."""

    ssrc: int = 0x1234
    payload_type: int | None = 111
    keyed: bool = True
    media: MediaStream | None = None
    sent: list[tuple[int, int, bool, bytes]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def can_send(self) -> bool:
        return self.keyed and not self.closed

    def send_rtp(self, now: float, seq: int, ts: int, marker: bool, payload: bytes) -> None:
        assert self.can_send()
        self.sent.append((seq, ts, marker, payload))

    def close(self, reason: str) -> None:
        self.closed.append(reason)


def _checks(leg: MediaLeg) -> MediaLeg:  # mypy: both kinds of leg satisfy the Protocol
    return leg


def test_server_call_and_fake_leg_are_media_legs() -> None:
    assert _checks(FakeLeg()).payload_type == 111
    assert callable(ServerCall.can_send) and callable(ServerCall.send_rtp)


def _tone() -> bytes:
    t = np.arange(960) / 48_000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    assert len(pcm) == FRAME_BYTES
    return pcm


def _pipeline(leg: FakeLeg, agent_name: str = "echo") -> tuple[PcmPipeline, list[float]]:
    scheduled: list[float] = []
    pipeline: PcmPipeline

    def output() -> None:
        pipeline.output_queued(now[0])

    now = [0.0]
    host = AgentHost(on_output=output)
    agent = resolve(agent_name)
    ctx = AgentContext(host, AgentIdentity(agent.name, "pcm", 0, {}))
    pipeline = PcmPipeline(leg, host, ctx, on_frame=agent.on_frame, schedule=scheduled.append)
    leg.media = pipeline
    return pipeline, scheduled


def test_pcm_echo_over_a_non_webrtc_leg() -> None:
    leg = FakeLeg()
    pipeline, scheduled = _pipeline(leg)
    enc = OpusEncoder()
    tone = _tone()
    for i in range(30):
        now = i * 0.02
        while scheduled and scheduled[0] <= now:
            pipeline.pace(now, scheduled.pop(0))
        payload = enc.encode(tone)
        plain = bytes(12) + payload
        pipeline.handle_rtp(now, plain, 0xBEEF, i, 960 * i, i == 0, 12, len(plain))
        deadline = pipeline.poll_timeout()
        if deadline is not None and deadline <= now:
            pipeline.handle_timeout(now)
    assert len(leg.sent) >= 20  # the echo came back through the leg
    seqs = [s for s, _, _, _ in leg.sent]
    assert len(set(seqs)) == len(seqs)
    assert all(payload for _, _, _, payload in leg.sent)
    assert pipeline.packetizer is not None


def test_nothing_is_encoded_while_the_leg_cannot_send() -> None:
    leg = FakeLeg(keyed=False)
    pipeline, _ = _pipeline(leg)
    pipeline.send_frame(0.0, _tone())
    assert leg.sent == []
    leg.keyed = True
    pipeline.send_frame(0.02, _tone())
    assert len(leg.sent) == 1


def test_passthrough_sends_through_the_leg() -> None:
    leg = FakeLeg()
    stream = PassthroughStream(leg)
    plain = bytes(12) + b"opus"
    stream.handle_rtp(0.0, plain, 0xBEEF, 7, 700, False, 12, len(plain))
    assert len(leg.sent) == 1 and leg.sent[0][2] is True and leg.sent[0][3] == b"opus"
