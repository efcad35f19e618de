"""``GET /v1/realtime?call_id=…``: a backend's WebSocket attached to a live call (the sideband).

The call's Realtime machine runs on the transceiver that carries it; this is signaling's
half (the transceiver's is appliance/realtime/sideband.py, the rules docs/realtime.md
"Sideband"). A call is a WebRTC one (the registry) or a SIP one (sip_calls.py: the
transceiver its phone session runs on). Before the upgrade: full rights (the API token; an ``ek_`` client secret never
attaches), the call known and live, ``realtime.attach`` answered by its transceiver — every
refusal is an HTTP answer in OpenAI's error shape. After it, three tasks:

* the poller: ``realtime.poll`` long polls on a control connection of its own (a held poll
  never delays another request), each batch into the socket's bounded queue;
* the sender: the queue to the socket, in order;
* the receiver (the route's task): each client event to ``realtime.send``, in order.

``session.created`` (the current session, from the attach answer) is the first event.
A socket that does not read (the queue past :data:`QUEUE_LIMIT`, or the transceiver's queue
past its own) is closed with 1008; the call ending closes it with 1000; a transceiver that
stops answering, with 1011. Closing the socket detaches it; the call goes on.

**GPT-Live's sideband** (``GET /v1/live/sessions/{id}/attach``: live_ws.py's route,
:func:`attach_live`) is the same socket over the same ops, asking for the ``live``
surface: a WebRTC Live session's point is on its call's transceiver (the registry names
it), a Live-accepted SIP call's (``live_sip_X``) on its phone session's transceiver under
``rtc_sip_X`` (sip_calls.py: one record, two ids), a WebSocket one's is in this process (its shell runs here: :class:`LocalLink` answers
the ops in process instead of over a control connection). The first event is the session's
replay (``session.started``), the rest its observer stream.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ..control import ControlClient, ControlError
from ..realtime.protocol import MAX_EVENT_BYTES, EventError
from ..realtime.sideband import CLOSED_ENDED, CLOSED_SLOW, LIVE, POINTS, handle_op
from ..realtime.ws_session import SEND_GRACE, SocketClosed
from .realtime_http import Realtime, RealtimeProblem
from .rules import authorize_header
from .sip_call import CallError
from .sip_calls import CALL_ID_RE, LIVE_ID_RE, SipCalls

log = logging.getLogger("appliance.realtime.sideband")
QUEUE_LIMIT = 2048  # events waiting for this socket before it is closed as a slow reader
POLL_WAIT = 15.0  # seconds a poll may be held by the transceiver
MAX_CALL_ID = 128
CLOSE_NORMAL = 1000
CLOSE_SLOW_READER = 1008
CLOSE_LOST = 1011
END_CLIENT = "client_closed"
END_LOST = "transceiver_lost"


class Link(Protocol):
    """Where the ``realtime.*`` ops go: a transceiver's :class:`ControlClient`, or
    :class:`LocalLink` for a session that runs in this process."""

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]: ...

    async def aclose(self) -> None: ...


class LocalLink:
    """The ops answered in this process (a Live WebSocket session's point is here): the
    transceiver's own handler, over ``POINTS``; ``live(session_id)`` says whether the
    session is still running (its route's table)."""

    def __init__(self, live: Callable[[str], bool]) -> None:
        self._live = live

    def _state(self, session_id: str) -> str | None:
        return "active" if self._live(session_id) else None

    async def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        return await handle_op(str(msg.get("op")), msg, self._state)

    async def aclose(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Attached:
    call_id: str
    address: str  # the transceiver's control address (the poller's own connection)
    client: Link  # the shared one, for send and detach
    sideband_id: str
    controller: bool
    created: dict[str, Any]  # the replay: the first event (session.created / .started)
    poll: Link | None = None  # the poller's link, when attach made it (Live)


def parse_locks(value: str | None) -> list[str]:
    if not value:
        return []
    return [f.strip() for f in value.split(",") if f.strip()]


async def attach(rt: Realtime, call_id: str, authorization: str,
                 args: Any, sip: SipCalls | None = None) -> Attached:
    """Attach to ``call_id`` or raise a :class:`RealtimeProblem` (before the upgrade).

    A WebRTC call is found in the registry; a SIP call (``rtc_sip_…``, inbound or
    outbound) through ``sip``'s call control, on the transceiver carrying its phone
    session, whose session id is the call id: the same ops attach to its agent."""
    if not 0 < len(call_id) <= MAX_CALL_ID or not call_id.isprintable():
        raise RealtimeProblem(400, "invalid_value", "call_id is not a call id", "call_id")
    caller = rt.caller(authorization)
    if not caller.full_rights:
        raise RealtimeProblem(403, "insufficient_permissions", "a client secret cannot "
                              "attach to a call: the sideband needs the API token", "call_id")
    state = rt.state
    rec = state.registry.get(call_id)
    if rec is not None:  # a WebRTC call
        ep = state.health.transceivers.get(rec.transceiver)
        if rec.ended or ep is None:
            raise RealtimeProblem(410, "call_ended", f"call {call_id!r} has ended "
                                  f"({rec.end_reason or 'transceiver lost'})", "call_id")
    elif sip is not None and CALL_ID_RE.fullmatch(call_id):  # a phone call (SIP)
        try:
            k = sip.sideband_transceiver(call_id)
        except CallError as exc:
            raise RealtimeProblem(exc.status, exc.code, exc.message, "call_id") from None
        ep = state.health.transceivers.get(k)
        if ep is None:
            raise RealtimeProblem(410, "call_ended", f"call {call_id!r} has ended "
                                  "(transceiver lost)", "call_id")
    else:
        raise RealtimeProblem(404, "call_not_found", f"no call {call_id!r}", "call_id")
    req: dict[str, Any] = {"op": "realtime.attach", "session_id": call_id,
                           "locks": parse_locks(args.get("lock"))}
    if args.get("role"):
        req["role"] = args.get("role")
    try:
        resp = await ep.client.request(req)
    except ControlError:
        raise RealtimeProblem(503, "transceiver_unavailable", "the call's transceiver did "
                              "not answer", headers={"Retry-After": "1"}) from None
    if not resp.get("ok"):
        status = resp.get("status")
        raise RealtimeProblem(status if isinstance(status, int) else 500,
                              str(resp.get("code") or "attach_failed"),
                              str(resp.get("detail") or "the call refused the sideband"),
                              "call_id")
    created = resp.get("session_created")
    return Attached(call_id, ep.address, ep.client, str(resp.get("sideband_id")),
                    bool(resp.get("controller")), created if isinstance(created, dict) else {})


MAX_SESSION_ID = 128


async def attach_live(rt: Realtime, session_id: str, authorization: str, args: Any,
                      local: Callable[[str], bool], sip: SipCalls | None = None) -> Attached:
    """Attach to the GPT-Live session ``session_id`` or raise a :class:`RealtimeProblem`
    (before the upgrade). ``local(id)``: a WebSocket session of this process that has
    started; a ``live_sip_…`` id is a Live-accepted phone call of ``sip``'s (its point is
    on the transceiver of its phone session, under the call's ``rtc_sip_…`` id); any other
    is a WebRTC session of the registry, on its transceiver."""
    authorize_header(rt.state, authorization, sessions=False)  # the API token, as /v1
    graceful = args.get("graceful_close")
    if graceful is not None and graceful not in ("true", "false"):
        raise RealtimeProblem(400, "invalid_value", "graceful_close must be true or false",
                              "graceful_close")
    if not 0 < len(session_id) <= MAX_SESSION_ID or not session_id.isprintable():
        raise RealtimeProblem(400, "invalid_value", "the path does not name a session id",
                              "session_id")
    link: Link
    poll: Link
    address = ""
    target = session_id  # the session id the transceiver knows
    if local(session_id):
        link = poll = LocalLink(local)
    elif sip is not None and LIVE_ID_RE.fullmatch(session_id):  # a phone call (SIP)
        try:
            target = sip.from_live(session_id)
            k = sip.sideband_transceiver(target)
        except CallError as exc:  # 404 unknown, 409 ringing, 410 ended: named by our id
            code = {"call_not_found": "session_not_found",
                    "call_ended": "session_closed"}.get(exc.code, exc.code)
            raise RealtimeProblem(exc.status, code, exc.message.replace(target, session_id),
                                  "session_id") from None
        ep = rt.state.health.transceivers.get(k)
        if ep is None:
            raise RealtimeProblem(410, "session_closed", f"session {session_id!r} has "
                                  "ended (transceiver lost)", "session_id")
        link, address = ep.client, ep.address
        poll = ControlClient(address, timeout=POLL_WAIT + 10.0)
    else:
        rec = rt.state.registry.get(session_id)
        if rec is None or not session_id.startswith("live_"):
            raise RealtimeProblem(404, "session_not_found", f"no Live session "
                                  f"{session_id!r}", "session_id")
        ep = rt.state.health.transceivers.get(rec.transceiver)
        if rec.ended or ep is None:
            raise RealtimeProblem(410, "session_closed", f"session {session_id!r} has "
                                  f"ended ({rec.end_reason or 'transceiver lost'})",
                                  "session_id")
        link, address = ep.client, ep.address
        # the poller's own connection, which may wait for a session still connecting
        # (realtime/sideband.py ATTACH_WAIT) without holding up the shared one
        poll = ControlClient(address, timeout=POLL_WAIT + 10.0)
    try:
        resp = await poll.request({"op": "realtime.attach", "session_id": target,
                                   "surface": LIVE})
    except ControlError:
        await poll.aclose()
        raise RealtimeProblem(503, "transceiver_unavailable", "the session's transceiver "
                              "did not answer", headers={"Retry-After": "1"}) from None
    if not resp.get("ok"):
        await poll.aclose()
        status = resp.get("status")
        raise RealtimeProblem(status if isinstance(status, int) else 500,
                              str(resp.get("code") or "attach_failed"),
                              str(resp.get("detail") or "the session refused the sideband"),
                              "session_id")
    created = resp.get("session_created")
    return Attached(session_id, address, link, str(resp.get("sideband_id")), True,
                    created if isinstance(created, dict) else {}, poll)


def local_session(session_id: str) -> bool:
    """A Live WebSocket session of this process that has started (its point is in
    ``POINTS`` from ``session.started`` on)."""
    point = POINTS.get(session_id)
    return point is not None and point.surface == LIVE and not point.ended


class SidebandSocket:
    def __init__(self, att: Attached, *, queue_limit: int = QUEUE_LIMIT,
                 poll_client: ControlClient | None = None) -> None:
        self.att = att
        self.end_reason: str | None = None
        self.ending = trio.Event()  # set with end_reason (before the tasks have stopped)
        self.events_out = 0
        self._limit = queue_limit
        self._queue: deque[str] = deque()
        self._wake = trio.Event()
        self._empty = trio.Event()
        self._poll: Link = poll_client or att.poll or ControlClient(
            att.address, timeout=POLL_WAIT + 10.0)
        self._nursery: trio.Nursery | None = None

    async def run(self, receive: Callable[[], Awaitable[str | bytes]],
                  send: Callable[[str], Awaitable[None]]) -> str:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._push(json.dumps(self.att.created, separators=(",", ":")))
                nursery.start_soon(self._sender, send)
                nursery.start_soon(self._poller)
                while self.end_reason is None:
                    try:
                        data = await receive()
                    except SocketClosed:
                        break
                    await self._forward(data)
                self._end(END_CLIENT)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await self.att.client.request({"op": "realtime.detach",
                                                   "sideband_id": self.att.sideband_id})
                except ControlError:
                    pass  # the transceiver is gone: nothing is attached any more
                await self._poll.aclose()
        return self.end_reason or END_CLIENT

    def _end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self.ending.set()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _push(self, text: str) -> None:
        self._queue.append(text)
        self._wake.set()
        if len(self._queue) > self._limit:
            log.info("sideband %s: %d events unread, closing", self.att.sideband_id,
                     len(self._queue))
            self._end(CLOSED_SLOW)

    def _error(self, exc: EventError) -> None:
        self._push(json.dumps(exc.to_event(f"event_sb{self.events_out:x}")))

    async def _forward(self, data: str | bytes) -> None:
        if len(data) > MAX_EVENT_BYTES:
            self._error(EventError(f"the event is {len(data)} bytes; at most "
                                   f"{MAX_EVENT_BYTES}", code="event_too_large"))
            return
        try:
            event = json.loads(data)
        except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError is a ValueError)
            self._error(EventError(f"the event is not JSON: {type(exc).__name__}",
                                   code="invalid_json"))
            return
        try:
            resp = await self.att.client.request({"op": "realtime.send", "sideband_id":
                                                  self.att.sideband_id, "events": [event]})
        except ControlError:
            self._end(END_LOST)
            return
        if not resp.get("ok"):
            self._end(END_LOST if resp.get("code") != "unknown_sideband" else CLOSED_ENDED)

    async def _poller(self) -> None:
        while True:
            try:
                resp = await self._poll.request({"op": "realtime.poll", "sideband_id":
                                                 self.att.sideband_id, "wait": POLL_WAIT})
            except ControlError:
                self._end(END_LOST)
                return
            events = resp.get("events")
            for text in events if isinstance(events, list) else ():
                if isinstance(text, str):
                    self._push(text)
            closed = resp.get("closed")
            if closed:
                if closed != CLOSED_SLOW:  # the call's last events go out first
                    with trio.move_on_after(SEND_GRACE):
                        while self._queue:
                            self._empty = trio.Event()
                            await self._empty.wait()
                self._end(str(closed))
                return

    async def _sender(self, send: Callable[[str], Awaitable[None]]) -> None:
        while True:
            while self._queue:
                text = self._queue.popleft()
                # a frame half written cannot be taken back (ws_session.py does the same)
                with trio.CancelScope(shield=True), trio.move_on_after(SEND_GRACE):
                    await send(text)
                self.events_out += 1
            self._empty.set()
            self._wake = trio.Event()
            await self._wake.wait()


def close_code(reason: str) -> tuple[int, str]:
    if reason == CLOSED_SLOW:
        return CLOSE_SLOW_READER, "slow reader: events were not read"
    if reason == CLOSED_ENDED:
        return CLOSE_NORMAL, "the call ended"
    if reason == END_LOST:
        return CLOSE_LOST, "the call's transceiver stopped answering"
    return CLOSE_NORMAL, reason
