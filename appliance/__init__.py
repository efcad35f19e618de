"""The appliance: a self-hosted WebRTC voice front door for AI agents.

A thin UDP relay on one public port routes every packet by the ICE ufrag to the transceiver
that owns the session; the transceiver terminates ICE-lite, DTLS and SRTP and hands agents
plain PCM frames and JSON events. See docs/architecture.md.
"""

__version__ = "0.1.0"
