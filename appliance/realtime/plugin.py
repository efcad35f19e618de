"""The realtime package as a plugin of the agent registry (appliance/agents/registry.py):

* ``--agent realtime`` / ``realtime:<module:attr|file.py:attr>`` — the Realtime event
  protocol on the ``oai-events`` channel (appliance/realtime/agent.py, docs/realtime.md);
* ``realtime+ws://…`` / ``realtime+wss://…`` — the bridge to an upstream Realtime server
  (appliance/realtime/bridge.py, docs/realtime-bridge.md).

agents/ sits below this package and names none of it: importing this module registers
both, and the processes that run agents import it through appliance/plugins.py. The
resolvers import their modules on first use, so a transceiver that never runs a Realtime
agent never loads the machine, the shell or the bridge.
"""

from __future__ import annotations

from ..agents.registry import AgentFn, register_family, register_scheme
from .bridge_state import SCHEMES

__all__ = ["bridge", "resolve"]


def resolve(spec: str) -> AgentFn:
    """``realtime`` or ``realtime:<target>`` -> the agent running the Realtime shell."""
    from .agent import resolve_spec

    return resolve_spec(spec)


def bridge(spec: str) -> AgentFn:
    """``realtime+ws(s)://host/path?…`` -> the agent bridging the call to that upstream."""
    from .bridge import bridge as upstream_bridge

    return upstream_bridge(spec)


register_family("realtime", resolve)
for _scheme in SCHEMES:
    register_scheme(_scheme, bridge)
