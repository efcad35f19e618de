"""How signaling hears that a call ended, for every call (WebRTC and phone): one ``events``
long-poll per transceiver that holds calls (docs/control-protocol.md "Call events").

Each answer goes to the handlers: :meth:`CallEvents.ended_calls` for WebRTC sessions (the
ended session object into the registry, then the ``on_ended`` listeners: the Realtime
webhooks' ``realtime.call.ended``), and phone media's ``handle_events`` (``ended`` and
``dtmf`` for the SIP call control). A poller sleeps while its transceiver holds no call
(``holds``) and is woken by :meth:`CallEvents.placed`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from ..control import ControlClient, ControlError
from .health import ProcessHealth
from .registry import SessionRegistry

log = logging.getLogger(__name__)

#: how long one ``events`` long-poll waits on the transceiver for an event
EVENTS_WAIT = 5.0

#: one answer from transceiver ``k``: its events, and (after it restarted) the calls it has
Handler = Callable[[int, list[dict[str, Any]], "set[str] | None"], None]


class CallEvents:
    """Given the session registry (what ends), the process health (where the transceivers
    are) and the clock: not signaling's whole state, which owns this."""

    def __init__(self, registry: SessionRegistry, health: ProcessHealth,
                 clock: Callable[[], float], *, wait: float = EVENTS_WAIT) -> None:
        self.registry = registry
        self.health = health
        self.clock = clock
        self.wait = wait
        self.handlers: list[Handler] = [self.ended_calls]
        #: whether transceiver ``k`` holds a call someone waits on (besides the registry's)
        self.holds: list[Callable[[int], bool]] = []
        #: told a WebRTC call's id once its record has ended (webhooks)
        self.on_ended: list[Callable[[str], object]] = []
        self._nursery: trio.Nursery | None = None
        self._pollers: dict[int, trio.Event] = {}  # transceiver -> "has calls again"

    def start(self, nursery: trio.Nursery) -> None:
        if self._nursery is None:
            self._nursery = nursery
            for k in self.registry.active_counts():  # placed before we started
                self.placed(k)

    def placed(self, k: int) -> None:
        """A call was placed on transceiver ``k``: its poller runs (started, or woken)."""
        wake = self._pollers.get(k)
        if wake is not None:
            wake.set()
            return
        if self._nursery is None:
            return  # not started (unit tests hand answers to handle() themselves)
        self._pollers[k] = trio.Event()
        self._nursery.start_soon(self._poll_loop, k)

    def _holds(self, k: int) -> bool:
        return bool(self.registry.active_counts().get(k)) or any(h(k) for h in self.holds)

    def handle(self, k: int, events: list[Any], live: set[str] | None = None) -> None:
        """One ``events`` answer from transceiver ``k``, to every handler."""
        good = [ev for ev in events if isinstance(ev, dict) and isinstance(ev.get("call_id"), str)]
        for handler in self.handlers:
            handler(k, good, live)

    def ended_calls(self, k: int, events: list[dict[str, Any]], live: set[str] | None) -> None:
        """WebRTC sessions of the registry that ended on ``k``: their ended session object
        (or what the event says) into the record; after a restart (``live`` given) the
        ones it no longer has are ``gone``, as a ``list`` would have found."""
        registry = self.registry
        done: list[str] = []
        for ev in events:
            rec = registry.get(ev["call_id"])
            if ev.get("type") != "ended" or rec is None or rec.transceiver != k or rec.ended:
                continue
            session = ev.get("session")
            obj = dict(session) if isinstance(session, dict) else dict(rec.last or {})
            if obj.get("state") != "ended":
                obj.update(state="ended", end_reason=str(ev.get("reason") or "ended"),
                           ended_at=None)
            registry.observe(rec, obj)
            done.append(rec.id)
        if live is not None:
            now = self.clock()
            for rec in list(registry.sessions.values()):
                if rec.transceiver == k and not rec.ended and rec.id not in live:
                    rec.ended_at, rec.end_reason = now, "gone"
                    done.append(rec.id)
        for call_id in done:
            for listener in self.on_ended:
                listener(call_id)

    async def _poll_loop(self, k: int) -> None:
        ep = self.health.transceivers[k]
        # Its own connection: the control server answers one connection's requests in
        # order, and a waiting poll must not hold up creates behind it.
        client = ControlClient(ep.address, timeout=self.wait + 10.0)
        epoch: str | None = None
        after = 0
        try:
            while True:
                if not self._holds(k):  # no call there: sleep until one is placed
                    wake = self._pollers[k] = trio.Event()
                    await wake.wait()
                    continue
                try:
                    resp = await client.request({"op": "events", "epoch": epoch,
                                                 "after": after, "wait": self.wait})
                except ControlError as exc:
                    log.info("events from transceiver %s failed: %s", k, exc)
                    await trio.sleep(1.0)
                    continue
                if not resp.get("ok"):
                    await trio.sleep(1.0)
                    continue
                got_epoch = resp.get("epoch")
                restarted = epoch is not None and got_epoch != epoch
                epoch = got_epoch if isinstance(got_epoch, str) else None
                nxt = resp.get("next")
                after = nxt if isinstance(nxt, int) else 0
                events = resp.get("events")
                live = resp.get("live")
                # After a restart (a new epoch) the calls it no longer has are over.
                self.handle(k, events if isinstance(events, list) else [],
                            set(live) if isinstance(live, list) and restarted else None)
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
