"""Call recordings (transceiver/recording.py, appliance/recordings.py): both directions of
the recorder tap laid side by side on one time axis (a gap in one direction is silence, a
burst of inbound frames stays contiguous), the WAV written off the loop and valid at every
moment, the quota and a full disk ending the recording but not the tap (the call), the
retention pruning, and the flags' parsers."""

from __future__ import annotations

import errno
import json
import os
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import trio

from appliance import recordings
from appliance.transceiver.recording import (
    TOLERANCE,
    CallRecording,
    RecordingSettings,
    StereoAligner,
    wav_header,
)
from appliance.transceiver.stages.base import FRAME_SAMPLES, SAMPLE_RATE
from appliance.transceiver.stages.recorder import RecorderTap, TapFrame

N = FRAME_SAMPLES


def frame(value: int) -> bytes:
    """A 20 ms frame whose every sample is ``value`` (so positions can be read back)."""
    return np.full(N, value, "<i2").tobytes()


def stereo(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").reshape(-1, 2)


# -- alignment ---------------------------------------------------------------------------


def test_aligner_keeps_bursts_contiguous_and_turns_a_gap_into_silence() -> None:
    al = StereoAligner()
    # Inbound: 20 frames, but the jitter buffer hands over frames 5..9 all at frame 9's
    # instant (a burst): they must still follow each other.
    for i in range(20):
        at = 9 if 5 <= i <= 9 else i
        al.add(TapFrame("in", at * 0.02, at * N, frame(100 + i)))
    # Outbound: frames 0..4, then the agent is silent for 10 frames, then frames 15..19.
    for i in [*range(5), *range(15, 20)]:
        al.add(TapFrame("out", i * 0.02, i * N, frame(-(100 + i))))
    out = stereo(al.take(final=True))
    assert out.shape == (20 * N, 2)
    left = out[:, 0].reshape(20, N)
    right = out[:, 1].reshape(20, N)
    assert list(left[:, 0]) == [100 + i for i in range(20)]  # every frame in its slot
    assert (left == left[:, :1]).all()  # and whole (no frame overlapping another)
    assert list(right[:5, 0]) == [-(100 + i) for i in range(5)]
    assert not right[5:15].any()  # the agent's silence
    assert list(right[15:, 0]) == [-(100 + i) for i in range(15, 20)]


def test_aligner_commits_only_what_can_no_longer_change() -> None:
    al = StereoAligner()
    for i in range(10):
        al.add(TapFrame("in", i * 0.02, i * N, frame(1)))
    first = stereo(al.take())
    # Everything up to the newest sample less the tolerance, nothing beyond.
    assert len(first) == 10 * N - TOLERANCE
    # The agent's first frame arrives now, late by less than the tolerance: it still lands
    # at its own place (right channel), after what was committed.
    al.add(TapFrame("out", 9 * 0.02, 9 * N, frame(7)))
    rest = stereo(al.take(final=True))
    both = np.concatenate([first, rest])
    assert len(both) == 10 * N
    assert (both[:, 0] == 1).all()
    assert (both[9 * N :, 1] == 7).all() and not both[: 9 * N, 1].any()
    assert al.late == 0


def test_aligner_follows_a_direction_that_jumps_ahead() -> None:
    """A frame far later than its direction's cursor (packets lost for 200 ms) is laid at
    its own sample: the gap is silence and the two directions stay in step."""
    al = StereoAligner()
    al.add(TapFrame("in", 0.0, 0, frame(5)))
    al.add(TapFrame("in", 0.22, 11 * N, frame(6)))
    al.add(TapFrame("out", 0.22, 11 * N, frame(9)))
    out = stereo(al.take(final=True))
    assert len(out) == 12 * N
    assert (out[:N, 0] == 5).all() and not out[N : 11 * N].any()
    assert (out[11 * N :, 0] == 6).all() and (out[11 * N :, 1] == 9).all()


def test_aligner_pulls_back_the_burst_after_a_stall_longer_than_the_tolerance() -> None:
    """The loop stalls 300 ms (15 frames): frames 5..19 reach the tap at frame 19's instant.
    Frame 5 looks like a gap, but the burst behind it shows the run was put too late: it
    is moved back into that silence, so frames 20.. land within the tolerance of their own
    place instead of 280 ms late for the rest of the call (CI, 2026-12-06: the echo's
    recorded lag -200 ms). Nothing is lost."""
    al = StereoAligner()
    for i in range(40):
        at = 19 if 5 <= i <= 19 else i
        al.add(TapFrame("in", at * 0.02, at * N, frame(100 + i)))
    out = stereo(al.take(final=True))[:, 0]
    slots = {int(v): k for k, v in enumerate(out[::N]) if v}
    assert sorted(slots) == [100 + i for i in range(40)] and al.skipped == 0
    for i in range(20, 40):
        assert slots[100 + i] - i <= TOLERANCE // N, (i, slots[100 + i])
    assert all(slots[100 + i] == i for i in range(5))


def test_aligner_pulls_back_across_take_boundaries_and_keeps_both_channels() -> None:
    """The same stall in the out direction only (the agent's frames 5..19 reach the tap
    together at frame 19's instant), the in direction steady, and takes between the ticks:
    the left channel is untouched, the right lands within the tolerance."""
    al = StereoAligner()
    chunks = []
    for t in range(40):
        al.add(TapFrame("in", t * 0.02, t * N, frame(1)))
        for i in ([] if 5 <= t < 19 else range(5, 20) if t == 19 else [t]):
            al.add(TapFrame("out", t * 0.02, t * N, frame(200 + i)))
        if t % 3 == 0:
            chunks.append(al.take())
    chunks.append(al.take(final=True))
    out = stereo(b"".join(chunks))
    assert len(out) >= 40 * N and (out[: 40 * N, 0] == 1).all()
    right = out[:, 1]
    slots = {int(v): k for k, v in enumerate(right[::N]) if v}
    assert all(slots[200 + i] - i <= TOLERANCE // N for i in range(20, 40) if 200 + i in slots)
    assert len(slots) + al.skipped == 40 and al.late == 0


def test_aligner_leaves_out_frames_of_a_sender_running_fast() -> None:
    """A direction that delivers 11 frames per 10 frame times with no silence to give back
    (its clock fast): a frame is left out whenever the run would sit past the tolerance,
    so it never drifts more than that; the count says how many."""
    al = StereoAligner()
    for i in range(220):
        sample = i * N * 10 // 11
        al.add(TapFrame("in", sample / SAMPLE_RATE, sample, frame(1 + i)))
    assert al.skipped > 0
    out = stereo(al.take(final=True))[:, 0]
    laid = [int(v) for v in out[::N] if v]
    assert len(laid) == 220 - al.skipped
    for slot, v in enumerate(out[::N]):
        if v:
            assert slot * N - (int(v) - 1) * N * 10 // 11 <= TOLERANCE


# -- the recording task ----------------------------------------------------------------------


def push_call(tap: RecorderTap, frames: int, start: int = 0) -> None:
    """Both directions, frame by frame: in carries 1000 + k, out carries -(1000 + k)."""
    for k in range(start, start + frames):
        tap.push("in", frame(1000 + k), k * 0.02)
        tap.push("out", frame(-(1000 + k)), k * 0.02)


async def drained(rec: CallRecording) -> None:
    """Until the writer has taken everything from the ring, or stopped (a condition
    polled, not a timed wait)."""
    while len(rec.tap) and rec.state in ("starting", "recording"):  # noqa: ASYNC110
        await trio.sleep(0.005)


async def record(tmp_path: Path, tap: RecorderTap, feed: object, *, quota: int = 1 << 30,
                 call_id: str = "rtc_test") -> CallRecording:
    rec = CallRecording(tap, call_id, RecordingSettings(tmp_path, quota=quota), {},
                        interval=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        await feed(rec)  # type: ignore[operator]
        rec.call_ended()
        await rec.finished.wait()
    return rec


async def test_recording_writes_both_directions_to_a_stereo_wav(tmp_path: Path) -> None:
    tap = RecorderTap.for_seconds(10)

    async def feed(rec: CallRecording) -> None:
        for part in range(5):  # 5 × 20 frames, the writer draining in between
            push_call(tap, 20, part * 20)
            await drained(rec)
        assert (tmp_path / "rtc_test.wav.part").exists()  # in progress
        assert rec.state == "recording" and rec.wav.data_bytes > 0

    rec = await record(tmp_path, tap, feed)
    assert rec.state == "done" and rec.reason is None
    assert not (tmp_path / "rtc_test.wav.part").exists()
    with wave.open(str(tmp_path / "rtc_test.wav")) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, SAMPLE_RATE)
        data = stereo(w.readframes(w.getnframes()))
    assert len(data) == 100 * N
    assert list(data[::N, 0]) == [1000 + k for k in range(100)]
    assert list(data[::N, 1]) == [-(1000 + k) for k in range(100)]
    meta = json.loads((tmp_path / "rtc_test.json").read_text())
    assert meta["complete"] is True and meta["duration_seconds"] == 2.0
    assert meta["channels"]["left"].startswith("caller")
    assert rec.stats()["seconds"] == 2.0


async def test_quota_ends_the_recording_not_the_call(tmp_path: Path) -> None:
    tap = RecorderTap.for_seconds(10)
    quota = 44 + 4 * N * 30  # the header and 30 frames of stereo
    (tmp_path / "other.wav").write_bytes(b"")  # an empty neighbour counts for nothing

    async def feed(rec: CallRecording) -> None:
        for part in range(10):
            push_call(tap, 10, part * 10)
            await drained(rec)

    rec = await record(tmp_path, tap, feed, quota=quota)
    assert rec.state == "stopped" and rec.reason == "quota"
    assert rec.counters["recordings_stopped"] == 1
    # The tap (the call's side) went on taking frames; only the writing stopped.
    assert tap.frames["in"] == 100
    with wave.open(str(tmp_path / "rtc_test.wav")) as w:
        n = w.getnframes()
    assert 0 < n <= 30 * N  # what fitted, and a valid WAV of it
    assert recordings.usage(tmp_path) - len((tmp_path / "rtc_test.json").read_bytes()) <= quota
    meta = json.loads((tmp_path / "rtc_test.json").read_text())
    assert meta["complete"] is False and meta["stopped"] == "quota"


async def test_a_full_disk_ends_the_recording(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tap = RecorderTap.for_seconds(10)
    calls = {"n": 0}

    async def feed(rec: CallRecording) -> None:
        real = rec.wav.append

        def append(data: bytes) -> None:
            calls["n"] += 1
            if calls["n"] >= 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(data)

        monkeypatch.setattr(rec.wav, "append", append)
        for part in range(6):
            push_call(tap, 10, part * 10)
            await drained(rec)

    rec = await record(tmp_path, tap, feed)
    assert rec.state == "stopped" and rec.reason == "disk: No space left on device"
    assert calls["n"] == 2  # no writing after the failure
    assert tap.frames["in"] == 60  # the ring still took every frame
    with wave.open(str(tmp_path / "rtc_test.wav")) as w:
        assert w.getnframes() > 0  # the first chunk, finalised


async def test_directory_over_quota_at_start_records_nothing(tmp_path: Path) -> None:
    (tmp_path / "old.wav").write_bytes(b"x" * 1000)
    tap = RecorderTap.for_seconds(1)

    async def feed(rec: CallRecording) -> None:
        push_call(tap, 10)
        await drained(rec)

    rec = await record(tmp_path, tap, feed, quota=500)
    assert rec.state == "stopped" and rec.reason == "quota"
    assert not (tmp_path / "rtc_test.wav").exists()
    assert not (tmp_path / "rtc_test.wav.part").exists()


async def test_cancelled_recording_still_finalises(tmp_path: Path) -> None:
    """The transceiver shutting down (its nursery cancelled) leaves a complete file."""
    tap = RecorderTap.for_seconds(10)
    rec = CallRecording(tap, "rtc_cut", RecordingSettings(tmp_path), {}, interval=0.01)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rec.run)
        push_call(tap, 10)
        await rec.started.wait()
        nursery.cancel_scope.cancel()
    assert rec.finished.is_set()
    with wave.open(str(tmp_path / "rtc_cut.wav")) as w:
        assert w.getnframes() == 10 * N


def test_wav_header_is_what_the_wave_module_reads(tmp_path: Path) -> None:
    body = np.arange(8, dtype="<i2").tobytes()
    p = tmp_path / "h.wav"
    p.write_bytes(wav_header(len(body)) + body)
    with wave.open(str(p)) as w:
        assert w.getnframes() == 4 and w.getnchannels() == 2
        assert w.readframes(4) == body


# -- the directory -----------------------------------------------------------------------------


def test_prune_removes_what_passed_the_retention(tmp_path: Path) -> None:
    now = time.time()
    for name, age in (("a.wav", 10), ("a.json", 10), ("b.wav", 1000), ("b.json", 1000),
                      ("c.wav.part", 1000), ("keep.txt", 1000)):
        p = tmp_path / name
        p.write_bytes(b"x")
        os.utime(p, (now - age, now - age))
    assert recordings.prune(tmp_path, 100, now=now) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.wav", "keep.txt"]
    assert recordings.prune(tmp_path / "missing", 100) == 0


@pytest.mark.parametrize("call_id", ["../x", ".hidden", "a/b", "", "x" * 129, "é", "a..b"])
def test_unsafe_ids_name_no_file(call_id: str) -> None:
    assert not recordings.safe_id(call_id)
    with pytest.raises(ValueError, match="cannot name"):
        recordings.paths(Path("/tmp"), call_id)


def test_safe_ids() -> None:
    for call_id in ("rtc_0123abcd", "3f2b8a4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "a.b"):
        assert recordings.safe_id(call_id)


@pytest.mark.parametrize(("text", "value"), [
    ("1000", 1000), ("500M", 500 << 20), ("2G", 2 << 30), ("1.5k", 1536), ("2 GiB", 2 << 30)])
def test_parse_size(text: str, value: int) -> None:
    assert recordings.parse_size(text) == value


@pytest.mark.parametrize(("text", "value"), [
    ("90", 90.0), ("90m", 5400.0), ("12h", 43200.0), ("7d", 604800.0), ("2w", 1209600.0),
    ("604800.0", 604800.0)])
def test_parse_duration(text: str, value: float) -> None:
    assert recordings.parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "ten", "5X", "-1", "0"])
def test_bad_sizes_and_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--recording-quota"):
        recordings.parse_size(text)
    with pytest.raises(ValueError, match="--recording-retention"):
        recordings.parse_duration(text)


# -- asking for one ------------------------------------------------------------------------------


def test_media_record_and_the_realtime_session_extension() -> None:
    from appliance.transceiver.stages import MediaConfig

    assert MediaConfig.from_params_untrusted({}).record is None  # the server's default
    assert MediaConfig.from_params_untrusted({"media": {"record": True}}).record is True
    assert MediaConfig.from_params_untrusted({"media": {"record": None}}).record is None
    rt = {"realtime": {"session": {"appliance": {"record": False, "echo_cancellation": True}}}}
    cfg = MediaConfig.from_params_untrusted(rt)
    assert cfg.record is False and cfg.echo_cancellation is True
    # A recorded call gets a ring of at least RECORD_RING_SECONDS.
    from appliance.transceiver.stages import CallStages

    stages = CallStages(MediaConfig(record=True, level_meter=False))
    assert stages.recorder is not None and stages.recorder.max_frames == 1000
    assert stages.describe()["recording"] is None  # until the transceiver attaches one


@pytest.mark.parametrize(("params", "message"), [
    ({"media": {"record": "yes"}}, "media.record must be"),
    ({"realtime": {"session": {"appliance": []}}}, "session.appliance must be an object"),
    ({"realtime": {"session": {"appliance": {"recrod": True}}}}, "session.appliance.recrod is not"),
    ({"realtime": {"session": {"appliance": {"record": 1}}}}, "session.appliance.record must be"),
])
def test_bad_record_options_are_refused(params: dict[str, object], message: str) -> None:
    from appliance.transceiver.stages import MediaConfig

    with pytest.raises(ValueError, match=message):
        MediaConfig.from_params_untrusted(params)


def test_end_of_call_report_carries_the_recording_link() -> None:
    from appliance.signaling.webhooks import end_report, recording_link

    media = {"recording": {"state": "done", "reason": None, "seconds": 3.0}}
    link = recording_link("rtc_abc", media)
    assert link == {"url": "/v1/realtime/calls/rtc_abc/recording", "format": "audio/wav",
                    "state": "done", "reason": None}
    report = end_report(started_at=1.0, ended_at=4.0, reason="hangup", stats={},
                        recording=link)
    assert report["recording"] == link
    assert recording_link("rtc_abc", {"recording": None}) is None
    assert recording_link("rtc_abc", None) is None
    assert end_report(started_at=1.0, ended_at=2.0, reason="x", stats={})["recording"] is None


def test_up_gives_every_transceiver_the_recordings_directory(tmp_path: Path) -> None:
    import argparse

    from appliance.config import resolve
    from appliance.supervisor import DEFAULTS, add_arguments, build_up_config, child_specs
    from appliance.transceiver import cli

    def argv(*flags: str) -> list[str]:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--state-dir", str(tmp_path / "state"), *flags])
        resolve(args, {}, "up", DEFAULTS)
        transceivers, _ = child_specs(build_up_config(args), tmp_path / "secret", tmp_path)
        return transceivers[0].argv

    plain = argv()
    assert plain[plain.index("--recordings-dir") + 1] == str(
        (tmp_path / "state").resolve() / "recordings")
    assert "--record" not in plain  # a call may still ask for one
    flags = argv("--record", "--recording-quota", "2G", "--recording-retention", "12h")
    assert "--record" in flags
    # What the transceiver makes of them.
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    targs = parser.parse_args(flags[flags.index("--id"):])
    resolve(targs, {}, "transceiver", cli.DEFAULTS)
    cfg = cli.build_config(targs, (b"x" * 32,))
    assert cfg.record is True and cfg.recording_quota == 2 << 30
    assert cfg.recording_retention == 43200.0
    assert cfg.recordings_dir == plain[plain.index("--recordings-dir") + 1]
    with pytest.raises(ValueError, match="--recording-quota"):
        argv("--recording-quota", "lots")
