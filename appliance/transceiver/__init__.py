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

from .server import TransceiverAddresses, serve_transceiver
from .settings import TransceiverConfig

__all__ = ["TransceiverAddresses", "TransceiverConfig", "serve_transceiver"]
