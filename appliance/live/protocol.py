"""GPT-Live client events (``types/live/client_event.py``): the untrusted parser and the
catalogue of what the appliance does with each.

One WebSocket text frame is one JSON object with a ``"type"`` and an optional client
``"event_id"``. :func:`parse_client_event_untrusted` turns it into a :class:`ClientEvent`
or raises :class:`~appliance.live.schema.LiveError` — only that (STYLE.md rule 5):
malformed JSON, a non-object, an unknown type, a missing, mistyped or **unknown** field
all become an ``error`` event on the socket, never a dropped connection. The fields of
each type are :data:`EVENT_FIELDS` (the SDK's ``*_event_param.py`` TypedDicts, compared
by tests/live/test_protocol.py).

What is served is :data:`CLIENT_EVENTS` (docs/live.md renders the same table; a test keeps
them equal). A type GPT-Live has but the appliance does not serve is answered with
``unsupported_event`` after its fields were checked, so a malformed command still hears
what is wrong with it. Nothing here does I/O; :mod:`appliance.live.connection` is the
state machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..realtime.protocol import EventError, Support, loads_untrusted
from .schema import AnyJson, Field, LiveError, Obj, Str, json_name, required, validate_untrusted

#: A WebSocket frame may be far larger than a data-channel message (base64 audio: the SDK
#: appends whatever the caller hands it); 4 MiB is ~65 s of 24 kHz PCM in one append.
MAX_EVENT_BYTES = 4 * 1024 * 1024
MAX_EVENT_ID = 512
#: The appended contexts' bound, "500 tokens" (~4 characters each).
MAX_APPEND_TOKENS = 500

_APPEND = {"content": required(Str()), "delegation_id": required(Str(max_len=MAX_EVENT_ID),
                                                                 nullable=True)}

#: Fields of each client event beside ``type`` and ``event_id``. A session config is
#: config.py's to check (``SESSION_CONFIG`` at start; an update must tell an immutable
#: field from an unknown one), so here it is only required.
EVENT_FIELDS: Mapping[str, Mapping[str, Field]] = {
    "session.start": {"session": required(AnyJson())},
    "session.update": {"session": required(AnyJson())},
    "session.close": {},
    "session.input_audio.append": {"audio": required(Str())},
    "session.input_audio.mute": {},
    "session.input_audio.unmute": {},
    "session.output_audio.fixture.play": {"audio": required(Str())},
    "session.instructions.append": _APPEND,
    "session.thinking.append": _APPEND,
    "session.commentary.append": _APPEND,
    "decision.create": {},
    "decision.item.create": {"item": required(AnyJson())},
    "decision.item.delete": {"item_id": required(Str())},
    "response.item.create": {"item": required(AnyJson())},
    "response.create": {},
}

#: The sideband's own command (``ConnectClientEvent``, not the primary union): one DTMF
#: keypress on a SIP call's phone leg. Parsed only for a sideband (``sideband=True``).
DTMF_KEYS = tuple("0123456789ABCD*#")  # RFC 4733 events 0-15, as the SDK names them
SIDEBAND_FIELDS: Mapping[str, Mapping[str, Field]] = {
    "transport.dtmf.send": {"event": required(Str(choices=DTMF_KEYS))},
}

_SPECS: dict[str, Obj] = {k: Obj(v) for k, v in {**EVENT_FIELDS, **SIDEBAND_FIELDS}.items()}

#: Every client event of the primary WebSocket: (support, note) — docs/live.md's table.
CLIENT_EVENTS: dict[str, tuple[Support, str]] = {
    "session.start": (Support.SUPPORTED, "-> session.started; strict config, defaults "
                      "resolved; a second one -> error"),
    "session.update": (Support.PARTIAL, "delegation (client: acknowledgement_delay_ms) and "
                       "triggers: [] -> session.updated; startup fields -> "
                       "immutable_field_update"),
    "session.close": (Support.SUPPORTED, "-> session.closed (close_requested), then close "
                      "code 1000"),
    "session.input_audio.append": (Support.SUPPORTED, "audio/pcm 16 or 24 kHz, audio/pcmu, "
                                   "audio/pcma 8 kHz; the server's turn engine hears it"),
    "session.input_audio.mute": (Support.SUPPORTED, "-> session.input_audio.muted; the "
                                 "agent hears silence"),
    "session.input_audio.unmute": (Support.SUPPORTED, "-> session.input_audio.unmuted"),
    "session.output_audio.fixture.play": (Support.ERROR, "not served: no fixture mixer"),
    "session.instructions.append": (Support.SUPPORTED, "-> session.instructions.appended; "
                                    "a system item in the agent's conversation"),
    "session.thinking.append": (Support.SUPPORTED, "-> session.thinking.appended; silent "
                                "context for the agent"),
    "session.commentary.append": (Support.SUPPORTED, "-> session.commentary.appended; "
                                  "spoken by the agent (after the current answer)"),
    "decision.create": (Support.ERROR, "not served: the Decision API"),
    "decision.item.create": (Support.ERROR, "not served: the Decision API"),
    "decision.item.delete": (Support.ERROR, "not served: the Decision API"),
    "response.item.create": (Support.SUPPORTED, "Responses delegation: an input item "
                             "(function_call_output, a message) for the backend; otherwise "
                             "-> error"),
    "response.create": (Support.SUPPORTED, "Responses delegation: continues the delegation "
                        "waiting for tool results (or asks the backend) -> response.event; "
                        "otherwise -> error"),
}

#: Why a type is refused after its shape passed (the ``error`` message).
UNSUPPORTED: dict[str, str] = {
    "session.output_audio.fixture.play": "Audio fixtures are not served by this appliance "
    "(docs/live.md).",
    "decision.create": "The Decision API is not served by this appliance (docs/live.md).",
    "decision.item.create": "The Decision API is not served by this appliance "
    "(docs/live.md).",
    "decision.item.delete": "The Decision API is not served by this appliance "
    "(docs/live.md).",
}


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """One checked client event: ``data`` holds only the fields the type has."""

    type: str
    event_id: str | None
    data: dict[str, Any]


def parse_client_event_untrusted(data: str | bytes, *, sideband: bool = False
                                 ) -> ClientEvent:
    """One WebSocket message -> :class:`ClientEvent`; raises only :class:`LiveError`.
    ``sideband``: a sideband's command, which may also be :data:`SIDEBAND_FIELDS`'."""
    try:
        obj = loads_untrusted(data, limit=MAX_EVENT_BYTES)
    except EventError as exc:
        raise LiveError(exc.message, code=exc.code) from None
    if not isinstance(obj, dict):
        raise LiveError(f"Invalid type for event: expected an object, but got "
                        f"{json_name(obj)} instead.", code="invalid_type")
    raw_id = obj.get("event_id")
    if raw_id is not None and (not isinstance(raw_id, str) or len(raw_id) > MAX_EVENT_ID):
        raise LiveError(f"Invalid 'event_id': expected a string of at most {MAX_EVENT_ID} "
                        "characters.", code="invalid_type", param="event_id")
    event_id: str | None = raw_id
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise LiveError("Missing required parameter: 'type'.",
                        code="missing_required_parameter", param="type",
                        client_event_id=event_id)
    fields = EVENT_FIELDS.get(kind)
    if fields is None and sideband:
        fields = SIDEBAND_FIELDS.get(kind)
    if fields is None:
        supported = ", ".join(f"'{k}'" for k in EVENT_FIELDS)
        raise LiveError(f"Invalid value: '{kind[:64]}'. Supported values are: {supported}.",
                        code="unknown_event", param="type", client_event_id=event_id)
    body = {k: v for k, v in obj.items() if k not in ("type", "event_id")}
    try:
        checked: dict[str, Any] = validate_untrusted(_SPECS[kind], body, "")
    except LiveError as exc:
        raise exc.with_event(event_id) from None
    if kind == "decision.create" and event_id is None:
        # The one command whose event_id is required (and unique in the session).
        raise LiveError("Missing required parameter: 'event_id'.",
                        code="missing_required_parameter", param="event_id")
    if kind in UNSUPPORTED:
        raise LiveError(UNSUPPORTED[kind], code="unsupported_event", param="type",
                        client_event_id=event_id)
    return ClientEvent(kind, event_id, checked)
