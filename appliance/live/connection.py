"""The GPT-Live protocol state of one WebSocket session (sans-IO): Live client events in,
Live server events out, **translated onto an inner Realtime machine** — the appliance's one
turn engine and agent protocol (appliance/realtime/machine.py), not a second one.

Verbs (docs/style.md rule 18, a *clockless* core; it is driven by the same WebSocket shell
as the Realtime machine, appliance/realtime/ws_session.py, through the same surface)::

    handle_open()                      the socket is open: nothing is sent (Live is silent
                                       until session.start)
    handle_input(data)                 one client event (untrusted; ``handle_message``)
    handle_delta(response_id, delta)   the agent's content (audio is encoded here, in the
                                       session's format; the rest goes to the machine)
    handle_response_end(response_id)   the agent finished (error=... if it failed)
    close(reason) / lost()             user operations: the session expired / the socket
                                       went away
    poll_output()                      actions first, then :class:`LiveEvent`; None when
                                       drained (``poll_action`` / ``poll_event`` split it)

What maps onto what (Live has no items, responses or VAD events; the machine has them all)::

    session.start                 -> the machine's session.update (semantic_vad turns,
                                     transcription on, the agent's prompt and voice) and
                                     session.input as conversation items
    session.input_audio.append    -> 20 ms frames of 48 kHz PCM (silence while muted)
                                     through the VAD into handle_frame: the machine opens
                                     and ends turns, barges in and asks for responses
    *.instructions|thinking.append -> a system item in the conversation
    session.commentary.append     -> a response the agent speaks (agent.py), queued
                                     behind the one running
    the delegate tool's call      -> session.delegation.created (client delegation: the
    (function_call_arguments.done)   agent's LLM decided), the call answered at once in
                                     the conversation ("delegated"), and after
                                     acknowledgement_delay_ms of timeline an automatic
                                     spoken acknowledgement — unless a commentary or
                                     thinking append comes first (it cancels them all)
                                     Responses delegation: AskBackend (the shell runs
                                     it: backend.py) with the voice conversation and
                                     the task; session.delegation.created (target
                                     responses, the backend's response_id) at its first
                                     event
    handle_backend_event / _end   -> response.event {event, delegation_id}; function calls
                                     wait for response.item.create + response.create;
                                     the final text is spoken (a queued commentary)
    transcription.delta (item)    -> session.input_transcript.delta, the turn's span
    output_audio_transcript.delta -> session.output_transcript.delta, held until the
                                     sentence's audio is out so its end_ms is known
    AudioDelta                    -> session.output_audio.delta (encoded here)
    everything else the machine says (items, responses, VAD events) is not Live's: dropped

**Two transports, one core.** ``media=False``: the WebSocket (``GET /v1/live/sessions``),
audio in ``session.input_audio.append`` and out in ``session.output_audio.delta``. ``media=True``:
a WebRTC call (``POST /v1/live/sessions``): the HTTP request started the session
(:meth:`start`; ``session.start`` on the channel is refused), the caller's audio is the
track's 20 ms frames (:meth:`handle_frame`, with the transceiver's VAD flag) and the answer's
goes back on the track (``handle_delta`` returns True: queue it; the machine runs in its
WebRTC mode, so a barge-in is a ``ClearAudio``), and the events are the ``oai-events``
channel's, held until it opens (:meth:`handle_open`), then filtered by
``client.data_channel`` (``allowed_client_events`` refuses a command with ``error``,
``allowed_server_events`` drops what may not go out; an ``info`` ``data_channel_permissions``
says what was applied). With a ``wake_policy`` the session is gated (idle.py): asleep until
speech wakes it (``session.resumed``), paused after ``idle_timeout_s`` idle
(``session.paused``). The gate's clock is the track's: each arriving frame is 20 ms (the
timeline rule below), so the core stays clockless and a pause lands on the frame that
crosses the deadline. While asleep the agent hears silence, except the last
:data:`WAKE_HOLD_FRAMES` frames, held back and delivered whole when the speech in them wakes
the session (so its first word is heard).

**The session timeline** (every ``start_ms`` / ``end_ms``) is the input audio's clock: the
milliseconds of audio appended since ``session.start`` — wall-clock time for a client that
streams in real time, and deterministic here. The answer's audio is laid on it from where
the input stood when its first chunk came (``max(output end, input)``); a barge-in cuts the
output back to the input's time.

**The sideband's stream** (``GET /v1/live/sessions/{id}/attach``; the shells hand it to
their :class:`~appliance.realtime.sideband.SidebandPoint`): while ``observed()`` says a
sideband is attached, every event also goes to :meth:`poll_observed` — before the WebRTC
channel's hold and ``allowed_server_events`` filter — with the observer extras of
``ConnectServerEvent``: the caller's audio reflected as ``session.input_audio.append``
(PCM16 24 kHz, before muting; :data:`REFLECT_FRAMES` frames a piece on WebRTC) and the
answer's audio as ``session.output_audio.delta`` in PCM16 24 kHz with its timeline span
(the primary socket's carries the session's format and no span). A sideband's command
(:meth:`handle_sideband`) is acted on like the client's, without the data channel's
``allowed_client_events``; ``session.start`` and ``session.input_audio.append`` are not
sideband commands, and an error it causes goes to the sidebands' stream only.

**A SIP call** (``phone=True``, with ``media``: a Live-accepted phone call; there is no
primary channel, so its events reach the sidebands only): the caller's keypresses
(:meth:`handle_dtmf`) are ``transport.dtmf.received``, and a sideband's
``transport.dtmf.send`` (the sideband-only command, protocol.py ``SIDEBAND_FIELDS``) is a
:class:`SendDtmf` action for the shell — the phone leg's RFC 4733 events — acknowledged
with ``transport.dtmf.sent``; on any other session it is an ``error`` naming it.

**Stored sessions** (``store: true``; store.py keeps them): :meth:`stored` is what a fork
needs — the config as given and the conversation as text (config.py :func:`history`); the
shell's ``tap(direction, timeline_s, pcm48k)`` hears the caller's audio (before muting) and
the answer's, each at its place on the timeline, for the WebSocket's recording (a WebRTC
call is recorded by its transceiver's recorder tap). A **fork** (``fork=`` a stored
session) takes a ``ForkSessionConfig`` at ``session.start``: config.py
:func:`fork_untrusted` makes the config it starts with.

States are a table (rule 19): a command before ``session.start``, a second
``session.start`` or anything after ``session.closed`` is an ``error`` event naming it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..realtime.audio import (
    g711_from_48k,
    g711_to_48k,
    pcm16k_to_48k,
    pcm24k_to_48k,
    pcm48k_to_16k,
    pcm48k_to_24k,
)
from ..realtime.interface import AudioDelta, Delta
from ..realtime.machine import RealtimeConnection
from ..realtime.socket_protocol import EndSession
from . import events
from .config import (
    DELEGATE_TOOL,
    MAX_SESSION_SECONDS,
    apply_update_untrusted,
    fork_untrusted,
    history,
    offers_delegation,
    realtime_items,
    realtime_session,
    resolve_untrusted,
    resource,
    tokens,
)
from .idle import Paused, WakeGate
from .protocol import (
    DTMF_KEYS,
    MAX_APPEND_TOKENS,
    ClientEvent,
    parse_client_event_untrusted,
)
from .responses import TERMINAL, Outcome, context, message, request_body, snapshot
from .schema import LiveError

FRAME_BYTES = 1920  # 20 ms of 48 kHz PCM16: the machine's frame
FRAME_MS = 20
BYTES_PER_MS = 96  # 48 kHz PCM16
USAGE_EVERY_MS = 15_000  # session.usage.updated cadence (the real service's, ~15 s)
#: The ResponseRequest.extra key of a commentary to speak (agent.py reads it).
SAY = "live_commentary"
MAX_TURNS = 64  # user turns whose span is kept while their transcript is pending
THINKING = "Silent context (do not read it out): "
HELD_BEFORE_OPEN = 256  # WebRTC: events kept for a channel that is not open yet
WAKE_HOLD_FRAMES = 25  # WebRTC, asleep: the last 500 ms, delivered when they wake it
SILENT_FRAME = bytes(FRAME_BYTES)
#: What the agent says when an acknowledgement falls due (GPT-Live's model says its own
#: words, "Okay, checking now" on the wire).
ACKNOWLEDGEMENT = "Okay, checking now."
#: The delegate call's answer in the agent's conversation: the LLM's tool call is never
#: left open (a chat-completions backend refuses a tool call without its result).
DELEGATED = ("Delegated to the application ({id}). Its result will come back as context; "
             "do not guess it.")
MAX_DELEGATIONS = 1024  # delegation ids kept for delegation_id checks (oldest forgotten)
MAX_BACKEND_ITEMS = 256  # the Responses backend's conversation items of one delegation
MAX_QUEUED = 16  # Responses delegations waiting for the backend
MAX_TASK = 2000  # characters of the delegate call's task passed to the backend
#: The backend's task, as the developer message that ends its context.
TASK = "The voice agent delegated this task to you: {task}"
#: The delegate call's answer under Responses delegation.
DELEGATED_BACKEND = ("Delegated to the backend ({id}). Its answer will be spoken to the user "
                     "when it comes; do not guess it.")
REFLECT_FRAMES = 5  # WebRTC: the caller's 20 ms frames per reflected input piece (100 ms)
MAX_OBSERVED = 4096  # events kept for the sideband between two drains (oldest go)
#: Not sideband commands (ConnectClientEvent has neither): why, for the error.
NOT_SIDEBAND = {
    "session.start": "The session is already running: a sideband does not send "
    "session.start.",
    "session.input_audio.append": "A sideband observes the session's audio; the input "
    "comes from the primary transport.",
}


class State(Enum):
    NEW = "new"  # open, silent until session.start
    ACTIVE = "active"
    CLOSED = "closed"  # session.closed sent, or the socket went away


class Move(Enum):
    START = "start"
    COMMAND = "command"
    CLOSE = "close"


#: (state, move) -> next state; a pair that is not here is answered with _REFUSED's error.
_TABLE: dict[tuple[State, Move], State] = {
    (State.NEW, Move.START): State.ACTIVE,
    (State.ACTIVE, Move.COMMAND): State.ACTIVE,
    (State.ACTIVE, Move.CLOSE): State.CLOSED,
}
_REFUSED: dict[tuple[State, Move], tuple[str, str]] = {
    (State.NEW, Move.COMMAND): ("session_not_started", "Send session.start first and wait "
                                "for session.started."),
    (State.NEW, Move.CLOSE): ("session_not_started", "There is no session to close: send "
                              "session.start first."),
    (State.ACTIVE, Move.START): ("session_already_started", "The session has already "
                                 "started; session.start is accepted once per connection."),
}


def _move(kind: str) -> Move:
    if kind == "session.start":
        return Move.START
    return Move.CLOSE if kind == "session.close" else Move.COMMAND


@dataclass(frozen=True, slots=True)
class Started:
    """The session started: the shell ends it after ``expires_in`` seconds
    (``close("expired")``) and may report it (webhooks)."""

    session_id: str
    model: str
    expires_in: float


@dataclass(frozen=True, slots=True)
class SendDtmf:
    """A sideband pressed ``key`` on a SIP call: the shell plays it on the phone leg."""

    key: str


@dataclass(frozen=True, slots=True)
class AskBackend:
    """Responses delegation: the shell sends ``body`` to the backend (``POST
    {llm}/responses``, or chat completions) and feeds its stream back with
    :meth:`LiveConnection.handle_backend_event`, then ``handle_backend_end``, each with
    ``stream`` (which request's stream it is: a delegation's tool round trip asks again
    under the same delegation id)."""

    delegation_id: str | None
    body: dict[str, Any]
    stream: int = 0


@dataclass(slots=True)
class _Run:
    """The backend response in flight: its delegation, the command that asked for it,
    whether ``session.delegation.created`` went out, and what it has come to."""

    delegation_id: str | None
    client_event_id: str | None
    offset_ms: int
    announced: bool
    outcome: Outcome
    stream: int = 0


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """``poll_output()``: one server event, the JSON object ``poll_event()`` returns."""

    event: dict[str, Any]


_Codec = tuple[Callable[[bytes], bytes], Callable[[bytes], bytes], int]
#: audio.format -> (decode to 48 kHz, encode from 48 kHz, 48 kHz bytes per encoded unit)
_CODECS: dict[tuple[str, int], _Codec] = {
    ("audio/pcm", 24000): (pcm24k_to_48k, pcm48k_to_24k, 4),
    ("audio/pcm", 16000): (pcm16k_to_48k, pcm48k_to_16k, 6),
    ("audio/pcmu", 8000): (lambda b: g711_to_48k(b, alaw=False),
                           lambda b: g711_from_48k(b, alaw=False), 12),
    ("audio/pcma", 8000): (lambda b: g711_to_48k(b, alaw=True),
                           lambda b: g711_from_48k(b, alaw=True), 12),
}


class LiveConnection:
    """One Live session. ``ids("event")`` makes unique ids; ``wall_clock()`` is Unix
    seconds (only ``expires_at`` reads it); ``vad(frame) -> bool`` is the shell's voice
    detector for 20 ms 48 kHz frames (the Realtime WebSocket's)."""

    def __init__(self, *, session_id: str, ids: Callable[[str], str],
                 wall_clock: Callable[[], float], vad: Callable[[bytes], bool] | None = None,
                 max_seconds: int = MAX_SESSION_SECONDS, usage_every_ms: int = USAGE_EVERY_MS,
                 transcription_model: str = "whisper-1", judge: bool = False,
                 speculate: bool = False, media: bool = False,
                 queued_seconds: Callable[[], float] = lambda: 0.0,
                 fork: dict[str, Any] | None = None, phone: bool = False,
                 backend: bool = False) -> None:
        """``judge`` / ``speculate``: the shell answers the turn engine's pause work
        (appliance/realtime/turns.py), as the Realtime WebSocket's does. ``media``: a
        WebRTC call (``vad`` unused: the frames carry their flag; ``queued_seconds`` is the
        output queue's, for the machine's barge-in); ``phone``: that call is a SIP one (DTMF
        both ways). ``backend``: an OpenAI-compatible LLM is configured, so Responses
        delegation can be served (:class:`AskBackend`)."""
        if not media and vad is None:
            raise ValueError("a WebSocket session needs a vad")
        self.id = session_id
        self.media = media
        self.phone = phone and media
        self._ids = ids
        self._clock = wall_clock
        self._vad = vad or (lambda _: False)
        self._max_seconds = max_seconds
        self._usage_every = usage_every_ms
        self._transcription = transcription_model
        self.machine = RealtimeConnection(session_id=f"sess_{session_id}", ids=ids,
                                          can_transcribe=True, vad=None if media else vad,
                                          queued_seconds=queued_seconds, judge=judge,
                                          speculate=speculate)
        self.machine.handle_open()
        while self.machine.poll_event() is not None:
            pass  # session.created is the Realtime client's, not ours
        self.state = State.NEW
        self.config: dict[str, Any] = {}
        self.fork = fork  # the stored session this one forks (its session.start: overrides)
        self.given: dict[str, Any] = {}  # the config as the client gave it (for a fork)
        #: the recording's ear: (``"in"`` | ``"out"``, timeline seconds, 48 kHz PCM16)
        self.tap: Callable[[str, float, bytes], None] | None = None
        self.expires_at = 0
        self.muted = False
        self._events: deque[dict[str, Any]] = deque()
        self._actions: deque[object] = deque()
        self._decode, self._encode, self._unit = _CODECS[("audio/pcm", 24000)]
        # input: the timeline, a sample byte split across appends, a frame's remainder
        self.input_ms = 0
        self._odd = b""
        self._partial = b""
        self._next_usage = usage_every_ms
        self._turns: OrderedDict[str, list[int | None]] = OrderedDict()  # item -> [start, end]
        self._heard_item: str | None = None  # the item of the last input transcript delta
        # output: where the answer's audio ends on the timeline, the held transcript
        self.output_ms = 0.0
        self._response_audio = False
        self._rest = b""  # 48 kHz bytes short of a whole encoded unit
        self._held: tuple[str, int] | None = None  # (text, start_ms)
        self._said = False  # an output transcript went out: later answers get a space
        self._response_said = False
        self._commentary: deque[str] = deque()
        # client delegation: the ids made (for delegation_id), acknowledgements pending
        self._delegations: OrderedDict[str, None] = OrderedDict()
        self._acks: dict[str, int] = {}  # delegation id -> the timeline ms it falls due
        self._delegating = False  # the agent was given the delegate tool
        # Responses delegation: the backend, its conversation, the response in flight, the
        # delegation waiting for tool results, the delegations waiting for the backend
        self._backend = backend
        self._backend_items: list[dict[str, Any]] = []
        self._run: _Run | None = None
        self._streams = 0  # AskBackend requests made (each run's stream number)
        self._waiting: str | None = None
        self._awaiting_tools = False
        self._queued: deque[tuple[str, str, int]] = deque()  # (id, task, offset_ms)
        # WebRTC: the channel, its permissions, the wake gate and what it holds back
        self.opened = not media
        self._allowed_client: frozenset[str] | None = None  # None: all
        self._allowed_server: frozenset[str] | None = None
        #: ``response.event`` selectors' ``response_event``: the nested types let through
        self._allowed_nested: frozenset[str] | None = None
        self.gate: WakeGate | None = None
        self._asleep: deque[tuple[bytes, bool]] = deque()
        self._track_ms = 0  # the track's frames as they arrived: the wake gate's clock
        # the sideband: its stream, whether one is attached, the command being run
        self.observed: Callable[[], bool] = lambda: False  # set by the shell
        self._observed: deque[dict[str, Any]] = deque()
        self._from_sideband = False
        self._reflect = b""  # WebRTC: 48 kHz frames not yet reflected

    # -- poll --------------------------------------------------------------------------------

    def poll_action(self) -> object | None:
        """The next action: the machine's (StartResponse, CancelResponse, Transcribe,
        SessionUpdated) and ours (:class:`Started`, ``EndSession``)."""
        self._pump()
        return self._actions.popleft() if self._actions else None

    def poll_event(self) -> dict[str, Any] | None:
        """The next server event; on WebRTC, None until the channel is open, and only the
        events ``allowed_server_events`` lets through."""
        self._pump()
        if not self.opened:
            while len(self._events) > HELD_BEFORE_OPEN:
                self._events.popleft()  # an audio-only caller: the oldest go
            return None
        while self._events:
            event = self._events.popleft()
            if self._allowed_server is None or (
                    event["type"] in self._allowed_server and self._nested_allowed(event)):
                return event
        return None

    def poll_output(self) -> object | None:
        """The next action, else the next server event as :class:`LiveEvent`; None when
        there is neither."""
        action = self.poll_action()
        if action is not None:
            return action
        event = self.poll_event()
        return None if event is None else LiveEvent(event)

    def poll_observed(self) -> dict[str, Any] | None:
        """The sideband's next event (every one, and the observer extras), None when
        drained; nothing is kept while no sideband is attached."""
        self._pump()
        return self._observed.popleft() if self._observed else None

    def replay(self) -> dict[str, Any]:
        """What a sideband attaching now gets first: ``session.started`` with the session
        as it stands (GPT-Live's "short replay")."""
        return events.session_started(self._ids("event"), self.resource())

    def _nested_allowed(self, event: dict[str, Any]) -> bool:
        """A ``response.event`` passes a data channel's selectors by its nested type."""
        if event["type"] != "response.event" or self._allowed_nested is None:
            return True
        return event["event"].get("type") in self._allowed_nested

    def _out(self, event: dict[str, Any], *, primary: bool = True,
             observers: bool = True) -> None:
        """One server event for the primary side, the sidebands, or both."""
        if primary:
            self._events.append(event)
        if observers and self.observed():
            self._observed.append(event)
            if len(self._observed) > MAX_OBSERVED:
                self._observed.popleft()  # a shell that never drains: bounded anyway

    def _emit(self, event: dict[str, Any]) -> None:
        self._pump()  # what the machine said before this comes first
        self._out(event)

    def _error(self, exc: LiveError) -> None:
        self._pump()
        # A sideband's mistake is its own: the primary client never sees it.
        self._out(events.error(self._ids("event"), exc), primary=not self._from_sideband)

    # -- input -------------------------------------------------------------------------------

    def handle_open(self) -> None:
        """The socket is open: a Live server says nothing until ``session.start``. On
        WebRTC, the ``oai-events`` channel opened: what was held goes out, ``session.started``
        first."""
        self.opened = True

    def handle_message(self, data: str | bytes) -> None:
        """One client event; never raises for any input (errors become ``error`` events)."""
        try:
            ev = parse_client_event_untrusted(data)
            self._dispatch(ev)
        except LiveError as exc:
            self._error(exc)

    handle_input = handle_message  # the rule-18 name of the network input

    def handle_sideband(self, data: str | bytes) -> None:
        """One command of an attached sideband (untrusted JSON, a trusted sender): acted on
        as the client's would be, never raises; its errors go to the sidebands only."""
        self._from_sideband = True
        try:
            ev = parse_client_event_untrusted(data, sideband=True)
            if ev.type in NOT_SIDEBAND:
                raise LiveError(NOT_SIDEBAND[ev.type], code="unsupported_event",
                                param="type", client_event_id=ev.event_id)
            self._dispatch(ev, trusted=True)
            self._pump()  # what the machine answered it, under the same rule
        except LiveError as exc:
            self._error(exc)
        finally:
            self._from_sideband = False

    def _dispatch(self, ev: ClientEvent, *, trusted: bool = False) -> None:
        cid = ev.event_id
        if (not trusted and self._allowed_client is not None
                and ev.type not in self._allowed_client):
            raise LiveError(f"The data channel may not send '{ev.type}': the session's "
                            "client.data_channel.allowed_client_events does not list it.",
                            code="client_event_not_allowed", param="type",
                            client_event_id=cid)
        move = _move(ev.type)
        nxt = _TABLE.get((self.state, move))
        if nxt is None:
            code, message = _REFUSED.get((self.state, move), (
                "session_closed", "The session has closed."))
            if self.media and move is Move.START:
                message = ("A WebRTC session is started by POST /v1/live/sessions: do not "
                           "send session.start on the data channel.")
            raise LiveError(message, code=code, param="type", client_event_id=cid)
        try:
            getattr(self, _HANDLERS[ev.type])(ev.data, cid)
        except LiveError as exc:
            raise exc.with_event(cid) from None
        if self.state is not State.CLOSED:
            self.state = nxt

    def start(self, session: Any) -> None:
        """WebRTC: the session config of ``POST /v1/live/sessions`` (validated again here:
        raises :class:`LiveError`) starts the session; ``session.started`` waits for the
        channel."""
        if self.state is not State.NEW or not self.media:
            raise LiveError("The session has already started.",
                            code="session_already_started", param="session")
        self._start({"session": session}, None)
        self.state = State.ACTIVE

    def _start(self, data: dict[str, Any], cid: str | None) -> None:
        if self.fork is not None and not self.media:  # WebRTC: signaling merged it
            data = {"session": fork_untrusted(self.fork, data["session"])}
        cfg = resolve_untrusted(data["session"], media=self.media, backend=self._backend)
        self.given = dict(data["session"])
        self._delegating = offers_delegation(data["session"])
        if not self.media:
            fmt = cfg["audio"]["format"]
            self._decode, self._encode, self._unit = _CODECS[(fmt["type"], fmt["rate"])]
        self.config = cfg
        self.expires_at = int(self._clock()) + self._max_seconds
        self._inner({"type": "session.update",
                     "session": realtime_session(cfg, self._transcription,
                                                 delegate=self._delegating)})
        for item in realtime_items(cfg):
            self._inner({"type": "conversation.item.create", "item": item})
        self._emit(events.session_started(self._ids("event"), self.resource(), cid))
        channel = (cfg.get("client") or {}).get("data_channel")
        if self.media and channel is not None:
            self._permissions(channel)
        wake = cfg.get("wake_policy")
        if self.media and wake is not None:
            self.gate = WakeGate(vad_threshold=wake.get("vad_threshold", 0.5),
                                 idle_timeout_s=cfg.get("idle_timeout_s"), now=self._t())
        self._actions.append(Started(self.id, cfg["model"], float(self._max_seconds)))

    def _permissions(self, channel: dict[str, Any]) -> None:
        """``client.data_channel``: what the channel may send and receive, and the
        ``info`` that says so (itself subject to ``allowed_server_events``)."""
        client = channel.get("allowed_client_events", "all")
        server = channel.get("allowed_server_events", "all")
        if client != "all":
            self._allowed_client = frozenset(client)
        if server != "all":
            self._allowed_server = frozenset(s["type"] for s in server)
            nested = [s.get("response_event") for s in server if s["type"] == "response.event"]
            if nested and None not in nested:
                self._allowed_nested = frozenset(n for n in nested if n is not None)

        def show(allowed: frozenset[str] | None) -> str:
            return "all" if allowed is None else ", ".join(sorted(allowed)) or "none"

        self._emit(events.info(self._ids("event"), "data_channel_permissions",
                               f"Data channel permissions applied. Client events: "
                               f"{show(self._allowed_client)}. Server events: "
                               f"{show(self._allowed_server)}."))

    def _update(self, data: dict[str, Any], cid: str | None) -> None:
        self.config = apply_update_untrusted(self.config, data["session"])
        self._emit(events.session_updated(self._ids("event"), self.resource(), cid))

    def _close_requested(self, data: dict[str, Any], cid: str | None) -> None:
        self._closed("close_requested", cid)

    def _append_audio(self, data: dict[str, Any], cid: str | None) -> None:
        if self.media:
            raise LiveError("On WebRTC the caller's audio is the media track: "
                            "session.input_audio.append is for WebSocket sessions.",
                            code="unsupported_event", param="type")
        try:
            raw = base64.b64decode(data["audio"], validate=True)
        except (binascii.Error, ValueError):
            raise LiveError("Invalid 'audio': not valid base64.", param="audio") from None
        if self._unit != 12:  # PCM16: a sample may be split across two appends
            raw = self._odd + raw
            whole = len(raw) & ~1
            self._odd = raw[whole:]
            raw = raw[:whole]
        pcm = self._decode(raw)
        if self.tap is not None and pcm:
            self.tap("in", (self.input_ms + len(self._partial) / BYTES_PER_MS) / 1000, pcm)
        if self.observed():  # reflected before muting, in the sideband's format
            self._out(events.input_audio_reflected(base64.b64encode(
                raw if self._unit == 4 else pcm48k_to_24k(pcm)).decode("ascii")),
                primary=False)
        if self.muted:  # the agent hears silence; the timeline goes on
            pcm = bytes(len(pcm))
        self._frames(pcm)

    def _frames(self, pcm: bytes) -> None:
        data = self._partial + pcm if self._partial else pcm
        whole = len(data) - len(data) % FRAME_BYTES
        self._partial = data[whole:]
        for i in range(0, whole, FRAME_BYTES):
            frame = data[i : i + FRAME_BYTES]
            self._feed(frame, self._vad(frame))

    def _feed(self, frame: bytes, speech: bool) -> None:
        """One 20 ms frame into the machine: the timeline moves on."""
        self.machine.handle_frame(frame, speech)
        self.input_ms += FRAME_MS
        # Translated at the frame that caused them: a barge-in cuts the output here.
        self._pump()
        if self._acks:
            self._acknowledge()
        if self.input_ms >= self._next_usage:
            self._next_usage += self._usage_every
            self._emit(events.usage_updated(self._ids("event"), self._seconds(),
                                            **self._breakdown()))

    def handle_frame(self, pcm: bytes, speech: bool) -> None:
        """WebRTC: 20 ms of the caller's audio (48 kHz PCM16) and its VAD flag. Ignored
        before the start and after the end."""
        if self.state is not State.ACTIVE:
            return
        if self.observed():  # reflected before muting, 100 ms a piece
            self._reflect += pcm
            if len(self._reflect) >= REFLECT_FRAMES * FRAME_BYTES:
                self._out(events.input_audio_reflected(base64.b64encode(
                    pcm48k_to_24k(self._reflect)).decode("ascii")), primary=False)
                self._reflect = b""
        elif self._reflect:
            self._reflect = b""
        if self.muted:  # the agent hears silence; the timeline goes on; it wakes nothing
            pcm, speech = SILENT_FRAME, False
        gate = self.gate
        if gate is None:
            self._feed(pcm, speech)
            return
        self._track_ms += FRAME_MS
        now = self._t()
        gate.handle_input(now, speech, self._busy)
        gate.handle_timeout(now)  # idle_timeout_s: this frame may cross the deadline
        if gate.awake:
            # Woken by this frame: the held ones hold the start of that speech, all real.
            held, self._asleep = self._asleep, deque()
            for frame, flag in held:
                self._feed(frame, flag)
            self._feed(pcm, speech)
        else:
            self._asleep.append((pcm, speech))
            if len(self._asleep) > WAKE_HOLD_FRAMES:
                self._asleep.popleft()
                self._feed(SILENT_FRAME, False)
        self._gated()

    def _t(self) -> float:
        return self._track_ms / 1000

    @property
    def _busy(self) -> bool:
        m = self.machine
        return m.response is not None or m.playing is not None or bool(self._commentary)

    def _gated(self) -> None:
        assert self.gate is not None
        while (out := self.gate.poll_output()) is not None:
            paused = isinstance(out, Paused)
            self._emit(events.paused(self._ids("event"), paused))
            if not paused:
                self._say_next()

    def _mute(self, data: dict[str, Any], cid: str | None) -> None:
        self.muted = True
        self._emit(events.input_audio_muted(self._ids("event"), True, cid))

    def _unmute(self, data: dict[str, Any], cid: str | None) -> None:
        self.muted = False
        self._emit(events.input_audio_muted(self._ids("event"), False, cid))

    def _append(self, kind: str, data: dict[str, Any], cid: str | None) -> None:
        content: str = data["content"]
        delegation = data["delegation_id"]
        if delegation is not None and self.config["delegation"]["type"] == "responses":
            # GPT-Live's rule: the backend answers a Responses delegation, not the client.
            raise LiveError("A delegation_id is not accepted under Responses delegation: "
                            "its result comes from the backend (use null).",
                            param="delegation_id")
        if delegation is not None and delegation not in self._delegations:
            raise LiveError(f"Unknown delegation_id '{delegation[:64]}': no delegation of "
                            "this session has that id.", param="delegation_id")
        if tokens(content) > MAX_APPEND_TOKENS:
            raise LiveError(f"Invalid 'content': longer than {MAX_APPEND_TOKENS} tokens.",
                            code="string_above_max_length", param="content")
        at = self.input_ms
        if kind != "session.instructions.append":
            self._acks.clear()  # "any commentary or thinking ... cancels all pending"
        if content.strip():
            if kind == "session.commentary.append":
                self._commentary.append(content)
            else:
                text = THINKING + content if kind == "session.thinking.append" else content
                self._inner({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "system",
                    "content": [{"type": "input_text", "text": text}]}})
        self._emit(events.appended(kind, self._ids("event"), at, at, cid))
        self._say_next()

    def _instructions(self, data: dict[str, Any], cid: str | None) -> None:
        self._append("session.instructions.append", data, cid)

    def _thinking(self, data: dict[str, Any], cid: str | None) -> None:
        self._append("session.thinking.append", data, cid)

    def _commentary_append(self, data: dict[str, Any], cid: str | None) -> None:
        self._append("session.commentary.append", data, cid)

    # -- SIP: DTMF both ways ---------------------------------------------------------------------

    def handle_dtmf(self, key: str) -> None:
        """The caller pressed ``key`` (RFC 4733 or SIP INFO): the sidebands hear it. Only
        while the session is active, and only the SDK's keys (the phone leg's decoder
        gives nothing else, but the shell's events are not this core's to trust)."""
        if self.state is State.ACTIVE and key in DTMF_KEYS:
            self._pump()
            self._out(events.dtmf_received(self._ids("event"), key), primary=False)

    def _dtmf_send(self, data: dict[str, Any], cid: str | None) -> None:
        if not self.phone:
            raise LiveError("transport.dtmf.send is supported only for SIP calls.",
                            code="unsupported_event", param="type")
        self._actions.append(SendDtmf(data["event"]))
        self._out(events.dtmf_sent(self._ids("event"), data["event"], cid), primary=False)

    # -- Responses delegation ------------------------------------------------------------------

    def _responses_only(self, kind: str) -> None:
        if self.config["delegation"]["type"] != "responses":
            raise LiveError(f"{kind} requires Responses delegation.",
                            code="unsupported_event", param="type")

    def _response_item_create(self, data: dict[str, Any], cid: str | None) -> None:
        """An input item for the backend's conversation (a function call's output, a
        message); the next ``response.create`` sends it. No acknowledgement, as in
        GPT-Live."""
        self._responses_only("response.item.create")
        item = data["item"]
        if not isinstance(item, dict) or not isinstance(item.get("type", "message"), str):
            raise LiveError("Invalid 'item': expected a Responses input item (an object "
                            "with a type).", code="invalid_type", param="item")
        if item.get("type") == "function_call_output" and not (
                isinstance(item.get("call_id"), str)
                and isinstance(item.get("output"), str | list)):
            raise LiveError("Invalid 'item': a function_call_output needs call_id and "
                            "output.", param="item")
        if len(self._backend_items) >= MAX_BACKEND_ITEMS:
            raise LiveError(f"The backend conversation holds {MAX_BACKEND_ITEMS} items: "
                            "send response.create first.", code="array_above_max_length",
                            param="item")
        self._backend_items.append(item)

    def _response_create(self, data: dict[str, Any], cid: str | None) -> None:
        """Continue the delegation waiting for tool results, or ask the backend with no
        delegation (its answer is spoken all the same)."""
        self._responses_only("response.create")
        if self._run is not None:
            raise LiveError("The backend is already answering: wait for its "
                            "response.completed.",
                            code="conversation_already_has_active_response", param="type")
        did, self._waiting = self._waiting, None
        self._awaiting_tools = False
        self._ask(did, cid, self.input_ms, announced=True)

    def _queue_backend(self, delegation_id: str, task: str) -> None:
        if len(self._queued) >= MAX_QUEUED:
            self._queued.popleft()  # the oldest is dropped: bounded under any LLM
        self._queued.append((delegation_id, task, self.input_ms))
        self._next_backend()

    def _next_backend(self) -> None:
        """Start the next queued delegation once the backend is free (no response in
        flight, none waiting for the client's tool results)."""
        if self._run is not None or self._awaiting_tools or not self._queued:
            return
        did, task, offset = self._queued.popleft()
        self._backend_items.append(message("developer", TASK.format(task=task)))
        self._ask(did, None, offset, announced=False)

    def _ask(self, did: str | None, cid: str | None, offset: int, *, announced: bool) -> None:
        voice = context(history(self.machine.conversation.public()))
        body = request_body(self.config["delegation"]["responses"],
                            [*voice, *self._backend_items])
        self._streams += 1
        self._run = _Run(did, cid, offset, announced, Outcome(), self._streams)
        self._actions.append(AskBackend(did, body, self._streams))

    def _current(self, delegation_id: str | None, stream: int | None) -> _Run | None:
        """The run a shell's callback is about (``stream``: the AskBackend's), or None
        for a stream already ended or given up."""
        run = self._run
        if run is None or run.delegation_id != delegation_id or (
                stream is not None and stream != run.stream):
            return None
        return run

    def handle_backend_event(self, delegation_id: str | None, event: dict[str, Any],
                             stream: int | None = None) -> None:
        """One event of the backend's stream (the shell parsed it): wrapped as
        ``response.event``; the first names the delegation (``session.delegation.created``
        with the backend's ``response_id``). A terminal event (``response.completed``,
        ``failed``, ``incomplete``) ends the response at once: a client that answers the
        completed event's function call with ``response.create`` must find the backend
        free, not wait for the HTTP stream to close behind it."""
        run = self._current(delegation_id, stream)
        if run is None or self.state is not State.ACTIVE:
            return  # a response that was given up (the session ended)
        self._pump()
        run.outcome.handle_event(event)
        self._announce(run)
        self._out(events.response_event(self._ids("event"), snapshot(event), delegation_id,
                                        run.client_event_id))
        if event.get("type") in TERMINAL:
            self._end_run(run, None)

    def _announce(self, run: _Run) -> None:
        if run.announced or run.delegation_id is None:
            return
        run.announced = True
        self._out(events.delegation_created(self._ids("event"), run.delegation_id,
                                            run.offset_ms, target="responses",
                                            response_id=run.outcome.response_id))

    def handle_backend_end(self, delegation_id: str | None, error: str | None = None,
                           stream: int | None = None) -> None:
        """The backend's stream ended (``error``: it failed: the HTTP status, an
        unreadable stream); nothing to do if its terminal event already ended it."""
        run = self._current(delegation_id, stream)
        if run is not None:
            self._end_run(run, error)

    def _end_run(self, run: _Run, error: str | None) -> None:
        """Function calls wait for the client's outputs and ``response.create``; a final
        text is spoken, and stays in the voice conversation."""
        delegation_id = run.delegation_id
        self._run = None
        if self.state is not State.ACTIVE:
            return
        self._pump()
        outcome = run.outcome
        if error is not None and outcome.status is None:
            self._announce(run)
            self._out(events.response_event(self._ids("event"), {
                "type": "error", "code": "backend_error", "message": error[:500],
                "param": None, "sequence_number": 0}, delegation_id, run.client_event_id))
        calls = outcome.calls() if error is None and outcome.status == "completed" else []
        if calls:
            # The backend's output joins its conversation; the client runs the calls.
            room = MAX_BACKEND_ITEMS - len(self._backend_items)
            self._backend_items.extend(outcome.items[:max(room, 0)])
            self._waiting, self._awaiting_tools = delegation_id, True
            return
        self._backend_items.clear()
        text = outcome.text()
        if text:
            if delegation_id is not None:
                self._acks.pop(delegation_id, None)  # the answer itself is on its way
            self._commentary.append(text)
            self._say_next()
        self._next_backend()

    # -- user operations -----------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """End an active session from the server's side (``expired``): ``session.closed``
        and ``EndSession``. Nothing happens in any other state."""
        if self.state is State.ACTIVE:
            self._closed(reason, None)

    def storage_failed(self, reason: str) -> None:
        """A stored session's recording stopped before the session ended (``quota``, or
        ``disk: …``): ``error`` ``session_storage_failed`` to the client and the sidebands.
        The session goes on; what was written before stays (GPT-Live's SDK names the code)."""
        if self.state is State.ACTIVE:
            self._emit(events.error(self._ids("event"), LiveError(
                f"The session's recording stopped ({reason}); the session goes on, "
                "what was recorded before is kept.",
                code="session_storage_failed", type="server_error")))

    def lost(self, reason: str = "connection_lost") -> None:
        """The socket went away (a SIP call: the caller hung up, ``remote_hangup``): the
        session ends with nothing sent to the primary side (there is nowhere to send it);
        an attached sideband gets ``session.closed``."""
        if self.state is State.ACTIVE and self.observed():
            self._pump()
            self._flush()
            self._out(events.session_closed(
                self._ids("event"), reason, self.resource(),
                events.usage(self._seconds(), **self._breakdown())), primary=False)
        self.state = State.CLOSED

    def _closed(self, reason: str, cid: str | None) -> None:
        self._pump()
        self._flush()
        self.state = State.CLOSED
        self._out(events.session_closed(
            self._ids("event"), reason, self.resource(),
            events.usage(self._seconds(), **self._breakdown()), cid))
        self._actions.append(EndSession(reason))

    # -- the agent's output --------------------------------------------------------------------

    def handle_delta(self, response_id: str, delta: Delta) -> bool:
        """The agent's content for a response: audio becomes ``session.output_audio.delta``
        (True: sent); transcripts go through the machine (its response bookkeeping)."""
        if not isinstance(delta, AudioDelta):
            return self.machine.handle_delta(response_id, delta)
        if self.media:  # the track carries it: the machine's WebRTC bookkeeping decides
            if self.state is not State.ACTIVE:
                return False
            self._pump()
            queue = self.machine.handle_delta(response_id, delta)
            if queue:
                if not self._response_audio:
                    self._response_audio = True
                    self.output_ms = max(self.output_ms, float(self.input_ms))
                self._reflect_output(delta.pcm)
            return queue
        r = self.machine.response
        if r is None or r.id != response_id or self.state is not State.ACTIVE:
            return False  # cancelled (barge-in) or over: drop it
        self._pump()  # the sentence's transcript is held before its audio goes
        pcm = self._rest + delta.pcm if self._rest else delta.pcm
        whole = len(pcm) - len(pcm) % self._unit
        self._rest = pcm[whole:]
        if not whole:
            return True
        if not self._response_audio:
            self._response_audio = True
            self.output_ms = max(self.output_ms, float(self.input_ms))
        self._out(events.output_audio_delta(
            base64.b64encode(self._encode(pcm[:whole])).decode("ascii")), observers=False)
        self._reflect_output(pcm[:whole])
        return True

    def _reflect_output(self, pcm: bytes) -> None:
        """The answer's audio (48 kHz) moves the output timeline on; a sideband gets it as
        PCM16 24 kHz with its span."""
        start = self.output_ms
        self.output_ms += len(pcm) / BYTES_PER_MS
        if self.tap is not None:
            self.tap("out", start / 1000, pcm)
        if self.observed():
            self._out(events.output_audio_delta(
                base64.b64encode(pcm48k_to_24k(pcm)).decode("ascii"),
                start_ms=round(start), end_ms=round(self.output_ms)), primary=False)

    def handle_response_end(self, response_id: str, error: str | None = None) -> None:
        self.machine.handle_response_end(response_id, error)

    def handle_output_drained(self, response_id: str) -> None:
        """WebRTC: the response's last audio frame left (the machine's bookkeeping)."""
        self.machine.handle_output_drained(response_id)

    # -- the machine's events, translated ----------------------------------------------------

    def _inner(self, event: dict[str, Any]) -> None:
        """A Realtime client event into the machine (its public input: the same checks)."""
        self.machine.handle_message(json.dumps(event))

    def _pump(self) -> None:
        m = self.machine
        while True:
            moved = False
            while (action := m.poll_action()) is not None:
                self._actions.append(action)
                moved = True
            while (event := m.poll_event()) is not None:
                self._translate(event)
                moved = True
            if not moved:
                return

    def _translate(self, e: dict[str, Any]) -> None:
        kind = e["type"]
        if kind == "input_audio_buffer.speech_started":
            self._turns[e["item_id"]] = [e["audio_start_ms"], None]
            while len(self._turns) > MAX_TURNS:
                self._turns.popitem(last=False)
        elif kind == "input_audio_buffer.speech_stopped":
            span = self._turns.get(e["item_id"])
            if span is not None:
                span[1] = e["audio_end_ms"]
        elif kind == "conversation.item.input_audio_transcription.delta":
            self._heard(e["item_id"], e["delta"])
        elif kind == "conversation.item.input_audio_transcription.completed":
            self._turns.pop(e["item_id"], None)
        elif kind == "conversation.item.input_audio_transcription.failed":
            self._turns.pop(e["item_id"], None)
            self._out(events.info(
                self._ids("event"), "input_transcript_failed",
                f"The user's speech could not be transcribed: {e['error']['message']}"))
        elif kind == "response.created":
            self._response_audio = False
            self._response_said = False
            self._rest = b""
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            self._hold(e["delta"])
        elif kind == "response.function_call_arguments.done" and e["name"] == DELEGATE_TOOL:
            self._delegate(e["item_id"], e["call_id"], e.get("arguments") or "")
        elif kind == "response.done":
            if e["response"]["status"] == "cancelled":  # cut: the rest was never heard
                self.output_ms = min(self.output_ms, float(self.input_ms))
            self._flush()
            self._say_next()
        elif kind == "error":
            err = e["error"]
            self._out(events.error(self._ids("event"), LiveError(
                err["message"], code=err["code"], param=err.get("param"),
                client_event_id=err.get("event_id"), type=err["type"])),
                primary=not self._from_sideband)
        # Items, responses, content parts, VAD events, rate limits: not Live's.

    def _delegate(self, item_id: str, call_id: str, arguments: str) -> None:
        """The agent called its delegate tool: a delegation (its id is the call's item id,
        ``item_…`` as GPT-Live's are) — to the client, or to the Responses backend."""
        if not self._delegating:
            return  # a tool the session never offered: not a delegation
        self._delegations[item_id] = None
        while len(self._delegations) > MAX_DELEGATIONS:
            self._delegations.popitem(last=False)
        backend = self.config["delegation"]["type"] == "responses"
        if backend:
            self._queue_backend(item_id, _task(arguments))
        else:
            self._out(events.delegation_created(self._ids("event"), item_id, self.input_ms))
        self._inner({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call_id,
            "output": (DELEGATED_BACKEND if backend else DELEGATED).format(id=item_id)}})
        delay = self.config["delegation"].get("acknowledgement_delay_ms", 0)
        self._acks[item_id] = self.input_ms + delay
        self._acknowledge()

    def _acknowledge(self) -> None:
        """Speak the acknowledgements that fell due (one for all due at once)."""
        due = [d for d, at in self._acks.items() if at <= self.input_ms]
        if not due:
            return
        for d in due:
            del self._acks[d]
        self._commentary.append(ACKNOWLEDGEMENT)
        self._say_next()

    def _heard(self, item_id: str, text: str) -> None:
        if not text:
            return
        span = self._turns.get(item_id) or [self.input_ms, self.input_ms]
        start = span[0] if span[0] is not None else self.input_ms
        end = span[1] if span[1] is not None else self.input_ms
        if self._heard_item not in (None, item_id) and not text[0].isspace():
            text = " " + text  # a new turn: the client joins the deltas as they come
        self._heard_item = item_id
        self._out(events.input_transcript_delta(self._ids("event"), text, start,
                                                          end))

    def _hold(self, text: str) -> None:
        """A transcript delta waits for the audio after it: its span ends where that audio
        ends, known at the next delta or the response's end."""
        self._flush()
        if not text:
            return
        if self._said and not self._response_said and not text[0].isspace():
            text = " " + text
        self._response_said = True
        start = self.output_ms if self._response_audio else max(self.output_ms,
                                                                float(self.input_ms))
        self._held = (text, round(start))

    def _flush(self) -> None:
        if self._held is None:
            return
        text, start = self._held
        self._held = None
        self._said = True
        end = max(start, round(self.output_ms)) if self._response_audio else start
        self._out(events.output_transcript_delta(self._ids("event"), text, start,
                                                           end))

    def _say_next(self) -> None:
        """Start the next queued commentary once no answer is running."""
        if self.state is not State.ACTIVE:
            return
        if self.gate is not None and not self.gate.awake:
            return  # inference is paused: the commentary waits for the wake
        if self._commentary and self.machine.response is None:
            text = self._commentary.popleft()
            self._inner({"type": "response.create", "response": {"input": [], SAY: text}})

    # -- views -------------------------------------------------------------------------------

    def stored(self) -> dict[str, Any]:
        """What a stored session keeps for its forks: the config as given (its ``input``
        is in the conversation) and the conversation so far, as ``session.input`` items."""
        return {"id": self.id, "session": {k: v for k, v in self.given.items() if k != "input"},
                "conversation": history(self.machine.conversation.public())}

    def resource(self) -> dict[str, Any]:
        return resource(self.config, session_id=self.id, expires_at=self.expires_at)

    def _seconds(self) -> int:
        return int(max(float(self.input_ms), self.output_ms) // 1000)

    def _breakdown(self) -> dict[str, int]:
        """A gated WebRTC session's ``active_seconds`` / ``paused_seconds`` (they add up
        to ``seconds``); nothing for any other."""
        if self.gate is None:
            return {}
        seconds = self._seconds()
        paused = min(seconds, int(self.gate.paused_seconds(self._t())))
        return {"active_seconds": seconds - paused, "paused_seconds": paused}


_HANDLERS: dict[str, str] = {
    "session.start": "_start",
    "session.update": "_update",
    "session.close": "_close_requested",
    "session.input_audio.append": "_append_audio",
    "session.input_audio.mute": "_mute",
    "session.input_audio.unmute": "_unmute",
    "session.instructions.append": "_instructions",
    "session.thinking.append": "_thinking",
    "session.commentary.append": "_commentary_append",
    "transport.dtmf.send": "_dtmf_send",
    "response.item.create": "_response_item_create",
    "response.create": "_response_create",
}


def _task(arguments: str) -> str:
    """The delegate call's ``task`` (the LLM's JSON; anything else is passed as text)."""
    try:
        task = json.loads(arguments).get("task")
    except (ValueError, AttributeError, RecursionError):
        task = None
    text = task if isinstance(task, str) and task.strip() else arguments
    return text[:MAX_TASK] or "(no task given: see the conversation)"
