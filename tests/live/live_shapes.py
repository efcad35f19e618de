"""Every GPT-Live server event the appliance sends, checked against the official SDK's
``ServerEvent`` union (openai-python ``types/live/server_event.py``): the event must
validate as the union member its ``type`` names (required fields, types, literals), and
may carry no field that member — or any model below it — does not have. The SDK's models
allow extra fields, so validation alone would let an invented field through; the walk
below is what fails on one. Extensions would be listed in :data:`EXTENSIONS` (none)."""

from __future__ import annotations

import types
import typing
from typing import Any

from openai.types.live.connect_server_event import (
    ConnectServerEvent,
    SessionPaused,
    SessionResumed,
)
from openai.types.live.server_event import ServerEvent
from pydantic import BaseModel, ValidationError

#: (type, field path) the appliance sends beyond the SDK's types, documented in
#: docs/live.md: none.
EXTENSIONS: frozenset[tuple[str, str]] = frozenset()

_MEMBERS: dict[str, type[BaseModel]] = {
    m.model_fields["type"].annotation.__args__[0]: m
    for m in typing.get_args(typing.get_args(ServerEvent)[0])
}
#: The WebRTC data channel's events beyond the primary union: ``session.paused`` /
#: ``resumed`` ("delivered to the sideband and, when permitted by its event settings, the
#: data channel": ``ConnectServerEvent``; the primary socket never gets them).
_DATA_CHANNEL: dict[str, type[BaseModel]] = {
    **_MEMBERS, "session.paused": SessionPaused, "session.resumed": SessionResumed}
#: A sideband's (``GET /v1/live/sessions/{id}/attach``): the SDK's ``ConnectServerEvent``,
#: whose ``session.input_audio.append`` is the reflected input audio and whose
#: ``session.output_audio.delta`` carries start_ms/end_ms.
_SIDEBAND: dict[str, type[BaseModel]] = {
    m.model_fields["type"].annotation.__args__[0]: m
    for m in typing.get_args(typing.get_args(ConnectServerEvent)[0])
}


def _fits(tp: Any, value: Any) -> bool:
    tp = _strip(tp)
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(a, value) for a in typing.get_args(tp))
    if origin is list:
        return isinstance(value, list)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if not isinstance(value, dict):
            return False
        tag = tp.model_fields.get("type")
        return tag is None or _fits(tag.annotation, value.get("type"))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    return True


def _strip(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _extra(tp: Any, value: Any, path: str) -> list[str]:
    tp = _strip(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return []
        fits = [_extra(a, value, path) for a in typing.get_args(tp)
                if a is not type(None) and _fits(a, value)]
        return min(fits, key=len) if fits else [f"{path}: fits no member of {tp}"]
    if origin is list:
        (item,) = typing.get_args(tp)
        return [e for i, v in enumerate(value) for e in _extra(item, v, f"{path}[{i}]")]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        out = []
        for key, v in value.items():
            field = tp.model_fields.get(key)
            if field is None:
                out.append(f"{path}.{key}")
            else:
                out += _extra(field.annotation, v, f"{path}.{key}")
        return out
    return []


def shape_errors(event: dict[str, Any], *, data_channel: bool = False,
                 sideband: bool = False) -> list[str]:
    """What is wrong with ``event`` by the SDK's types (empty: nothing); ``data_channel``:
    an event of a WebRTC session's ``oai-events`` channel; ``sideband``: of a sideband
    (``ConnectServerEvent``; its output audio must carry its span)."""
    kind = event.get("type")
    if sideband and kind == "session.output_audio.delta" and not (
            isinstance(event.get("start_ms"), int) and isinstance(event.get("end_ms"), int)):
        return ["a sideband's session.output_audio.delta needs start_ms and end_ms"]
    members = _SIDEBAND if sideband else _DATA_CHANNEL if data_channel else _MEMBERS
    model = members.get(kind) if isinstance(kind, str) else None
    if model is None:
        return [f"type {kind!r} is not in the SDK's server event union"]
    try:
        model.model_validate(event)  # the member the SDK's "type" discriminator picks
    except ValidationError as exc:
        return [str(exc)]
    return [e for e in _extra(model, event, kind)
            if (kind, e.split(".", 1)[-1]) not in EXTENSIONS]
