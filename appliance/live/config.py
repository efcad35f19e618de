"""The GPT-Live session config (``types/live/session_config.py``): validation, defaults,
updates, the resolved ``SessionResource`` and the Realtime session it runs as.

**Strict.** Every field is checked against :data:`SESSION_CONFIG` and an unknown one is an
``error`` naming its ``param`` (the real service does the same; Realtime's config kept
unknown fields). Beyond the shape, what the appliance cannot serve is refused at
``session.start`` with ``unsupported_value`` and the field: ``decisions`` delegation,
``triggers`` (Decisions) and a Responses backend's hosted tools (responses.py checks the
``responses`` config: function tools only). ``store: true`` keeps the session (store.py).

**Forks** (:func:`fork_untrusted`): a fork's ``session.start`` (or the ``session`` of a
WebRTC ``POST …/{id}/fork``) is a ``ForkSessionConfig`` of overrides — ``audio.format``
(WebSocket), ``client`` (WebRTC), ``store`` — applied to the stored session's config, whose
conversation becomes the fork's ``input`` (:func:`history`); the model cannot change.

**Immutable after start** (``session.update`` → ``immutable_field_update``): model,
instructions, audio (format and voice), input, client, store and safety_identifier.
``session.update`` takes only ``delegation`` (of the session's type: ``client``, whose one
setting is ``acknowledgement_delay_ms``, or ``responses``, whose ``responses`` fields are
merged) and ``triggers`` (an empty list only).

**What acts on what** (the inner Realtime session, :func:`realtime_session`):
``instructions`` is the agent's system prompt, ``audio.output.voice`` its voice (the
offline TTS speaks in its own voice whatever the name), ``input`` seeds the conversation
(developer messages as ``system`` items); ``audio.format`` is the WebSocket's encoding both
ways (connection.py converts). Turn-taking has no knob here, as in GPT-Live: the inner
session always runs ``semantic_vad`` with the appliance's turn engine, interrupting.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .responses import check_config_untrusted
from .schema import (
    AnyJson,
    Arr,
    Bool,
    Const,
    Int,
    LiveError,
    Num,
    Obj,
    OneOf,
    Str,
    Tagged,
    optional,
    required,
    validate_untrusted,
)

BUILT_IN_VOICES = ("alloy", "ash", "ballad", "beacon", "bossa", "cedar", "cinder", "coral",
                   "delta", "echo", "gleam", "marin", "meridian", "quartz", "ripple", "sage",
                   "shida", "shimmer", "stone", "tempo", "verse", "vesper", "willow")
DEFAULT_VOICE = "marin"
DEFAULT_FORMAT: dict[str, Any] = {"type": "audio/pcm", "rate": 24000}
#: How long a session may run (``expires_at``); then it closes with reason ``expired``.
MAX_SESSION_SECONDS = 3600
MAX_MODEL = 256
MAX_INSTRUCTIONS_TOKENS = 16_384
MAX_INPUT_ITEMS = 128
MAX_INPUT_TOKENS = 8_192
MAX_ID = 128
_EVENT_TYPE = re.compile(r"(?:error|info|[a-z][a-z0-9_-]*(?:\.[a-z0-9_-]+)+)")


def tokens(text: str) -> int:
    """A token estimate (~4 characters each): the limits are stated in tokens, and no
    tokenizer of the model exists here."""
    return math.ceil(len(text) / 4)


def _format(kind: str, rates: tuple[int, ...]) -> Obj:
    return Obj({"type": required(Const(kind)), "rate": required(Int(choices=rates))})


AUDIO_FORMAT = Tagged("type", {
    "audio/pcm": _format("audio/pcm", (16000, 24000)),
    "audio/pcmu": _format("audio/pcmu", (8000,)),
    "audio/pcma": _format("audio/pcma", (8000,)),
})
VOICE = OneOf((Str(choices=BUILT_IN_VOICES), Obj({"id": required(Str(max_len=MAX_ID))})))
AUDIO = Obj({"format": optional(AUDIO_FORMAT),
             "output": optional(Obj({"voice": optional(VOICE)}))})
CLIENT = Obj({"data_channel": required(Obj({
    "allowed_client_events": optional(OneOf((
        Const("all"), Arr(Str(max_len=128, pattern=_EVENT_TYPE), max_items=256)))),
    "allowed_server_events": optional(OneOf((
        Const("all"), Arr(Obj({"type": required(Str(max_len=128, pattern=_EVENT_TYPE)),
                               "response_event": optional(Str(max_len=128))}),
                          max_items=256)))),
}))})
_ACK = optional(Int(lo=0, hi=60_000))
#: ``decisions`` is refused after the shape check (its config is not validated field by
#: field: the refusal is the answer either way); ``responses`` is checked by responses.py.
DELEGATION = Tagged("type", {
    "client": Obj({"type": required(Const("client")), "acknowledgement_delay_ms": _ACK}),
    "responses": Obj({"type": required(Const("responses")), "responses": required(AnyJson()),
                      "acknowledgement_delay_ms": _ACK}),
    "decisions": Obj({"type": required(Const("decisions")), "decisions": required(AnyJson()),
                      "acknowledgement_delay_ms": _ACK}),
})
UPDATE_DELEGATION = Tagged("type", {
    "client": Obj({"type": required(Const("client")), "acknowledgement_delay_ms": _ACK}),
    "responses": Obj({"type": required(Const("responses")), "responses": optional(AnyJson()),
                      "acknowledgement_delay_ms": _ACK}),
    "decisions": Obj({"type": required(Const("decisions")), "decisions": optional(AnyJson()),
                      "acknowledgement_delay_ms": _ACK}),
})


def _message(role: str, parts: Tagged) -> Obj:
    return Obj({"role": required(Const(role)),
                "content": required(Arr(parts, exactly=1)),
                "id": optional(Str(max_len=MAX_ID), nullable=True),
                "status": optional(Str(choices=("incomplete", "completed")), nullable=True),
                "type": optional(Const("message"))})


_TEXT_IN = Tagged("type", {"input_text": Obj({"text": required(Str()),
                                              "type": optional(Const("input_text"))})},
                  default="input_text")
_TEXT_OUT = Tagged("type", {"text": Obj({"text": required(Str()), "type": optional(Const("text"))}),
                            "output_text": Obj({"text": required(Str()),
                                                "type": required(Const("output_text"))})},
                   default="text")
INITIAL_ITEM = Tagged("role", {"developer": _message("developer", _TEXT_IN),
                               "user": _message("user", _TEXT_IN),
                               "assistant": _message("assistant", _TEXT_OUT)})

SESSION_CONFIG = Obj({
    "model": required(Str(max_len=MAX_MODEL)),
    "audio": optional(AUDIO),
    "client": optional(CLIENT),
    "delegation": optional(DELEGATION, nullable=True),
    "input": optional(Arr(INITIAL_ITEM, max_items=MAX_INPUT_ITEMS)),
    "instructions": optional(Str(), nullable=True),
    "safety_identifier": optional(Str(max_len=512), nullable=True),
    "store": optional(Bool()),
    "triggers": optional(Arr(AnyJson(), max_items=2)),
})
#: ``MediaSessionConfigParam`` (``POST /v1/live/sessions``, WebRTC): no ``audio.format``
#: (the media transport negotiates its codec), and the WebRTC-only ``idle_timeout_s`` and
#: ``wake_policy`` (idle.py).
MEDIA_SESSION_CONFIG = Obj({
    **{k: v for k, v in SESSION_CONFIG.fields.items() if k != "audio"},
    "audio": optional(Obj({"output": optional(Obj({"voice": optional(VOICE)}))})),
    "idle_timeout_s": optional(Int(lo=1, hi=MAX_SESSION_SECONDS)),
    "wake_policy": optional(Obj({"type": required(Const("speech")),
                                 "vad_threshold": optional(Num(lo=0.0, hi=1.0))})),
})
#: What a WebRTC session's resource does not show (``SessionResource`` has no such fields).
MEDIA_ONLY = ("idle_timeout_s", "wake_policy")
#: ``ForkSessionConfig`` (a WebSocket fork's ``session.start``) and
#: ``MediaSessionForkConfig`` (a WebRTC fork's ``session``): the overrides a fork may give.
#: ``delegation`` overrides only a Responses backend's settings, and only of a stored
#: session that used Responses delegation (the type cannot change): a sparse update, as
#: ``session.update``'s.
FORK_CONFIG = Obj({
    "audio": optional(Obj({"format": optional(AUDIO_FORMAT)})),
    "client": optional(CLIENT),
    "delegation": optional(Obj({"type": required(Const("responses")),
                                "responses": optional(AnyJson()),
                                "acknowledgement_delay_ms": _ACK})),
    "store": optional(Bool()),
})
MEDIA_FORK_CONFIG = Obj({k: v for k, v in FORK_CONFIG.fields.items() if k != "audio"})
SESSION_UPDATE = Obj({
    "delegation": optional(UPDATE_DELEGATION, nullable=True),
    "triggers": optional(Arr(AnyJson(), max_items=2)),
})


def _unsupported(message: str, param: str) -> LiveError:
    return LiveError(f"{message} This appliance does not serve it (docs/live.md).",
                     code="unsupported_value", param=param)


def _served(config: dict[str, Any], where: str, *, update: bool = False) -> None:
    """Refuse what passed the shape check but is not served (Decisions delegation and
    triggers, a Responses backend's hosted tools); a Responses config is checked in full
    here (responses.py) and replaced by its checked copy."""
    delegation = config.get("delegation")
    if isinstance(delegation, dict) and delegation["type"] == "decisions":
        raise _unsupported("Decisions delegation needs the Decision API: client and "
                           "responses delegation are served.", f"{where}delegation.type")
    if isinstance(delegation, dict) and "responses" in delegation:
        delegation["responses"] = check_config_untrusted(
            delegation["responses"], f"{where}delegation.responses", update=update)
    if config.get("triggers"):
        raise _unsupported("Decisions triggers need the Decision API.", f"{where}triggers")


#: Responses delegation asked of an appliance with no LLM configured.
NO_BACKEND = ("Responses delegation needs an OpenAI-compatible LLM behind the appliance: "
              "start it with --llm URL (its …/v1 base; --llm-key-file for its key). "
              "Without one, use client delegation.")


def resolve_untrusted(value: Any, *, media: bool = False, backend: bool = True) -> dict[str, Any]:
    """A ``session.start`` config (``media``: the ``session`` of a WebRTC
    ``POST /v1/live/sessions``), checked, with the server's defaults filled in (what
    ``session.started`` shows). ``backend``: an LLM is configured, so Responses delegation
    is served. Raises :class:`LiveError`."""
    spec = MEDIA_SESSION_CONFIG if media else SESSION_CONFIG
    cfg: dict[str, Any] = validate_untrusted(spec, value, "session")
    if "idle_timeout_s" in cfg and "wake_policy" not in cfg:
        # GPT-Live pauses only "a session with a speech wake policy": without one nothing
        # could ever wake it, so the pair is refused rather than the timeout ignored.
        raise LiveError("Invalid 'session.idle_timeout_s': an idle timeout needs "
                        "'session.wake_policy' (speech wakes a paused session).",
                        param="session.idle_timeout_s")
    model = cfg["model"]
    if not model.strip() or not model.isprintable():
        raise LiveError("Invalid value for 'session.model': a model name is required.",
                        param="session.model")
    instructions = cfg.get("instructions")
    if instructions is not None and tokens(instructions) > MAX_INSTRUCTIONS_TOKENS:
        raise LiveError(f"Invalid 'session.instructions': longer than "
                        f"{MAX_INSTRUCTIONS_TOKENS} tokens.", code="string_above_max_length",
                        param="session.instructions")
    items = cfg.get("input") or []
    if sum(tokens(item["content"][0]["text"]) for item in items) > MAX_INPUT_TOKENS:
        raise LiveError(f"Invalid 'session.input': the history is longer than "
                        f"{MAX_INPUT_TOKENS} tokens.", code="string_above_max_length",
                        param="session.input")
    _served(cfg, "session.")
    delegation = cfg.get("delegation")
    if isinstance(delegation, dict) and delegation["type"] == "responses" and not backend:
        raise LiveError(NO_BACKEND, code="unsupported_value", param="session.delegation.type")
    audio = cfg.get("audio") or {}
    output = audio.get("output") or {}
    voice = {"voice": output.get("voice") or DEFAULT_VOICE}
    cfg["audio"] = ({"output": voice} if media else
                    {"format": audio.get("format") or dict(DEFAULT_FORMAT), "output": voice})
    cfg["delegation"] = cfg.get("delegation") or {"type": "client"}
    cfg["input"] = items
    cfg["store"] = bool(cfg.get("store", False))
    for key in ("instructions", "safety_identifier"):
        if cfg.get(key) is None:
            cfg.pop(key, None)
    return cfg


def history(items: Any) -> list[dict[str, Any]]:
    """The conversation a stored session keeps (its Realtime items: what was said, as text)
    as ``session.input`` items for a fork: user and assistant messages with their text or
    transcript, system items as ``developer``; the newest that fit the ``input`` limits."""
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list | tuple) else ():
        if not isinstance(item, dict) or item.get("type") != "message":
            continue  # tool calls and their outputs: the text around them says the result
        role = item.get("role")
        role = "developer" if role == "system" else role
        if role not in ("developer", "user", "assistant"):
            continue
        text = " ".join(
            t for part in item.get("content") or () if isinstance(part, dict)
            for t in (part.get("text"), part.get("transcript")) if isinstance(t, str) and t)
        if not text.strip():
            continue  # unheard audio, a cancelled answer
        part = "output_text" if role == "assistant" else "input_text"
        out.append({"role": role, "content": [{"type": part, "text": text}]})
    out = out[-MAX_INPUT_ITEMS:]
    while out and sum(tokens(i["content"][0]["text"]) for i in out) > MAX_INPUT_TOKENS:
        out.pop(0)
    return out


def fork_untrusted(stored: dict[str, Any], overrides: Any, *,
                   media: bool = False) -> dict[str, Any]:
    """The config a fork starts with, as a client would have given it: ``stored`` (a
    stored session: its ``session`` config and its ``conversation``), the conversation as
    ``input``, then the checked ``overrides``. Raises :class:`LiveError` naming the
    param."""
    patch = validate_untrusted(MEDIA_FORK_CONFIG if media else FORK_CONFIG, overrides,
                               "session")
    _served(patch, "session.", update=True)
    if "client" in patch and not media:
        raise LiveError("Invalid 'session.client': client overrides are only supported for "
                        "WebRTC forks.", code="unknown_parameter", param="session.client")
    given = {k: v for k, v in stored["session"].items()
             if k not in (MEDIA_ONLY if not media else ())}
    given["input"] = stored["conversation"]
    audio = dict(given.get("audio") or {})
    if media:
        audio.pop("format", None)
    elif "format" in (patch.get("audio") or {}):
        audio["format"] = patch["audio"]["format"]
    given["audio"] = audio
    if "client" in patch:
        given["client"] = patch["client"]
    elif not media:
        given.pop("client", None)
    if "store" in patch:
        given["store"] = patch["store"]
    if "delegation" in patch:
        given["delegation"] = _merge_delegation(given.get("delegation") or {"type": "client"},
                                                patch["delegation"])
    return given


def _merge_delegation(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A delegation update (``session.update``, a fork's override) over ``current``: the
    type is fixed; a Responses backend's settings are updated sparsely."""
    kind = current["type"]
    if patch["type"] != kind:
        raise LiveError(f"Cannot change the delegation type from '{kind}' to "
                        f"'{patch['type']}': it is fixed at session start.",
                        code="immutable_field_update", param="session.delegation.type")
    merged = {**current, **patch}
    if "responses" in patch:  # a sparse update of the backend's settings
        merged["responses"] = {**current["responses"], **patch["responses"]}
    return merged


def apply_update_untrusted(current: dict[str, Any], value: Any) -> dict[str, Any]:
    """``current`` with a ``session.update`` applied (a new dict). Raises
    :class:`LiveError`: ``immutable_field_update`` for a startup-only field."""
    if isinstance(value, dict):
        for key in value:
            if key in SESSION_CONFIG.fields and key not in SESSION_UPDATE.fields:
                raise LiveError(f"Cannot update 'session.{key}' after the session has "
                                "started: it is immutable. Start a new session to change it.",
                                code="immutable_field_update", param=f"session.{key}")
    patch = validate_untrusted(SESSION_UPDATE, value, "session")
    _served(patch, "session.", update=True)
    out = dict(current)
    delegation = patch.get("delegation")
    if delegation is not None:
        out["delegation"] = _merge_delegation(current["delegation"], delegation)
    if "triggers" in patch:  # only [] passes _served: no triggers
        out.pop("triggers", None)
    return out


def resource(config: dict[str, Any], *, session_id: str, expires_at: int) -> dict[str, Any]:
    """The ``SessionResource`` of ``session.started`` / ``updated`` / ``closed``."""
    return {"id": session_id, "expires_at": expires_at, "model": config["model"],
            "status": "active",
            **{k: v for k, v in config.items() if k != "model" and k not in MEDIA_ONLY}}


#: Client delegation (issue 42 item 3): the one tool the agent is given. GPT-Live's model
#: decides to delegate; here the agent's LLM decides by calling this tool (an agent with
#: tools: the assistant with an LLM, or a RealtimeAgent of your own; the built-in
#: responder never does). Offered only when the session names ``delegation: {"type":
#: "client"}`` itself (:func:`offers_delegation`): GPT-Live's default is client delegation,
#: but a client that does not ask for it has no handler for what comes back, and an
#: OpenAI-compatible backend without tool support (vLLM without auto tool choice, some
#: local servers) would refuse every answer of a session that declares a tool.
#: The task text stays with the LLM: GPT-Live's
#: ``session.delegation.created`` carries none (the application rebuilds the task from the
#: transcript up to ``offset_ms``).
DELEGATE_TOOL = "delegate"
DELEGATE: dict[str, Any] = {
    "type": "function", "name": DELEGATE_TOOL,
    "description": ("Hand a task you cannot complete from the conversation alone (it needs "
                    "the user's account, live data, or an action in the application) to "
                    "the application. Do not make up its result: it will come back to "
                    "you as context, and you will be told what to say."),
    "parameters": {"type": "object", "properties": {
        "task": {"type": "string", "description": "The task, in one sentence."}},
        "required": ["task"]},
}


def offers_delegation(session: Any) -> bool:
    """Whether a (checked) ``session.start`` / POST config asked for client delegation by
    name, so its agent gets the delegate tool."""
    delegation = session.get("delegation") if isinstance(session, dict) else None
    return isinstance(delegation, dict) and delegation.get("type") in ("client", "responses")


def realtime_session(config: dict[str, Any], transcription_model: str, *,
                     delegate: bool = False) -> dict[str, Any]:
    """The inner Realtime session (``session.update`` of appliance/realtime/session.py):
    the agent's prompt, voice and (``delegate``) its delegate tool, audio always, and
    turns the server's."""
    voice = config["audio"]["output"]["voice"]
    return {
        "type": "realtime",
        "tools": [DELEGATE] if delegate else [],
        "model": config["model"],
        "instructions": config.get("instructions") or "",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "transcription": {"model": transcription_model},
                "turn_detection": {"type": "semantic_vad", "eagerness": "auto",
                                   "create_response": True, "interrupt_response": True},
            },
            "output": {"voice": voice},
        },
    }


def realtime_items(config: dict[str, Any]) -> list[dict[str, Any]]:
    """``session.input`` as Realtime conversation items (developer → ``system``)."""
    out = []
    for item in config.get("input") or ():
        role = "system" if item["role"] == "developer" else item["role"]
        part = "output_text" if role == "assistant" else "input_text"
        out.append({"type": "message", "role": role,
                    "content": [{"type": part, "text": item["content"][0]["text"]}]})
    return out
