"""Call recordings: the recorder tap's ring (stages/recorder.py) drained into a stereo WAV
in the recordings directory, off the media loop (docs/recordings.md).

::

    network loop:  in chain ─► RecorderTap ◄─ out chain        (bounded ring, push only)
    recording task (trio, one per recorded call, the transceiver's nursery):
        every INTERVAL: tap.drain() ─► StereoAligner (pure) ─► stereo PCM
                        ─► trio.to_thread: WavFile.append (quota checked, header patched)
        call ended: last drain, .wav.part renamed .wav, metadata .json beside it

**Alignment.** Both directions' frames carry their place on the call's shared 48 kHz axis
(``TapFrame.sample``, from the call clock when the frame passed the tap). The jitter
buffer may hand the tap several inbound frames at one instant, so a frame is laid at its
direction's *cursor* (right after the previous one) while that is within :data:`TOLERANCE`
of its own ``sample``, and at its ``sample`` when it is later than that (a real gap: the
agent silent, the caller's packets lost): contiguous audio stays contiguous, a gap becomes
silence. A frame is never laid more than the tolerance *after* its ``sample`` either: a
stall longer than the tolerance looks like a gap at its first frame, and the burst behind
it would otherwise push its direction ahead for the rest of the call, so the run is moved
back into the silence before it (and where there is none, e.g. a sender's clock running
fast, the frame is left out and counted, ``skipped``). So neither direction drifts from its
own clock by more than the tolerance. Audio is
committed to the file only up to ``newest sample seen - TOLERANCE``: nothing can be laid
before that any more, so the file is written front to back and never rewritten.

**Failure.** The quota (bytes of the whole directory, every writer's) is checked before each
chunk; over it, or any ``OSError`` (a full disk), ends the *recording*: what was written
stays, finalised, with the reason in its metadata; counted (``recordings_stopped``) and
logged. Nothing here can end the call: the tap only pushes into its ring, which drops its
oldest frame when nobody drains it.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import trio

from appliance import recordings

from .stages.base import FRAME_SAMPLES, SAMPLE_RATE
from .stages.recorder import RecorderTap, TapFrame

log = logging.getLogger(__name__)

CHANNELS = ("in", "out")  # left: what the caller sent (raw); right: what the agent sent
TOLERANCE = 5 * FRAME_SAMPLES  # 100 ms: how far a frame may be pulled to its cursor
INTERVAL = 0.25  # s between drains of the ring
#: The ring a recorded call gets (both directions): what the writer may fall behind by
#: before frames are dropped (counted as ``dropped``).
RING_SECONDS = 10.0
FINAL_GRACE = 5.0  # s the last write may take once the transceiver is shutting down
_WAV_HEADER = 44
_MAX_DATA = 0xFFFFFFFF - 36  # what a RIFF size field can say (~6.2 h of 48 kHz stereo)


class QuotaExceeded(OSError):
    """The recordings directory would grow past ``--recording-quota``."""


class StereoAligner:
    """Tap frames in, interleaved stereo PCM16 (L = in, R = out) out, in order. Pure."""

    def __init__(self, tolerance: int = TOLERANCE) -> None:
        self.tolerance = tolerance
        self.cursor: dict[str, int | None] = {"in": None, "out": None}
        #: where each direction's current contiguous run starts, and how far back it may
        #: move: the end of that direction's previous run (the silence between them)
        self._run: dict[str, tuple[int, int]] = {}
        self.written = 0  # samples (per channel) handed out by take()
        self.newest = 0  # one past the newest sample any frame said it covers
        self._buf = np.zeros((4 * SAMPLE_RATE, 2), np.int16)
        self._end = 0  # samples laid in _buf (relative to written)
        self.late = 0  # frames (or parts) that fell before what was already taken
        self.skipped = 0  # frames left out to keep a direction within the tolerance

    def add(self, frame: TapFrame) -> None:
        x = np.frombuffer(frame.pcm, "<i2")
        n = len(x)
        d = frame.direction
        cursor = self.cursor[d]
        self.newest = max(self.newest, frame.sample + n)
        if cursor is None or frame.sample > cursor + self.tolerance:
            pos = frame.sample  # a gap: silence since the cursor
            self._run[d] = (pos, self.written if cursor is None else cursor)
        else:
            pos = cursor
        if pos > frame.sample + self.tolerance:
            # Laid at its cursor, this frame would sit later than the instant it passed
            # the tap: the run it continues was put too late, at a "gap" that was a stall
            # (the loop handing over a burst longer than the tolerance). Move the run back
            # into the silence before it; if there is none left, leave the frame out.
            pos = self._pull_back(d, pos, frame.sample)
            if pos > frame.sample + self.tolerance:
                self.skipped += 1
                return
        self.cursor[d] = pos + n
        if pos < self.written:  # only after a forced take(): keep what is still ahead
            self.late += 1
            x = x[self.written - pos :]
            pos = self.written
            if not len(x):
                return
        rel = pos - self.written
        self._reserve(rel + len(x))
        self._buf[rel : rel + len(x), CHANNELS.index(d)] = x
        self._end = max(self._end, rel + len(x))

    def _pull_back(self, direction: str, pos: int, sample: int) -> int:
        """Move ``direction``'s current run (uncommitted, ending at ``pos``) up to
        ``pos - sample`` earlier, into the silence before it; the new ``pos``."""
        start, floor = self._run.get(direction, (pos, pos))
        shift = min(pos - sample, start - max(floor, self.written))
        if shift <= 0:
            return pos
        a, b = start - self.written, pos - self.written
        c = CHANNELS.index(direction)
        self._buf[a - shift : b - shift, c] = self._buf[a:b, c]
        self._buf[b - shift : b, c] = 0
        self._run[direction] = (start - shift, floor)
        self.cursor[direction] = pos - shift
        self._end = max(0, *(e - self.written for e in self.cursor.values() if e is not None))
        return pos - shift

    def _reserve(self, n: int) -> None:
        if n > len(self._buf):
            grown = np.zeros((max(n, 2 * len(self._buf)), 2), np.int16)
            grown[: self._end] = self._buf[: self._end]
            self._buf = grown

    @property
    def pending(self) -> int:
        return self._end

    def take(self, *, final: bool = False) -> bytes:
        """What can no longer change (everything, with ``final``), as interleaved bytes."""
        upto = self._end if final else min(self._end, self.newest - self.tolerance - self.written)
        if upto <= 0:
            return b""
        out = self._buf[:upto].tobytes()
        rest = self._end - upto
        self._buf[:rest] = self._buf[upto : self._end]
        self._buf[rest : self._end] = 0
        self._end = rest
        self.written += upto
        return out


def wav_header(data_bytes: int, rate: int = SAMPLE_RATE) -> bytes:
    """RIFF/WAVE, PCM16, stereo, ``rate`` (48 kHz: what is recorded), ``data_bytes`` of
    samples."""
    block = 2 * len(CHANNELS)
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, len(CHANNELS), rate,
                                    rate * block, block, 16)
            + b"data" + struct.pack("<I", data_bytes))


class WavFile:
    """A stereo WAV being appended to (blocking: called through ``trio.to_thread``). The
    header's sizes are patched after every append, so the file is a valid WAV of what it
    holds at any moment (a transceiver that dies mid-call leaves a playable ``.part``)."""

    def __init__(self, path: Path, *, directory: Path, quota: int) -> None:
        self.path = path
        self.directory = directory
        self.quota = quota
        self.data_bytes = 0
        self._f: BinaryIO | None = None

    def open(self) -> None:
        if recordings.usage(self.directory) + _WAV_HEADER > self.quota:
            raise QuotaExceeded("the recordings directory is at its quota")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        f = os.fdopen(fd, "wb")
        try:
            f.write(wav_header(0))
            f.flush()
        except OSError:
            f.close()
            self.path.unlink(missing_ok=True)
            raise
        self._f = f

    def append(self, data: bytes) -> None:
        f = self._f
        assert f is not None
        if self.data_bytes + len(data) > _MAX_DATA:
            raise QuotaExceeded("a WAV file holds at most 4 GiB")
        if recordings.usage(self.directory) + len(data) > self.quota:
            raise QuotaExceeded("the recordings directory is at its quota")
        f.seek(_WAV_HEADER + self.data_bytes)
        f.write(data)
        f.flush()  # ENOSPC surfaces here rather than at close
        self.data_bytes += len(data)
        self._patch()

    def _patch(self) -> None:
        f = self._f
        assert f is not None
        f.seek(4)
        f.write(struct.pack("<I", 36 + self.data_bytes))
        f.seek(40)
        f.write(struct.pack("<I", self.data_bytes))
        f.flush()

    def close(self) -> None:
        if self._f is None:
            return
        try:
            self._f.truncate(_WAV_HEADER + self.data_bytes)  # drop a half-written chunk
            self._patch()
        finally:
            self._f.close()
            self._f = None


@dataclass(frozen=True, slots=True)
class RecordingSettings:
    directory: Path
    quota: int = recordings.DEFAULT_QUOTA
    retention: float = recordings.DEFAULT_RETENTION


class CallRecording:
    """One call's recording task: drains ``tap`` into ``<call id>.wav`` until
    :meth:`call_ended`, then finalises. Never raises out of :meth:`run` (but Cancelled)."""

    def __init__(self, tap: RecorderTap, call_id: str, settings: RecordingSettings,
                 counters: dict[str, int] | None = None, *, interval: float = INTERVAL,
                 on_stop: Callable[[str], None] | None = None) -> None:
        self.tap = tap
        #: told the reason when the recording stops before the call ends (quota, disk): a
        #: GPT-Live session's ``session_storage_failed``
        self.on_stop = on_stop
        self.call_id = call_id
        self.settings = settings
        self.counters = counters if counters is not None else {}
        self.interval = interval
        self.final, self.part, self.meta = recordings.paths(settings.directory, call_id)
        self.aligner = StereoAligner()
        self.wav = WavFile(self.part, directory=settings.directory, quota=settings.quota)
        self.state = "starting"  # → recording → done | stopped
        self.reason: str | None = None  # why a stopped recording stopped
        self.started_at = time.time()
        self._ended = trio.Event()
        self.started = trio.Event()  # the file is open (or the recording stopped already)
        self.finished = trio.Event()  # the file is complete (renamed, metadata written)

    def call_ended(self) -> None:
        self._ended.set()

    def stats(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason,
                "seconds": round(self.wav.data_bytes / (4 * SAMPLE_RATE), 2),
                "bytes": self.wav.data_bytes, "dropped": self.tap.dropped,
                "skipped": self.aligner.skipped}

    async def run(self) -> None:
        try:
            try:
                await trio.to_thread.run_sync(self._start)
            except OSError as exc:
                self._stop(exc)
                self.started.set()
            else:
                self.state = "recording"
                self.started.set()
                while not self._ended.is_set():
                    with trio.move_on_after(self.interval):
                        await self._ended.wait()
                    if self.state == "recording":
                        await self._write(final=False)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(FINAL_GRACE):
                await self._finish()

    def _start(self) -> None:
        d = self.settings.directory
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        recordings.prune(d, self.settings.retention)
        self.wav.open()

    async def _write(self, *, final: bool) -> None:
        al = self.aligner
        for frame in self.tap.drain():
            al.add(frame)
        data = al.take(final=final)
        if not data:
            return
        try:
            await trio.to_thread.run_sync(self.wav.append, data)
        except OSError as exc:
            self._stop(exc)

    def _stop(self, exc: OSError) -> None:
        self.state = "stopped"
        self.reason = ("quota" if isinstance(exc, QuotaExceeded)
                       else f"disk: {exc.strerror or type(exc).__name__}")
        self.counters["recordings_stopped"] = self.counters.get("recordings_stopped", 0) + 1
        log.warning("session %s: recording stopped (%s: %s); the call goes on",
                    self.call_id, self.reason, exc)
        self.tap.drain()  # what is buffered will not be written
        if self.on_stop is not None:
            self.on_stop(self.reason)

    async def _finish(self) -> None:
        if self.state == "recording":
            await self._write(final=True)
            if self.state == "recording":
                self.state = "done"
        try:
            await trio.to_thread.run_sync(self._finalise)
        except OSError as exc:
            log.warning("session %s: recording could not be finalised: %s", self.call_id, exc)
        self.finished.set()

    def _finalise(self) -> None:
        self.wav.close()
        if not self.part.exists():
            return  # never opened (quota, directory not writable)
        os.replace(self.part, self.final)
        meta = {"call_id": self.call_id, "format": "audio/wav", "sample_rate": SAMPLE_RATE,
                "channels": {"left": "caller (received, before any processing)",
                             "right": "agent (sent)"},
                "started_at": round(self.started_at, 3), "ended_at": round(time.time(), 3),
                "duration_seconds": round(self.wav.data_bytes / (4 * SAMPLE_RATE), 3),
                "bytes": _WAV_HEADER + self.wav.data_bytes, "complete": self.state == "done",
                "stopped": self.reason, "dropped_frames": self.tap.dropped,
                "skipped_frames": self.aligner.skipped}
        try:
            self.meta.write_text(json.dumps(meta))
        except OSError as exc:  # a full disk: the WAV is there, its metadata is not
            log.warning("session %s: recording metadata not written: %s", self.call_id,
                        exc.strerror)
