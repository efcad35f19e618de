"""The transceiver's half of the sideband (``GET /v1/realtime?call_id=…``): the fan-out of
one call's Realtime events to the backends attached to it, and their client events back in.

The call's :class:`~appliance.realtime.machine.RealtimeConnection` runs in the transceiver
that carries the call (its :class:`~appliance.realtime.agent.RealtimeShell`); the backend's
WebSocket ends in signaling (appliance/signaling/sideband.py). Between them, over the
control channel (docs/control-protocol.md "Realtime sideband"):

* ``realtime.attach`` -> :meth:`SidebandPoint.attach`: the current session (signaling sends
  it as ``session.created``) and an :class:`Attachment` with its own bounded queue;
* ``realtime.poll`` -> :meth:`Attachment.take`: a long poll on a connection of its own;
  answers as soon as events are queued (a batch of at most :data:`BATCH_CHARS`);
* ``realtime.send`` -> the shell's ``feed``: a client event of the controller;
* ``realtime.detach``.

Every event the shell drains is serialised once and handed to :meth:`SidebandPoint.publish`
with its *origin* (``None``: the browser's ``oai-events``; else a sideband id): an
``error`` goes only to the side whose event caused it; the events of a function call whose
tool a sideband declared go to the sidebands only (the browser did not declare it and
must not try to run it); everything else goes to every side. A queue that reaches
:data:`QUEUE_LIMIT` unread events closes that attachment (``slow_reader``), never stalls the
call. Locks: the session fields a controller locked refuse a browser ``session.update``
that would change them (an ``error``, the update not applied: it is atomic).

Registry: shells register their point under the call's session id in :data:`POINTS` (one
process-wide table: the transceiver's control handler finds a call's point there).

**Two surfaces, one fan-out.** A point serves the Realtime sideband (``surface`` ``"realtime"``:
the rules above) or GPT-Live's (``"live"``, ``GET /v1/live/sessions/{id}/attach``:
appliance/live/socket.py and call.py register one). The protocol supplies what differs:
``replay`` (the event an attachment gets first: Realtime's ``session.created``, Live's
``session.started``: the short replay) and the routing — a Live session's core makes the observers' stream
itself (appliance/live/connection.py ``poll_observed``: every event, the reflected audio,
an error only to the sideband that caused it), handed to :meth:`SidebandPoint.observe`.
On a Live point every attachment may send (no controller, no locks: GPT-Live's sideband is
the trusted backend's), and ``realtime.attach`` names the surface it wants: asking one
surface for the other's session is a 409.
"""

from __future__ import annotations

import json
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from .protocol import MAX_EVENT_BYTES, EventError

QUEUE_LIMIT = 2048  # unread events per attachment before it is closed as a slow reader
BATCH_CHARS = 256 * 1024  # one poll answer's events (an event is at most ~256 KiB itself)
POLL_WAIT_MAX = 20.0  # the longest a poll is held open with nothing to say
MAX_ATTACHMENTS = 16  # per call
#: Top-level session fields a controller may lock (``type``/``object``/``id`` never change).
LOCKABLE = frozenset({"instructions", "tools", "tool_choice", "output_modalities", "audio",
                      "max_output_tokens", "tracing", "truncation", "prompt", "include",
                      "model"})
CLOSED_SLOW = "slow_reader"
CLOSED_ENDED = "call_ended"
CLOSED_DETACHED = "detached"
REALTIME = "realtime"
LIVE = "live"
SURFACES = (REALTIME, LIVE)

#: session id -> the point of its live Realtime call (registered by RealtimeShell.run).
POINTS: dict[str, SidebandPoint] = {}
#: A Live WebRTC session's point exists once its media connected (the agent runs from
#: then on), but a backend attaches on ``live.transport.connected``, sent when the session
#: is created: a Live attach waits this long for the point of a session still connecting.
ATTACH_WAIT = 10.0
_registered = trio.Event()  # set (and replaced) whenever a point is registered


def register(point: SidebandPoint) -> None:
    """``POINTS[point.call_id] = point``, waking the attaches waiting for it."""
    global _registered
    POINTS[point.call_id] = point
    _registered.set()
    _registered = trio.Event()


def unregister(point: SidebandPoint) -> None:
    if POINTS.get(point.call_id) is point:
        del POINTS[point.call_id]

_FUNCTION_EVENTS = frozenset({"response.function_call_arguments.delta",
                              "response.function_call_arguments.done"})
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done",
                          "conversation.item.added", "conversation.item.done"})


class SidebandError(Exception):
    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail

    def answer(self) -> dict[str, Any]:
        return {"ok": False, "status": self.status, "code": self.code, "detail": self.detail}


class Attachment:
    """One backend socket's view of the call: a bounded queue of serialised events."""

    def __init__(self, sideband_id: str, controller: bool, limit: int = QUEUE_LIMIT) -> None:
        self.id = sideband_id
        self.controller = controller
        self.limit = limit
        self.queue: deque[str] = deque()
        self.closed: str | None = None
        self._wake = trio.Event()

    def push(self, text: str) -> None:
        if self.closed is not None:
            return
        self.queue.append(text)
        if len(self.queue) > self.limit:
            self.close(CLOSED_SLOW)
        self._wake.set()

    def close(self, reason: str) -> None:
        if self.closed is None:
            self.closed = reason
            if reason != CLOSED_ENDED:  # the call's last events still go out
                self.queue.clear()
        self._wake.set()

    def batch(self) -> list[str]:
        out: list[str] = []
        size = 0
        while self.queue and (not out or size + len(self.queue[0]) <= BATCH_CHARS):
            text = self.queue.popleft()
            size += len(text)
            out.append(text)
        return out

    async def take(self, wait: float) -> tuple[list[str], str | None]:
        """The queued events (waiting up to ``wait`` s for one), and why it closed if so."""
        with trio.move_on_after(min(max(wait, 0.0), POLL_WAIT_MAX)):
            while not self.queue and self.closed is None:
                self._wake = trio.Event()
                await self._wake.wait()
        return self.batch(), self.closed if not self.queue else None


class SidebandPoint:
    """The sideband side of one call's shell. ``session`` returns the current session;
    ``feed(text, origin)`` runs a client event through the call's machine (the shell drains
    and publishes what it produced). ``surface``: whose sideband this is; ``replay``: the
    event an attachment gets first (default: Realtime's ``session.created``)."""

    def __init__(self, call_id: str, session: Callable[[], dict[str, Any]],
                 feed: Callable[[str, str], None], *, surface: str = REALTIME,
                 replay: Callable[[], dict[str, Any]] | None = None) -> None:
        assert surface in SURFACES
        self.call_id = call_id
        self.surface = surface
        self._session = session
        self._feed = feed
        self._replay = replay or self._session_created
        self.attachments: dict[str, Attachment] = {}
        self.controller: str | None = None
        self.locks: set[str] = set()
        self.tool_owner: dict[str, str | None] = {}  # tool name -> declaring origin
        self._item_owner: dict[str, str] = {}  # function_call item id -> sideband id
        self._pending_tools: list[str] | None = None  # of the session.update being run
        self.ended = False

    # -- attachments ---------------------------------------------------------------------

    def _session_created(self) -> dict[str, Any]:
        return {"type": "session.created", "event_id": f"event_{secrets.token_hex(8)}",
                "session": self._session()}

    def attach(self, role: str | None, locks: list[str]) -> tuple[Attachment, dict[str, Any]]:
        """A new attachment and its replay (the event to send first)."""
        if self.ended:
            raise SidebandError(410, "call_ended", f"call {self.call_id} has ended")
        if len(self.attachments) >= MAX_ATTACHMENTS:
            raise SidebandError(429, "too_many_sidebands",
                                f"{MAX_ATTACHMENTS} sidebands are attached to this call")
        if self.surface == LIVE:
            if role is not None or locks:
                raise SidebandError(400, "invalid_value", "a GPT-Live sideband has no roles "
                                    "or locks: every attached backend may send commands")
            att = Attachment(f"sb_{secrets.token_hex(8)}", True)
            self.attachments[att.id] = att
            return att, self._replay()
        if role not in (None, "controller", "observer"):
            raise SidebandError(400, "invalid_value", "role must be controller or observer")
        controller = role == "controller" or (role is None and self.controller is None)
        if controller and self.controller is not None:
            raise SidebandError(409, "controller_exists", "this call already has a "
                                "controlling sideband; attach with role=observer")
        bad = [f for f in locks if f not in LOCKABLE]
        if bad:
            raise SidebandError(400, "invalid_value", f"cannot lock {bad[0]!r}: lockable "
                                f"fields are {', '.join(sorted(LOCKABLE))}")
        if locks and not controller:
            raise SidebandError(400, "invalid_value", "only the controller may lock fields")
        att = Attachment(f"sb_{secrets.token_hex(8)}", controller)
        self.attachments[att.id] = att
        if controller:
            self.controller = att.id
            self.locks.update(locks)  # locks outlive the controller: the browser gains nothing
        return att, self._replay()

    def detach(self, sideband_id: str) -> None:
        att = self.attachments.pop(sideband_id, None)
        if att is None:
            return
        att.close(CLOSED_DETACHED)
        if self.controller == sideband_id:
            self.controller = None
        for name, owner in list(self.tool_owner.items()):
            if owner == sideband_id:
                self.tool_owner[name] = None  # its tools' calls go to everyone again

    def close(self) -> None:
        """The call ended: every attachment learns it at its next poll."""
        self.ended = True
        for att in self.attachments.values():
            att.close(CLOSED_ENDED)

    def send(self, sideband_id: str, event: Any) -> None:
        att = self.attachments.get(sideband_id)
        if att is None or att.closed is not None:
            raise SidebandError(404, "unknown_sideband", "this sideband is not attached")
        text = json.dumps(event, separators=(",", ":"))
        if not att.controller:
            err = EventError("this sideband is an observer: only the controller may send "
                             "client events", code="sideband_observer",
                             event_id=_event_id(event))
            att.push(json.dumps(err.to_event(f"event_{secrets.token_hex(8)}")))
            return
        self._feed(text, sideband_id)

    # -- the shell's hooks ------------------------------------------------------------------

    def refuse_untrusted(self, data: str | bytes, origin: str | None) -> EventError | None:
        """Called before a client event reaches the machine: an error when the browser's
        ``session.update`` would change a locked field (or None); notes the tools a
        ``session.update`` declares, so their calls go to the side that declared them."""
        self._pending_tools = None
        if not self.attachments and not self.locks and origin is None:
            return None  # nothing attached, nothing locked: the common call pays nothing
        if len(data) > MAX_EVENT_BYTES:
            return None  # the machine answers it
        try:
            event = json.loads(data)
        except (ValueError, RecursionError, UnicodeDecodeError):
            return None  # the machine answers it
        if not isinstance(event, dict) or event.get("type") != "session.update":
            return None
        patch = event.get("session")
        if not isinstance(patch, dict):
            return None
        if origin is None and self.locks:
            current = self._session()
            for key in sorted(self.locks & patch.keys()):
                if patch[key] != current.get(key):
                    return EventError(f"session.{key} is locked by the call's backend",
                                      code="session_field_locked", param=f"session.{key}",
                                      event_id=_event_id(event))
        tools = patch.get("tools")
        if isinstance(tools, list):
            self._pending_tools = [t["name"] for t in tools
                                   if isinstance(t, dict) and isinstance(t.get("name"), str)]
        return None

    def publish(self, event: dict[str, Any], text: str, origin: str | None) -> str | None:
        """Queue ``event`` for the sidebands that should see it; returns what the browser's
        channel gets (None: nothing)."""
        kind = event.get("type")
        if kind == "session.updated" and self._pending_tools is not None:
            for name in self._pending_tools:
                self.tool_owner[name] = origin
            self._pending_tools = None
        if kind == "error" and origin is None:  # the browser's: its channel only
            return text
        self.observe(event, text, origin)
        if kind == "error":
            return None
        if self._function_owner(event) is not None:
            return None
        if kind == "response.done" and self._item_owner:
            return self._without_sideband_calls(event, text)
        return text

    def observe(self, event: dict[str, Any], text: str, origin: str | None) -> None:
        """Queue ``event`` for the sidebands: an ``error`` only to the one whose client
        event caused it (``origin``; an error of the primary side's goes to none), anything
        else to every one. Live's shells hand their core's observer stream here."""
        if event.get("type") == "error":
            att = self.attachments.get(origin) if origin is not None else None
            if att is not None:
                att.push(text)
            return
        for att in self.attachments.values():
            att.push(text)

    def _without_sideband_calls(self, event: dict[str, Any], text: str) -> str:
        response = event.get("response")
        output = response.get("output") if isinstance(response, dict) else None
        if not isinstance(output, list):
            return text
        kept = [o for o in output if not (isinstance(o, dict)
                                          and str(o.get("id")) in self._item_owner)]
        if len(kept) == len(output):
            return text
        assert isinstance(response, dict)
        return json.dumps({**event, "response": {**response, "output": kept}},
                          separators=(",", ":"))

    def _function_owner(self, event: dict[str, Any]) -> str | None:
        kind = event.get("type")
        if kind in _ITEM_EVENTS:
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") in ("function_call",
                                                               "function_call_output"):
                if item.get("type") == "function_call_output":
                    return self._item_owner.get(str(item.get("call_id")))
                owner = self.tool_owner.get(str(item.get("name")))
                if owner is not None:
                    self._item_owner[str(item.get("id"))] = owner
                    self._item_owner[str(item.get("call_id"))] = owner
                return owner
        elif kind in _FUNCTION_EVENTS:
            return self._item_owner.get(str(event.get("item_id")))
        return None


def _event_id(event: Any) -> str | None:
    eid = event.get("event_id") if isinstance(event, dict) else None
    return eid if isinstance(eid, str) else None


# -- the control operations (the transceiver's handle_control delegates ``realtime.*``) -----

#: sideband id -> (its call's point, the attachment); kept after the call ends until the
#: attachment's last poll (or its detach) so the call's final events still reach it.
ATTACHED: dict[str, tuple[SidebandPoint, Attachment]] = {}
MAX_ATTACHED = 4096


def _error(status: int, code: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "status": status, "code": code, "detail": detail}


async def handle_op(op: str, req: dict[str, Any], state_of: Callable[[str], str | None]
                    ) -> dict[str, Any]:
    """``realtime.attach`` / ``.poll`` / ``.send`` / ``.detach``; ``state_of(session_id)``
    is the transceiver's session state (None: unknown here)."""
    try:
        if op == "realtime.attach":
            if req.get("surface") == LIVE:
                await _connecting(req.get("session_id"), state_of)
            return _attach(req, state_of)
        sid = req.get("sideband_id")
        found = ATTACHED.get(sid) if isinstance(sid, str) else None
        if op == "realtime.poll":
            if found is None:
                return {"ok": True, "events": [], "closed": CLOSED_DETACHED}
            wait = req.get("wait", 0.0)
            wait = float(wait) if isinstance(wait, int | float) else 0.0
            events, closed = await found[1].take(wait)
            if closed is not None:
                ATTACHED.pop(found[1].id, None)
            return {"ok": True, "events": events, "closed": closed}
        if op == "realtime.send":
            if found is None:
                raise SidebandError(404, "unknown_sideband", "this sideband is not attached")
            sent = req.get("events")
            if not isinstance(sent, list):
                raise SidebandError(400, "bad-request", "events must be a list")
            for event in sent:
                found[0].send(found[1].id, event)
            return {"ok": True}
        if op == "realtime.detach":
            if found is not None:
                ATTACHED.pop(found[1].id, None)
                found[0].detach(found[1].id)
            return {"ok": True}
    except SidebandError as exc:
        return exc.answer()
    return _error(400, "unknown-op", f"unknown op {op!r}")


async def _connecting(sid: Any, state_of: Callable[[str], str | None]) -> None:
    """Wait (up to :data:`ATTACH_WAIT`) while the session ``sid`` exists here, has no
    point yet and has not ended: its media is still connecting."""
    if not isinstance(sid, str):
        return
    with trio.move_on_after(ATTACH_WAIT):
        while POINTS.get(sid) is None and state_of(sid) not in (None, "ended"):
            await _registered.wait()


def _attach(req: dict[str, Any], state_of: Callable[[str], str | None]) -> dict[str, Any]:
    sid = req.get("session_id")
    if not isinstance(sid, str):
        raise SidebandError(400, "bad-request", "session_id must be a string")
    state = state_of(sid)
    if state is None:
        raise SidebandError(404, "call_not_found", f"no call {sid!r} on this transceiver")
    point = POINTS.get(sid)
    if state == "ended" or (point is not None and point.ended):
        raise SidebandError(410, "call_ended", f"call {sid!r} has ended")
    surface = req.get("surface", REALTIME)
    if surface not in SURFACES:
        raise SidebandError(400, "bad-request", f"surface must be one of {SURFACES}")
    if point is None or point.surface != surface:
        if surface == LIVE and point is None:
            raise SidebandError(409, "session_not_connected", f"session {sid!r} has no "
                                f"media yet: its caller did not connect within "
                                f"{ATTACH_WAIT:g} s")
        if surface == LIVE:
            raise SidebandError(409, "not_live", f"session {sid!r} is not a GPT-Live "
                                "session: attach with GET /v1/realtime?call_id=")
        if point is not None:
            raise SidebandError(409, "not_realtime", f"call {sid!r} is a GPT-Live session: "
                                f"attach at /v1/live/sessions/{sid}/attach")
        raise SidebandError(409, "not_realtime", f"call {sid!r} is not answered by a "
                            "Realtime agent: there is no event stream to attach to")
    locks = req.get("locks") or []
    if not isinstance(locks, list) or not all(isinstance(x, str) for x in locks):
        raise SidebandError(400, "bad-request", "locks must be a list of field names")
    role = req.get("role")
    att, created = point.attach(role if isinstance(role, str) else None, locks)
    if len(ATTACHED) >= MAX_ATTACHED:
        for key in [k for k, (_, a) in ATTACHED.items() if a.closed is not None]:
            del ATTACHED[key]
    ATTACHED[att.id] = (point, att)
    # session_created: the replay, whichever surface's (Live's is session.started)
    return {"ok": True, "sideband_id": att.id, "controller": att.controller,
            "locks": sorted(point.locks), "session_created": created}
