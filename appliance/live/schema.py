"""A small declarative validator for GPT-Live's JSON: a spec is a tree of frozen nodes
(:class:`Obj`, :class:`Str`, :class:`Int`, :class:`Tagged`, …) and :func:`validate_untrusted`
walks a value against it, returning a checked copy or raising :class:`LiveError` — only that —
with the failing field's path as ``param`` (``session.audio.format.rate``,
``session.input[2].content[0].text``), in OpenAI's words and codes:

==============================  ==========================================================
``unknown_parameter``           a field the spec does not have (GPT-Live is strict: the
                                real service refuses unknown fields, where Realtime kept
                                and echoed them)
``missing_required_parameter``  a required field is absent
``invalid_type``                a string where an object goes, a float for an integer…
``invalid_value``               not one of the allowed values
``string_above_max_length``,    a bound of the spec
``array_above_max_length``,
``integer_below_min_value``,
``integer_above_max_value``
==============================  ==========================================================

Sans-IO and clockless; the specs themselves live beside their users (protocol.py,
config.py). The shapes follow openai-python's ``types/live/*_param.py`` TypedDicts, which
tests/live/test_protocol.py compares field by field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class LiveError(Exception):
    """A client event GPT-Live cannot act on: the ``error`` event's ``error`` object.

    ``client_event_id`` is the offending command's ``event_id`` when it had one (Live's
    name; Realtime called it ``event_id``)."""

    def __init__(self, message: str, *, code: str = "invalid_value", param: str | None = None,
                 client_event_id: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.client_event_id = client_event_id
        self.type = type

    def with_event(self, client_event_id: str | None) -> LiveError:
        """This error, naming the command it answers (set once it is known)."""
        if self.client_event_id is None:
            self.client_event_id = client_event_id
        return self


# -- spec nodes ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Str:
    max_len: int | None = None
    choices: tuple[str, ...] | None = None
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True, slots=True)
class Int:
    lo: int | None = None
    hi: int | None = None
    choices: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Num:
    """A JSON number (an integer is one too), within ``lo``..``hi`` inclusive."""

    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True, slots=True)
class Bool:
    pass


@dataclass(frozen=True, slots=True)
class Const:
    """Exactly this string (a discriminator: ``"type": "client"``)."""

    value: str


@dataclass(frozen=True, slots=True)
class AnyJson:
    """Any JSON value (already bounded in size and depth by the parser): for a payload
    that is refused as a whole (a Decisions item, a Responses config) — its shape is not
    what the error is about."""


@dataclass(frozen=True, slots=True)
class Field:
    spec: Spec
    required: bool = False
    nullable: bool = False


@dataclass(frozen=True, slots=True)
class Obj:
    fields: Mapping[str, Field]


@dataclass(frozen=True, slots=True)
class Arr:
    item: Spec
    max_items: int | None = None
    exactly: int | None = None


@dataclass(frozen=True, slots=True)
class Tagged:
    """A union told apart by one key (``type``, ``role``); ``default`` is the variant of an
    object without it (an initial item's content part without ``type`` is text)."""

    key: str
    variants: Mapping[str, Obj]
    default: str | None = None


@dataclass(frozen=True, slots=True)
class OneOf:
    """The first option the value fits (a voice: a built-in name or ``{"id": …}``); the
    error is the option of the value's JSON type, so it names the right sub-field."""

    options: tuple[Spec, ...] = field(default_factory=tuple)


Spec = Str | Int | Num | Bool | Const | AnyJson | Obj | Arr | Tagged | OneOf


def required(spec: Spec, *, nullable: bool = False) -> Field:
    return Field(spec, True, nullable)


def optional(spec: Spec, *, nullable: bool = False) -> Field:
    return Field(spec, False, nullable)


# -- the walk ----------------------------------------------------------------------------------

_JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", float: "a number",
                                bool: "a boolean", dict: "an object", list: "an array",
                                type(None): "null"}


def json_name(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _type_error(path: str, expected: str, value: Any) -> LiveError:
    return LiveError(f"Invalid type for '{path}': expected {expected}, but got "
                     f"{json_name(value)} instead.", code="invalid_type", param=path)


def _quote(values: tuple[Any, ...]) -> str:
    return ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in values)


def _show(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _accepts(spec: Spec, value: Any) -> bool:
    """Whether ``value``'s JSON type is the one ``spec`` takes (OneOf's pick)."""
    if isinstance(spec, Str | Const):
        return isinstance(value, str)
    if isinstance(spec, Int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(spec, Bool):
        return isinstance(value, bool)
    if isinstance(spec, Num):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(spec, Obj | Tagged):
        return isinstance(value, dict)
    if isinstance(spec, Arr):
        return isinstance(value, list)
    return True


def validate_untrusted(spec: Spec, value: Any, path: str) -> Any:
    """``value`` checked against ``spec``: a copy holding only what the spec names.
    Raises :class:`LiveError` (param: the path of the first bad field) and nothing else."""
    if isinstance(spec, Str):
        if not isinstance(value, str):
            raise _type_error(path, "a string", value)
        if spec.choices is not None and value not in spec.choices:
            raise LiveError(f"Invalid value: '{_show(value)}'. Supported values are: "
                            f"{_quote(spec.choices)}.", param=path)
        if spec.max_len is not None and len(value) > spec.max_len:
            raise LiveError(f"Invalid '{path}': string too long. Expected a string with "
                            f"maximum length {spec.max_len}, but got a string with length "
                            f"{len(value)} instead.", code="string_above_max_length",
                            param=path)
        if spec.pattern is not None and not spec.pattern.fullmatch(value):
            raise LiveError(f"Invalid '{path}': '{_show(value)}' does not match the pattern "
                            f"'{spec.pattern.pattern}'.", param=path)
        return value
    if isinstance(spec, Const):
        if not isinstance(value, str):
            raise _type_error(path, "a string", value)
        if value != spec.value:
            raise LiveError(f"Invalid value: '{_show(value)}'. Supported values are: "
                            f"'{spec.value}'.", param=path)
        return value
    if isinstance(spec, Int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _type_error(path, "an integer", value)
        if spec.choices is not None and value not in spec.choices:
            raise LiveError(f"Invalid value: {_show(value)}. Supported values are: "
                            f"{_quote(spec.choices)}.", param=path)
        if spec.lo is not None and value < spec.lo:
            raise LiveError(f"Invalid '{path}': integer below minimum value. Expected a "
                            f"value >= {spec.lo}, but got {value} instead.",
                            code="integer_below_min_value", param=path)
        if spec.hi is not None and value > spec.hi:
            raise LiveError(f"Invalid '{path}': integer above maximum value. Expected a "
                            f"value <= {spec.hi}, but got {_show(value)} instead.",
                            code="integer_above_max_value", param=path)
        return value
    if isinstance(spec, Bool):
        if not isinstance(value, bool):
            raise _type_error(path, "a boolean", value)
        return value
    if isinstance(spec, Num):
        if not isinstance(value, int | float) or isinstance(value, bool) \
                or not math.isfinite(value):
            raise _type_error(path, "a number", value)
        if (spec.lo is not None and value < spec.lo) or (spec.hi is not None
                                                         and value > spec.hi):
            raise LiveError(f"Invalid '{path}': expected a number from {spec.lo} to "
                            f"{spec.hi}, but got {_show(value)} instead.", param=path)
        return float(value)
    if isinstance(spec, AnyJson):
        return value
    if isinstance(spec, Obj):
        return _object(spec, value, path)
    if isinstance(spec, Arr):
        if not isinstance(value, list):
            raise _type_error(path, "an array", value)
        if spec.exactly is not None and len(value) != spec.exactly:
            raise LiveError(f"Invalid '{path}': expected exactly {spec.exactly} item"
                            f"{'s' if spec.exactly != 1 else ''}, but got {len(value)}.",
                            param=path)
        if spec.max_items is not None and len(value) > spec.max_items:
            raise LiveError(f"Invalid '{path}': array too long. Expected an array with "
                            f"maximum length {spec.max_items}, but got an array with length "
                            f"{len(value)} instead.", code="array_above_max_length",
                            param=path)
        return [validate_untrusted(spec.item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(spec, Tagged):
        if not isinstance(value, dict):
            raise _type_error(path, "an object", value)
        tag = value.get(spec.key, spec.default)
        if tag is None and spec.key in value:
            raise _type_error(f"{path}.{spec.key}", "a string", None)
        if tag is None:
            raise LiveError(f"Missing required parameter: '{path}.{spec.key}'.",
                            code="missing_required_parameter", param=f"{path}.{spec.key}")
        if not isinstance(tag, str):
            raise _type_error(f"{path}.{spec.key}", "a string", tag)
        variant = spec.variants.get(tag)
        if variant is None:
            raise LiveError(f"Invalid value: '{_show(tag)}'. Supported values are: "
                            f"{_quote(tuple(spec.variants))}.", param=f"{path}.{spec.key}")
        return _object(variant, value, path)
    # OneOf: the option whose JSON type the value has decides the error.
    for option in spec.options:
        if _accepts(option, value):
            return validate_untrusted(option, value, path)
    names = " or ".join(dict.fromkeys(_kind(o) for o in spec.options))
    raise _type_error(path, names, value)


def _kind(spec: Spec) -> str:
    if isinstance(spec, Str | Const):
        return "a string"
    if isinstance(spec, Int):
        return "an integer"
    if isinstance(spec, Bool):
        return "a boolean"
    if isinstance(spec, Num):
        return "a number"
    if isinstance(spec, Arr):
        return "an array"
    return "an object"


def _object(spec: Obj, value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _type_error(path, "an object", value)
    where = f"{path}." if path else ""
    for key in value:
        if key not in spec.fields:
            raise LiveError(f"Unknown parameter: '{where}{_show(key)}'.",
                            code="unknown_parameter", param=f"{where}{key[:128]}")
    out: dict[str, Any] = {}
    for key, f in spec.fields.items():
        if key not in value:
            if f.required:
                raise LiveError(f"Missing required parameter: '{where}{key}'.",
                                code="missing_required_parameter", param=f"{where}{key}")
            continue
        v = value[key]
        if v is None and (f.nullable or isinstance(f.spec, AnyJson)):
            out[key] = None
            continue
        out[key] = validate_untrusted(f.spec, v, f"{where}{key}")
    return out
