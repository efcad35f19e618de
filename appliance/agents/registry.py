"""Resolve ``--agent NAME|module:attr|ws://…`` to something the transceiver can run.

* ``NAME`` — a built-in or :func:`register`-ed agent (``echo``);
* ``passthrough`` — no agent and no codec: the transceiver echoes the caller's RTP itself
  after SRTP unprotect/protect (media passthrough, for capacity measurements and as the
  cheapest possible "agent"); :attr:`ResolvedAgent.passthrough` is set;
* ``package.module:attr`` or ``path/to/file.py:attr`` — imported on first use; ``attr`` is an async function
  ``async def agent(ctx)`` or a class whose instances have ``async def run(self, ctx)``
  (a fresh instance per session);
* ``NAME``, ``NAME:…`` or ``NAME?…`` for a family registered with :func:`register_family`:
  the whole spec goes to the family's resolver. This floor names no family; the packages
  that have one register it themselves (the realtime package ``realtime``, the speech
  package ``assistant``: docs/realtime.md, docs/speech.md), and the processes that run
  agents import them (appliance/plugins.py);
* ``scheme://…`` — an external agent, handled by the factory registered for that scheme
  with :func:`register_scheme`: ``ws`` and ``wss`` are the built-in WebSocket bridge
  (:mod:`.ws`), others come from their packages (``realtime+ws``); an unregistered scheme
  is rejected with a clear error.

:func:`resolve` is called when a session is created, so a bad spec fails the ``create``
request (400 ``unknown-agent``) instead of the session later; ``appliance up`` and
``appliance transceiver`` call it on their ``--agent`` at start and exit 2 when it fails.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .channels import ChannelEvent
from .context import AgentContext, AgentFn, Frame
from .context import provide_transcripts as provide_transcripts  # the seam, in one place
from .echo import echo, echo_channel, echo_frame
from .loader import AgentError as AgentError  # re-exported: where callers have always found it
from .loader import import_target

__all__ = ["DEFAULT_AGENT", "PASSTHROUGH", "AgentError", "AgentFn", "ChannelFn", "FrameFn",
           "ResolvedAgent", "SchemeFactory", "SpecResolver", "family_name", "provide_transcripts",
           "register", "register_family", "register_scheme", "resolve"]

#: A synchronous per-frame handler, called by the transceiver for every decoded frame
#: instead of running an agent task (built-ins only; see :attr:`ResolvedAgent.on_frame`).
FrameFn = Callable[[AgentContext, Frame], None]
#: A synchronous data-channel handler, the channel counterpart of :data:`FrameFn`.
ChannelFn = Callable[[AgentContext, ChannelEvent], None]
#: A scheme factory turns the whole spec (``ws://host/path``) into an agent function.
SchemeFactory = Callable[[str], AgentFn]
#: A family's resolver: the whole spec (``assistant?llm=…``) -> an agent function, or
#: :class:`AgentError` naming what is wrong with it (checked at start-up and per ``create``).
SpecResolver = Callable[[str], AgentFn]

DEFAULT_AGENT = "echo"
PASSTHROUGH = "passthrough"


def _ws_bridge(spec: str) -> AgentFn:
    """``ws://`` / ``wss://``: the built-in WebSocket bridge, loaded with its first spec
    (trio-websocket stays out of a transceiver that never runs one)."""
    from .ws import bridge

    return bridge(spec)


_registered: dict[str, Any] = {}
_schemes: dict[str, SchemeFactory] = {"ws": _ws_bridge, "wss": _ws_bridge}
_families: dict[str, SpecResolver] = {}


@dataclass(frozen=True, slots=True)
class ResolvedAgent:
    name: str  # the spec as given (for stats and the agent's identity)
    run: AgentFn  # call once per session with that session's context
    #: Media passthrough: no decode, no agent task; RTP is echoed under our SSRC.
    passthrough: bool = False
    #: When set, the transceiver calls this for every decoded frame, synchronously in its
    #: network loop, and does not run :attr:`run` (built-in ``echo``: no task switch per
    #: frame). It must be quick and must not block; output goes through
    #: :meth:`AgentContext.send_nowait`.
    on_frame: FrameFn | None = None
    #: With :attr:`on_frame`: called for every data-channel event, synchronously in the
    #: network loop (the agent has no task to read ``channel_events()``).
    on_channel: ChannelFn | None = None


def register(name: str, agent: Any) -> None:
    """Make ``agent`` (function or class) available as ``--agent name``."""
    _registered[name] = agent


def register_scheme(scheme: str, factory: SchemeFactory) -> None:
    """Route ``scheme://…`` specs to ``factory`` (the hook for the WebSocket bridges)."""
    _schemes[scheme.lower()] = factory


def register_family(name: str, resolver: SpecResolver) -> None:
    """Route ``name``, ``name:…`` and ``name?…`` specs, whole, to ``resolver`` (how a plugin
    package adds an agent kind with options: appliance/realtime/plugin.py,
    appliance/speech/plugin.py). A family is matched before schemes, so its options may
    hold URLs (``assistant?llm=http://…``)."""
    _families[name] = resolver


def family_name(spec: str) -> str:
    """The family a spec would belong to: everything before its first ``:`` or ``?``
    (``assistant?llm=…`` -> ``assistant``; ``pkg.mod:attr`` -> ``pkg.mod``, which no family
    is named). The Realtime WebSocket surface's own table (realtime/registry.py) uses it
    too."""
    cut = min((i for i in (spec.find(":"), spec.find("?")) if i >= 0), default=len(spec))
    return spec[:cut]


def _as_fn(obj: Any, spec: str) -> AgentFn:
    if inspect.isclass(obj):
        if not inspect.iscoroutinefunction(getattr(obj, "run", None)):
            raise AgentError(f"agent class {spec!r} needs an 'async def run(self, ctx)'")
        cls: Any = obj

        async def run_instance(ctx: AgentContext) -> None:
            await cls().run(ctx)

        return run_instance
    if inspect.iscoroutinefunction(obj):
        fn: AgentFn = obj
        return fn
    if callable(obj) and inspect.iscoroutinefunction(getattr(obj, "run", None)):
        bound: AgentFn = obj.run  # an instance: shared by every session
        return bound
    raise AgentError(f"agent {spec!r} is not an async function or an agent class")


async def _no_agent(ctx: AgentContext) -> None:
    """The ``passthrough`` agent's body: never run (the transceiver echoes RTP itself)."""


#: The longest kind :func:`agent_kind` returns (it names a cost in load reports).
MAX_KIND = 100


def agent_kind(spec: str | None) -> str:
    """What a spec's calls have in common for costing them (issue 41 item 4: the learned
    per-call cost of an assistant call, transceiver/offload.py): the spec without its
    options (``assistant?stt=whisper`` -> ``assistant``), a registered family's name for
    any of its specs (``realtime:pkg.mod:Agent`` -> ``realtime``; matched first, as
    :func:`resolve` does, so ``assistant?llm=http://…`` is ``assistant``), a ``scheme://``
    bridge's scheme alone (a URL may carry credentials, and the work is the remote
    agent's). ``None`` or ``""`` is the default agent, as in :func:`resolve`; signaling,
    which may not know a transceiver's default, asks that transceiver's report."""
    spec = (spec or DEFAULT_AGENT).strip()
    family = family_name(spec)
    if family in _families:
        return family[:MAX_KIND]
    scheme, sep, _ = spec.partition("://")
    if sep:
        return scheme.lower()[:MAX_KIND - 3] + "://"
    return spec.partition("?")[0][:MAX_KIND]


def resolve(spec: str | None) -> ResolvedAgent:
    """The runnable agent for ``spec`` (``None`` or ``""``: the default, ``echo``)."""
    spec = (spec or DEFAULT_AGENT).strip()
    family = _families.get(family_name(spec))
    if family is not None:  # first: a family's options may hold URLs (assistant?llm=http://…)
        return ResolvedAgent(spec, family(spec))
    scheme, sep, _ = spec.partition("://")
    if sep:
        factory = _schemes.get(scheme.lower())
        if factory is None:
            raise AgentError(f"agent {spec!r}: no bridge for {scheme}:// agents is installed")
        return ResolvedAgent(spec, factory(spec))
    if spec == PASSTHROUGH:
        return ResolvedAgent(spec, _no_agent, passthrough=True)
    if spec in _registered:
        return ResolvedAgent(spec, _as_fn(_registered[spec], spec))
    if spec == DEFAULT_AGENT:  # the built-in echo: a frame handler, no task per frame
        return ResolvedAgent(spec, echo, on_frame=echo_frame, on_channel=echo_channel)
    if ":" in spec:
        return ResolvedAgent(spec, _as_fn(import_target(spec, spec), spec))
    known = ", ".join(sorted({DEFAULT_AGENT, PASSTHROUGH, *_registered, *_families}))
    raise AgentError(f"unknown agent {spec!r} (built-in: {known}; or package.module:attr, "
                     "path/file.py:attr, ws://host:port/path)")
