"""The session object: the one definition of the JSON shape that ``GET /v1/sessions/{id}``
returns and the transceiver reports over the control channel (``list``/``get``,
docs/control-protocol.md). STYLE.md rule 15: one definition of each JSON shape that
crosses a process boundary.

::

    {"id": "…", "state": "new|connecting|connected|ended", "end_reason": null | "…",
     "transceiver": 0, "agent": "echo" | null,
     "client_address": "203.0.113.7:53211" | null,
     "relay_flow": {"public": "198.51.100.1:3478", "relay": "127.0.0.1:40001"} | null,
     "codec": "opus/48000/2" | null, "srtp_profile": "…" | null, "cipher_suite": "…" | null,
     "created_at": 1764460800.123, "ended_at": null | 1764460860.5,     (Unix seconds)
     "packets_in": 0, "packets_out": 0, "bytes_in": 0, "bytes_out": 0,
     "rtt_ms": null | 12.3, "jitter_ms": null | 1.2, "loss": null | 0.001,
     "timeline": {"offer_received": 0.0, "answer_sent": 0.4, …},       (ms after the offer)
     "datachannels": null | {"sctp": "connecting|connected|<why it closed>",
                             "open": [{"id": 1, "label": "chat", "protocol": "",
                                       "ordered": true, "max_retransmits": null,
                                       "max_packet_lifetime": null, "negotiated": false}],
                             "messages_in": 0, "bytes_in": 0, "messages_out": 0,
                             "bytes_out": 0, "messages_dropped": 0},
     "media": null | {"in": ["recorder-in", "denoise", "level-in"], "out": ["level-out", …],
                      "levels": null | {"in": {"rms_dbfs": -31.2, "peak_dbfs": -12.0,
                                               "max_peak_dbfs": -6.1, "clipped": 0,
                                               "frames": 1500}, "out": {…}},
                      "recorder": null | {"buffered": 0, "max_frames": 6000, "dropped": 0,
                                          "frames_in": 0, "frames_out": 0},
                      "recording": null | {"state": "recording|done|stopped", "reason": null,
                                           "seconds": 1.5, "bytes": 288000, "dropped": 0,
                                           "skipped": 0},
                      "stages": {"denoise": {…}, "aec": {…}}, "stage_failures": 0,
                      "failed": {"name": "ExceptionType"},
                      "unavailable": {"noise_reduction": "needs …"}}}
    (media: the PCM stages, appliance/transceiver/stages/; null for passthrough and
    data-only sessions)
     "transcript": null | [{"who": "user" | "agent", "text": "…", "at": 1764460801.5}]
    (transcript: what an agent reported hearing and saying — the assistant's
    ``transcript.user.final`` / ``transcript.agent`` events — the last
    :data:`MAX_TRANSCRIPT` lines; null when it reported none)
     "turns": null | [{"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0,
                       "transcript_ms": 2.1, "stt_ms": 2.0, "first_token_ms": -60.3,
                       "first_audio_ms": 31.0, "first_sent_ms": 31.2}]
    (turns: each turn's waterfall as the agent reported it — the assistant's
    ``turn.metrics`` events, :func:`turn_line` — the last :data:`MAX_TURNS`; each mark in
    ms after the end of the turn was decided (negative: before it), null when the turn
    never reached it; null when it reported none)

``SessionInfo(...).to_json()`` makes the dict (key order as above); ``from_json(obj)``
reads one back, checking each field's type (raises :class:`ValueError` naming the field;
unknown keys are ignored, missing ones take the defaults below, so a reader copes with an
older or newer writer). ``SessionInfo.placeholder(...)`` is what a reader that lost touch
with the transceiver shows: the identity it knows, everything else unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The values of ``state`` (the transceiver's ``CallState``), in lifecycle order.
STATES = ("new", "connecting", "connected", "ended")
#: what carries the call: a WebRTC peer, or a phone call (SIP, inbound or outbound)
KINDS = ("webrtc", "phone")
#: The ``timeline`` steps, in the order they happen (ms after the transceiver got the offer).
TIMELINE_STEPS = ("offer_received", "answer_sent", "first_stun", "ice_nominated",
                  "dtls_done", "first_rtp_in", "first_rtp_out")


@dataclass(frozen=True, slots=True)
class RelayFlow:
    """The path the call's media takes through the relay: the public address the client
    sends to, and the relay's internal address that forwards it."""

    public: str
    relay: str

    def to_json(self) -> dict[str, str]:
        return {"public": self.public, "relay": self.relay}


MAX_TRANSCRIPT = 50  # transcript lines a session object carries (the newest)
MAX_TURNS = 50  # turn waterfalls a session object carries (the newest)

#: A turn's marks (issue 38 item 5), in the order they happen, each in ms after the end of
#: the turn was decided (itself 0): the detector heard speech start; the VAD paused (the
#: caller's last voiced audio arrived); the final transcript was in hand; the LLM's first
#: token; the TTS's first frame; that frame sent to the caller.
TURN_MARKS = ("speech_start_ms", "speech_end_ms", "transcript_ms", "first_token_ms",
              "first_audio_ms", "first_sent_ms")
#: How long the STT took after the end of turn (not a mark: a part of ``transcript_ms``).
TURN_EXTRAS = ("stt_ms",)
#: A mark further than this from the end of turn is not believed (an agent's clock bug).
MAX_TURN_MS = 3_600_000.0


def turn_line(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The session object's ``turns`` line for an agent's ``turn.metrics`` event: its
    ``turn`` (a positive integer) and each of :data:`TURN_MARKS` and :data:`TURN_EXTRAS`
    as a finite number of ms (rounded to 0.1) or None; anything else in the event is left
    out. None when the event has no turn number. Agents are any code (``ws://`` ones too),
    so this is what keeps their events to the shape."""
    turn = event.get("turn")
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        return None
    out: dict[str, Any] = {"turn": turn}
    for key in (*TURN_MARKS, *TURN_EXTRAS):
        value = event.get(key)
        out[key] = None
        if (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value) and abs(value) <= MAX_TURN_MS):
            out[key] = round(float(value), 1)
    return out


@dataclass(frozen=True, slots=True)
class SessionInfo:
    id: str
    transceiver: int
    created_at: float
    state: str = "new"
    end_reason: str | None = None
    agent: str | None = None
    client_address: str | None = None
    relay_flow: RelayFlow | None = None
    codec: str | None = None
    srtp_profile: str | None = None
    cipher_suite: str | None = None
    ended_at: float | None = None
    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    rtt_ms: float | None = None
    jitter_ms: float | None = None
    loss: float | None = None
    timeline: Mapping[str, float | None] = field(default_factory=dict)
    #: The call's data channels (null when the offer negotiated none).
    datachannels: Mapping[str, Any] | None = None
    #: The call's PCM stages and levels (null without a PCM pipeline).
    media: Mapping[str, Any] | None = None
    #: The agent's transcript lines, newest last (null when it reported none).
    transcript: tuple[Mapping[str, Any], ...] | None = None
    #: The agent's turn waterfalls (:func:`turn_line`), newest last (null: none reported).
    turns: tuple[Mapping[str, Any], ...] | None = None
    #: What carries the call (:data:`KINDS`).
    kind: str = "webrtc"

    @classmethod
    def placeholder(cls, id: str, transceiver: int, created_at: float,
                    agent: str | None = None) -> SessionInfo:
        """A session nothing is known about yet (or any more) beyond who it is."""
        return cls(id=id, transceiver=transceiver, created_at=created_at, agent=agent)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "end_reason": self.end_reason,
            "transceiver": self.transceiver,
            "agent": self.agent,
            "client_address": self.client_address,
            "relay_flow": self.relay_flow.to_json() if self.relay_flow is not None else None,
            "codec": self.codec,
            "srtp_profile": self.srtp_profile,
            "cipher_suite": self.cipher_suite,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "packets_in": self.packets_in,
            "packets_out": self.packets_out,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "rtt_ms": self.rtt_ms,
            "jitter_ms": self.jitter_ms,
            "loss": self.loss,
            "timeline": dict(self.timeline),
            "datachannels": dict(self.datachannels) if self.datachannels is not None else None,
            "media": dict(self.media) if self.media is not None else None,
            "transcript": ([dict(t) for t in self.transcript] if self.transcript is not None
                           else None),
            "turns": [dict(t) for t in self.turns] if self.turns is not None else None,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SessionInfo:
        """Read a session object (e.g. from a transceiver's ``get``). Raises only
        :class:`ValueError`, naming the first field of the wrong type."""
        if not isinstance(obj, Mapping):
            raise ValueError("a session object must be a JSON object")
        flow = obj.get("relay_flow")
        relay_flow = None
        if flow is not None:
            if not isinstance(flow, Mapping):
                raise ValueError("relay_flow must be an object or null")
            try:
                relay_flow = RelayFlow(_str(flow, "public"), _str(flow, "relay"))
            except ValueError as exc:
                raise ValueError(f"relay_flow.{exc}") from None
        state = _str(obj, "state", "new")
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        kind = _str(obj, "kind", "webrtc")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        timeline = obj.get("timeline", {})
        if not isinstance(timeline, Mapping) or not all(
                isinstance(k, str) and _is_num_or_none(v) for k, v in timeline.items()):
            raise ValueError("timeline must map step names to milliseconds or null")
        channels = obj.get("datachannels")
        if channels is not None and not isinstance(channels, Mapping):
            raise ValueError("datachannels must be an object or null")
        media = obj.get("media")
        if media is not None and not isinstance(media, Mapping):
            raise ValueError("media must be an object or null")
        transcript = obj.get("transcript")
        if transcript is not None and not (isinstance(transcript, list) and all(
                isinstance(t, Mapping) and t.get("who") in ("user", "agent")
                and isinstance(t.get("text"), str) and _is_num_or_none(t.get("at"))
                for t in transcript)):
            raise ValueError("transcript must be a list of {who, text, at} lines or null")
        turns = obj.get("turns")
        if turns is not None and not (isinstance(turns, list) and all(
                isinstance(t, Mapping) and turn_line(t) is not None for t in turns)):
            raise ValueError("turns must be a list of {turn, …_ms} lines or null")
        return cls(
            id=_str(obj, "id"),
            transceiver=_int(obj, "transceiver"),
            created_at=_num(obj, "created_at"),
            state=state,
            kind=kind,
            end_reason=_opt_str(obj, "end_reason"),
            agent=_opt_str(obj, "agent"),
            client_address=_opt_str(obj, "client_address"),
            relay_flow=relay_flow,
            codec=_opt_str(obj, "codec"),
            srtp_profile=_opt_str(obj, "srtp_profile"),
            cipher_suite=_opt_str(obj, "cipher_suite"),
            ended_at=_opt_num(obj, "ended_at"),
            packets_in=_int(obj, "packets_in", 0),
            packets_out=_int(obj, "packets_out", 0),
            bytes_in=_int(obj, "bytes_in", 0),
            bytes_out=_int(obj, "bytes_out", 0),
            rtt_ms=_opt_num(obj, "rtt_ms"),
            jitter_ms=_opt_num(obj, "jitter_ms"),
            loss=_opt_num(obj, "loss"),
            timeline={k: (None if v is None else float(v)) for k, v in timeline.items()},
            datachannels=dict(channels) if channels is not None else None,
            media=dict(media) if media is not None else None,
            transcript=(tuple(dict(t) for t in transcript[-MAX_TRANSCRIPT:])
                        if transcript is not None else None),
            turns=(tuple(_turn(t) for t in turns[-MAX_TURNS:]) if turns is not None
                   else None),
        )


def _turn(line: Mapping[str, Any]) -> dict[str, Any]:
    out = turn_line(line)
    assert out is not None  # from_json checked every line
    return out


_MISSING: Any = object()


def _get(obj: Mapping[str, Any], key: str, default: Any) -> Any:
    value = obj.get(key, default)
    if value is _MISSING:
        raise ValueError(f"{key} is missing")
    return value


def _str(obj: Mapping[str, Any], key: str, default: Any = _MISSING) -> str:
    value = _get(obj, key, default)
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a string or null")
    return value


def _int(obj: Mapping[str, Any], key: str, default: Any = _MISSING) -> int:
    value = _get(obj, key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer")
    return value


def _is_num_or_none(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _num(obj: Mapping[str, Any], key: str) -> float:
    value = _get(obj, key, _MISSING)
    if value is None or not _is_num_or_none(value):
        raise ValueError(f"{key} must be a number")
    return float(value)


def _opt_num(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    if not _is_num_or_none(value):
        raise ValueError(f"{key} must be a number or null")
    return None if value is None else float(value)
