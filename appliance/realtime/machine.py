"""The Realtime event state machine of one call (sans-IO): client events and audio frames
in, server events and actions out.

Verbs (docs/style.md rule 18 for a *clockless* core: no ``now``, no timer verbs; the user
operations are this protocol's other inputs)::

    handle_open()                       the oai-events channel opened -> session.created
    handle_input(data)                  one client event (untrusted) -> events / actions
                                        (``handle_message`` is the same method)
    handle_frame(pcm, speech)           20 ms of the caller's audio + the VAD flag
    handle_verdict(query_id, p[, text]) Smart Turn's answer to a JudgeTurn, with the pause's
                                        transcript if there is one (may end the turn)
    handle_delta(response_id, delta)    the agent's content -> True if audio is to be queued
    handle_response_end(response_id)    the agent finished (error=... if it failed)
    handle_transcript_delta(item_id, d) part of a user turn's transcript arrived
    handle_transcript(item_id, text)    a user turn's transcript is complete
    handle_transcript_failed(item_id, message)  transcribing it failed
    handle_output_drained(response_id)  the response's last audio frame left
    poll_output()                       drain until None after every handle_*: the
                                        actions first, then each server event wrapped
                                        in a :class:`ServerEvent`
    poll_action() / poll_event()        the same stream split in two (the shells, which
                                        drain the actions and then the events, use these)
    poll_bound()                        the turn engine's turn bounds (:class:`TurnBound`),
                                        a side stream for the shells' turn waterfall

Actions tell the shell what only it can do: :class:`StartResponse` (run the agent),
:class:`CancelResponse` (cancel that run), :class:`ClearAudio` (``ctx.interrupt()``: drop
the queued audio *now*), :class:`Transcribe`, and the turn engine's pause work
(:class:`JudgeTurn`, :class:`SpeculateTurn`: appliance/realtime/turns.py). Turns come from
the shared turn engine (appliance/speech/vad.py's ``TurnDetector``, fed the frames' VAD
flag; the machine's media position is its clock). How much was heard comes from the injected
``queued_seconds`` (the transceiver's output queue): *played = queued into it − still in it*.

A response's life (GA order, as OpenAI sends it)::

    response.created, rate_limits.updated, response.output_item.added,
    conversation.item.added, response.content_part.added,
    [output_audio_buffer.started at the first audio], ...audio_transcript.delta | text.delta,
    [response.output_audio.done], ...transcript.done | text.done, response.content_part.done,
    response.output_item.done, conversation.item.done, response.done,
    [output_audio_buffer.stopped once played, or .cleared on barge-in / clear]

Barge-in: speech while a response's audio plays (``interrupt_response``) or a client's
``output_audio_buffer.clear`` drops the queued audio at once, truncates the item at what
was played (``conversation.item.truncated``) and — for a running response cut by speech —
cancels it (``response.done`` with ``status: cancelled``, reason ``turn_detected``).
"""

from __future__ import annotations

import base64
import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..speech.vad import (
    EndOfTurnQuery,
    SpeechAudio,
    SpeechStarted,
    SpeechStopped,
    TurnConfig,
    TurnDetector,
)
from . import session as sessions
from .audio import RATE, from_48k, pcm48k_to_24k, seconds, to_48k
from .conversation import Conversation, Item, item_from_client_untrusted, truncate
from .interface import AudioDelta, Delta, FunctionCall, ResponseRequest, UserTurn
from .protocol import (
    MAX_EVENT_BYTES,
    ClientEvent,
    EventError,
    b64decode_untrusted,
    check,
    json_copy,
    parse_client_event_untrusted,
)

FRAME_MS = 20
FRAME_BYTES = RATE * FRAME_MS // 1000 * 2  # one 20 ms frame of 48 kHz PCM16
#: Frame.speech stays up this long after the voice stops (EnergyVad's hangover): the
#: end-of-turn silence is counted from its fall, so this much is already behind us.
VAD_HANGOVER_MS = 200
MAX_BUFFER_SECONDS = 30.0  # the input audio buffer keeps its newest 30 s
MIN_COMMIT_MS = 100  # OpenAI refuses to commit less
HELD_BEFORE_OPEN = 256  # server events kept for a channel that is not open yet


@dataclass(frozen=True, slots=True)
class StartResponse:
    request: ResponseRequest


@dataclass(frozen=True, slots=True)
class CancelResponse:
    response_id: str


@dataclass(frozen=True, slots=True)
class ClearAudio:
    """Drop every queued output sample now (``AgentContext.interrupt``)."""


@dataclass(frozen=True, slots=True)
class Transcribe:
    """Transcribe a committed user audio item (``audio.input.transcription`` is set):
    ``config`` is that object (``model``, ``language``, ``prompt``); the shell answers with
    ``handle_transcript_delta`` / ``handle_transcript`` / ``handle_transcript_failed``."""

    item_id: str
    turn: UserTurn
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JudgeTurn:
    """Semantic end of turn: the caller paused; is the turn complete? The shell runs the
    model on ``audio16k`` (the turn so far, 16 kHz PCM16, last 8 s) off the loop and answers
    with ``handle_verdict(query_id, p)`` (appliance/realtime/turns.py)."""

    query_id: int
    audio16k: bytes = field(repr=False)
    #: The :class:`SpeculateTurn` of the same pause (its item and pause), when the agent
    #: transcribes at pauses: the shell hands that transcript over with the verdict, so the
    #: words can veto a "complete" they contradict (the ctx loop's way, listen.py).
    item_id: str | None = None
    pause: int | None = None


@dataclass(frozen=True, slots=True)
class SpeculateTurn:
    """The caller paused inside a turn: the audio so far (48 kHz PCM16, the item it will
    become), for an agent that starts work there (its ``speculate`` hook). If the turn ends
    in this pause the committed item's :class:`UserTurn` carries ``pause`` (the caller said
    nothing after it); else the agent's work there is wasted."""

    item_id: str
    pause: int
    audio: bytes = field(repr=False)


@dataclass(frozen=True, slots=True)
class TurnBound:
    """The turn engine opened (``ended`` False) or ended a user turn that will be the item
    ``item_id``: for the shell's turn waterfall (appliance/realtime/waterfall.py), which
    stamps the time it drained this (the machine has no clock). ``speech_end_ms``: where
    the caller's speech ended, as a session media position (:attr:`RealtimeConnection.
    audio_ms`; the end of turn's silence and the VAD's hangover not included)."""

    item_id: str
    ended: bool
    speech_end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SessionUpdated:
    """The session changed (the shell calls the agent's ``session_updated`` hook)."""


_SESSION_UPDATED = SessionUpdated()
Action = (StartResponse | CancelResponse | ClearAudio | Transcribe | JudgeTurn | SpeculateTurn
          | SessionUpdated)


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """``poll_output()``: one server event for the oai-events channel, the JSON object as
    ``poll_event()`` returns it (the wrapper is frozen; the event is the shell's to send)."""

    event: dict[str, Any]


Output = Action | ServerEvent


@dataclass(slots=True)
class _Response:
    id: str
    obj: dict[str, Any]  # the GA realtime.response
    item: Item
    modality: str  # "audio" | "text"
    in_conversation: bool
    turn: UserTurn | None
    text: list[str] = field(default_factory=list)
    audio_sent: int = 0  # bytes of PCM queued for playback
    chunks: list[bytes] = field(default_factory=list)  # audio not yet joined into the item
    calls: list[Item] = field(default_factory=list)  # function_call items (output 1, 2, …)
    audible: bool = False  # between output_audio_buffer.started and stopped/cleared
    truncated: bool = False  # cut: later audio is dropped
    done: bool = False


class _Buffer:
    """The input audio buffer: chunks with a byte count, the oldest dropped past ``limit``
    (a push-to-talk caller who never commits must not grow the call, and dropping the
    front of one bytearray per frame would copy the whole buffer every 20 ms)."""

    __slots__ = ("chunks", "size", "limit")

    def __init__(self, limit: int) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.limit = limit

    def __len__(self) -> int:
        return self.size

    def append(self, pcm: bytes) -> None:
        self.chunks.append(pcm)
        self.size += len(pcm)
        while self.size > self.limit:
            excess = self.size - self.limit
            head = self.chunks[0]
            if len(head) <= excess:
                self.chunks.popleft()
                self.size -= len(head)
            else:
                self.chunks[0] = head[excess:]
                self.size -= excess

    def clear(self) -> None:
        self.chunks.clear()
        self.size = 0

    def take(self) -> bytes:
        out = self.peek()
        self.clear()
        return out

    def peek(self) -> bytes:
        out = b"".join(self.chunks)
        self.chunks.clear()
        if out:
            self.chunks.append(out)  # joined once: the next peek copies one chunk
        return out


def _tokens_text(text: str) -> int:
    return math.ceil(len(text) / 4)


def _tokens_audio(nbytes: int) -> int:
    return math.ceil(seconds(nbytes) * 10)  # an estimate (~10 tokens a second), not billing


class RealtimeConnection:
    """One call's Realtime protocol state. ``ids`` makes unique ids (``ids("event")``)."""

    def __init__(
        self,
        *,
        session_id: str,
        ids: Callable[[str], str],
        queued_seconds: Callable[[], float] = lambda: 0.0,
        session: dict[str, Any] | None = None,
        can_transcribe: bool = False,
        vad: Callable[[bytes], bool] | None = None,
        judge: bool = False,
        speculate: bool = False,
    ) -> None:
        """``vad`` set means a WebSocket session (no media track): appended audio is the
        caller's audio, cut into 20 ms frames and run through ``vad`` for server turn
        detection; the answer's audio goes out as ``response.output_audio.delta`` events
        (in the session's output format) and no ``output_audio_buffer.*`` event is sent, as
        OpenAI does on a WebSocket.

        ``judge``: the shell answers :class:`JudgeTurn` (Smart Turn is installed), so
        ``semantic_vad`` is the semantic end of turn; without it ``semantic_vad`` ends a
        turn after its eagerness's silence. ``speculate``: the shell's agent takes
        :class:`SpeculateTurn` (work at each pause)."""
        self._ids = ids
        self._vad = vad
        self.websocket = vad is not None
        self._partial = b""  # appended audio short of a whole frame (WebSocket)
        self._queued = queued_seconds
        self.session = sessions.default_session(session_id)
        self._initial_error: EventError | None = None
        if session:
            try:
                self.session = sessions.apply_update_untrusted(self.session, session)
            except EventError as exc:  # reported once the channel is open
                self._initial_error = exc
        self.conversation = Conversation()
        self.conversation_id = ids("conv")
        self._can_transcribe = can_transcribe
        self._judge = judge
        self._speculate = speculate
        self._events: deque[dict[str, Any]] = deque()
        self._actions: deque[Action] = deque()
        self.opened = False
        # input side: the shared turn engine (appliance/speech/vad.py) on the frames' flags,
        # rebuilt between turns when turn_detection changes
        self._buffer = _Buffer(int(MAX_BUFFER_SECONDS * RATE) * 2)
        self._detector: TurnDetector | None = None
        self._detector_for: str | None = None  # the turn_detection it was built from
        self._detector_origin_ms = 0  # session audio before the detector's first frame
        self._asked: dict[int, int] = {}  # JudgeTurn.query_id -> the detector's query
        self._query_ids = 0
        self._settled: dict[str, int] = {}  # item -> the pause its turn ended in (last 8)
        self._audio_ms = 0  # all audio the buffer has been fed, as OpenAI counts it
        # The turn engine's turn bounds for the shell's waterfall (poll_bound): a shell that
        # does not read them loses only the oldest.
        self._bounds: deque[TurnBound] = deque(maxlen=16)
        self._pending_item: str | None = None
        # output side
        self.response: _Response | None = None  # generating
        self.playing: _Response | None = None  # its audio in the output queue
        self._last_response: str | None = None

    # -- poll ------------------------------------------------------------------------------

    def poll_event(self) -> dict[str, Any] | None:
        """The next server event. None until the channel is open: what happened before it
        (the caller speaking while DCEP was still opening the channel) is held, at most
        :data:`HELD_BEFORE_OPEN` events, and follows ``session.created``."""
        if not self.opened:
            while len(self._events) > HELD_BEFORE_OPEN:
                self._events.popleft()  # an audio-only caller: the oldest go
            return None
        return self._events.popleft() if self._events else None

    def poll_action(self) -> Action | None:
        return self._actions.popleft() if self._actions else None

    def poll_bound(self) -> TurnBound | None:
        """The next :class:`TurnBound` (a side stream beside the events: a protocol over
        this machine, GPT-Live's, translates the events; the turns are the machine's)."""
        return self._bounds.popleft() if self._bounds else None

    @property
    def audio_ms(self) -> int:
        """The caller's audio fed so far (ms of session media time)."""
        return self._audio_ms

    def poll_output(self) -> Output | None:
        """The next action, else the next server event (as :class:`ServerEvent`, and held
        like :meth:`poll_event` until the channel is open); None when there is neither."""
        if self._actions:
            return self._actions.popleft()
        event = self.poll_event()
        return None if event is None else ServerEvent(event)

    def _emit(self, kind: str, **fields: Any) -> None:
        self._events.append({"type": kind, "event_id": self._ids("event"), **fields})

    def _error(self, exc: EventError) -> None:
        self._events.append(exc.to_event(self._ids("event")))

    # -- the channel -------------------------------------------------------------------------

    def handle_open(self) -> None:
        if self.opened:
            return
        self.opened = True
        held = list(self._events)
        self._events.clear()
        self._emit("session.created", session=json_copy(self.session))
        if self._initial_error is not None:
            self._error(self._initial_error)
        self._events.extend(held)

    def handle_message(self, data: str | bytes) -> None:
        """One client event; never raises for any input (errors become ``error`` events)."""
        try:
            event = parse_client_event_untrusted(data)
            self._dispatch(event)
        except EventError as exc:
            self._error(exc)

    handle_input = handle_message  # the rule-18 name of the network input

    def _dispatch(self, ev: ClientEvent) -> None:
        d, eid = ev.data, ev.event_id
        if ev.type == "session.update":
            self.session = sessions.apply_update_untrusted(self.session, d["session"], eid)
            self._emit("session.updated", session=json_copy(self.session))
            self._actions.append(_SESSION_UPDATED)
            if sessions.turn_detection(self.session) is None:
                self._detector = None  # VAD turned off (mid-turn: the buffer stays)
        elif ev.type == "input_audio_buffer.append":
            raw = b64decode_untrusted(d["audio"], param="audio", event_id=eid)
            self._appended(to_48k(raw, sessions.input_format(self.session)))
        elif ev.type == "input_audio_buffer.commit":
            if self._partial:
                self._append(self._partial)
                self._partial = b""
            if seconds(len(self._buffer)) * 1000 < MIN_COMMIT_MS:
                raise EventError(
                    "Error committing input audio buffer: buffer too small. Expected at least "
                    f"{MIN_COMMIT_MS}ms of audio, but buffer only has "
                    f"{seconds(len(self._buffer)) * 1000:.2f}ms of audio.",
                    code="input_audio_buffer_commit_empty", event_id=eid)
            self._end_turn()
            self._commit()
        elif ev.type == "input_audio_buffer.clear":
            self._buffer.clear()
            self._partial = b""
            self._end_turn()
            self._pending_item = None
            self._emit("input_audio_buffer.cleared")
        elif ev.type == "conversation.item.create":
            item = item_from_client_untrusted(d["item"], self._ids("item"),
                                              sessions.input_format(self.session), eid)
            prev = self.conversation.add(item, d.get("previous_item_id"), eid)
            self._item_events(item, prev)
        elif ev.type == "conversation.item.retrieve":
            self._materialize(self.response)
            self._retrieve(self.conversation.get(d["item_id"], eid), eid)
        elif ev.type == "conversation.item.truncate":
            self._materialize(self.response)
            item = self.conversation.get(d["item_id"], eid)
            playing = self.playing is not None and self.playing.item is item
            if playing:  # what the caller hears must match the item: stop it too
                self._clear_output(truncate_item=False)
            truncate(item, d["content_index"], d["audio_end_ms"], eid)
            self.conversation.set_audio(item, item.audio)
            self._emit("conversation.item.truncated", item_id=item.id,
                       content_index=d["content_index"], audio_end_ms=d["audio_end_ms"])
        elif ev.type == "conversation.item.delete":
            self.conversation.delete(d["item_id"], eid)
            self._emit("conversation.item.deleted", item_id=d["item_id"])
        elif ev.type == "response.create":
            self._create_response(d.get("response") or {}, eid)
        elif ev.type == "response.cancel":
            r = self.response
            wanted = d.get("response_id")
            if r is None or (wanted is not None and wanted != r.id):
                raise EventError("Cancellation failed: no active response found",
                                 code="response_cancel_not_active", event_id=eid)
            self._cancel(r, "client_cancelled")
        elif ev.type == "output_audio_buffer.clear":
            self._clear_output(truncate_item=True, fallback=True)

    # -- input audio and turns -----------------------------------------------------------------

    def _append(self, pcm: bytes) -> None:
        self._buffer.append(pcm)

    def _appended(self, pcm: bytes) -> None:
        """``input_audio_buffer.append``: on WebRTC (the track carries the caller) straight
        into the buffer; on a WebSocket it *is* the caller's audio: 20 ms frames through the
        VAD, as the track's frames go (push-to-talk: into the buffer, counted)."""
        if self._vad is None:
            self._append(pcm)
            return
        data = self._partial + pcm if self._partial else pcm
        whole = len(data) - len(data) % FRAME_BYTES
        self._partial = data[whole:]
        for i in range(0, whole, FRAME_BYTES):
            frame = data[i : i + FRAME_BYTES]
            self.handle_frame(frame, self._vad(frame))

    def handle_dtmf(self, digit: str, received_at: int) -> None:
        """A keypad press on a phone call (RFC 4733 or SIP INFO, from the transceiver's
        ``dtmf`` agent event): OpenAI's SIP-only ``input_audio_buffer.dtmf_event_received``
        (``event`` = the key, ``received_at`` = Unix seconds)."""
        self._emit("input_audio_buffer.dtmf_event_received", event=digit,
                   received_at=received_at)

    @property
    def in_speech(self) -> bool:
        """A VAD turn is open."""
        return self._detector is not None and self._detector.in_turn

    def handle_frame(self, pcm: bytes, speech: bool) -> None:
        """20 ms of the caller's audio (48 kHz PCM16) and its VAD flag (``Frame.speech``)."""
        self._audio_ms += FRAME_MS
        td = sessions.turn_detection(self.session)
        if td is None:  # push-to-talk: everything goes into the buffer, the client commits
            self._append(pcm)
            return
        key = json.dumps(td, sort_keys=True)
        if key != self._detector_for and not self.in_speech:
            self._detector = TurnDetector(self._turn_config(td))
            self._detector_for = key
            self._detector_origin_ms = self._audio_ms - FRAME_MS
            self._asked.clear()
        assert self._detector is not None
        self._detector.handle_frame(self._audio_ms / 1000, pcm, speech)
        self._turn_events(td)

    def _turn_config(self, td: dict[str, Any]) -> TurnConfig:
        """The turn engine's config for a ``turn_detection``: the frames' flag as the VAD
        (its 200 ms hangover is silence already counted), a turn opened by one speech
        frame (the energy VAD has its own onset rule)."""
        common: dict[str, Any] = {
            "prefix_padding_ms": int(td.get("prefix_padding_ms", 300)), "vad": "flag",
            "min_speech_ms": FRAME_MS, "release_ms": VAD_HANGOVER_MS,
            "speculate": self._speculate}
        if td["type"] == "semantic_vad" and self._judge:
            return TurnConfig.semantic_vad(td.get("eagerness", "auto"), **common)
        return TurnConfig(silence_duration_ms=sessions.end_of_turn_silence_ms(td), **common)

    def handle_verdict(self, query_id: int, probability: float,
                       transcript: str | None = None) -> None:
        """The model's P(complete) for :class:`JudgeTurn` ``query_id``, with the pause's
        speculative transcript when the agent made one (None: the model decides alone): may
        end the turn (a verdict for a pause the caller already ended by speaking is
        ignored; words that read as cut short veto a "complete": the turn engine's
        ``unfinished``)."""
        asked = self._asked.pop(query_id, None)
        td = sessions.turn_detection(self.session)
        if asked is None or self._detector is None or td is None:
            return  # stale: another detector (turn_detection changed) or VAD off
        self._detector.handle_verdict(self._audio_ms / 1000, asked, probability, transcript)
        self._turn_events(td)

    def _turn_events(self, td: dict[str, Any]) -> None:
        det = self._detector
        assert det is not None
        while (ev := det.poll_output()) is not None:
            if isinstance(ev, SpeechAudio):
                self._append(ev.pcm)
            elif isinstance(ev, SpeechStarted):
                # The buffer keeps what input_audio_buffer.append put there; the turn
                # follows it.
                self._pending_item = self._ids("item")
                self._emit("input_audio_buffer.speech_started",
                           audio_start_ms=self._detector_origin_ms + ev.audio_start_ms,
                           item_id=self._pending_item)
                self._bounds.append(TurnBound(self._pending_item, False))
                if td.get("interrupt_response", True):
                    self._barge_in()
            elif isinstance(ev, EndOfTurnQuery):
                # A second question about a pause (``again``) has the first one's words:
                # no new transcript (its pause id would not be the one the turn ends in).
                speculate = self._speculate and self._pending_item is not None and not ev.again
                if self._judge and ev.audio16k:
                    self._query_ids += 1
                    self._asked[self._query_ids] = ev.query_id
                    self._actions.append(JudgeTurn(
                        self._query_ids, ev.audio16k,
                        self._pending_item if speculate else None,
                        ev.query_id if speculate else None))
                if speculate:
                    assert self._pending_item is not None
                    self._actions.append(SpeculateTurn(self._pending_item, ev.query_id,
                                                       self._buffer.peek()))
            elif isinstance(ev, SpeechStopped):
                self._asked.clear()
                item_id = self._pending_item or self._ids("item")
                self._pending_item = item_id
                if ev.pause is not None:
                    self._settled[item_id] = ev.pause
                    while len(self._settled) > 8:
                        del self._settled[next(iter(self._settled))]
                self._emit("input_audio_buffer.speech_stopped", audio_end_ms=self._audio_ms,
                           item_id=item_id)
                self._bounds.append(TurnBound(item_id, True,
                                              self._detector_origin_ms + ev.audio_end_ms))
                self._commit()
                if td.get("create_response", True) and self.response is None:
                    self._create_response({}, None)

    def _end_turn(self) -> None:
        """The client committed or cleared the buffer: any VAD turn is over (the next
        speech opens a new one, on a fresh detector)."""
        self._detector = None
        self._detector_for = None
        self._asked.clear()

    def _commit(self) -> None:
        item_id = self._pending_item or self._ids("item")
        self._pending_item = None
        audio = self._buffer.take()
        item = Item({"id": item_id, "object": "realtime.item", "type": "message",
                     "status": "completed", "role": "user",
                     "content": [{"type": "input_audio", "transcript": None}]}, audio, 0)
        prev = self.conversation.add(item)
        self._emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=prev)
        self._item_events(item, prev)
        transcription = self.session.get("audio", {}).get("input", {}).get("transcription")
        if transcription and self._can_transcribe:
            self._actions.append(Transcribe(
                item_id, UserTurn(item_id, audio, pause=self._settled.get(item_id)),
                json_copy(transcription)))

    def _audio_item(self, item_id: str) -> Item | None:
        item = self.conversation.items.get(item_id)
        if item is None or item.audio_part is None:
            return None  # deleted meanwhile (OpenAI then sends nothing for it either)
        return item

    def handle_transcript_delta(self, item_id: str, delta: str) -> None:
        """Part of a user audio item's transcript (appended to what came before)."""
        item = self._audio_item(item_id)
        if item is None or not delta:
            return
        self._emit("conversation.item.input_audio_transcription.delta", item_id=item_id,
                   content_index=item.audio_part, delta=delta)

    def handle_transcript(self, item_id: str, text: str) -> None:
        item = self._audio_item(item_id)
        if item is None or item.audio_part is None:
            return
        item.data["content"][item.audio_part]["transcript"] = text
        self._emit("conversation.item.input_audio_transcription.completed", item_id=item_id,
                   content_index=item.audio_part, transcript=text,
                   usage={"type": "duration", "seconds": round(seconds(item.audio), 3)})

    def handle_transcript_failed(self, item_id: str, message: str,
                                 code: str = "transcription_failed") -> None:
        item = self._audio_item(item_id)
        if item is None:
            return
        self._emit("conversation.item.input_audio_transcription.failed", item_id=item_id,
                   content_index=item.audio_part, error={
                       "type": "transcription_error", "code": code,
                       "message": message[:500], "param": None})

    def _item_events(self, item: Item, prev: str | None) -> None:
        self._emit("conversation.item.added", previous_item_id=prev,
                   item=json_copy(item.data))
        self._emit("conversation.item.done", previous_item_id=prev,
                   item=json_copy(item.data))

    def _retrieve(self, item: Item, eid: str | None) -> None:
        data = json_copy(item.data)
        if item.audio and item.audio_part is not None:
            b64 = base64.b64encode(pcm48k_to_24k(item.audio)).decode()
            if len(b64) > MAX_EVENT_BYTES - 4096:  # one channel message must hold it
                raise EventError("The item's audio is too large for one data-channel message "
                                 f"({seconds(item.audio):.1f} s).", code="item_too_large",
                                 param="item_id", event_id=eid)
            data["content"][item.audio_part]["audio"] = b64
        self._emit("conversation.item.retrieved", item=data)

    # -- responses ---------------------------------------------------------------------------

    def _create_response(self, params: dict[str, Any], eid: str | None) -> None:
        if self.response is not None:
            raise EventError(f"Conversation already has an active response in progress: "
                             f"{self.response.id}. Wait until the response is finished before "
                             "creating a new one.",
                             code="conversation_already_has_active_response", event_id=eid)
        s = self.session
        instructions = check(params.get("instructions", s.get("instructions") or ""), str,
                             param="response.instructions", event_id=eid)
        mods = params.get("output_modalities")
        modalities = (sessions._modalities(mods, "response.output_modalities", eid)
                      if mods is not None else list(s.get("output_modalities") or ["audio"]))
        conv = params.get("conversation", "auto")
        if conv not in ("auto", "none"):
            raise EventError("Invalid value for 'response.conversation': expected 'auto' or "
                             "'none'.", param="response.conversation", event_id=eid)
        out_cfg = s.get("audio", {}).get("output", {})
        audio_params = params.get("audio")
        voice = out_cfg.get("voice")
        if isinstance(audio_params, dict) and isinstance(audio_params.get("output"), dict):
            voice = audio_params["output"].get("voice", voice)
        metadata = params.get("metadata")
        if metadata is not None:
            check(metadata, dict, param="response.metadata", event_id=eid)
        max_tokens = (sessions._max_tokens(params["max_output_tokens"],
                                           "response.max_output_tokens", eid)
                      if params.get("max_output_tokens") is not None
                      else s.get("max_output_tokens", "inf"))
        if voice is not None and not isinstance(voice, str | dict):
            raise EventError("Invalid type for 'response.audio.output.voice': expected a "
                             "string.", code="invalid_type",
                             param="response.audio.output.voice", event_id=eid)
        turn = self._turn(params, eid)
        rid = self._ids("resp")
        item = Item({"id": self._ids("item"), "object": "realtime.item", "type": "message",
                     "status": "in_progress", "role": "assistant", "content": []})
        modality = modalities[0]
        obj = {"object": "realtime.response", "id": rid, "status": "in_progress",
               "status_details": None, "output": [],
               "conversation_id": self.conversation_id if conv == "auto" else None,
               "output_modalities": modalities,
               "max_output_tokens": max_tokens,
               # agents-js parses response voices as strings: a custom voice shows its id.
               "audio": {"output": {"format": json_copy(out_cfg.get("format")),
                                    "voice": voice.get("id") if isinstance(voice, dict)
                                    else voice}},
               "usage": None, "metadata": json_copy(metadata)}
        r = _Response(rid, obj, item, modality, conv == "auto", turn)
        self.response = r
        self._last_response = rid
        self._emit("response.created", response=json_copy(obj))
        self._emit("rate_limits.updated", rate_limits=[
            {"name": "requests", "limit": 10_000, "remaining": 9_999, "reset_seconds": 0.006},
            {"name": "tokens", "limit": 1_000_000, "remaining": 1_000_000, "reset_seconds": 0.0}])
        self._emit("response.output_item.added", response_id=rid, output_index=0,
                   item=json_copy(item.data))
        if r.in_conversation:
            prev = self.conversation.add(item)
            self._emit("conversation.item.added", previous_item_id=prev,
                       item=json_copy(item.data))
        part = {"type": "audio", "transcript": ""} if modality == "audio" else {
            "type": "text", "text": ""}
        item.data["content"].append(
            {"type": "output_audio", "transcript": None} if modality == "audio" else
            {"type": "output_text", "text": ""})
        item.audio_part = 0 if modality == "audio" else None
        self._emit("response.content_part.added", response_id=rid, item_id=item.id,
                   output_index=0, content_index=0, part=part)
        known = {"instructions", "output_modalities", "conversation", "audio", "metadata",
                 "input", "max_output_tokens"}
        self._actions.append(StartResponse(ResponseRequest(
            response_id=rid, session=json_copy(s), instructions=instructions,
            output_modalities=tuple(modalities), voice=json_copy(voice), turn=turn,
            conversation=self.conversation.public(), metadata=json_copy(metadata),
            extra={k: json_copy(v) for k, v in params.items() if k not in known})))

    def _turn(self, params: dict[str, Any], eid: str | None) -> UserTurn | None:
        """The user item the response answers: the last in ``input`` or the conversation."""
        source = self.conversation.last_user()
        if "input" in params:
            inputs = check(params["input"], list, param="response.input", event_id=eid)
            source = None
            for i, raw in enumerate(inputs):
                check(raw, dict, param=f"response.input[{i}]", event_id=eid)
                if raw.get("type") == "item_reference":
                    ref = check(raw.get("id"), str, param=f"response.input[{i}].id",
                                event_id=eid)
                    candidate = self.conversation.get(ref, eid)
                else:
                    candidate = item_from_client_untrusted(
                        raw, self._ids("item"), sessions.input_format(self.session), eid)
                if candidate.data.get("role") == "user":
                    source = candidate
        if source is None:
            return None
        return UserTurn(source.id, source.audio, source.text(), self._settled.get(source.id))

    def handle_delta(self, response_id: str, delta: Delta) -> bool:
        """The agent's content for a response. For audio: True if the shell is to queue it
        (False once the response is cancelled or cut: drop it)."""
        r = self.response
        if r is None or r.id != response_id or r.done:
            return False
        if isinstance(delta, FunctionCall):
            self._function_call(r, delta)
            return False
        if isinstance(delta, AudioDelta):
            if r.modality != "audio" or r.truncated or not delta.pcm:
                return False
            if self.websocket:  # no track: the audio is the event (OpenAI's WebSocket)
                r.audio_sent += len(delta.pcm)
                if r.audio_sent <= 2 * RATE * 60:
                    r.chunks.append(delta.pcm)
                fmt = self.session.get("audio", {}).get("output", {}).get("format", {})
                out = from_48k(delta.pcm, fmt.get("type", "audio/pcm"))
                self._emit("response.output_audio.delta", response_id=r.id, item_id=r.item.id,
                           output_index=0, content_index=0,
                           delta=base64.b64encode(out).decode("ascii"))
                return False
            if self.playing is not None and self.playing is not r:
                self._stopped(self.playing)  # the earlier answer's tail is queued ahead
            if not r.audible:
                r.audible = True
                self.playing = r
                self._emit("output_audio_buffer.started", response_id=r.id)
            r.audio_sent += len(delta.pcm)
            if r.audio_sent <= 2 * RATE * 60:  # the item keeps the first minute
                r.chunks.append(delta.pcm)  # joined once, not per delta (quadratic)
            return True
        if not delta.text or r.truncated:
            return False
        r.text.append(delta.text)
        # One output modality: in audio mode every text is the transcript, in text mode text.
        kind = ("response.output_audio_transcript.delta" if r.modality == "audio"
                else "response.output_text.delta")
        self._emit(kind, response_id=r.id, item_id=r.item.id, output_index=0,
                   content_index=0, delta=delta.text)
        return False

    def _function_call(self, r: _Response, call: FunctionCall) -> None:
        """A ``function_call`` output item, whole (GA order: output_item.added, item added,
        arguments delta and done, output_item.done, item done)."""
        if r.truncated:
            return
        index = 1 + len(r.calls)
        call_id = call.call_id or self._ids("call")
        item = Item({"id": self._ids("item"), "object": "realtime.item",
                     "type": "function_call", "status": "in_progress", "name": call.name,
                     "call_id": call_id, "arguments": ""})
        r.calls.append(item)
        self._emit("response.output_item.added", response_id=r.id, output_index=index,
                   item=json_copy(item.data))
        prev = None
        if r.in_conversation:
            prev = self.conversation.add(item)
            self._emit("conversation.item.added", previous_item_id=prev,
                       item=json_copy(item.data))
        base = {"response_id": r.id, "item_id": item.id, "output_index": index,
                "call_id": call_id}
        self._emit("response.function_call_arguments.delta", **base, delta=call.arguments)
        self._emit("response.function_call_arguments.done", **base, name=call.name,
                   arguments=call.arguments)
        item.data.update(status="completed", arguments=call.arguments)
        self._emit("response.output_item.done", response_id=r.id, output_index=index,
                   item=json_copy(item.data))
        if r.in_conversation:
            self._emit("conversation.item.done", previous_item_id=prev,
                       item=json_copy(item.data))

    def handle_response_end(self, response_id: str, error: str | None = None) -> None:
        r = self.response
        if r is None or r.id != response_id:
            return  # cancelled already
        if error is None:
            self._finish(r, "completed", None)
        else:
            self._finish(r, "failed", {"type": "failed", "error": {"type": "server_error",
                                                                     "code": error}})

    def _materialize(self, r: _Response | None) -> None:
        if r is not None and r.chunks:
            self.conversation.set_audio(r.item, r.item.audio + b"".join(r.chunks))
            r.chunks.clear()

    def _finish(self, r: _Response, status: str, details: dict[str, Any] | None) -> None:
        self._materialize(r)
        r.done = True
        self.response = None
        text = "".join(r.text)
        content = r.item.data["content"][0]
        base = {"response_id": r.id, "item_id": r.item.id, "output_index": 0,
                "content_index": 0}
        if r.modality == "audio":
            self._emit("response.output_audio.done", **base)
            heard = None if r.truncated else text
            self._emit("response.output_audio_transcript.done", **base, transcript=text)
            content["transcript"] = heard
            part = {"type": "audio", "transcript": text}
        else:
            self._emit("response.output_text.done", **base, text=text)
            content["text"] = text
            part = {"type": "text", "text": text}
        self._emit("response.content_part.done", **base, part=part)
        r.item.data["status"] = "completed" if status == "completed" else "incomplete"
        item = json_copy(r.item.data)
        self._emit("response.output_item.done", response_id=r.id, output_index=0, item=item)
        if r.in_conversation and r.item.id in self.conversation.items:
            self._emit("conversation.item.done", previous_item_id=self._prev_of(r.item.id),
                       item=json_copy(item))
        turn = r.turn
        instr = _tokens_text(self.session.get("instructions") or "")
        in_text = instr + (_tokens_text(turn.text) if turn and turn.text else 0)
        in_audio = _tokens_audio(len(turn.audio)) if turn else 0
        out_text, out_audio = _tokens_text(text), _tokens_audio(r.audio_sent)
        output = [item, *(json_copy(c.data) for c in r.calls)]
        r.obj.update(status=status, status_details=details, output=output, usage={
            "total_tokens": in_text + in_audio + out_text + out_audio,
            "input_tokens": in_text + in_audio, "output_tokens": out_text + out_audio,
            "input_token_details": {"text_tokens": in_text, "audio_tokens": in_audio,
                                    "image_tokens": 0, "cached_tokens": 0,
                                    "cached_tokens_details": {"text_tokens": 0,
                                                              "audio_tokens": 0,
                                                              "image_tokens": 0}},
            "output_token_details": {"text_tokens": out_text, "audio_tokens": out_audio}})
        self._emit("response.done", response=json_copy(r.obj))

    def _prev_of(self, item_id: str) -> str | None:
        prev = None
        for key in self.conversation.items:
            if key == item_id:
                return prev
            prev = key
        return None

    def _cancel(self, r: _Response, reason: str) -> None:
        self._actions.append(CancelResponse(r.id))
        self._finish(r, "cancelled", {"type": "cancelled", "reason": reason})

    # -- output audio ------------------------------------------------------------------------

    def handle_output_drained(self, response_id: str) -> None:
        p = self.playing
        if p is not None and p.id == response_id and p.done:
            self._stopped(p)

    def _stopped(self, p: _Response) -> None:
        p.audible = False
        self.playing = None
        self._emit("output_audio_buffer.stopped", response_id=p.id)

    def _barge_in(self) -> None:
        """The caller started speaking: cut what we are saying (OpenAI's interrupt_response)."""
        if self.response is not None:
            self._cancel(self.response, "turn_detected")
        if self.playing is not None:
            self._clear_output(truncate_item=True)

    def _clear_output(self, *, truncate_item: bool, fallback: bool = False) -> None:
        p = self.playing
        self._materialize(p)
        self._actions.append(ClearAudio())
        if p is None:
            if fallback and self._last_response is not None:
                self._emit("output_audio_buffer.cleared", response_id=self._last_response)
            return
        played = max(0, p.audio_sent - 2 * round(self._queued() * RATE))
        p.audible = False
        p.truncated = True
        self.playing = None
        self._emit("output_audio_buffer.cleared", response_id=p.id)
        if truncate_item and p.item.id in self.conversation.items:
            end_ms = min(played, len(p.item.audio)) * 1000 // (2 * RATE)
            truncate(p.item, 0, end_ms)
            self.conversation.set_audio(p.item, p.item.audio)
            self._emit("conversation.item.truncated", item_id=p.item.id, content_index=0,
                       audio_end_ms=end_ms)

