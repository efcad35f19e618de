"""The plugins: the packages that add agent kinds to the floors below them, loaded here.

agents/ (the agent interface and its registry) names no plugin, and realtime/ names no
package above it (docs/architecture.md, "Imports only point down"): each plugin registers
itself from its own package when imported —

* appliance/realtime/plugin.py: ``--agent realtime[:<target>]``, ``realtime+ws(s)://``;
* appliance/live/plugin.py: ``--agent live[:<--live-agent spec>]`` (GPT-Live's WebRTC
  sessions, placed by ``POST /v1/live/sessions``);
* appliance/speech/plugin.py: ``--agent assistant[?options]`` (calls and the Realtime
  WebSocket surface) and ``ctx.transcripts()``'s provider.

This module is the one list of them. The composition roots import it: each role that
resolves agent specs (appliance/transceiver/cli.py, appliance/signaling/cli.py and
appliance/supervisor.py for ``appliance up``), and anything else that builds those roles
in-process (the test suite's conftest.py). A new plugin is a line here.
"""

from __future__ import annotations

from .live import plugin as live_plugin
from .realtime import plugin as realtime_plugin
from .speech import plugin as speech_plugin

__all__ = ["live_plugin", "realtime_plugin", "speech_plugin"]
