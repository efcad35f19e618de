"""Outbound phone calls (issue 28 item 5): place a call through a trunk of ``--sip-trunks``,
connect it to an agent when the callee answers, and say clearly why when it fails.

::

    POST /v1/realtime/calls/sip {"to", "trunk", "agent", "session"}   (sip_http.py)
      └► SipOutbound.place: OutboundPhoneMedia.offer ─► our SDP (SDES keys if srtp)
         resolve the trunk; TCP/TLS: SipService.connect
         SipEndpoint.invite(target, from, sdp, addr, transport, credentials)   "dialing"
      ◄─ 100 / 180 / 183 ─► CallProgress                                       "ringing"
      ◄─ 401 / 407 ─► the core answers one challenge (digest, proto/sip/auth.py)
      ◄─ 2xx ─► CallAnswered ─► ACK; OutboundPhoneMedia.answered(answer)       "active"
                                   refused ─► BYE, failure 488
      ◄─ 3xx-6xx ─► CallFailed                                                 "failed"
      no final answer in ring_timeout ─► CANCEL, failure 408 "no answer"       "failed"
      BYE either way / POST …/hangup ─► CallEnded                              "ended"

The call's id is ``rtc_`` + the core's id, the same shape as an incoming call's, so
``GET /v1/realtime/calls/{id}`` and ``POST …/{id}/hangup`` serve both. ``failure`` in the
view names what went wrong: ``{"status_code": 486, "reason": "Busy Here", "code": "busy"}``.
Credentials come from the trunk (sip_trunks.py) straight into the core; they are in no
view, event, log line or error.
"""

from __future__ import annotations

import logging
import secrets
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ..proto.sip import (
    CallAnswered,
    CallEnded,
    CallFailed,
    CallProgress,
    Dtmf,
    ReInvite,
    SipError,
    SipUsageError,
)
from ..proto.sip.message import parse_uri_untrusted
from .phone_media import MediaRefusal, OutboundPhoneMedia
from .sip_call import (
    DONE,
    PREFIX,
    CallError,
    CallRecord,
    CallState,
    Shell,
    SipCallControl,
    can_move,
    move,
)
from .sip_trunks import Trunk, TrunkError
from .webhooks import CALL_STARTED

if TYPE_CHECKING:
    from .state import SignalingState

log = logging.getLogger(__name__)

MAX_CALLS = 256  # outbound calls in progress at once
MAX_HEADERS = 16  # X- headers a caller may add to the INVITE

#: a failure's status -> its short code (the rest: "rejected" for 4xx, "trunk_error" 5xx,
#: "declined" 6xx)
_CODES = {401: "auth_failed", 407: "auth_failed", 403: "forbidden", 404: "not_found",
          408: "no_answer", 480: "unavailable", 484: "address_incomplete", 486: "busy",
          487: "cancelled", 488: "media_refused", 503: "trunk_unavailable", 600: "busy",
          603: "declined", 604: "not_found"}


def failure_code(status: int) -> str:
    if status in _CODES:
        return _CODES[status]
    return "rejected" if status < 500 else "trunk_error" if status < 600 else "declined"


@dataclass
class OutboundCall(CallRecord):
    """A call we place (sip_call.py's record: dialing | ringing | answering | active |
    failed | ended; ``dtmf``: SIP INFO digits from the callee)."""

    direction: ClassVar[str] = "outbound"
    trunk: str
    to: str
    agent: str
    session: dict[str, Any]
    state: CallState = field(default=CallState.DIALING, kw_only=True)
    failure: dict[str, Any] | None = None
    progress: int | None = None  # last provisional status (180, 183)
    from_uri: str | None = None  # the From we dialled with, for the report
    target: str | None = None  # the Request-URI we dialled
    sip_call_id: str | None = None  # the Call-ID header the core generated, for the report

    def view(self) -> dict[str, Any]:
        return {"id": self.call_id, "object": "realtime.call", "transport": "sip",
                "direction": "outbound", "status": self.state.value, "to": self.to,
                "trunk": self.trunk, "agent": self.agent, "created_at": self.created_at,
                "started_at": self.started_at, "ended_at": self.ended_at,
                "end_reason": self.end_reason, "hung_up_by": self.hung_up_by,
                "failure": self.failure, "progress": self.progress,
                "dtmf": "".join(self.dtmf[-64:])}

    def sip_ids(self) -> tuple[str | None, str | None, str | None]:
        return self.sip_call_id, self.from_uri, self.target

    def ended_data(self, report: dict[str, Any]) -> dict[str, Any]:
        return {"call_id": self.call_id, "transport": "sip", "direction": "outbound",
                "report": report}


class SipOutbound(SipCallControl[OutboundCall]):
    """The outbound calls of one signaling process (sip_calls.SipCalls hands it the
    endpoint's events for the calls it placed)."""

    #: the media may end a call once it is up
    MEDIA_LIVE = frozenset({CallState.ACTIVE})
    #: the core forgot a call the media ended: it ended here
    _media_forgotten = "api"

    def __init__(self, state: SignalingState, trunks: Mapping[str, Trunk],
                 media: OutboundPhoneMedia | None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(state, clock)
        self.trunks = dict(trunks)
        self.media = media
        self._by_sip: dict[str, str] = {}
        self._settled: dict[str, trio.Event] = {}  # set at the INVITE's final answer

    def _media(self) -> OutboundPhoneMedia | None:
        return self.media

    def attach(self, shell: Shell, nursery: trio.Nursery) -> None:
        self._shell, self._nursery = shell, nursery

    def owns(self, call_id: str) -> bool:
        return call_id in self.calls or call_id in self.ended

    # -- placing a call -------------------------------------------------------------------

    async def place(self, to: str, trunk_name: str | None, agent: str | None,
                    session: Mapping[str, Any],
                    headers: Mapping[str, str] | None = None) -> OutboundCall:
        """Start a call; returns at once with the call "dialing" (the INVITE is sent by a
        task; its progress shows in :meth:`get`)."""
        if self.media is None:
            raise CallError(501, "outbound_unsupported",
                                "this deployment's phone media cannot place calls")
        if not self.trunks:
            raise CallError(400, "no_trunks", "no trunk configured (--sip-trunks FILE)")
        if trunk_name is None:
            if len(self.trunks) != 1:
                raise CallError(400, "trunk_required",
                                    "name the trunk: " + ", ".join(sorted(self.trunks)))
            trunk_name = next(iter(self.trunks))
        trunk = self.trunks.get(trunk_name)
        if trunk is None:
            raise CallError(404, "trunk_not_found", f"no trunk {trunk_name!r}")
        try:
            target = trunk.target_uri(to)
            parse_uri_untrusted(target)
        except (TrunkError, SipError):
            raise CallError(400, "invalid_to", "'to' must be a sip:/tel: URI or a number") \
                from None
        extra = tuple((headers or {}).items())
        if len(extra) > MAX_HEADERS or any(
                not k.lower().startswith("x-") or not k[2:].replace("-", "").isalnum()
                or not v.isprintable() or len(v) > 256 for k, v in extra):
            raise CallError(400, "invalid_headers",
                                f"headers: at most {MAX_HEADERS} X-… names, printable values")
        if len(self.calls) >= MAX_CALLS:
            raise CallError(503, "too_many_calls", "too many outbound calls in progress")
        if self._nursery is None:
            raise CallError(503, "sip_not_running", "the SIP listener is not running")
        chosen = agent or trunk.agent or self.state.config.realtime_agent
        call = OutboundCall(PREFIX + "sip_" + secrets.token_hex(12), "", self.clock(),
                            trunk.name, to, chosen, dict(session))
        self.calls[call.call_id] = call
        self._count("placed")
        self._nursery.start_soon(self._dial, call, trunk, target, extra)
        return call

    async def _dial(self, call: OutboundCall, trunk: Trunk, target: str,
                    extra: tuple[tuple[str, str], ...]) -> None:
        try:
            await self._dial_inner(call, trunk, target, extra)
        except Exception:  # a bug (or a media backend's) must not take the SIP service down
            log.exception("sip: placing outbound call %s failed", call.call_id)
            if can_move(call.direction, call.state, CallState.FAILED):
                self._fail(call, 500, "internal error placing the call", "local_error")
            self._hangup_quietly(call)

    async def _dial_inner(self, call: OutboundCall, trunk: Trunk, target: str,
                          extra: tuple[tuple[str, str], ...]) -> None:
        media = self.media
        assert media is not None
        try:
            if trunk.transport == "udp":
                # the family of our UDP socket: a dual-stack name's AAAA first would not do
                family = trio.socket.AF_INET6 if ":" in self.shell.host else trio.socket.AF_INET
                infos = await trio.socket.getaddrinfo(trunk.host, trunk.port, family=family,
                                                      type=trio.socket.SOCK_DGRAM)
                if not infos:
                    raise OSError("no address")
                addr = (str(infos[0][4][0]), trunk.port)
            else:
                ctx = None
                if trunk.transport == "tls":
                    ctx = ssl.create_default_context(cafile=trunk.tls_ca)
                    if not trunk.tls_verify:
                        ctx.check_hostname = False
                        ctx.verify_mode = ssl.CERT_NONE
                addr = await self.shell.connect(trunk.host, trunk.port, trunk.transport,
                                                ssl_context=ctx)
        except (OSError, trio.BrokenResourceError) as exc:
            self._fail(call, 503, f"trunk unreachable: {type(exc).__name__}", "unreachable")
            return
        if call.state != CallState.DIALING:  # hung up while we connected
            return
        got = await media.offer(call.call_id, addr, call.agent, call.session,
                                secure=trunk.srtp)
        if isinstance(got, MediaRefusal):
            self._fail(call, got.status, got.text, "media_refused")
            return
        if call.state != CallState.DIALING:
            await media.end(call.call_id)
            return
        ep = self.shell.endpoint
        call.from_uri, call.target = trunk.from_uri, target
        try:
            sip_id = ep.invite(trio.current_time(), target, trunk.from_uri, got.sdp.encode(),
                               addr, trunk.transport, trunk.credentials, extra)
        except (SipError, SipUsageError) as exc:
            await media.end(call.call_id)
            self._fail(call, 500, f"could not send the INVITE: {type(exc).__name__}",
                       "local_error")
            return
        call.sip_id = sip_id
        call.sip_call_id = ep.sip_call_id(sip_id)
        # our call id was chosen before the core's: keep ours, map the core's to it
        self._by_sip[sip_id] = call.call_id
        settled = self._settled[call.call_id] = trio.Event()
        self.shell.drain()
        with trio.move_on_after(trunk.ring_timeout):
            await settled.wait()
        if not settled.is_set() and call.state in (CallState.DIALING, CallState.RINGING):
            # RFC 3261 §9.1: give up with CANCEL (the core waits for a provisional first)
            self._fail(call, 408, f"no answer within {trunk.ring_timeout:g} s", "no_answer")
            try:
                ep.hangup(trio.current_time(), sip_id)
            except SipUsageError:
                pass
            self.shell.drain()
        self._settled.pop(call.call_id, None)

    # -- events from the endpoint (sip_calls.SipCalls.on_event hands them over) -----------

    def on_event(self, ev: object) -> bool:
        """Handle an event of a call we placed; False for any other call's."""
        sip_id = getattr(ev, "call_id", None)
        cid = self._by_sip.get(sip_id) if isinstance(sip_id, str) else None
        if cid is None:
            return False
        call = self.calls.get(cid)
        if call is None:
            return True
        if isinstance(ev, CallProgress):
            call.progress = ev.status
            if call.state == CallState.DIALING:
                move(call, CallState.RINGING)
        elif isinstance(ev, CallAnswered):
            self._settle(call)
            if call.state in (CallState.DIALING, CallState.RINGING):
                move(call, CallState.ANSWERING)
                assert self._nursery is not None
                self._nursery.start_soon(self._answered, call, ev.answer_sdp)
        elif isinstance(ev, CallFailed):
            self._settle(call)
            if call.state in (CallState.DIALING, CallState.RINGING):
                # Timer B (§17.1.1.2): not even a provisional response came back
                code = "unreachable" if ev.status == 408 and call.progress is None \
                    and call.state == CallState.DIALING else failure_code(ev.status)
                self._fail(call, ev.status, ev.reason, code)
            else:
                self._retire(call, None)
        elif isinstance(ev, CallEnded):
            self._settle(call)
            by = "callee" if ev.by == "remote" else call.hung_up_by or "server"
            self._ended(call, ev.reason, by)
        elif isinstance(ev, Dtmf):
            call.dtmf.append(ev.digit)
            del call.dtmf[:-256]
        elif isinstance(ev, ReInvite):
            assert self._nursery is not None
            if call.state == CallState.ACTIVE:
                self._nursery.start_soon(self._reinvite, call, ev.offer_sdp)
            else:  # §14.2: not before the call is up (the core answers 500 before the ACK)
                try:
                    self.shell.endpoint.reject_reinvite(trio.current_time(), call.sip_id, 491)
                except SipUsageError:
                    pass
        else:
            self._count(f"event-{type(ev).__name__}")
        return True

    def _settle(self, call: OutboundCall) -> None:
        ev = self._settled.get(call.call_id)
        if ev is not None:
            ev.set()

    async def _answered(self, call: OutboundCall, answer: bytes) -> None:
        assert self.media is not None
        try:
            got = await self.media.answered(call.call_id, answer)
        except Exception:
            log.exception("sip: media for outbound call %s failed", call.call_id)
            got = MediaRefusal(500, "media could not be started")
        if call.state != CallState.ANSWERING:
            await self.media.end(call.call_id)  # ended while media was set up
            return
        if isinstance(got, MediaRefusal):
            # the callee's answer is unusable: the dialog exists, so BYE it
            self._count("answer-refused")
            call.failure = {"status_code": got.status, "reason": got.text,
                            "code": "media_refused"}
            call.hung_up_by = "server"
            self._hangup_core(call)
            return
        move(call, CallState.ACTIVE)
        call.started_at = self.clock()
        self._count("answered")
        self.state.webhooks.emit(CALL_STARTED, {"call_id": call.call_id, "transport": "sip",
                                                "direction": "outbound", "agent": call.agent,
                                                "model": call.session.get("model")
                                                if isinstance(call.session.get("model"), str)
                                                else None})

    # -- operations -----------------------------------------------------------------------

    def hangup(self, call_id: str) -> None:
        call = self.get(call_id)
        if call.state in DONE:
            raise CallError(409, "invalid_call_state", f"the call is {call.state}")
        call.hung_up_by = "api"
        if not call.sip_id:  # the INVITE is not out yet: _dial sees the state and stops
            self._ended(call, "hangup", "api")
            return
        self._hangup_core(call)

    def _hangup_quietly(self, call: OutboundCall) -> None:
        if call.sip_id and self._shell is not None:
            try:
                self._shell.endpoint.hangup(trio.current_time(), call.sip_id)
            except SipUsageError:
                return
            self._shell.drain()

    # -- internals ------------------------------------------------------------------------

    def _fail(self, call: OutboundCall, status: int, reason: str, code: str) -> None:
        if call.state in DONE:
            return
        call.failure = {"status_code": status, "reason": reason[:200], "code": code}
        move(call, CallState.FAILED)
        call.end_reason = f"{status} {reason}"[:200]
        self._count(f"failed-{code}")
        log.info("sip: outbound call %s through %s failed: %s %s", call.call_id, call.trunk,
                 status, code)
        self._retire(call, None)

    def _ended(self, call: OutboundCall, reason: str, by: str) -> None:
        if call.state in DONE:
            self._retire(call, None)
            return
        started = call.state == CallState.ACTIVE
        move(call, CallState.FAILED if call.failure is not None and not started
             else CallState.ENDED)
        call.end_reason = call.end_reason or reason
        call.hung_up_by = call.hung_up_by or by
        self._retire(call, reason if started else None)

    def _retired(self, call: OutboundCall) -> None:
        # the core's id stays mapped while the call is kept, so the events it still has for
        # the call (CallEnded after our CANCEL, a late 487) are recognised as ours
        self._settle(call)

    def _forgotten(self, call: OutboundCall) -> None:
        self._by_sip.pop(call.sip_id, None)
