"""The speech package as a plugin: what it adds below it, registered from here.

* ``--agent assistant[?options]`` in the agent registry (appliance/agents/registry.py) for
  calls, and in the Realtime WebSocket surface's table (appliance/realtime/registry.py)
  for ``GET /v1/realtime`` sessions — both appliance/speech/assistant.py (docs/speech.md);
* the provider of ``ctx.transcripts()`` (:func:`appliance.speech.listen.transcripts`),
  which :class:`~appliance.agents.context.AgentContext` runs but does not import.

agents/ and realtime/ name nothing of this package: importing this module registers it,
and the processes that run agents import it through appliance/plugins.py. The assistant's
module loads with its first spec, listen.py with the first ``ctx.transcripts()``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from types import ModuleType
from typing import Any

from ..agents.context import AgentContext
from ..agents.registry import AgentError, AgentFn, provide_transcripts, register_family
from ..realtime.interface import RealtimeAgent
from ..realtime.registry import register_factory

__all__ = ["realtime_factory", "resolve", "transcripts"]

EXTRA_HINT = "pip install 'appliance[speech]'"


def _assistant() -> ModuleType:
    try:
        from . import assistant
    except ModuleNotFoundError as exc:  # numpy-only parts import; engines fail in resolve_spec
        raise AgentError(f"--agent assistant needs the 'speech' extra ({exc.name} is missing): "
                         f"{EXTRA_HINT}") from exc
    return assistant


def resolve(spec: str) -> AgentFn:
    """``assistant[?options]`` for a call (its engines are built and loaded now)."""
    fn: AgentFn = _assistant().resolve_spec(spec)
    return fn


def realtime_factory(spec: str) -> Callable[[], RealtimeAgent]:
    """``assistant[?options]`` for a Realtime WebSocket session."""
    made: Callable[[], RealtimeAgent] = _assistant().realtime_factory(spec)
    return made


def transcripts(ctx: AgentContext, **options: Any) -> AsyncGenerator[Any, None]:
    """``ctx.transcripts(**options)``: :func:`appliance.speech.listen.transcripts`, loaded
    at the first call (listen.py is a trio shell over the engines: a process that never
    asks for transcripts does not load it)."""
    from .listen import transcripts as listen

    return listen(ctx, **options)


register_family("assistant", resolve)
register_factory("assistant", realtime_factory)
provide_transcripts(transcripts)
