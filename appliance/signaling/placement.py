"""Placement: which transceiver gets the next ``create``.

Least loaded first, where load is the live sessions a transceiver holds *plus the creates
sent to it and not answered yet*; ties go to the one that was given fewest sessions ever,
then the lowest id, so equal loads alternate.

Why the creates in flight count: a burst of POSTs (20 callers at once) is placed before any
answer comes back. Counted only once answered, every one of them saw the same loads and
went to the same transceiver, which then set up all 20 on its one core while the other
idled (docs/performance.md, "Setup time"; tests/signaling/test_placement.py).

No knowledge of sessions: the caller says which transceivers are up (health.py) and how
many live sessions each holds (registry.py). :meth:`Placement.place` is the one placement
loop every call kind goes through (a WebRTC session, state.py; a phone call, phone_media.py):
it sends ``create`` to each transceiver in order until one answers finally::

    for k in order:  admitted still? (it may have filled while an earlier try was awaited)
      create ─► no answer (ControlError)   ─► noted on the endpoint; next
              ─► {"ok": false, status 503} ─► draining, full or overloaded: next
              ─► {"ok": true}              ─► placed: counted, Answer
              ─► any other refusal         ─► Answer (the caller says what it means)
    none answered finally ─► Refused(tried): what each one tried said, for the caller's 503
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from ..control import ControlError

log = logging.getLogger(__name__)


def _busy(resp: dict[str, Any]) -> bool:
    """A refusal that another transceiver might not give (the status read as
    problems.from_control reads it)."""
    try:
        return int(resp.get("status", 502)) == 503
    except (TypeError, ValueError):
        return False


class _Client(Protocol):
    async def request(self, req: dict[str, Any]) -> dict[str, Any]: ...


class Peer(Protocol):
    """What placing needs of a transceiver's endpoint (health.Endpoint)."""

    @property
    def client(self) -> _Client: ...

    last_error: str | None


@dataclass(frozen=True, slots=True)
class Answer:
    """The first final answer: ``response["ok"]`` (placed on ``k``) or a refusal other
    than 503, to the ``request`` sent."""

    k: int
    request: dict[str, Any]
    response: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refused:
    """No transceiver took it: per transceiver tried, in order, its 503 answer or None
    (it did not answer). Empty: every one had filled up (admission) before its turn."""

    tried: tuple[dict[str, Any] | None, ...]


class Placement:
    def __init__(self, transceivers: Iterable[int]) -> None:
        keys = list(transceivers)
        self.assigned: dict[int, int] = dict.fromkeys(keys, 0)  # sessions ever created on k
        self.placing: dict[int, int] = dict.fromkeys(keys, 0)  # creates sent to k, unanswered

    def order(self, up: Iterable[int], active: Mapping[int, int]) -> list[int]:
        """The transceivers of ``up`` to try, best first, given ``active`` live sessions
        per transceiver."""
        placing = self.placing
        return sorted(up, key=lambda k: (active.get(k, 0) + placing.get(k, 0),
                                         self.assigned.get(k, 0), k))

    @contextmanager
    def in_flight(self, k: int) -> Iterator[None]:
        """Count a create sent to ``k`` as load for as long as its answer is awaited."""
        self.placing[k] = self.placing.get(k, 0) + 1
        try:
            yield
        finally:
            self.placing[k] -= 1

    def placed(self, k: int) -> None:
        """``k`` took a session."""
        self.assigned[k] = self.assigned.get(k, 0) + 1

    def created_total(self) -> int:
        return sum(self.assigned.values())

    async def place(self, order: Sequence[int], *, admits: Callable[[int], bool],
                    peers: Mapping[int, Peer],
                    build: Callable[[int], dict[str, Any]]) -> Answer | Refused:
        """Send ``build(k)`` (the ``create`` request for ``k``: a fresh id per attempt, if
        the caller wants one) to each admitted transceiver of ``order`` in turn, counted in
        flight while awaited, until one answers finally. What ``build`` raises goes to the
        caller."""
        tried: list[dict[str, Any] | None] = []
        for k in order:
            if not admits(k):  # filled up while an earlier try was awaited
                continue
            peer = peers[k]
            req = build(k)
            try:
                with self.in_flight(k):
                    resp = await peer.client.request(req)
            except ControlError as exc:
                log.warning("transceiver %s did not answer create: %s", k, exc)
                peer.last_error = str(exc)
                tried.append(None)
                continue
            if not resp.get("ok") and _busy(resp):
                tried.append(resp)  # draining, full or overloaded: try another
                continue
            if resp.get("ok"):
                self.placed(k)
            return Answer(k, req, resp)
        return Refused(tuple(tried))

