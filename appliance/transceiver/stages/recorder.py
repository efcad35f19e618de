"""Recorder tap: both directions of a call, 48 kHz PCM16 mono, into one bounded ring that a
recording feature drains.

The tap is one :class:`RecorderTap` with a stage in each chain (:attr:`RecorderTap.inbound`
first in the in chain — the **raw** decoded audio, before echo cancelling or noise
suppression — and :attr:`RecorderTap.outbound` last in the out chain — what is encoded and
sent). Every frame becomes a :class:`TapFrame` stamped with the call clock and its place on
a shared sample axis, ``sample = round((now - origin) * 48000)``, ``origin`` being the time
of the first frame either way: so the two directions line up without any further state (a
mixer puts each frame at its ``sample``; a gap in ``sample`` is a gap in the call, e.g. the
agent being silent, which sends nothing).

The ring holds at most ``max_frames`` frames of both directions together (a 1920-byte frame
each: 60 s of both directions is 6000 frames, ~11.5 MiB). When it is full the **oldest**
frame is dropped and counted (:attr:`RecorderTap.dropped`): a recorder that stopped draining
costs bounded memory and never stalls the call.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from .base import SAMPLE_RATE


@dataclass(frozen=True, slots=True)
class TapFrame:
    direction: str  # "in" | "out"
    at: float  # the call clock when the frame passed the tap
    sample: int  # its first sample on the call's shared 48 kHz axis
    pcm: bytes


class _TapSide:
    __slots__ = ("name", "direction", "_tap")

    def __init__(self, tap: RecorderTap, direction: str) -> None:
        self.name = f"recorder-{direction}"
        self.direction = direction
        self._tap = tap

    def process(self, pcm: bytes, now: float) -> bytes:
        self._tap.push(self.direction, pcm, now)
        return pcm

    def stats(self) -> dict[str, Any]:
        return self._tap.stats()

    def close(self) -> None:
        pass  # the ring outlives the chain: a recorder may drain it after the call


class RecorderTap:
    def __init__(self, *, max_frames: int) -> None:
        if max_frames < 1:
            raise ValueError("the recorder ring holds at least one frame")
        self.max_frames = max_frames
        self._ring: deque[TapFrame] = deque(maxlen=max_frames)
        self.origin: float | None = None
        self.dropped = 0
        self.frames = {"in": 0, "out": 0}
        self.inbound = _TapSide(self, "in")
        self.outbound = _TapSide(self, "out")

    @classmethod
    def for_seconds(cls, seconds: float) -> RecorderTap:
        """A ring of ``seconds`` of both directions."""
        return cls(max_frames=max(1, round(seconds * 50 * 2)))

    def push(self, direction: str, pcm: bytes, now: float) -> None:
        if self.origin is None:
            self.origin = now
        if len(self._ring) == self.max_frames:
            self.dropped += 1  # deque(maxlen) drops the oldest on append
        self.frames[direction] += 1
        self._ring.append(TapFrame(direction, now, round((now - self.origin) * SAMPLE_RATE),
                                   pcm))

    def __len__(self) -> int:
        return len(self._ring)

    def drain(self, limit: int | None = None) -> list[TapFrame]:
        """Take up to ``limit`` of the oldest frames (all, by default), in arrival order."""
        ring = self._ring
        n = len(ring) if limit is None else min(limit, len(ring))
        return [ring.popleft() for _ in range(n)]

    def stats(self) -> dict[str, Any]:
        return {"buffered": len(self._ring), "max_frames": self.max_frames,
                "dropped": self.dropped, "frames_in": self.frames["in"],
                "frames_out": self.frames["out"]}
