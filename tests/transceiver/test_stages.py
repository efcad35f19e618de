"""PCM stages (appliance/transceiver/stages/): chain order, removal mid-call, a failing stage
ends only itself, the recorder ring's bound and alignment, the level meter's numbers, the
per-call MediaConfig — on synthetic frames and through a real PcmPipeline on a virtual
network (tests/transceiver/call_pair.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from transceiver.call_pair import CallPair, Netem

from appliance.agents import AgentContext, AgentHost, AgentIdentity, Frame
from appliance.client.peer import RtpReceived
from appliance.session_info import SessionInfo
from appliance.transceiver.call import CallState
from appliance.transceiver.media import PcmPipeline
from appliance.transceiver.opus import OpusEncoder
from appliance.transceiver.stages import (
    FRAME_BYTES,
    CallStages,
    LevelMeter,
    MediaConfig,
    RecorderTap,
    StageChain,
    VadConfig,
)
from appliance.transceiver.stages.config import MAX_RECORDER_SECONDS


def tone(amplitude: float = 8000.0, freq: float = 440.0, n: int = 960) -> bytes:
    t = np.arange(n) / 48_000
    return (np.sin(2 * np.pi * freq * t) * amplitude).astype("<i2").tobytes()


class Tag:
    """Logs its name for every frame; optionally transforms (samples -> f(samples))."""

    def __init__(self, name: str, log: list[str],
                 fn: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.name = name
        self.log = log
        self.fn = fn
        self.closed = 0

    def process(self, pcm: bytes, now: float) -> bytes:
        self.log.append(self.name)
        if self.fn is None:
            return pcm
        x = np.frombuffer(pcm, "<i2").astype(np.int32)
        return np.clip(self.fn(x), -32768, 32767).astype("<i2").tobytes()

    def close(self) -> None:
        self.closed += 1

    def stats(self) -> dict[str, Any]:
        return {"seen": self.log.count(self.name)}


class Boom(Tag):
    def __init__(self, name: str, log: list[str], after: int) -> None:
        super().__init__(name, log)
        self.after = after

    def process(self, pcm: bytes, now: float) -> bytes:
        super().process(pcm, now)
        if self.log.count(self.name) > self.after:
            raise RuntimeError("the native library fell over")
        return pcm


# -- the chain ---------------------------------------------------------------------------


def test_chain_runs_stages_in_order_and_composes() -> None:
    log: list[str] = []
    chain = StageChain("in", [Tag("plus", log, lambda x: x + 100),
                              Tag("double", log, lambda x: x * 2)])
    out = chain.run(bytes(FRAME_BYTES), 0.0)
    assert log == ["plus", "double"]
    assert set(np.frombuffer(out, "<i2").tolist()) == {200}  # (0 + 100) * 2, not 0 * 2 + 100
    chain.add(Tag("first", log), 0)
    log.clear()
    chain.run(bytes(FRAME_BYTES), 0.0)
    assert log == ["first", "plus", "double"]
    with pytest.raises(ValueError, match="already"):
        chain.add(Tag("plus", log))


def test_removal_between_frames_and_from_inside_a_frame() -> None:
    log: list[str] = []
    a, b, c = Tag("a", log), Tag("b", log), Tag("c", log)
    chain = StageChain("in", [a, b, c])
    chain.run(bytes(FRAME_BYTES), 0.0)
    assert chain.remove("b") is b and b.closed == 1
    assert chain.remove("b") is None
    log.clear()
    chain.run(bytes(FRAME_BYTES), 0.02)
    assert log == ["a", "c"]

    # A stage that removes a later one while the frame is in flight: this frame finishes
    # on the old list, the next one skips it.
    class Remover(Tag):
        def process(self, pcm: bytes, now: float) -> bytes:
            chain.remove("c")
            return super().process(pcm, now)

    chain.add(Remover("r", log), 0)
    log.clear()
    chain.run(bytes(FRAME_BYTES), 0.04)
    assert log == ["r", "a", "c"]
    log.clear()
    chain.run(bytes(FRAME_BYTES), 0.06)
    assert log == ["r", "a"]


def test_a_raising_stage_is_removed_and_counted_and_the_frame_goes_on() -> None:
    log: list[str] = []
    boom = Boom("boom", log, after=2)
    chain = StageChain("in", [Tag("plus", log, lambda x: x + 7), boom,
                              Tag("after", log)])
    for i in range(5):
        out = chain.run(bytes(FRAME_BYTES), i * 0.02)
        # The failing frame still reaches the rest of the chain with the last good value.
        assert set(np.frombuffer(out, "<i2").tolist()) == {7}
    assert chain.names() == ["plus", "after"]
    assert chain.failures == 1 and chain.failed == {"boom": "RuntimeError"}
    assert boom.closed == 1
    assert log.count("after") == 5  # every frame, the failing one included
    assert log.count("boom") == 3


def test_a_stage_that_changes_the_frame_length_is_a_failure() -> None:
    class Short(Tag):
        def process(self, pcm: bytes, now: float) -> bytes:
            return pcm[:100]

    chain = StageChain("out", [Short("short", [])])
    pcm = tone()
    assert chain.run(pcm, 0.0) == pcm
    assert chain.failed == {"short": "bad-frame-length"} and not chain.stages


def test_a_stage_whose_close_raises_still_leaves() -> None:
    class BadClose(Tag):
        def close(self) -> None:
            raise OSError("double free")

    chain = StageChain("in", [BadClose("x", [])])
    assert chain.remove("x") is not None
    assert not chain.stages


# -- the level meter ---------------------------------------------------------------------


def test_level_meter_reports_rms_and_peak_of_a_sine() -> None:
    meter = LevelMeter("in", every=1)
    amp = 8000.0
    for i in range(50):
        assert meter.process(tone(amp), i * 0.02) is not None
    s = meter.stats()
    assert s["frames"] == 50
    assert s["rms_dbfs"] == pytest.approx(20 * math.log10(amp / 32768 / math.sqrt(2)), abs=0.2)
    assert s["peak_dbfs"] == pytest.approx(20 * math.log10(amp / 32768), abs=0.1)
    assert s["clipped"] == 0
    # Silence: the smoothed RMS falls, the peak hold falls at 20 dB/s.
    for i in range(25):
        meter.process(bytes(FRAME_BYTES), 1.0 + i * 0.02)
    # One-pole smoothing, alpha 0.06 per frame: 25 frames of silence take 0.94 ** 25.
    expect = 10 * math.log10(10 ** (s["rms_dbfs"] / 10) * 0.94 ** 25)
    assert meter.stats()["rms_dbfs"] == pytest.approx(expect, abs=0.2)
    assert meter.stats()["peak_dbfs"] == pytest.approx(s["peak_dbfs"] - 25 * 0.4, abs=0.1)
    assert meter.stats()["max_peak_dbfs"] == s["peak_dbfs"]
    for _ in range(500):
        meter.process(bytes(FRAME_BYTES), 0.0)
    assert meter.stats()["rms_dbfs"] == -120.0 and meter.stats()["peak_dbfs"] == -120.0


def test_level_meter_counts_clipped_frames() -> None:
    meter = LevelMeter("out", every=1)
    meter.process(np.full(960, -32768, "<i2").tobytes(), 0.0)
    meter.process(tone(40000.0 / 1.3), 0.02)  # 30769 peak: loud, not clipped
    assert meter.stats()["clipped"] == 1
    assert meter.stats()["max_peak_dbfs"] == 0.0


# -- the recorder tap --------------------------------------------------------------------


def test_recorder_ring_is_bounded_and_drops_the_oldest() -> None:
    tap = RecorderTap(max_frames=10)
    for i in range(25):
        tap.inbound.process(i.to_bytes(2, "little") * 960, i * 0.02)
    assert len(tap) == 10 and tap.dropped == 15
    frames = tap.drain(4)
    assert [int.from_bytes(f.pcm[:2], "little") for f in frames] == [15, 16, 17, 18]
    assert len(tap) == 6
    assert tap.stats() == {"buffered": 6, "max_frames": 10, "dropped": 15, "frames_in": 25,
                           "frames_out": 0}
    assert len(tap.drain()) == 6 and len(tap) == 0
    with pytest.raises(ValueError, match="at least one"):
        RecorderTap(max_frames=0)


def test_recorder_aligns_both_directions_on_one_sample_axis() -> None:
    tap = RecorderTap.for_seconds(1.0)
    assert tap.max_frames == 100
    tap.inbound.process(tone(), 10.000)
    tap.outbound.process(tone(), 10.005)
    tap.inbound.process(tone(), 10.020)
    tap.outbound.process(tone(), 10.250)  # the agent was silent in between
    got = [(f.direction, f.sample) for f in tap.drain()]
    assert got == [("in", 0), ("out", 240), ("in", 960), ("out", 12_000)]


# -- the per-call configuration ----------------------------------------------------------


def test_media_config_from_params() -> None:
    assert MediaConfig.from_params_untrusted(None) == MediaConfig()
    assert MediaConfig.from_params_untrusted({"other": 1}) == MediaConfig()
    cfg = MediaConfig.from_params_untrusted({"media": {
        "level_meter": False, "recorder_seconds": 30, "noise_reduction": "near_field",
        "echo_cancellation": True, "vad": {"margin_db": 9, "hangover_ms": 300}}})
    assert cfg.level_meter is False and cfg.recorder_seconds == 30.0
    assert cfg.noise_reduction == "near_field" and cfg.echo_cancellation is True
    assert cfg.vad == VadConfig(margin_db=9.0, min_dbfs=-50.0, hangover_frames=15)
    # The Realtime session's audio.input.noise_reduction; media's own setting wins.
    rt = {"session": {"audio": {"input": {"noise_reduction": {"type": "far_field"}}}}}
    assert MediaConfig.from_params_untrusted({"realtime": rt}).noise_reduction == "far_field"
    assert MediaConfig.from_params_untrusted(
        {"realtime": rt, "media": {"noise_reduction": None}}).noise_reduction is None
    assert MediaConfig.from_params_untrusted(
        {"realtime": {"session": {"audio": {"input": {"noise_reduction": None}}}}}
    ).noise_reduction is None


@pytest.mark.parametrize(("media", "message"), [
    ([], "media must be an object"),
    ({"recorder": 1}, "media.recorder is not"),
    ({"level_meter": 1}, "media.level_meter must be true or false"),
    ({"recorder_seconds": True}, "must be a number"),
    ({"recorder_seconds": float("nan")}, "must be a number"),
    ({"recorder_seconds": MAX_RECORDER_SECONDS + 1}, "between 0 and"),
    ({"noise_reduction": "loud"}, "near_field"),
    ({"vad": {"margin_db": 99}}, "margin_db"),
    ({"vad": {"x": 1}}, "media.vad.x"),
    ({"vad": 3}, "media.vad must be an object"),
])
def test_media_config_refuses_bad_params(media: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MediaConfig.from_params_untrusted({"media": media})


def test_call_stages_canonical_order_and_describe() -> None:
    log: list[str] = []
    cfg = MediaConfig(recorder_seconds=1.0, extra_in=(lambda: Tag("x-in", log),),
                      extra_out=(lambda: Tag("x-out", log),))
    stages = CallStages(cfg)
    assert stages.inbound.names() == ["recorder-in", "level-in", "x-in"]
    assert stages.outbound.names() == ["level-out", "x-out", "recorder-out"]
    stages.inbound.run(tone(), 0.0)
    d = stages.describe()
    assert d["levels"]["in"]["frames"] == 1 and d["levels"]["out"]["frames"] == 0
    assert d["stages"] == {"x-in": {"seen": 1}, "x-out": {"seen": 0}}
    assert d["recorder"]["frames_in"] == 1
    assert d["stage_failures"] == 0
    # The object round-trips through the one session-object definition.
    info = SessionInfo(id="s", transceiver=0, created_at=1.0, media=d)
    assert SessionInfo.from_json(info.to_json()).media == d
    with pytest.raises(ValueError, match="media must be"):
        SessionInfo.from_json({**info.to_json(), "media": [1]})
    empty = CallStages(MediaConfig(level_meter=False))
    assert empty.inbound.stages == [] and empty.outbound.stages == []
    assert empty.describe()["levels"] is None


# -- through a real pipeline -------------------------------------------------------------


class EchoCall:
    """An echo call on the virtual network whose frame handler records every frame the
    agent got, with the given media configuration."""

    def __init__(self, config: MediaConfig) -> None:
        self.pair = pair = CallPair(passthrough=False, net=Netem(delay=0.01))
        self.frames: list[Frame] = []
        scheduled: list[float] = []
        self.scheduled = scheduled

        def output() -> None:
            self.pipeline.output_queued(pair.now)

        host = AgentHost(on_output=output)
        ctx = AgentContext(host, AgentIdentity("recorder-echo", "stages", 0, {}))

        def on_frame(ctx: AgentContext, frame: Frame) -> None:
            self.frames.append(frame)
            ctx.send_nowait(frame.pcm)

        self.pipeline = PcmPipeline(pair.server, host, ctx, on_frame=on_frame,
                                    schedule=scheduled.append, config=config)
        pair.server.media = self.pipeline
        assert pair.run_until(self._connected, within=1.0)

    def _connected(self) -> bool:
        return self.pair.server.state is CallState.CONNECTED

    def run(self, packets: int, pcm: bytes, each: Callable[[int], None] | None = None) -> None:
        enc = OpusEncoder()
        pair = self.pair
        ticks = sent = 0
        base = getattr(self, "_sent", 0)

        def tick(now: float) -> None:
            nonlocal ticks, sent
            while self.scheduled and self.scheduled[0] <= now:
                self.pipeline.pace(now, self.scheduled.pop(0))
            ticks += 1
            if ticks % 4 == 1 and sent < packets:
                n = base + sent
                pair.client.send_rtp(enc.encode(pcm), (960 * n) & 0xFFFFFFFF, marker=not n)
                sent += 1
                if each is not None:
                    each(sent)

        pair.tick, pair.tick_every = tick, 0.005
        pair.run_for(packets * 0.02 + 0.3)
        self._sent = base + packets

    def echoes(self) -> int:
        return sum(isinstance(e, RtpReceived) for e in self.pair.client_events)


def test_pipeline_runs_both_chains_and_the_vad_sees_the_processed_audio() -> None:
    log: list[str] = []
    mute = Tag("mute", log, lambda x: x * 0)
    call = EchoCall(MediaConfig(extra_in=(lambda: mute,), extra_out=(lambda: Tag("o", log),)))
    call.run(30, tone(8000.0))
    assert len(call.frames) >= 25
    # The agent and the VAD got the muted frames: no speech though a loud tone came in.
    assert all(f.pcm == bytes(FRAME_BYTES) and not f.speech for f in call.frames)
    assert all(f.level_dbfs == -120.0 for f in call.frames)
    assert log.count("o") >= 20 and call.echoes() >= 20
    media = call.pipeline.stages.describe()
    # The in meter sits before the extras: it saw the tone, the out meter the muted echo.
    assert media["levels"]["in"]["peak_dbfs"] > -13
    assert media["levels"]["out"]["rms_dbfs"] < -60


def test_pipeline_removal_mid_call() -> None:
    log: list[str] = []
    call = EchoCall(MediaConfig(extra_in=(lambda: Tag("t", log),)))

    def each(n: int) -> None:
        if n == 10:
            assert call.pipeline.stages.inbound.remove("t") is not None

    call.run(30, tone())
    seen = log.count("t")
    assert seen >= 25
    log.clear()
    call.run(30, tone(), each)
    assert 5 <= log.count("t") <= 12  # up to the removal (give or take the jitter buffer)
    assert len(call.frames) >= 55 and call.echoes() >= 50  # the call went on


def test_pipeline_stage_failure_ends_only_the_stage() -> None:
    log: list[str] = []
    call = EchoCall(MediaConfig(extra_in=(lambda: Boom("boom", log, after=5),),
                                extra_out=(lambda: Boom("boom-out", log, after=3),)))
    call.run(50, tone())
    assert call.pair.server.state is CallState.CONNECTED
    stages = call.pipeline.stages
    assert stages.inbound.failures == 1 and stages.outbound.failures == 1
    assert stages.describe()["failed"] == {"boom": "RuntimeError", "boom-out": "RuntimeError"}
    assert stages.describe()["stage_failures"] == 2
    assert len(call.frames) >= 45 and call.echoes() >= 40  # every frame after the failure too
    assert log.count("boom") == 6 and log.count("boom-out") == 4


def test_pipeline_recorder_taps_raw_in_and_sent_out() -> None:
    call = EchoCall(MediaConfig(recorder_seconds=10.0,
                                extra_in=(lambda: Tag("halve", [], lambda x: x // 2),)))
    call.run(20, tone(8000.0))
    tap = call.pipeline.stages.recorder
    assert tap is not None
    frames = tap.drain()
    ins = [f for f in frames if f.direction == "in"]
    outs = [f for f in frames if f.direction == "out"]
    assert len(ins) >= 15 and len(outs) >= 15
    peak_in = max(int(np.abs(np.frombuffer(f.pcm, "<i2")).max()) for f in ins)
    peak_out = max(int(np.abs(np.frombuffer(f.pcm, "<i2")).max()) for f in outs)
    assert peak_in > 6000  # raw: before the halving stage
    assert peak_out < 0.6 * peak_in  # what was sent: the echo of the halved frames
    samples = [f.sample for f in ins]
    assert samples == sorted(samples) and samples[0] >= 0
    call.pipeline.close()
    assert call.pipeline.stages.inbound.stages == []


def test_a_speech_option_without_its_library_is_reported_not_fatal(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from appliance.transceiver.stages import aec, denoise

    def missing(module: str) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            raise ImportError(f"No module named 'lib_for_{module}'")
        return make

    # Each speech stage's module loads its library when the stage is made.
    monkeypatch.setattr(aec, "make_echo_canceller", missing("aec"))
    monkeypatch.setattr(denoise, "make_denoiser", missing("denoise"))
    stages = CallStages(MediaConfig(noise_reduction="far_field", echo_cancellation=True))
    assert stages.inbound.names() == ["level-in"]
    un = stages.describe()["unavailable"]
    assert set(un) == {"noise_reduction", "echo_cancellation"}
    assert "appliance[speech]" in un["noise_reduction"] and "lib_for_denoise" in un[
        "noise_reduction"]
    assert stages.inbound.run(tone(), 0.0) == tone()  # the call's audio goes on untouched


def test_level_meter_samples_one_frame_in_every() -> None:
    meter = LevelMeter("in")  # the default: one in four
    for i in range(40):
        meter.process(tone(8000.0 if i % 4 == 3 else 100.0), i * 0.02)
    s = meter.stats()
    assert s["frames"] == 40 and s["measured"] == 10
    # Only the measured (loud) frames count: a steady sine's level, as if every frame was.
    assert s["rms_dbfs"] == pytest.approx(20 * math.log10(8000 / 32768 / math.sqrt(2)), abs=0.2)


def test_silero_vad_chosen_per_call_flags_speech_not_silence() -> None:
    """``media.vad.kind = "silero"`` puts Silero VAD (the speech extra) where the energy VAD
    was: espeak-ng speech is flagged, silence is not; a bad kind or threshold is refused."""
    from speech.speech_support import espeak_pcm48

    from appliance.speech.vad import SileroVad

    cfg = MediaConfig.from_params_untrusted({"media": {"vad": {"kind": "silero",
                                                               "threshold": 0.6}}})
    assert (cfg.vad.kind, cfg.vad.threshold) == ("silero", 0.6)
    vad = cfg.vad.make()
    assert isinstance(vad, SileroVad) and vad.threshold == 0.6
    frame = 1920
    assert not any(vad.update(bytes(frame)) for _ in range(25))
    speech = espeak_pcm48("the quick brown fox jumps over the lazy dog")
    flags = [vad.update(speech[i : i + frame]) for i in range(0, len(speech) - frame + 1, frame)]
    assert sum(flags) >= len(flags) // 3, (sum(flags), len(flags))
    assert MediaConfig.from_params_untrusted({"media": {}}).vad.kind == "energy"
    for bad in ({"kind": "webrtc"}, {"threshold": 1.0}, {"threshold": 0}):
        with pytest.raises(ValueError, match="media.vad"):
            MediaConfig.from_params_untrusted({"media": {"vad": bad}})
