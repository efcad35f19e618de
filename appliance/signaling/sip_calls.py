"""Call control for phone calls, shaped like OpenAI's Realtime SIP: a trunk's INVITE rings,
``realtime.call.incoming`` is POSTed to the webhook endpoints, and the application answers
over HTTP (sip_http.py) with accept / reject, later refer / hangup. GPT-Live's surface is
the same pending call under a second id: ``live.transport.incoming`` beside
``realtime.call.incoming``, and ``POST /v1/live/sessions/{id}/accept|reject|refer|hangup``
(live_http.py) on the same :class:`SipCall`; the first accept on either surface wins.

::

    trunk INVITE ─► SipEndpoint: 100 Trying ─► IncomingCall ─► SipCalls.on_event
                      offer unreadable: 400; unservable: 488 + Warning (no webhook)
                      180 Ringing; webhook realtime.call.incoming {call_id, sip_headers}
                        and live.transport.incoming {session_id, type: "sip", sip_headers}
                      (no --webhook-url: --sip-agent answers at once; neither: 480)
    POST …/{call_id}/accept  ─► PhoneMedia.create ─► 200 OK + SDP ─► ACK ─► "active"
    POST …/{call_id}/reject  ─► 603 (or status_code)
    POST …/{call_id}/refer   ─► REFER; NOTIFY progress; a final 2xx ─► BYE (transferred)
    POST …/{call_id}/hangup  ─► BYE (603 while ringing)
    nobody answers within answer_timeout ─► 480 (the core's ring timer)

Call ids are ``rtc_`` + the SIP core's own id (``rtc_sip_<24 hex>``): never derived from
the trunk's Call-ID. The call's Live id is ``live_`` + the same core id (``live_sip_<24
hex>``, :func:`live_id` / :meth:`SipCalls.from_live`): one record, two names, no second
table to keep in step. The endpoint is driven only from the trio thread; every operation here
is followed by the shell's ``drain()`` (house rule: poll_output after every mutation).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ..proto.errors import ProtocolError
from ..proto.sdp.parse import parse_offer_untrusted
from ..proto.sdp.phone import PhonePlan, PhoneRefusal, choose_phone_audio, warning_header
from ..proto.sip import (
    CallAcked,
    CallCancelled,
    CallEnded,
    Dtmf,
    IncomingCall,
    ReferProgress,
    ReInvite,
    SipError,
    SipUsageError,
)
from .phone_media import MediaRefusal, PhoneMedia, RelayAnswerMedia, TransceiverPhoneMedia
from .sip_call import DONE, PREFIX, CallError, CallRecord, CallState, Shell, SipCallControl, move
from .sip_config import SipSettings
from .sip_outbound import SipOutbound
from .webhooks import CALL_STARTED

if TYPE_CHECKING:
    from .state import SignalingState

log = logging.getLogger(__name__)

CALL_INCOMING = "realtime.call.incoming"
CALL_ID_RE = re.compile(r"rtc_sip_[0-9a-f]{24}")
#: GPT-Live's (the SDK's ``LiveTransportIncomingWebhookEvent``): ``data`` is
#: ``{session_id: "live_…", type: "sip", sip_headers, sip_media_security}``. The deprecated
#: ``live.call.incoming`` (the same without ``type``) is for "existing subscriptions" only,
#: and webhook endpoints here have no subscriptions (every endpoint gets every event):
#: it is never sent.
LIVE_INCOMING = "live.transport.incoming"
LIVE_PREFIX = "live_"
LIVE_ID_RE = re.compile(r"live_sip_[0-9a-f]{24}")
#: the surfaces an incoming call can be accepted on (the first accept picks one)
REALTIME, LIVE = "realtime", "live"
_SURFACE_ROUTE = {REALTIME: "POST /v1/realtime/calls/{id}/accept",
                  LIVE: "POST /v1/live/sessions/{id}/accept"}
#: never forwarded in a webhook (OpenAI: "excluding SIP authorization headers")
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization"})
MAX_HEADERS = 64  # sip_headers entries in one webhook


@dataclass
class SipCall(CallRecord):
    """An incoming call (sip_call.py's record: ringing | accepting | answered | active |
    ended)."""

    direction: ClassVar[str] = "inbound"
    incoming: IncomingCall
    agent: str | None = None
    refer: list[dict[str, Any]] = field(default_factory=list)
    #: the surface whose accept won (``realtime`` | ``live``), None until one accepts
    surface: str | None = None

    @property
    def live_id(self) -> str:
        """The call's GPT-Live ``session_id`` (``live_sip_…``)."""
        return LIVE_PREFIX + self.sip_id

    def view(self) -> dict[str, Any]:
        return {"id": self.call_id, "object": "realtime.call", "transport": "sip",
                "live_session_id": self.live_id, "accepted_via": self.surface,
                "status": self.state.value, "agent": self.agent,
                "created_at": self.created_at, "started_at": self.started_at,
                "ended_at": self.ended_at, "end_reason": self.end_reason,
                "dtmf": "".join(self.dtmf[-64:]), "refer": self.refer[-8:]}

    def sip_ids(self) -> tuple[str | None, str | None, str | None]:
        invite = self.incoming.invite
        return invite.get("Call-ID"), invite.get("From"), invite.get("To")

    def ended_data(self, report: dict[str, Any]) -> dict[str, Any]:
        return {"call_id": self.call_id, "transport": "sip", "agent": self.agent,
                "model": None, "report": report}


def sip_headers(call: IncomingCall) -> list[dict[str, str]]:
    """The INVITE's headers as OpenAI's ``sip_headers``: names, values, repeats and order
    kept, authorization headers dropped. Untrusted text: the receiver treats it so."""
    out = [{"name": k, "value": v} for k, v in call.sip_headers
           if k.lower() not in _SECRET_HEADERS]
    return out[:MAX_HEADERS]


def media_security(plan: PhonePlan | PhoneRefusal | None) -> str | None:
    """``sip_media_security`` of the Live webhook: ``srtp`` when the offer we will answer
    is RTP/SAVP (SDES), ``rtp`` for plain RTP, None when there was no offer to judge (an
    INVITE without SDP: the medium is settled by our offer later)."""
    if not isinstance(plan, PhonePlan):
        return None
    return "srtp" if plan.secure else "rtp"


class SipCalls(SipCallControl[SipCall]):
    """The phone calls of this signaling process and the operations on them (the incoming
    ones here; the ones we place in :attr:`outbound`)."""

    #: the media may end a call once our 200 OK is out
    MEDIA_LIVE = frozenset({CallState.ANSWERED, CallState.ACTIVE})

    def __init__(self, state: SignalingState, settings: SipSettings,
                 media: PhoneMedia | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        super().__init__(state, clock)
        self.settings = settings
        if media is None:
            cfg = state.config
            media = RelayAnswerMedia(cfg.public_addresses[0], cfg.udp_port)
        self.media = media
        media.bind(self)
        #: the calls we place (sip_outbound.py); their events and media go there
        self.outbound: SipOutbound | None = None

    def _media(self) -> PhoneMedia:
        return self.media

    # -- wiring (sip_server.serve_sip) ------------------------------------------------------

    def attach(self, shell: Shell, nursery: trio.Nursery) -> None:
        self._shell, self._nursery = shell, nursery
        self.media.start(nursery)

    @property
    def running(self) -> Shell | None:
        """The shell once serve_sip runs (the metrics read its counters), else None."""
        return self._shell

    @property
    def has_webhooks(self) -> bool:
        return bool(self.state.webhooks.queue.endpoints)

    # -- events from the endpoint (called by the shell's drain, synchronously) --------------

    def on_event(self, ev: object) -> None:
        if self.outbound is not None and self.outbound.on_event(ev):
            return
        if isinstance(ev, IncomingCall):
            self._incoming(ev)
        elif isinstance(ev, CallAcked):
            call = self._by_sip(ev.call_id)
            if call is not None and call.state == CallState.ANSWERED:
                move(call, CallState.ACTIVE)
        elif isinstance(ev, CallCancelled):
            call = self._by_sip(ev.call_id)
            if call is not None:
                self._ended(call, "cancelled", "client")
        elif isinstance(ev, CallEnded):
            call = self._by_sip(ev.call_id)
            if call is not None:
                by = "client" if ev.by == "remote" else call.hung_up_by or "server"
                self._ended(call, ev.reason, by)
        elif isinstance(ev, Dtmf):
            call = self._by_sip(ev.call_id)
            if call is not None:
                self.dtmf(call.call_id, ev.digit, ev.duration_ms)
                if self._nursery is not None:  # SIP INFO: the agent hears it from media
                    self._nursery.start_soon(self.media.dtmf, call.call_id, ev.digit,
                                             ev.duration_ms)
        elif isinstance(ev, ReInvite):
            call = self._by_sip(ev.call_id)
            if call is not None and self._nursery is not None:
                self._nursery.start_soon(self._reinvite, call, ev.offer_sdp)
        elif isinstance(ev, ReferProgress):
            self._refer_progress(ev)
        else:
            self._count(f"event-{type(ev).__name__}")

    def _by_sip(self, sip_id: str) -> SipCall | None:
        return self.calls.get(PREFIX + sip_id)

    def _incoming(self, ev: IncomingCall) -> None:
        ep, now = self.shell.endpoint, trio.current_time()
        host = self.shell.host
        plan: PhonePlan | PhoneRefusal | None = None
        if ev.offer_sdp.strip():
            try:
                plan = choose_phone_audio(parse_offer_untrusted(ev.offer_sdp))
            except ProtocolError:
                self._count("rejected-bad-sdp")
                ep.reject(now, ev.call_id, 400, "Bad SDP Offer")
                return
            if isinstance(plan, PhoneRefusal):
                self._count("rejected-488")
                ep.reject(now, ev.call_id, plan.status, warning=warning_header(host, plan))
                return
        call = SipCall(PREFIX + ev.call_id, ev.call_id, self.clock(), ev)
        self.calls[call.call_id] = call
        ep.ringing(now, ev.call_id)
        if self.has_webhooks:
            # both surfaces hear of the call; the first accept on either wins
            headers = sip_headers(ev)
            self.state.webhooks.emit(CALL_INCOMING, {"call_id": call.call_id,
                                                     "sip_headers": headers})
            live: dict[str, Any] = {"session_id": call.live_id, "type": "sip",
                                    "sip_headers": headers}
            security = media_security(plan)
            if security is not None:
                live["sip_media_security"] = security
            self.state.webhooks.emit(LIVE_INCOMING, live)
        elif self.settings.agent is not None and self._nursery is not None:
            self._nursery.start_soon(self._auto_accept, call.call_id, self.settings.agent)
        else:
            # nobody could ever answer: say so now rather than after the ring timeout
            ep.reject(now, ev.call_id, 480, "No Call Control Configured")

    async def _auto_accept(self, call_id: str, agent: str) -> None:
        try:
            await self.accept(call_id, {"type": "realtime"}, agent)
        except CallError as exc:
            log.info("sip: auto-accept of %s failed: %s", call_id, exc.message)

    # -- operations (sip_http.py) ----------------------------------------------------------

    def _live(self, call_id: str, *states: CallState) -> SipCall:
        call = self.get(call_id)
        if call.state not in states:
            raise CallError(409, "invalid_call_state",
                            f"the call is {call.state}; this needs {' or '.join(states)}")
        return call

    def from_live(self, session_id: str) -> str:
        """The call id (``rtc_sip_…``) of a Live ``session_id`` (``live_sip_…``);
        :class:`CallError` 404 for any other id."""
        if not LIVE_ID_RE.fullmatch(session_id):
            raise CallError(404, "session_not_found", f"no SIP Live session {session_id[:64]!r}")
        return PREFIX + session_id[len(LIVE_PREFIX):]

    async def accept(self, call_id: str, session: dict[str, Any], agent: str | None, *,
                     surface: str = REALTIME, params: dict[str, Any] | None = None) -> None:
        """Answer a ringing call. ``surface``: the API the accept came through; the first
        accept wins, another surface's gets 409 ``call_accepted_on_other_surface``.
        ``params``: more of the agent's ``ctx.params`` (a Live accept's ``live``)."""
        call = self.get(call_id)
        if call.surface is not None and call.surface != surface:
            route = _SURFACE_ROUTE[call.surface].format(
                id=call.live_id if call.surface == LIVE else call.call_id)
            raise CallError(409, "call_accepted_on_other_surface",
                            f"the call was already accepted through the {call.surface} API "
                            f"({route}); the first accept on either surface wins")
        call = self._live(call_id, CallState.RINGING)
        call.surface = surface
        move(call, CallState.ACCEPTING)
        call.agent = agent or self.settings.agent or self.state.config.realtime_agent
        got = await self.media.create(call.call_id, call.incoming.offer_sdp,
                                      call.incoming.source, call.agent, session, params=params)
        if call.state != CallState.ACCEPTING:  # cancelled or timed out while media was set up
            await self.media.end(call.call_id)
            raise CallError(409, "invalid_call_state", f"the call {call.state} while accepting")
        ep, now = self.shell.endpoint, trio.current_time()
        if isinstance(got, MediaRefusal):
            ep.reject(now, call.sip_id, got.status,
                      warning=warning_header(self.shell.host, PhoneRefusal(got.text, got.status)))
            self.shell.drain()
            raise CallError(400 if got.status == 488 else 503, "media_refused", got.text)
        ep.accept(now, call.sip_id, got.sdp.encode())
        move(call, CallState.ANSWERED)
        call.started_at = self.clock()
        self.shell.drain()
        self.state.webhooks.emit(CALL_STARTED, {"call_id": call.call_id, "transport": "sip",
                                                "agent": call.agent,
                                                "model": session.get("model")
                                                if isinstance(session.get("model"), str) else None})

    def reject(self, call_id: str, status: int = 603) -> None:
        call = self._live(call_id, CallState.RINGING)
        call.hung_up_by = "api"
        self.shell.endpoint.reject(trio.current_time(), call.sip_id, status)
        self.shell.drain()

    def refer(self, call_id: str, target_uri: str) -> None:
        call = self._live(call_id, CallState.ACTIVE)
        try:
            self.shell.endpoint.refer(trio.current_time(), call.sip_id, target_uri)
        except SipError:
            raise CallError(400, "invalid_target_uri", "target_uri is not a SIP/tel URI") from None
        call.refer.append({"target_uri": target_uri, "status": None, "final": False})
        self.shell.drain()

    def hangup(self, call_id: str) -> None:
        call = self._live(call_id, CallState.RINGING, CallState.ACCEPTING,
                          CallState.ANSWERED, CallState.ACTIVE)
        call.hung_up_by = "api"
        if call.state == CallState.ACCEPTING:
            # media is being set up: answer the INVITE with a final refusal now
            self.shell.endpoint.reject(trio.current_time(), call.sip_id, 603)
            self.shell.drain()
        else:
            self._hangup_core(call)  # the core already forgot it: ended here, by the API

    def sideband_transceiver(self, call_id: str) -> int:
        """The transceiver to attach ``GET /v1/realtime?call_id=`` to (signaling/sideband.py):
        the one running this SIP call's (inbound or outbound) phone session and agent.
        :class:`CallError` 404 (no such SIP call), 410 (it ended), 409 (no agent yet:
        ringing and not accepted, or no transceivers behind this signaling)."""
        call: CallRecord
        if self.outbound is not None and self.outbound.owns(call_id):
            call = self.outbound.get(call_id)
        else:
            call = self.get(call_id)
        if call.state in DONE:
            raise CallError(410, "call_ended", f"call {call_id!r} has ended "
                            f"({call.end_reason or call.state})")
        k = self.media.transceiver_of(call_id) \
            if isinstance(self.media, TransceiverPhoneMedia) else None
        if k is None:
            raise CallError(409, "call_not_answered", f"call {call_id!r} is {call.state}: "
                            "no agent runs it yet (accept it first)")
        return k

    # -- PhoneMediaListener --------------------------------------------------------------

    def media_ended(self, call_id: str, reason: str) -> bool:
        if self.outbound is not None and self.outbound.media_ended(call_id, reason):
            return True
        return super().media_ended(call_id, reason)

    def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None:
        call = self.calls.get(call_id)
        if call is not None:
            call.dtmf.append(digit)
            del call.dtmf[:-256]

    # -- internals ------------------------------------------------------------------------

    def _refer_progress(self, ev: ReferProgress) -> None:
        call = self._by_sip(ev.call_id)
        if call is None:
            return
        if call.refer:
            call.refer[-1].update(status=ev.status, reason=ev.reason, final=ev.final)
        if ev.final and 200 <= ev.status < 300 and call.state == CallState.ACTIVE:
            # RFC 5589 §6.1: the transfer succeeded; the transferor leaves the call
            call.hung_up_by = "api"
            try:
                self.shell.endpoint.hangup(trio.current_time(), call.sip_id)
            except SipUsageError:
                pass

    def _ended(self, call: SipCall, reason: str, by: str) -> None:
        if call.state == CallState.ENDED:
            return
        started = call.state in self.MEDIA_LIVE
        move(call, CallState.ENDED)
        call.ended_at = self.clock()
        call.end_reason = reason
        call.hung_up_by = call.hung_up_by or by
        # an answered call's report waits for the media's session object
        self._retire(call, reason if started else None)
