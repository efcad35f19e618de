"""The turn engine's pause work for both Realtime shells (the ``oai-events`` channel,
appliance/realtime/agent.py, and the WebSocket, appliance/realtime/ws_session.py).

The machine takes its turns from the shared turn engine (appliance/speech/vad.py's
``TurnDetector``, the one the ctx voice loop uses). At each pause inside a user turn it
asks for work only a shell can do, and goes on with the frames meanwhile:

* :class:`~appliance.realtime.machine.JudgeTurn` (``semantic_vad``, when Smart Turn is
  installed: :func:`can_judge`): Smart Turn's P(complete) on the turn so far, in a worker
  thread (~50-100 ms of one core), handed back with ``machine.handle_verdict``; a verdict
  at or above the eagerness's threshold ends the turn there instead of after the silence
  bound;
* :class:`~appliance.realtime.machine.SpeculateTurn` (agents with a ``speculate`` hook:
  the assistant): the turn's audio so far, for the agent to transcribe while the caller is
  silent. If the turn ends in that pause the committed item's ``UserTurn.pause`` names it
  and the agent answers from that transcript instead of starting one then.

A model that fails leaves the silence bound to end the turn; a speculation that fails
leaves the agent to transcribe the committed item as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from .machine import JudgeTurn, RealtimeConnection, SpeculateTurn

log = logging.getLogger("appliance.realtime.turns")


def can_judge() -> bool:
    """Smart Turn can run here (the ``speech`` extra): ``semantic_vad`` is semantic."""
    from ..speech import endpoint

    return endpoint.available()


def can_speculate(agent: Any) -> bool:
    return callable(getattr(agent, "speculate", None))


class PauseWork:
    """One session's pause work (both shells hold one): at most one Smart Turn inference
    and one speculation in flight. A WebSocket client may append a minute of audio with
    a hundred pauses in one event; a pause asked while the last one's work still runs is
    skipped (its turn then ends on the silence bound, or is transcribed after it ends), so
    a session's burst costs one inference and one decode at a time, never a queue."""

    def __init__(self, machine: RealtimeConnection, agent: Any,
                 drain: Callable[[], None]) -> None:
        self.machine = machine
        self.agent = agent
        self.drain = drain
        self.judging = False
        self.speculating = False
        self.skipped = 0  # pauses whose work was not started (the last one's still ran)

    def start(self, action: JudgeTurn | SpeculateTurn, nursery: trio.Nursery) -> None:
        if isinstance(action, JudgeTurn):
            if self.judging:
                self.skipped += 1
                return
            self.judging = True
            nursery.start_soon(self._judge, action)
        else:
            if self.speculating:
                self.skipped += 1
                return
            self.speculating = True
            nursery.start_soon(self._speculate, action)

    async def _judge(self, action: JudgeTurn) -> None:
        try:
            await judge(action, self.machine, self.drain, self.agent)
        finally:
            self.judging = False

    async def _speculate(self, action: SpeculateTurn) -> None:
        try:
            await speculate(action, self.agent)
        finally:
            self.speculating = False


async def judge(action: JudgeTurn, machine: RealtimeConnection,
                drain: Callable[[], None], agent: Any = None) -> None:
    """Smart Turn on the pause's audio, off the loop; the verdict back to ``machine``, with
    the pause's speculative transcript when the agent made one (its ``pause_words(item_id,
    pause)`` hook: the assistant's decode of the same pause, running beside the model; the
    words may veto a "complete" they contradict, as in the ctx loop)."""
    from ..speech.endpoint import SmartTurn

    try:
        p = await trio.to_thread.run_sync(
            lambda: SmartTurn().probability(action.audio16k))
    except Exception:  # the silence bound ends this turn
        log.warning("end-of-turn model failed; the silence bound ends this turn",
                    exc_info=True)
        return
    words: str | None = None
    hook = getattr(agent, "pause_words", None)
    if action.item_id is not None and action.pause is not None and callable(hook):
        try:
            words = await hook(action.item_id, action.pause)
        except Exception:  # the model decides alone
            log.info("pause transcript of %s failed", action.item_id, exc_info=True)
    machine.handle_verdict(action.query_id, p, words)
    drain()


async def speculate(action: SpeculateTurn, agent: Any) -> None:
    """The agent's ``speculate`` hook (its failure is only a lost head start)."""
    try:
        await agent.speculate(action.item_id, action.pause, action.audio)
    except Exception:
        log.info("speculation on %s failed", action.item_id, exc_info=True)
