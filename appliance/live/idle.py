"""GPT-Live's ``idle_timeout_s`` and ``wake_policy`` (``types/live/media_session_config_param.py``):
when inference runs, pauses and wakes again (sans-IO, time passed in).

GPT-Live, for a WebRTC (or SIP) session with ``wake_policy: {type: "speech",
vad_threshold}``:

* the session starts **not yet woken**: inference waits for the caller's speech, and the
  first wake sends ``session.resumed`` ("This occurs on the first wake and after each later
  wake", ``connect_server_event.py`` ``SessionResumed``);
* after ``idle_timeout_s`` whole seconds of **inactivity** inference pauses
  (``session.paused``); the connection and the conversation are kept; speech wakes it
  again. Without ``idle_timeout_s`` it stays awake after the first wake until the session
  ends. Without a wake policy there is no gate at all (config.py refuses
  ``idle_timeout_s`` alone: nothing could wake a session it paused);
* usage splits into ``active_seconds`` and ``paused_seconds``.

What counts here (the SDK does not say; docs/live.md states it):

* **activity** is the caller speaking (a frame the VAD flags) or the agent busy (an answer
  being made or played): the timer restarts at each, so a session never pauses under an
  answer or in mid-sentence;
* **speech that wakes** is :func:`wake_frames` consecutive voiced 20 ms frames:
  ``vad_threshold`` × 200 ms (at least one frame; the default 0.5 is 100 ms). The frame
  flag is the transceiver's energy VAD (boolean), so the threshold is the evidence's
  *length*: "higher values require stronger evidence of speech".

Verbs (STYLE.md rule 18)::

    handle_input(now, data, busy)     one 20 ms input frame: ``data`` is its VAD flag
                                      (speech?), ``busy`` whether the agent is answering;
                                      may wake
    handle_timeout(now)               may pause
    poll_timeout()                    when to call handle_timeout next (None: no timer)
    poll_output()                     Paused / Resumed, in order; None when drained
    paused_seconds(now)               the time spent not awake, for usage

``now`` is any monotonic clock in seconds: a WebRTC session's is the track's own timeline
(connection.py: 20 ms a frame, as they arrive), a test's a plain float.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import Enum

FRAME_S = 0.02
MAX_EVIDENCE_FRAMES = 10  # vad_threshold 1.0: 200 ms of speech wakes


class GateError(Exception):
    """An illegal (state, input) pair: a bug in the caller, never the network's doing."""


class Phase(Enum):
    ASLEEP = "asleep"  # not yet woken, or paused by the idle timeout
    AWAKE = "awake"


class Move(Enum):
    WAKE = "wake"
    PAUSE = "pause"


#: (phase, move) -> next phase (rule 19: an illegal pair raises GateError).
_TABLE: dict[tuple[Phase, Move], Phase] = {
    (Phase.ASLEEP, Move.WAKE): Phase.AWAKE,
    (Phase.AWAKE, Move.PAUSE): Phase.ASLEEP,
}


@dataclass(frozen=True, slots=True)
class Paused:
    """Idle for ``idle_timeout_s``: inference paused (``session.paused``)."""


@dataclass(frozen=True, slots=True)
class Resumed:
    """Speech woke inference (``session.resumed``)."""


def wake_frames(vad_threshold: float) -> int:
    """Consecutive voiced frames that wake a sleeping session (``vad_threshold`` 0..1)."""
    return max(1, math.ceil(vad_threshold * MAX_EVIDENCE_FRAMES - 1e-9))


class WakeGate:
    """One session's gate. ``idle_timeout_s`` None: once awake, awake for good."""

    def __init__(self, *, vad_threshold: float = 0.5, idle_timeout_s: int | None = None,
                 now: float) -> None:
        self.phase = Phase.ASLEEP
        self._need = wake_frames(vad_threshold)
        self._idle = idle_timeout_s
        self._voiced = 0  # consecutive voiced frames while asleep
        self._last_active = now
        self._asleep_since: float | None = now
        self._asleep_total = 0.0
        self._out: deque[Paused | Resumed] = deque()

    @property
    def awake(self) -> bool:
        return self.phase is Phase.AWAKE

    def _move(self, move: Move, now: float) -> None:
        nxt = _TABLE.get((self.phase, move))
        if nxt is None:
            raise GateError(f"{move.value} while {self.phase.value}")
        self.phase = nxt
        if nxt is Phase.AWAKE:
            assert self._asleep_since is not None
            self._asleep_total += max(0.0, now - self._asleep_since)
            self._asleep_since = None
            self._last_active = now
            self._voiced = 0
            self._out.append(Resumed())
        else:
            self._asleep_since = now
            self._out.append(Paused())

    def handle_input(self, now: float, data: bool, busy: bool = False) -> None:
        """One 20 ms frame: ``data`` is the VAD's speech flag."""
        speech = data
        if self.phase is Phase.AWAKE:
            if speech or busy:
                self._last_active = now
            return
        self._voiced = self._voiced + 1 if speech else 0
        if self._voiced >= self._need:
            self._move(Move.WAKE, now)

    def handle_timeout(self, now: float) -> None:
        deadline = self.poll_timeout()
        if deadline is not None and now >= deadline:
            self._move(Move.PAUSE, now)

    def poll_timeout(self) -> float | None:
        if self.phase is not Phase.AWAKE or self._idle is None:
            return None
        return self._last_active + self._idle

    def poll_output(self) -> Paused | Resumed | None:
        """The next change, in order; None when drained."""
        return self._out.popleft() if self._out else None

    def paused_seconds(self, now: float) -> float:
        """Seconds spent asleep so far (before the first wake included)."""
        running = now - self._asleep_since if self._asleep_since is not None else 0.0
        return self._asleep_total + max(0.0, running)
