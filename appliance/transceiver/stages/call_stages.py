"""The two chains of one call, built from its :class:`~.config.MediaConfig`, in the one
canonical order (base.py draws it):

* in: recorder tap (raw) → echo canceller → noise suppressor → level meter → extras
* out: level meter → echo reference → recorder tap (sent) → extras … (extras go before the
  reference and the tap, so both see what is really sent)

The speech stages (noise suppression, echo cancelling) need the optional ``speech`` extra;
without it a call that asks for one gets no such stage, the session object says which
package is missing (``media.unavailable``), and everything else works.
"""

from __future__ import annotations

import logging
from typing import Any

from .base import Stage, StageChain, StageUnavailable
from .config import RECORD_RING_SECONDS, MediaConfig
from .level import LevelMeter
from .recorder import RecorderTap

log = logging.getLogger(__name__)


class CallStages:
    def __init__(self, config: MediaConfig, *, label: str = "") -> None:
        self.config = config
        self.label = label
        self.inbound = StageChain("in", label=label)
        self.outbound = StageChain("out", label=label)
        #: ``{option: "needs …"}`` for options asked for whose library is not installed.
        self.unavailable: dict[str, str] = {}
        self.meter_in: LevelMeter | None = None
        self.meter_out: LevelMeter | None = None
        self.recorder: RecorderTap | None = None
        #: The call's recording (transceiver/recording.py) when it has one: its stats() go
        #: into describe() as ``recording``.
        self.recording: Any = None
        seconds = config.recorder_seconds
        if config.record:
            seconds = max(seconds, RECORD_RING_SECONDS)
        if seconds > 0:
            self.recorder = RecorderTap.for_seconds(seconds)
            self.inbound.add(self.recorder.inbound)
        echo_ref: Stage | None = None
        if config.echo_cancellation:
            echo_ref = self._add_echo_canceller()
        if config.noise_reduction is not None:
            self.set_noise_reduction(config.noise_reduction)
        if config.level_meter:
            self.meter_in = LevelMeter("in")
            self.meter_out = LevelMeter("out")
            self.inbound.add(self.meter_in)
            self.outbound.add(self.meter_out)
        for make in config.extra_in:
            self.inbound.add(make())
        for make in config.extra_out:
            self.outbound.add(make())
        if echo_ref is not None:  # the reference taps what is really sent
            self.outbound.add(echo_ref)
        if self.recorder is not None:
            self.outbound.add(self.recorder.outbound)

    # -- optional stages -----------------------------------------------------------------

    def _insert_in(self, stage: Stage, after: tuple[str, ...]) -> None:
        """Into the in chain right after the last of ``after`` present (else first)."""
        names = self.inbound.names()
        idx = max((names.index(n) + 1 for n in after if n in names), default=0)
        self.inbound.add(stage, idx)

    def _add_echo_canceller(self) -> Stage | None:
        """The in side goes right after the raw recorder tap; the out side (returned) is
        added by the caller after the out meter and any extras."""
        try:
            # A speech stage's module is imported on first use: ImportError when its library
            # (or the module itself) is missing, and the option is reported unavailable.
            from . import aec

            # The in chain carries each frame's media time (the sender's RTP clock): the
            # canceller places the microphone stream by it.
            near, ref = aec.make_echo_canceller(media=self.inbound)
        except (ImportError, OSError, StageUnavailable) as exc:
            self._missing("echo_cancellation", exc)
            return None
        self._insert_in(near, ("recorder-in",))
        return ref

    def set_noise_reduction(self, mode: str | None) -> None:
        """Switch noise suppression mid-call (``session.update``): None removes it."""
        current = self.inbound.get("denoise")
        if current is not None:
            if mode is not None and getattr(current, "mode", None) == mode:
                return
            self.inbound.remove("denoise")
        if mode is None:
            return
        try:
            from . import denoise  # on first use, as aec above

            stage = denoise.make_denoiser(mode)
        except (ImportError, OSError, StageUnavailable) as exc:
            self._missing("noise_reduction", exc)
            return
        self._insert_in(stage, ("recorder-in", "aec"))

    def _missing(self, option: str, exc: BaseException) -> None:
        why = str(exc) if isinstance(exc, StageUnavailable) else (
            f"needs the speech extra (pip install 'appliance[speech]'): {exc}")
        if option not in self.unavailable:
            log.warning("session %s: %s is off: %s", self.label, option, why)
        self.unavailable[option] = why

    # -- reports -------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """The session object's ``media`` member."""
        levels: dict[str, Any] = {}
        if self.meter_in is not None:
            levels["in"] = self.meter_in.stats()
        if self.meter_out is not None:
            levels["out"] = self.meter_out.stats()
        stages: dict[str, Any] = {}
        for chain in (self.inbound, self.outbound):
            for stage in chain.stages:
                if isinstance(stage, LevelMeter) or stage.name.startswith("recorder-"):
                    continue  # reported as levels / recorder
                stages[stage.name] = stage.stats()
        return {
            "in": self.inbound.names(),
            "out": self.outbound.names(),
            "levels": levels or None,
            "recorder": self.recorder.stats() if self.recorder is not None else None,
            "recording": self.recording.stats() if self.recording is not None else None,
            "stages": stages,
            "stage_failures": self.inbound.failures + self.outbound.failures,
            "failed": {**self.inbound.failed, **self.outbound.failed},
            "unavailable": dict(self.unavailable),
        }

    def close(self) -> None:
        self.inbound.close()
        self.outbound.close()
