"""The in-process realtime agent interface: what answers behind the Realtime event protocol.

The appliance owns the protocol — items, responses, turn detection, truncation, barge-in —
and asks a :class:`RealtimeAgent` only for *content*::

    from appliance.realtime.interface import AudioDelta, ResponseRequest, TranscriptDelta

    class Shout:
        async def respond(self, request: ResponseRequest):
            turn = request.turn
            if turn is not None and turn.text is not None:
                yield TranscriptDelta(turn.text.upper())   # a text turn: text back
            elif turn is not None:
                yield TranscriptDelta(f"({turn.seconds:.1f} s)")
                yield AudioDelta(turn.audio)               # an audio turn: audio back

Run it with ``appliance up --agent realtime:path/to/file.py:Shout`` (a class: one instance
per call; a plain ``async def respond(request)`` generator function works too).

* **In**: one :class:`ResponseRequest` per response: the session config as the client set
  it (``session``: the GA ``realtime.session`` object, unknown fields included), the
  response's ``instructions`` / ``output_modalities`` / ``voice`` / ``metadata``, the user
  ``turn`` it answers (the latest user item: its audio as 48 kHz mono PCM16, or its text),
  and the conversation so far (GA item objects, without audio).
* **Out**: an async iterator of deltas. :class:`AudioDelta` is 48 kHz mono PCM16 (any even
  length; played at real time, the iterator is paced by the output queue's back-pressure);
  :class:`TranscriptDelta` is the spoken text; :class:`TextDelta` text for a text-only
  response. The machine maps them onto the session's modality: with ``["audio"]`` audio and
  transcript go out (text deltas count as transcript), with ``["text"]`` text and
  transcript deltas become ``response.output_text.delta`` and audio is dropped.
  :class:`FunctionCall` asks the client to run one of its declared tools (a
  ``function_call`` output item); its result arrives as a ``function_call_output`` item in
  the next request's ``conversation``.
* **Cancellation**: ``response.cancel``, ``output_audio_buffer.clear`` after the response
  and a barge-in (speech while the answer plays, ``interrupt_response``) cancel the task
  iterating — trio cancellation at the generator's next ``await``, or, when it is parked
  at a ``yield`` (the shell waiting for the output queue), ``aclose()`` by the shell;
  either way its ``finally`` blocks run at once.
* Optional: ``session_updated(session)`` (sync) is called after each ``session.update``;
  ``transcribe(turn) -> str`` (async) gives the user turn's transcript for the
  ``conversation.item.input_audio_transcription.*`` events when the session turns
  transcription on; without it the appliance's speech engine named by the session's
  transcription ``model`` transcribes (appliance/realtime/transcription.py).
  ``speculate(item_id, pause, audio)`` (async) is called at each pause inside a user turn
  (appliance/realtime/turns.py) with the turn's audio so far: an agent may transcribe it
  there, and use that transcript when ``turn.pause`` names the same pause (the caller said
  nothing more); it is cancelled if the caller goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .audio import seconds as _seconds


@dataclass(frozen=True, slots=True)
class UserTurn:
    """The user item a response answers: audio (48 kHz mono PCM16) or text."""

    item_id: str
    audio: bytes = b""
    text: str | None = None
    #: The turn ended in the pause the machine numbered so (``SpeculateTurn.pause``): a
    #: speculative transcript started there saw all of its speech. None: no such pause.
    pause: int | None = None

    @property
    def seconds(self) -> float:
        return _seconds(self.audio)


@dataclass(frozen=True, slots=True)
class ResponseRequest:
    response_id: str
    session: dict[str, Any]  # the whole session config (GA shape, unknown fields kept)
    instructions: str
    output_modalities: tuple[str, ...]  # ("audio",) or ("text",)
    voice: Any
    turn: UserTurn | None  # None: no user item yet (a greeting, say)
    conversation: tuple[dict[str, Any], ...] = ()  # GA items so far, audio left out
    metadata: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # response.create's unknown fields


@dataclass(frozen=True, slots=True)
class AudioDelta:
    pcm: bytes  # 48 kHz mono PCM16


@dataclass(frozen=True, slots=True)
class TranscriptDelta:
    text: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """Call a tool the client declared (``session.tools``): the response gets a
    ``function_call`` item, the client runs the tool and sends a ``function_call_output``
    item (then ``response.create``). ``arguments`` is the JSON text; ``call_id`` is made up
    when None."""

    name: str
    arguments: str = "{}"
    call_id: str | None = None


Delta = AudioDelta | TranscriptDelta | TextDelta | FunctionCall


@runtime_checkable
class RealtimeAgent(Protocol):
    def respond(self, request: ResponseRequest) -> AsyncIterator[Delta]:
        """The response's content, streamed; cancelled on response.cancel / barge-in."""
        ...
