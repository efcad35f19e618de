"""Resolve ``--agent NAME|module:attr|ws://…`` to something the transceiver can run.

* ``NAME`` — a built-in or :func:`register`-ed agent (``echo``);
* ``passthrough`` — no agent and no codec: the transceiver echoes the caller's RTP itself
  after SRTP unprotect/protect (media passthrough, for capacity measurements and as the
  cheapest possible "agent"); :attr:`ResolvedAgent.passthrough` is set;
* ``package.module:attr`` or ``path/to/file.py:attr`` — imported on first use; ``attr`` is an async function
  ``async def agent(ctx)`` or a class whose instances have ``async def run(self, ctx)``
  (a fresh instance per session);
* ``realtime`` / ``realtime:<module:attr|file.py:attr>`` — the OpenAI Realtime event
  protocol on the ``oai-events`` channel, answered by the built-in echo realtime agent or a
  user ``RealtimeAgent`` (:mod:`appliance.realtime.agent`, docs/realtime.md);
* ``assistant`` / ``assistant?llm=URL&…`` — the voice assistant (listen, transcribe,
  answer, speak; :mod:`appliance.speech.assistant`, docs/speech.md); needs the ``speech``
  extra, and fails here with a message naming it when that is missing;
* ``scheme://…`` — an external agent, handled by the factory registered for that scheme
  with :func:`register_scheme` (the WebSocket bridge registers ``ws`` and ``wss``). Until a
  bridge is registered such specs are rejected with a clear error.

:func:`resolve` is called when a session is created, so a bad spec fails the ``create``
request (400 ``unknown-agent``) instead of the session later; ``appliance up`` and
``appliance transceiver`` call it on their ``--agent`` at start and exit 2 when it fails.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .channels import ChannelEvent
from .context import AgentContext, Frame
from .loader import AgentError as AgentError  # re-exported: where callers have always found it
from .loader import import_target

AgentFn = Callable[[AgentContext], Awaitable[None]]
#: A synchronous per-frame handler, called by the transceiver for every decoded frame
#: instead of running an agent task (built-ins only; see :attr:`ResolvedAgent.on_frame`).
FrameFn = Callable[[AgentContext, Frame], None]
#: A synchronous data-channel handler, the channel counterpart of :data:`FrameFn`.
ChannelFn = Callable[[AgentContext, ChannelEvent], None]
#: A scheme factory turns the whole spec (``ws://host/path``) into an agent function.
SchemeFactory = Callable[[str], AgentFn]

DEFAULT_AGENT = "echo"
PASSTHROUGH = "passthrough"
_BUILTINS: dict[str, str] = {"echo": "appliance.agents.echo:echo"}
#: Built-ins that also have a synchronous frame handler (same behaviour, no task per frame).
_INLINE: dict[str, str] = {"echo": "appliance.agents.echo:echo_frame"}
#: ... and their synchronous data-channel handlers (see :attr:`ResolvedAgent.on_channel`).
_INLINE_CHANNEL: dict[str, str] = {"echo": "appliance.agents.echo:echo_channel"}
_BUILTIN_SCHEMES: dict[str, str] = {"ws": "appliance.agents.ws", "wss": "appliance.agents.ws",
                                     # The OpenAI-Realtime upstream bridge (issue 17).
                                     "realtime+ws": "appliance.realtime.bridge",
                                     "realtime+wss": "appliance.realtime.bridge"}
_registered: dict[str, Any] = {}
_schemes: dict[str, SchemeFactory] = {}


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
    """Route ``scheme://…`` specs to ``factory`` (the hook for the WebSocket bridge)."""
    _schemes[scheme.lower()] = factory


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




def _assistant(spec: str) -> AgentFn:
    """``assistant[?options]`` (appliance.speech.assistant); needs the ``speech`` extra."""
    try:
        module = importlib.import_module("appliance.speech.assistant")
    except ModuleNotFoundError as exc:  # numpy-only parts import; engines fail in resolve_spec
        raise AgentError(f"--agent assistant needs the 'speech' extra ({exc.name} is missing): "
                         "pip install 'appliance[speech]'") from exc
    fn: AgentFn = module.resolve_spec(spec)
    return fn


async def _no_agent(ctx: AgentContext) -> None:
    """The ``passthrough`` agent's body: never run (the transceiver echoes RTP itself)."""


#: The longest kind :func:`agent_kind` returns (it names a cost in load reports).
MAX_KIND = 100


def agent_kind(spec: str | None) -> str:
    """What a spec's calls have in common for costing them (issue 41 item 4: the learned
    per-call cost of an assistant call, transceiver/offload.py): the spec without its
    options (``assistant?stt=whisper`` -> ``assistant``), a ``scheme://`` bridge's scheme
    alone (a URL may carry credentials, and the work is the remote agent's), ``realtime``
    for any Realtime spec. ``None`` or ``""`` is the default agent, as in :func:`resolve`;
    signaling, which may not know a transceiver's default, asks that transceiver's report."""
    spec = (spec or DEFAULT_AGENT).strip()
    scheme, sep, _ = spec.partition("://")
    if sep:
        return scheme.lower()[:MAX_KIND - 3] + "://"
    name = spec.partition("?")[0]
    if name.startswith("realtime:"):
        return "realtime"
    return name[:MAX_KIND]


def resolve(spec: str | None) -> ResolvedAgent:
    """The runnable agent for ``spec`` (``None`` or ``""``: the default, ``echo``)."""
    spec = (spec or DEFAULT_AGENT).strip()
    if spec == "assistant" or spec.startswith("assistant?"):  # the voice loop (issue 30);
        return ResolvedAgent(spec, _assistant(spec))  # first: its options hold URLs
    scheme, sep, _ = spec.partition("://")
    if sep:
        factory = _schemes.get(scheme.lower())
        if factory is None and scheme.lower() in _BUILTIN_SCHEMES:
            importlib.import_module(_BUILTIN_SCHEMES[scheme.lower()])  # registers itself
            factory = _schemes.get(scheme.lower())
        if factory is None:
            raise AgentError(f"agent {spec!r}: no bridge for {scheme}:// agents is installed")
        return ResolvedAgent(spec, factory(spec))
    if spec == PASSTHROUGH:
        return ResolvedAgent(spec, _no_agent, passthrough=True)
    if spec == "realtime" or spec.startswith("realtime:"):  # the OpenAI Realtime protocol
        realtime = importlib.import_module("appliance.realtime.agent")  # (issue 17)
        return ResolvedAgent(spec, realtime.resolve_spec(spec))
    if spec in _registered:
        return ResolvedAgent(spec, _as_fn(_registered[spec], spec))
    if spec in _BUILTINS:
        inline = import_target(_INLINE[spec], spec) if spec in _INLINE else None
        on_channel = import_target(_INLINE_CHANNEL[spec], spec) if spec in _INLINE_CHANNEL else None
        return ResolvedAgent(spec, _as_fn(import_target(_BUILTINS[spec], spec), spec), on_frame=inline,
                             on_channel=on_channel)
    if ":" in spec:
        return ResolvedAgent(spec, _as_fn(import_target(spec, spec), spec))
    known = ", ".join(sorted(set(_BUILTINS) | set(_registered) | {PASSTHROUGH, "assistant"}))
    raise AgentError(f"unknown agent {spec!r} (built-in: {known}; or package.module:attr, "
                     "path/file.py:attr, ws://host:port/path)")
