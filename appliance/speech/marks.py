"""A turn's waterfall (issue 38 item 5): one definition for every voice surface.

:class:`TurnMarks` is what the ctx voice loop (appliance/speech/assistant.py) and the
Realtime shells (appliance/realtime/waterfall.py: the ``oai-events`` channel, the Realtime
and GPT-Live WebSockets) fill in, each mark a time on the shell's clock (trio's), and send
as the ``turn.metrics`` event: every mark in ms after the end of the turn was decided. The
session object's ``turns`` lines (appliance/session_info.py ``turn_line``) are made from
that event, and from them the end-of-call report's ``turns`` and the
``appliance_turn_*_seconds`` histograms (appliance/signaling/registry.py ``TURN_SPANS``).

:class:`Arrivals` tells when the audio at a media position arrived: the turn engine counts
time in frames (a turn's speech ends at a media position), the waterfall needs the moment
the VAD paused, i.e. when the caller's last voiced frame reached us.

Sans-IO: no clock is read here; the shells pass the times in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass
class TurnMarks:
    """One turn's waterfall, sent as ``turn.metrics`` once the reply's first frame is sent:
    each mark in ms after the end of the turn was decided (negative: before it). The
    caller's silence between ``speech_end`` and the end of turn is the detector's wait
    (``silence_ms``, or the semantic pause and verdict); the marks' names are the session
    object's ``turns`` keys (appliance/session_info.py)."""

    turn: int
    end_of_turn: float
    transcript: float | None  # the final transcript was in hand
    stt_seconds: float  # of which the STT's own time after the end of turn
    #: The detector heard speech start (``min_speech_ms`` into it: UserSpeechStarted).
    speech_start: float | None = None
    #: The VAD paused: the caller's last voiced frame arrived (:class:`Arrivals`).
    speech_end: float | None = None
    first_token: float | None = None  # the responder's first text
    first_audio: float | None = None  # the TTS's first frame
    first_queued: float | None = None  # that frame queued for the pacer
    first_sent: float | None = None  # that frame sent: the pacer took it (played_past)

    def event(self) -> dict[str, Any]:
        def ms(t: float | None) -> float | None:
            return None if t is None else round((t - self.end_of_turn) * 1000, 1)

        return {"type": "turn.metrics", "turn": self.turn,
                "speech_start_ms": ms(self.speech_start),
                "speech_end_ms": ms(self.speech_end),
                "transcript_ms": ms(self.transcript),
                "stt_ms": round(self.stt_seconds * 1000, 1),
                "first_token_ms": ms(self.first_token),
                "first_audio_ms": ms(self.first_audio),
                "first_queued_ms": ms(self.first_queued),
                "first_sent_ms": ms(self.first_sent)}


class Arrivals:
    """When the audio up to each media position arrived: ``note(position_ms, at)`` after
    the frames up to ``position_ms`` were fed to the turn engine at ``at`` (one note a
    frame on a call; one a message on a WebSocket, whose client sends many frames at
    once), ``at(position_ms)`` the time of the first note that covers it."""

    #: 10 s of 20 ms frames: past the longest silence bound (5 s) plus what a shell reads
    #: while a pause's work runs, before it hears the end of the turn.
    KEEP = 500

    def __init__(self) -> None:
        self._notes: deque[tuple[int, float]] = deque(maxlen=self.KEEP)

    def note(self, position_ms: int, at: float) -> None:
        if self._notes and self._notes[-1][0] >= position_ms:
            return  # nothing new was fed (a message without audio)
        self._notes.append((position_ms, at))

    def at(self, position_ms: int) -> float | None:
        """Arrival time of the audio ending at ``position_ms`` (None before the first note,
        past the last, or older than what is kept)."""
        notes = self._notes
        if not notes or position_ms <= 0 or position_ms > notes[-1][0]:
            return None
        if position_ms < notes[0][0] and len(notes) == notes.maxlen:
            return None  # its note may have fallen out: the time would be a guess
        lo, hi = 0, len(notes) - 1
        while lo < hi:  # the first note at or past the position
            mid = (lo + hi) // 2
            if notes[mid][0] >= position_ms:
                hi = mid
            else:
                lo = mid + 1
        return notes[lo][1]
