"""Who answers a Realtime session that has no call behind it (``GET /v1/realtime``, the
WebSocket surface: appliance/realtime/ws_session.py runs a :class:`RealtimeAgent` with no
:class:`~appliance.agents.context.AgentContext`), by agent spec.

``realtime`` and ``realtime:<module:attr|file.py:attr>`` are this package's own
(:func:`appliance.realtime.agent.factory_for_spec`). Any other family registers its
factory here from its own package — the speech package registers ``assistant``
(appliance/speech/plugin.py) — so realtime/ names no package above it (docs/architecture.md,
"Imports only point down"). The agent registry (appliance/agents/registry.py) is the same
seam for calls; a family that answers both registers in both.
"""

from __future__ import annotations

from collections.abc import Callable

from ..agents.registry import family_name
from .interface import RealtimeAgent

__all__ = ["FactoryResolver", "factory_resolver", "register_factory", "registered"]

#: The whole spec (``assistant?stt=whisper``) -> a factory of one RealtimeAgent per session,
#: or :class:`~appliance.agents.loader.AgentError` naming what is wrong with the spec.
FactoryResolver = Callable[[str], Callable[[], RealtimeAgent]]

_factories: dict[str, FactoryResolver] = {}


def register_factory(name: str, resolver: FactoryResolver) -> None:
    """Answer ``name``, ``name:…`` and ``name?…`` WebSocket sessions with ``resolver(spec)``."""
    _factories[name] = resolver


def factory_resolver(spec: str) -> FactoryResolver | None:
    """The registered resolver of the family ``spec`` belongs to, if any."""
    return _factories.get(family_name(spec))


def registered() -> list[str]:
    """The registered family names, sorted (for error messages)."""
    return sorted(_factories)
