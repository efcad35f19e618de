"""The transceiver: terminates WebRTC (ICE-lite, DTLS, SRTP, RTP/RTCP) for the sessions a
relay routes to it and turns their audio into 20 ms PCM frames for agents.

* :mod:`.server` — :func:`serve_transceiver`, the UDP hot loop, the call table and the
  control dispatch; :mod:`.ops` the control operations, :mod:`.negotiate` the SDP answer,
  :mod:`.load` the headroom glue, :mod:`.settings` the config;
* :mod:`.session` — one session: protocol machines, media pipeline, agent task;
* :mod:`.jitter`, :mod:`.packetizer`, :mod:`.opus` — the sans-IO media pipeline pieces;
* :mod:`.cli` — ``appliance transceiver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import TransceiverAddresses, serve_transceiver
    from .settings import TransceiverConfig

__all__ = ["TransceiverAddresses", "TransceiverConfig", "serve_transceiver"]


def __getattr__(name: str) -> Any:
    """The server on first use, not on import of the package: signaling imports small
    pieces of it (``recording.wav_header``) and paid 0.35 s of start-up for the hot loop
    it never runs."""
    if name in ("TransceiverAddresses", "serve_transceiver"):
        from . import server
        return getattr(server, name)
    if name == "TransceiverConfig":
        from .settings import TransceiverConfig
        return TransceiverConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
