"""The Realtime session configuration (GA ``realtime.session``): defaults, validation, merge.

``session.update`` carries a partial session: the fields present replace the current ones,
the nested ``audio``, ``audio.input`` and ``audio.output`` objects merge key by key (as
OpenAI merges them). Every field the appliance understands is checked — the update is
atomic, one bad field refuses all of it with an ``error`` naming the client's ``event_id``
and the field's path in ``param`` — and every field it does not understand is **kept and
echoed** in ``session.updated`` (a newer client's field must not be silently dropped).

What acts on what: ``instructions``, ``output_modalities``, ``audio.output.voice`` and the
rest reach the agent in each :class:`~appliance.realtime.interface.ResponseRequest`;
``audio.input.turn_detection`` drives the machine's turns (the shared turn engine on the
energy VAD: ``silence_duration_ms`` (server) sets the end-of-turn silence; ``eagerness``
(semantic) the Smart Turn threshold and silence bound, or only a silence without the
model, see machine.py; ``prefix_padding_ms`` the audio kept before speech,
``create_response`` / ``interrupt_response`` are honoured; ``threshold`` is kept, not
applied). ``audio.input.transcription`` turns on the input transcription events
(appliance/realtime/transcription.py).
"""

from __future__ import annotations

from typing import Any

from .protocol import EventError, check, json_copy, optional

VOICES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin",
          "cedar")
FORMATS = ("audio/pcm", "audio/pcmu", "audio/pcma")
MODALITIES = ("text", "audio")
EAGERNESS_SILENCE_MS = {"low": 1500, "medium": 800, "auto": 800, "high": 500}

SERVER_VAD_DEFAULTS: dict[str, Any] = {
    "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
    "silence_duration_ms": 500, "idle_timeout_ms": None, "create_response": True,
    "interrupt_response": True,
}
SEMANTIC_VAD_DEFAULTS: dict[str, Any] = {
    "type": "semantic_vad", "eagerness": "auto", "create_response": True,
    "interrupt_response": True,
}


def default_session(session_id: str, model: str = "appliance-realtime") -> dict[str, Any]:
    """A fresh session as ``session.created`` shows it (OpenAI's GA defaults)."""
    return {
        "type": "realtime",
        "object": "realtime.session",
        "id": session_id,
        "model": model,
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "expires_at": 0,
        "include": None,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": dict(SERVER_VAD_DEFAULTS),
            },
            "output": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "voice": "alloy",
                "speed": 1.0,
            },
        },
    }


def _bad(param: str, message: str, eid: str | None) -> EventError:
    return EventError(f"Invalid value for '{param}': {message}", param=param, event_id=eid)


def _format(value: Any, param: str, eid: str | None) -> dict[str, Any]:
    fmt: dict[str, Any] = dict(check(value, dict, param=param, event_id=eid))
    kind = fmt.get("type", "audio/pcm")
    if kind not in FORMATS:
        raise _bad(f"{param}.type", f"expected one of {', '.join(FORMATS)}", eid)
    fmt["type"] = kind
    if kind == "audio/pcm":
        rate = fmt.get("rate", 24000)
        if rate != 24000 or isinstance(rate, bool):
            raise _bad(f"{param}.rate", "only 24000 is supported", eid)
        fmt["rate"] = 24000
    return fmt


def _turn_detection(value: Any, param: str, eid: str | None) -> dict[str, Any] | None:
    if value is None:
        return None
    td: dict[str, Any] = dict(check(value, dict, param=param, event_id=eid))
    kind = td.get("type", "server_vad")
    if kind == "server_vad":
        out = {**SERVER_VAD_DEFAULTS, **td}
        threshold = check(out["threshold"], float, param=f"{param}.threshold", event_id=eid)
        if not 0.0 <= threshold <= 1.0:
            raise _bad(f"{param}.threshold", "expected a number between 0 and 1", eid)
        for key in ("prefix_padding_ms", "silence_duration_ms"):
            n = check(out[key], int, param=f"{param}.{key}", event_id=eid)
            if not 0 <= n <= 60_000:
                raise _bad(f"{param}.{key}", "expected an integer between 0 and 60000", eid)
        optional(out, "idle_timeout_ms", int, where=f"{param}.", event_id=eid)
    elif kind == "semantic_vad":
        out = {**SEMANTIC_VAD_DEFAULTS, **td}
        if out["eagerness"] not in EAGERNESS_SILENCE_MS:
            raise _bad(f"{param}.eagerness", "expected low, medium, high or auto", eid)
    else:
        raise _bad(f"{param}.type", "expected 'server_vad', 'semantic_vad' or null", eid)
    for key in ("create_response", "interrupt_response"):
        check(out[key], bool, param=f"{param}.{key}", event_id=eid)
    return out


def _audio_input(patch: dict[str, Any], current: dict[str, Any], eid: str | None) -> None:
    where = "session.audio.input"
    if "format" in patch:
        current["format"] = _format(patch["format"], f"{where}.format", eid)
    if "turn_detection" in patch:
        current["turn_detection"] = _turn_detection(patch["turn_detection"],
                                                    f"{where}.turn_detection", eid)
    if "transcription" in patch:
        tr = patch["transcription"]
        if tr is not None:
            tr = dict(check(tr, dict, param=f"{where}.transcription", event_id=eid))
            for key in ("model", "language", "prompt"):
                optional(tr, key, str, where=f"{where}.transcription.", event_id=eid)
        current["transcription"] = tr
    if "noise_reduction" in patch:
        nr = patch["noise_reduction"]
        if nr is not None:
            nr = dict(check(nr, dict, param=f"{where}.noise_reduction", event_id=eid))
            if nr.get("type") not in ("near_field", "far_field"):
                raise _bad(f"{where}.noise_reduction.type", "expected near_field or far_field",
                           eid)
        current["noise_reduction"] = nr
    for key, value in patch.items():  # unknown input fields: kept and echoed
        if key not in ("format", "turn_detection", "transcription", "noise_reduction"):
            current[key] = json_copy(value)


def _audio_output(patch: dict[str, Any], current: dict[str, Any], eid: str | None) -> None:
    where = "session.audio.output"
    if "format" in patch:
        current["format"] = _format(patch["format"], f"{where}.format", eid)
    if "voice" in patch and patch["voice"] is not None:
        voice = check(patch["voice"], (str, dict), param=f"{where}.voice", event_id=eid)
        if isinstance(voice, dict):  # a custom voice: {"id": "voice_…"}
            check(voice.get("id"), str, param=f"{where}.voice.id", event_id=eid)
        current["voice"] = json_copy(voice)
    if "speed" in patch and patch["speed"] is not None:
        speed = check(patch["speed"], float, param=f"{where}.speed", event_id=eid)
        if not 0.25 <= speed <= 1.5:
            raise _bad(f"{where}.speed", "expected a number between 0.25 and 1.5", eid)
        current["speed"] = speed
    for key, value in patch.items():
        if key not in ("format", "voice", "speed"):
            current[key] = json_copy(value)


def _modalities(value: Any, param: str, eid: str | None) -> list[str]:
    mods = check(value, list, param=param, event_id=eid)
    # OpenAI takes exactly one output modality: ["audio"] (with its transcript) or ["text"].
    if len(mods) != 1 or mods[0] not in MODALITIES:
        raise _bad(param, "expected [\"audio\"] or [\"text\"]", eid)
    return [mods[0]]


def _max_tokens(value: Any, param: str, eid: str | None) -> int | str:
    if value == "inf":
        return "inf"
    n: int = check(value, int, param=param, event_id=eid)
    if not 1 <= n <= 4096:
        raise _bad(param, "expected an integer between 1 and 4096, or 'inf'", eid)
    return n


#: Top-level keys the client may not change (they name the session, not configure it).
_READ_ONLY = ("id", "object", "expires_at")


def apply_update_untrusted(current: dict[str, Any], patch: dict[str, Any],
                           event_id: str | None = None) -> dict[str, Any]:
    """``current`` with ``patch`` applied (a new dict; ``current`` is untouched).

    Raises :class:`EventError` (param: the field's path) on the first invalid field.
    """
    eid = event_id
    out: dict[str, Any] = json_copy(current)
    kind = patch.get("type", "realtime")
    if kind != "realtime":
        raise _bad("session.type", "only 'realtime' sessions are supported (no "
                   "transcription-only sessions)", eid)
    for key, value in patch.items():
        param = f"session.{key}"
        if key in _READ_ONLY or key == "type":
            continue
        if key == "instructions":
            out[key] = "" if value is None else check(value, str, param=param, event_id=eid)
        elif key == "model":
            out[key] = check(value, str, param=param, event_id=eid)
        elif key == "output_modalities":
            out[key] = _modalities(value, param, eid)
        elif key == "max_output_tokens":
            out[key] = _max_tokens(value, param, eid)
        elif key == "tools":
            tools = check(value, list, param=param, event_id=eid)
            for i, tool in enumerate(tools):
                check(tool, dict, param=f"{param}[{i}]", event_id=eid)
            out[key] = json_copy(tools)
        elif key == "audio":
            audio = check(value, dict, param=param, event_id=eid)
            target = out.setdefault("audio", {})
            if "input" in audio and audio["input"] is not None:
                _audio_input(check(audio["input"], dict, param=f"{param}.input", event_id=eid),
                             target.setdefault("input", {}), eid)
            if "output" in audio and audio["output"] is not None:
                _audio_output(check(audio["output"], dict, param=f"{param}.output",
                                    event_id=eid), target.setdefault("output", {}), eid)
            for sub, v in audio.items():
                if sub not in ("input", "output"):
                    target[sub] = json_copy(v)
        else:  # tool_choice, tracing, truncation, prompt, include, unknown: kept and echoed
            out[key] = json_copy(value)
    return out


def turn_detection(session: dict[str, Any]) -> dict[str, Any] | None:
    td: dict[str, Any] | None = session.get("audio", {}).get("input", {}).get("turn_detection")
    return td


def end_of_turn_silence_ms(td: dict[str, Any]) -> int:
    if td["type"] == "semantic_vad":
        return EAGERNESS_SILENCE_MS[td.get("eagerness", "auto")]
    silence: int = td.get("silence_duration_ms", 500)
    return silence


def input_format(session: dict[str, Any]) -> str:
    fmt: str = session.get("audio", {}).get("input", {}).get("format", {}).get("type",
                                                                               "audio/pcm")
    return fmt
