"""Signaling: the HTTP API (WHIP-style), the web UI routes and metrics (DESIGN.md "HTTP").

Signaling holds no WebRTC state: it picks a transceiver, forwards offers and ICE
fragments over the control channel (docs/control-protocol.md), and keeps a small registry of
the sessions it created so it can route later requests and report sessions whose
transceiver died.
"""

from .app import create_app
from .server import serve_signaling
from .state import SignalingConfig, SignalingState

__all__ = ["SignalingConfig", "SignalingState", "create_app", "serve_signaling"]
