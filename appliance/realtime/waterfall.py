"""Each turn's waterfall on the Realtime surfaces (issue 38 item 5), for both shells: the
``oai-events`` channel of a WebRTC or phone call (appliance/realtime/agent.py) and the
WebSocket (appliance/realtime/ws_session.py, GPT-Live's socket too).

The marks are the ctx voice loop's (:class:`~appliance.speech.marks.TurnMarks`, sent as the
same ``turn.metrics`` event), gathered from what a shell sees:

=================  ===========================================================================
mark               where it comes from
=================  ===========================================================================
speech_start       the machine's :class:`~.machine.TurnBound` opening the turn, as drained
speech_end         the turn's end of speech (``TurnBound.speech_end_ms``, a media position)
                   mapped to when that audio arrived (:class:`~appliance.speech.marks.Arrivals`)
end of turn (0)    the ``TurnBound`` that ended the turn, as drained
transcript,        the agent's own marks when it has a ``turn_marks(response_id)`` hook (the
stt_ms,            assistant: its transcript in hand, the STT's time, the LLM's first text);
first_token        without one ``first_token`` is the response's first text delta
first_audio        the response's first :class:`~.interface.AudioDelta`
first_queued       that audio queued (``ctx.send``; on a WebSocket: its event queued)
first_sent         that audio sent (the pacer took it; on a WebSocket: its event written)
=================  ===========================================================================

A turn gets marks when a response answers the user item the turn engine ended (the
``create_response`` one, or a client's ``response.create`` after it); responses to text
items or push-to-talk commits have no VAD turn and get none. A response cut before its
first audio went out reports nothing (the caller heard no reply), as in the ctx loop.

Sans-IO: the shell passes every time in (trio's clock), and sends the event itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ..speech.marks import Arrivals, TurnMarks
from .interface import ResponseRequest
from .machine import TurnBound

#: Turns waiting for their response, and responses waiting for their first frame to go out
#: (a client may make responses that never play): the oldest are forgotten past this.
MAX_OPEN = 16


class Waterfall:
    """One Realtime session's turn marks (see the module docstring)."""

    def __init__(self) -> None:
        self.arrivals = Arrivals()
        self._started: tuple[str, float] | None = None  # the open turn: item, when heard
        #: Turns the engine ended, by item: (end of turn, speech start, speech end).
        self._ended: OrderedDict[str, tuple[float, float | None, float | None]] = OrderedDict()
        self._marks: OrderedDict[str, TurnMarks] = OrderedDict()  # by response id
        self.turns = 0  # turns answered (the ``turn`` numbers)

    def arrived(self, position_ms: int, now: float) -> None:
        """The machine has been fed audio up to ``position_ms`` (its ``audio_ms``) by now."""
        self.arrivals.note(position_ms, now)

    def bound(self, bound: TurnBound, now: float) -> None:
        """A :class:`TurnBound` the shell drained from the machine at ``now``."""
        if not bound.ended:
            self._started = (bound.item_id, now)
            return
        start = self._started[1] if self._started and self._started[0] == bound.item_id \
            else None
        self._started = None
        end = None if bound.speech_end_ms is None else self.arrivals.at(bound.speech_end_ms)
        self._ended[bound.item_id] = (now, start, end)
        while len(self._ended) > MAX_OPEN:
            self._ended.popitem(last=False)

    def respond(self, request: ResponseRequest) -> None:
        """A response starts: if it answers a turn the engine ended, that turn's marks."""
        turn = request.turn
        found = self._ended.pop(turn.item_id, None) if turn is not None else None
        if found is None:
            return
        self.turns += 1
        end, start, speech_end = found
        self._marks[request.response_id] = TurnMarks(
            self.turns, end, None, 0.0, speech_start=start, speech_end=speech_end)
        while len(self._marks) > MAX_OPEN:
            self._marks.popitem(last=False)

    def text(self, response_id: str, now: float) -> None:
        """The response's text (a transcript or text delta): its first is ``first_token``
        unless the agent tells its own."""
        m = self._marks.get(response_id)
        if m is not None and m.first_token is None:
            m.first_token = now

    def audio(self, response_id: str, now: float) -> None:
        m = self._marks.get(response_id)
        if m is not None and m.first_audio is None:
            m.first_audio = now

    def queued(self, response_id: str, now: float) -> bool:
        """The response's audio was queued: True the first time (the shell then watches for
        it to go out and calls :meth:`sent`)."""
        m = self._marks.get(response_id)
        if m is None or m.first_queued is not None:
            return False
        m.first_queued = now
        return True

    def sent(self, response_id: str, now: float | None,
             agent: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The response's first audio went out at ``now`` (None: the time is unknown, e.g.
        the call ended first): its ``turn.metrics`` event, with the agent's own marks
        (``transcript``, ``stt_seconds``, ``first_token``) over the shell's. None if the
        response has no turn, or it was reported already."""
        m = self._marks.pop(response_id, None)
        if m is None:
            return None
        m.first_sent = now
        for key in ("transcript", "first_token"):
            value = (agent or {}).get(key)
            if isinstance(value, int | float):
                setattr(m, key, float(value))
        stt = (agent or {}).get("stt_seconds")
        if isinstance(stt, int | float):
            m.stt_seconds = float(stt)
        return m.event()

    def ended(self, response_id: str) -> None:
        """The response's generation ended: unless its audio was queued (and the shell
        waits for it to go out), it has no waterfall."""
        m = self._marks.get(response_id)
        if m is not None and m.first_queued is None:
            del self._marks[response_id]

    def forget(self, response_id: str) -> None:
        """The response's audio never went out (cut, or the call ended): no waterfall."""
        self._marks.pop(response_id, None)
