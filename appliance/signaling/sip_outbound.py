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
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ..proto.sdp.phone import PhoneRefusal, warning_header
from ..proto.sip import (
    CallAnswered,
    CallEnded,
    CallFailed,
    CallProgress,
    Dtmf,
    ReInvite,
    SipEndpoint,
    SipError,
    SipUsageError,
)
from ..proto.sip.message import parse_uri_untrusted
from .phone_media import MediaRefusal, OutboundPhoneMedia
from .sip_trunks import Trunk, TrunkError
from .webhooks import CALL_ENDED, CALL_STARTED, end_report, report_stats, sip_report

if TYPE_CHECKING:
    from .state import SignalingState

log = logging.getLogger(__name__)

PREFIX = "rtc_"
MAX_CALLS = 256  # outbound calls in progress at once
MAX_ENDED = 256
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


class OutboundError(Exception):
    """What the HTTP route answers (status, OpenAI-style error code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class Shell(Protocol):
    """The part of sip_server.SipService outbound calls use."""

    endpoint: SipEndpoint
    host: str

    def drain(self) -> None: ...

    async def connect(self, host: str, port: int, transport: str, *,
                      server_hostname: str | None = None,
                      ssl_context: ssl.SSLContext | None = None) -> tuple[str, int]: ...


@dataclass
class OutboundCall:
    call_id: str  # rtc_sip_…
    sip_id: str  # the endpoint's sip_… ("" until the INVITE is sent)
    trunk: str
    to: str
    agent: str
    session: dict[str, Any]
    created_at: float
    state: str = "dialing"  # dialing | ringing | answering | active | failed | ended
    started_at: float | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    hung_up_by: str | None = None
    failure: dict[str, Any] | None = None
    progress: int | None = None  # last provisional status (180, 183)
    dtmf: list[str] = field(default_factory=list)  # SIP INFO digits from the callee
    media_reason: str | None = None  # why the media ended the call, when it did
    from_uri: str | None = None  # the From we dialled with, for the report
    target: str | None = None  # the Request-URI we dialled
    sip_call_id: str | None = None  # the Call-ID header the core generated, for the report

    def view(self) -> dict[str, Any]:
        return {"id": self.call_id, "object": "realtime.call", "transport": "sip",
                "direction": "outbound", "status": self.state, "to": self.to,
                "trunk": self.trunk, "agent": self.agent, "created_at": self.created_at,
                "started_at": self.started_at, "ended_at": self.ended_at,
                "end_reason": self.end_reason, "hung_up_by": self.hung_up_by,
                "failure": self.failure, "progress": self.progress,
                "dtmf": "".join(self.dtmf[-64:])}


class SipOutbound:
    """The outbound calls of one signaling process (sip_calls.SipCalls hands it the
    endpoint's events for the calls it placed)."""

    def __init__(self, state: SignalingState, trunks: Mapping[str, Trunk],
                 media: OutboundPhoneMedia | None,
                 clock: Callable[[], float] | None = None) -> None:
        self.state = state
        self.trunks = dict(trunks)
        self.media = media
        self.clock = clock or state.clock
        self.calls: dict[str, OutboundCall] = {}
        self.ended: OrderedDict[str, OutboundCall] = OrderedDict()
        self._by_sip: dict[str, str] = {}
        self._settled: dict[str, trio.Event] = {}  # set at the INVITE's final answer
        self._shell: Shell | None = None
        self._nursery: trio.Nursery | None = None
        self.counters: dict[str, int] = {}

    def attach(self, shell: Shell, nursery: trio.Nursery) -> None:
        self._shell, self._nursery = shell, nursery

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def shell(self) -> Shell:
        if self._shell is None:
            raise OutboundError(503, "sip_not_running", "the SIP listener is not running")
        return self._shell

    def owns(self, call_id: str) -> bool:
        return call_id in self.calls or call_id in self.ended

    def get(self, call_id: str) -> OutboundCall:
        call = self.calls.get(call_id) or self.ended.get(call_id)
        if call is None:
            raise OutboundError(404, "call_not_found", f"no SIP call {call_id}")
        return call

    # -- placing a call -------------------------------------------------------------------

    async def place(self, to: str, trunk_name: str | None, agent: str | None,
                    session: Mapping[str, Any],
                    headers: Mapping[str, str] | None = None) -> OutboundCall:
        """Start a call; returns at once with the call "dialing" (the INVITE is sent by a
        task; its progress shows in :meth:`get`)."""
        if self.media is None:
            raise OutboundError(501, "outbound_unsupported",
                                "this deployment's phone media cannot place calls")
        if not self.trunks:
            raise OutboundError(400, "no_trunks", "no trunk configured (--sip-trunks FILE)")
        if trunk_name is None:
            if len(self.trunks) != 1:
                raise OutboundError(400, "trunk_required",
                                    "name the trunk: " + ", ".join(sorted(self.trunks)))
            trunk_name = next(iter(self.trunks))
        trunk = self.trunks.get(trunk_name)
        if trunk is None:
            raise OutboundError(404, "trunk_not_found", f"no trunk {trunk_name!r}")
        try:
            target = trunk.target_uri(to)
            parse_uri_untrusted(target)
        except (TrunkError, SipError):
            raise OutboundError(400, "invalid_to", "'to' must be a sip:/tel: URI or a number") \
                from None
        extra = tuple((headers or {}).items())
        if len(extra) > MAX_HEADERS or any(
                not k.lower().startswith("x-") or not k[2:].replace("-", "").isalnum()
                or not v.isprintable() or len(v) > 256 for k, v in extra):
            raise OutboundError(400, "invalid_headers",
                                f"headers: at most {MAX_HEADERS} X-… names, printable values")
        if len(self.calls) >= MAX_CALLS:
            raise OutboundError(503, "too_many_calls", "too many outbound calls in progress")
        if self._nursery is None:
            raise OutboundError(503, "sip_not_running", "the SIP listener is not running")
        chosen = agent or trunk.agent or self.state.config.realtime_agent
        call = OutboundCall(PREFIX + "sip_" + secrets.token_hex(12), "", trunk.name, to, chosen,
                            dict(session), self.clock())
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
        if call.state != "dialing":  # hung up while we connected
            return
        got = await media.offer(call.call_id, addr, call.agent, call.session,
                                secure=trunk.srtp)
        if isinstance(got, MediaRefusal):
            self._fail(call, got.status, got.text, "media_refused")
            return
        if call.state != "dialing":
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
        if not settled.is_set() and call.state in ("dialing", "ringing"):
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
            if call.state == "dialing":
                call.state = "ringing"
        elif isinstance(ev, CallAnswered):
            self._settle(call)
            if call.state in ("dialing", "ringing"):
                call.state = "answering"
                assert self._nursery is not None
                self._nursery.start_soon(self._answered, call, ev.answer_sdp)
        elif isinstance(ev, CallFailed):
            self._settle(call)
            if call.state in ("dialing", "ringing"):
                # Timer B (§17.1.1.2): not even a provisional response came back
                code = "unreachable" if ev.status == 408 and call.progress is None \
                    and call.state == "dialing" else failure_code(ev.status)
                self._fail(call, ev.status, ev.reason, code)
            else:
                self._finish(call)
        elif isinstance(ev, CallEnded):
            self._settle(call)
            by = "callee" if ev.by == "remote" else call.hung_up_by or "server"
            self._ended(call, ev.reason, by)
        elif isinstance(ev, Dtmf):
            call.dtmf.append(ev.digit)
            del call.dtmf[:-256]
        elif isinstance(ev, ReInvite):
            assert self._nursery is not None
            if call.state == "active":
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
        if call.state != "answering":
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
        call.state = "active"
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
        if call.state in ("failed", "ended"):
            raise OutboundError(409, "invalid_call_state", f"the call is {call.state}")
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

    async def _reinvite(self, call: OutboundCall, offer: bytes) -> None:
        """The callee's re-INVITE (hold, unhold, a new address): the media's new answer."""
        assert self.media is not None
        try:
            got = await self.media.update(call.call_id, offer)
        except Exception:
            log.exception("sip: re-INVITE of outbound call %s failed", call.call_id)
            got = MediaRefusal(500, "media could not be updated")
        if call.state != "active" or self._shell is None:
            return
        ep, now = self._shell.endpoint, trio.current_time()
        try:
            if isinstance(got, MediaRefusal):
                ep.reject_reinvite(now, call.sip_id, 488, warning=warning_header(
                    self._shell.host, PhoneRefusal(got.text)))
            else:
                ep.answer_reinvite(now, call.sip_id, got.sdp.encode())
        except SipUsageError:
            return
        self._shell.drain()

    def _hangup_core(self, call: OutboundCall) -> None:
        try:
            self.shell.endpoint.hangup(trio.current_time(), call.sip_id)
        except SipUsageError:
            self._ended(call, "hangup", call.hung_up_by or "api")  # the core forgot it
        self.shell.drain()

    def media_ended(self, call_id: str, reason: str) -> bool:
        """The agent or its media ended the call: BYE (False when not ours)."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        if call.state == "active":
            call.hung_up_by = "agent" if "agent" in reason else "server"
            call.media_reason = reason
            self._hangup_core(call)
        return True

    # -- internals ------------------------------------------------------------------------

    def _fail(self, call: OutboundCall, status: int, reason: str, code: str) -> None:
        if call.state in ("failed", "ended"):
            return
        call.failure = {"status_code": status, "reason": reason[:200], "code": code}
        call.state = "failed"
        call.end_reason = f"{status} {reason}"[:200]
        self._count(f"failed-{code}")
        log.info("sip: outbound call %s through %s failed: %s %s", call.call_id, call.trunk,
                 status, code)
        self._finish(call)

    def _ended(self, call: OutboundCall, reason: str, by: str) -> None:
        if call.state in ("failed", "ended"):
            self._finish(call)
            return
        started = call.state == "active"
        call.state = "failed" if call.failure is not None and not started else "ended"
        call.end_reason = call.end_reason or reason
        call.hung_up_by = call.hung_up_by or by
        self._finish(call, report=reason if started else None)

    def _report(self, call: OutboundCall, reason: str, session: dict[str, Any] | None) -> None:
        """``realtime.call.ended`` for an answered call: as sip_calls.SipCalls._report."""
        report = end_report(started_at=call.started_at or call.created_at,
                            ended_at=call.ended_at or self.clock(), reason=reason,
                            stats=report_stats(session),
                            transcript=session.get("transcript") if session else None,
                            turns=session.get("turns") if session else None)
        report["hung_up_by"] = call.hung_up_by
        report["sip"] = sip_report(direction="outbound", sip_call_id=call.sip_call_id,
                                   from_=call.from_uri, to=call.target,
                                   cause=call.media_reason or reason, dtmf="".join(call.dtmf))
        self.state.webhooks.emit(CALL_ENDED, {"call_id": call.call_id, "transport": "sip",
                                              "direction": "outbound", "report": report})

    async def _end_and_report(self, call: OutboundCall, reason: str | None) -> None:
        assert self.media is not None
        session = await self.media.end(call.call_id)
        if reason is not None:
            self._report(call, reason, session)

    def _finish(self, call: OutboundCall, *, report: str | None = None) -> None:
        """``report``: the end reason of an answered call, whose ended event goes out once
        its media has ended (and said what it carried)."""
        if call.ended_at is None:
            call.ended_at = self.clock()
        if self.calls.pop(call.call_id, None) is None:
            if report is not None:
                self._report(call, report, None)
            return
        # the core's id stays mapped while the call is kept, so the events it still has for
        # the call (CallEnded after our CANCEL, a late 487) are recognised as ours
        self._settle(call)
        self.ended[call.call_id] = call
        while len(self.ended) > MAX_ENDED:
            _, old = self.ended.popitem(last=False)
            self._by_sip.pop(old.sip_id, None)
        if self._nursery is not None and self.media is not None:
            self._nursery.start_soon(self._end_and_report, call, report)
        elif report is not None:
            self._report(call, report, None)
