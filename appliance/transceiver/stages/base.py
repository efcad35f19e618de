"""The seam between the PCM pipeline and what works on a call's audio (no I/O here).

:class:`~appliance.transceiver.media.PcmPipeline` decodes and encodes; everything that
*looks at* or *changes* the 20 ms frames in between is a :class:`Stage` in one of the call's
two :class:`StageChain` s::

    in:   jitter ─► decode ─► [in chain: recorder(raw) ─► echo canceller ─► noise
                               suppressor ─► level meter] ─► VAD ─► agent
    out:  agent ─► [out chain: level meter ─► echo reference ─► recorder(sent)] ─► encode

A stage gets one frame — 20 ms of 48 kHz mono PCM16, :data:`FRAME_BYTES` = 1920 bytes —
and the call's clock (``now``, the transceiver's trio clock, the same for both directions)
and returns the frame the next stage gets (the same object when it only looks). It runs on
the network loop, synchronously, so it must be quick and never block: a stage that needs
more than a frame's worth of work per frame belongs in an agent, not here.

A stage that raises, or returns a frame of another length, is **removed from its chain**,
closed and counted (:attr:`StageChain.failures`); the frame it was given goes on unchanged to
the next stage, and the call goes on. Nothing a stage does can end a call.

The empty chain is the echo hot path: the pipeline checks :attr:`StageChain.stages` once per
drained packet and skips the chain entirely when it is empty (bench/pcm_path.py).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960  # 20 ms
FRAME_BYTES = 2 * FRAME_SAMPLES


class StageUnavailable(Exception):
    """An optional stage's library is missing; the message names the package to install."""


@runtime_checkable
class Stage(Protocol):
    """One step of a chain. ``name`` is unique in its chain (removal and stats use it)."""

    name: str

    def process(self, pcm: bytes, now: float) -> bytes:
        """One 20 ms frame in, one out (the same length)."""
        ...

    def close(self) -> None:
        """The stage left its chain (the call ended, it was removed, or it failed): free
        native state. Called once; must not raise (a raise is logged and ignored)."""
        ...

    def stats(self) -> dict[str, Any]:
        """A small JSON-able snapshot for the session object (``media.stages``)."""
        ...


class StageChain:
    """The ordered stages of one direction of one call."""

    __slots__ = ("direction", "stages", "failures", "failed", "media_time", "_label")

    def __init__(self, direction: str, stages: list[Stage] | tuple[Stage, ...] = (),
                 label: str = "") -> None:
        self.direction = direction  # "in" | "out"
        #: The live list; the pipeline tests its truth per packet (empty: chain skipped).
        self.stages: list[Stage] = []
        self.failures = 0
        #: ``{name: exception type}`` of the stages that failed and were removed.
        self.failed: dict[str, str] = {}
        #: In chain: the sender's media time of the frame being run (its RTP timestamp
        #: since the call's first packet, seconds), set by the pipeline before run();
        #: None where there is none. A stage that places frames in time (the echo
        #: canceller) reads it; ``now`` is when the frame is processed, not when it was made.
        self.media_time: float | None = None
        self._label = label  # the session id, for logs
        for stage in stages:
            self.add(stage)

    def __len__(self) -> int:
        return len(self.stages)

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def get(self, name: str) -> Stage | None:
        for s in self.stages:
            if s.name == name:
                return s
        return None

    def add(self, stage: Stage, index: int | None = None) -> None:
        """Insert ``stage`` at ``index`` (default: the end). Names are unique."""
        if self.get(stage.name) is not None:
            raise ValueError(f"a stage named {stage.name!r} is already in the {self.direction} chain")
        if index is None:
            self.stages.append(stage)
        else:
            self.stages.insert(index, stage)

    def remove(self, name: str) -> Stage | None:
        """Take the named stage out (mid-call is fine: the next frame skips it) and close
        it. Returns it, or None when no such stage is in the chain."""
        stage = self.get(name)
        if stage is None:
            return None
        # A new list, not an in-place delete: a run() iterating the old one (a stage that
        # removes another from inside process) finishes the frame it is on undisturbed.
        self.stages = [s for s in self.stages if s is not stage]
        _close(stage, self._label)
        return stage

    def run(self, pcm: bytes, now: float) -> bytes:
        """The frame through every stage, in order."""
        for stage in self.stages:
            try:
                out = stage.process(pcm, now)
            except Exception as exc:
                self._fail(stage, type(exc).__name__, exc)
                continue
            if len(out) != len(pcm):
                self._fail(stage, "bad-frame-length", None)
                continue
            pcm = out
        return pcm

    def _fail(self, stage: Stage, why: str, exc: Exception | None) -> None:
        self.failures += 1
        self.failed[stage.name] = why
        log.warning("session %s: %s stage %s failed (%s); removed, the call goes on",
                    self._label, self.direction, stage.name, why, exc_info=exc)
        self.remove(stage.name)

    def close(self) -> None:
        stages, self.stages = self.stages, []
        for stage in stages:
            _close(stage, self._label)


def _close(stage: Stage, label: str) -> None:
    try:
        stage.close()
    except Exception:
        log.exception("session %s: closing stage %s failed", label, stage.name)
