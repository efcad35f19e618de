"""Every GPT-Live server event the appliance sends, one constructor each: the one place
their JSON shapes are written (``types/live/server_event.py``; tests/live/test_shapes.py
checks each against the SDK's ``ServerEvent`` union, field by field).

Conventions of ``types/live/``: every event carries the server's ``event_id`` (``event_…``)
except ``session.output_audio.delta`` on the primary socket; an event answering a command
that had an ``event_id`` echoes it as ``client_event_id``; ``start_ms`` / ``end_ms`` are
milliseconds of the session timeline (connection.py: the input audio's clock).
:data:`SERVER_EVENTS` is docs/live.md's table of the union: what is sent, what never is.
"""

from __future__ import annotations

from typing import Any

from ..realtime.protocol import Support
from .schema import LiveError

#: Every type of the SDK's primary ``ServerEvent`` union: (support, note).
SERVER_EVENTS: dict[str, tuple[Support, str]] = {
    "session.started": (Support.SUPPORTED, "id live_…, expires_at, status active, the "
                        "resolved config"),
    "session.updated": (Support.SUPPORTED, ""),
    "session.closed": (Support.SUPPORTED, "close_requested, expired (after "
                       "expires_at); a dropped socket ends the session as connection_lost"),
    "session.input_audio.muted": (Support.SUPPORTED, ""),
    "session.input_audio.unmuted": (Support.SUPPORTED, ""),
    "session.input_transcript.delta": (Support.SUPPORTED, "one per user turn (Whisper), "
                                       "the turn's start_ms/end_ms"),
    "session.output_transcript.delta": (Support.SUPPORTED, "one per spoken sentence, the "
                                        "sentence's audio span"),
    "session.output_audio.delta": (Support.SUPPORTED, "the session's format, paced at "
                                   "real time (+300 ms lead); on a sideband PCM16 24 kHz "
                                   "with start_ms/end_ms, on WebRTC too"),
    "session.instructions.appended": (Support.SUPPORTED, ""),
    "session.thinking.appended": (Support.SUPPORTED, ""),
    "session.commentary.appended": (Support.SUPPORTED, ""),
    "session.usage.updated": (Support.SUPPORTED, "every 15 s of session timeline: "
                              "usage.seconds; no context_window"),
    "error": (Support.SUPPORTED, "OpenAI's codes; error.client_event_id and "
              "client_event_id name the command"),
    "info": (Support.SUPPORTED, "input_transcript_failed"),
    "session.output_audio.fixture.playing": (Support.NEVER, "no fixtures"),
    "session.output_audio.fixture.played": (Support.NEVER, "no fixtures"),
    "session.delegation.created": (Support.SUPPORTED, "when the agent's LLM calls its "
                                   "delegate tool (an agent with tools, e.g. --llm); "
                                   "offset_ms on the timeline, no task text; responses: "
                                   "target responses and the backend's response_id"),
    "response.event": (Support.SUPPORTED, "Responses delegation: the backend's stream "
                       "(/responses, or synthesised from chat completions), with "
                       "delegation_id"),
    "decision.event": (Support.NEVER, "no Decision API"),
    "decision.item.created": (Support.NEVER, "no Decision API"),
    "decision.item.deleted": (Support.NEVER, "no Decision API"),
    "session.input_audio.append": (Support.SUPPORTED, "sideband only: the caller's audio "
                                   "reflected, PCM16 24 kHz, before muting"),
    "transport.dtmf.received": (Support.SUPPORTED, "sideband of a SIP session: each RFC "
                                "4733 (or SIP INFO) digit the caller pressed"),
    "transport.dtmf.send": (Support.NEVER, "legacy notification: transport.dtmf.sent "
                            "confirms a sideband's transport.dtmf.send"),
    "transport.dtmf.sent": (Support.SUPPORTED, "sideband of a SIP session: the digit "
                            "went out on the phone leg as RFC 4733 events"),
    "transport.ringing": (Support.NEVER, "outbound SIP legs are the Realtime surface's "
                          "(no outbound Live SIP)"),
    "transport.answered": (Support.NEVER, "outbound SIP legs are the Realtime surface's "
                           "(no outbound Live SIP)"),
    "transport.failed": (Support.NEVER, "outbound SIP legs are the Realtime surface's "
                         "(no outbound Live SIP)"),
}

#: Beyond the primary union: the WebRTC data channel's (and the sideband's) extras, in the
#: SDK's ``ConnectServerEvent`` (``types/live/connect_server_event.py``).
DATA_CHANNEL_EVENTS: dict[str, tuple[Support, str]] = {
    "session.paused": (Support.SUPPORTED, "idle_timeout_s of inactivity under a "
                       "wake_policy: inference paused"),
    "session.resumed": (Support.SUPPORTED, "speech woke inference (the first wake too)"),
}

CLOSE_REASONS = ("close_requested", "expired", "content", "remote_hangup", "connection_lost")
APPENDED = {"session.instructions.append": "session.instructions.appended",
            "session.thinking.append": "session.thinking.appended",
            "session.commentary.append": "session.commentary.appended"}


def _answer(event: dict[str, Any], client_event_id: str | None) -> dict[str, Any]:
    if client_event_id is not None:
        event["client_event_id"] = client_event_id
    return event


def session_started(event_id: str, session: dict[str, Any],
                    client_event_id: str | None = None) -> dict[str, Any]:
    return _answer({"type": "session.started", "event_id": event_id, "session": session},
                   client_event_id)


def session_updated(event_id: str, session: dict[str, Any],
                    client_event_id: str | None = None) -> dict[str, Any]:
    return _answer({"type": "session.updated", "event_id": event_id, "session": session},
                   client_event_id)


def session_closed(event_id: str, reason: str, session: dict[str, Any],
                   usage: dict[str, Any], client_event_id: str | None = None
                   ) -> dict[str, Any]:
    assert reason in CLOSE_REASONS
    return _answer({"type": "session.closed", "event_id": event_id, "reason": reason,
                    "session": session, "usage": usage}, client_event_id)


def usage(seconds: int, *, active_seconds: int | None = None,
          paused_seconds: int | None = None) -> dict[str, Any]:
    """``SessionUsage``: cumulative whole seconds (a float in the SDK's type); a gated
    WebRTC session adds the active / paused split (adding up to ``seconds``)."""
    out: dict[str, Any] = {"seconds": float(seconds)}
    if active_seconds is not None and paused_seconds is not None:
        out.update(active_seconds=active_seconds, paused_seconds=paused_seconds)
    return out


def usage_updated(event_id: str, seconds: int, *, active_seconds: int | None = None,
                  paused_seconds: int | None = None) -> dict[str, Any]:
    return {"type": "session.usage.updated", "event_id": event_id,
            "usage": usage(seconds, active_seconds=active_seconds,
                           paused_seconds=paused_seconds)}


def paused(event_id: str, is_paused: bool) -> dict[str, Any]:
    """``session.paused`` / ``session.resumed`` (data channel and sideband only: not in the
    primary ``ServerEvent`` union)."""
    return {"type": "session.paused" if is_paused else "session.resumed",
            "event_id": event_id}


def input_audio_muted(event_id: str, muted: bool,
                      client_event_id: str | None = None) -> dict[str, Any]:
    kind = "session.input_audio.muted" if muted else "session.input_audio.unmuted"
    return _answer({"type": kind, "event_id": event_id}, client_event_id)


def appended(command: str, event_id: str, start_ms: int, end_ms: int,
             client_event_id: str | None = None) -> dict[str, Any]:
    """The ack of one of the three context appends (``command`` is the client type)."""
    return _answer({"type": APPENDED[command], "event_id": event_id, "start_ms": start_ms,
                    "end_ms": end_ms}, client_event_id)


def input_transcript_delta(event_id: str, delta: str, start_ms: int,
                           end_ms: int) -> dict[str, Any]:
    return {"type": "session.input_transcript.delta", "event_id": event_id, "delta": delta,
            "start_ms": start_ms, "end_ms": end_ms}


def output_transcript_delta(event_id: str, delta: str, start_ms: int,
                            end_ms: int) -> dict[str, Any]:
    return {"type": "session.output_transcript.delta", "event_id": event_id,
            "delta": delta, "start_ms": start_ms, "end_ms": end_ms}


def output_audio_delta(b64: str, *, start_ms: int | None = None,
                       end_ms: int | None = None) -> dict[str, Any]:
    """No event_id; on the primary socket no timestamps, on a sideband (PCM16 24 kHz) the
    span of the chunk on the session timeline."""
    event: dict[str, Any] = {"type": "session.output_audio.delta", "delta": b64}
    if start_ms is not None and end_ms is not None:
        event.update(start_ms=start_ms, end_ms=end_ms)
    return event


def input_audio_reflected(b64: str) -> dict[str, Any]:
    """The caller's audio reflected to a sideband (PCM16 24 kHz, before muting): the
    server event that shares the client command's type and ``audio`` key; no event_id."""
    return {"type": "session.input_audio.append", "audio": b64}


def delegation_created(event_id: str, delegation_id: str, offset_ms: int,
                       target: str = "client",
                       response_id: str | None = None) -> dict[str, Any]:
    """The agent delegated work: metadata only (GPT-Live sends no task text); a Responses
    delegation names its backend response."""
    delegation = {"id": delegation_id, "type": "delegation", "target": target}
    if response_id is not None:
        delegation["response_id"] = response_id
    return {"type": "session.delegation.created", "event_id": event_id,
            "offset_ms": offset_ms, "delegation": delegation}


def response_event(event_id: str, event: dict[str, Any], delegation_id: str | None,
                   client_event_id: str | None = None) -> dict[str, Any]:
    """One event of the Responses backend's stream, wrapped (``delegation_id`` null for a
    response the client asked for with no delegation waiting)."""
    return _answer({"type": "response.event", "event_id": event_id, "event": event,
                    "delegation_id": delegation_id}, client_event_id)


def dtmf_received(event_id: str, key: str) -> dict[str, Any]:
    """A caller's keypress on a SIP session (sideband only)."""
    return {"type": "transport.dtmf.received", "event_id": event_id, "event": key}


def dtmf_sent(event_id: str, key: str, client_event_id: str | None = None
              ) -> dict[str, Any]:
    """A sideband's ``transport.dtmf.send`` went out on the phone leg (sideband only)."""
    return _answer({"type": "transport.dtmf.sent", "event_id": event_id, "event": key},
                   client_event_id)


def error(event_id: str, exc: LiveError) -> dict[str, Any]:
    err: dict[str, Any] = {"type": exc.type, "code": exc.code, "message": exc.message,
                           "param": exc.param}
    if exc.client_event_id is not None:
        err["client_event_id"] = exc.client_event_id
    return _answer({"type": "error", "event_id": event_id, "error": err},
                   exc.client_event_id)


def info(event_id: str, code: str, message: str,
         client_event_id: str | None = None) -> dict[str, Any]:
    return _answer({"type": "info", "event_id": event_id, "code": code, "message": message},
                   client_event_id)
