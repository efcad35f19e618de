"""Adapters that put an existing voice-agent framework behind the appliance.

Each submodule is an optional extra and imports its framework at import time:

* :mod:`appliance.integrations.pipecat` (``pip install appliance[pipecat]``): a Pipecat
  transport that serves the WebSocket agent protocol (docs/agent-protocol.md), one pipeline
  per call.
* :mod:`appliance.integrations.livekit_agents` (``pip install appliance[livekit]``):
  ``AudioInput`` / ``AudioOutput`` for a LiveKit Agents ``AgentSession``, over the same
  protocol; no LiveKit server involved.

Nothing here is imported by the appliance itself. See docs/integrations.md.
"""
