"""One SIP call lifecycle for both directions: the call record, its states as an enum with a
table of legal moves, the one error call control answers with, and the controller logic an
incoming call (sip_calls.py) and a call we place (sip_outbound.py) share — re-INVITEs, the
media ending the call, retiring an ended call and its end-of-call report.

States and moves (h11's ``_state.py`` shape: one table per role, an illegal move raises)::

    inbound   ringing ─► accepting ─► answered ─► active ─► ended
                 │           │            │
                 └───────────┴────────────┴──────────────► ended   (CANCEL, 480, BYE, hangup)

    outbound  dialing ─► ringing ─► answering ─► active ─► ended
              dialing ─► answering                     (a 2xx with no provisional before it)
              dialing, ringing, answering ─► failed    (3xx-6xx, no answer, media refused)
              dialing, ringing, answering ─► ended     (hung up, or the callee left, first)

    failed and ended have no move out.

``dialing`` (the INVITE is not settled, no provisional yet) and ``answering`` (a 2xx came,
our media is being started) are the outbound's; ``accepting`` (the application accepted,
media is being set up) and ``answered`` (our 200 OK is out, no ACK yet) the inbound's.
JSON views carry the same strings they always did (``CallState`` is a ``StrEnum``).
"""

from __future__ import annotations

import enum
import logging
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

import trio

from ..proto.sdp.phone import PhoneRefusal, warning_header
from ..proto.sip import SipEndpoint, SipUsageError
from .phone_media import MediaAnswer, MediaRefusal
from .webhooks import CALL_ENDED, end_report, sip_report

if TYPE_CHECKING:
    from .state import SignalingState

log = logging.getLogger(__name__)

PREFIX = "rtc_"
MAX_ENDED = 256  # ended calls kept for GET


class CallError(Exception):
    """What an HTTP route answers (status, OpenAI-style error code, message)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class IllegalMove(CallError):
    """Call control tried a move its table does not have (a bug here, never the peer's
    doing: h11's LocalProtocolError)."""

    def __init__(self, direction: str, old: CallState, new: CallState) -> None:
        super().__init__(500, "illegal_call_state",
                         f"{direction} call: no move from {old.value} to {new.value}")
        self.old, self.new = old, new


class CallState(enum.StrEnum):
    DIALING = "dialing"
    RINGING = "ringing"
    ACCEPTING = "accepting"
    ANSWERING = "answering"
    ANSWERED = "answered"
    ACTIVE = "active"
    FAILED = "failed"
    ENDED = "ended"


S = CallState
#: every legal move, per direction; a state absent as a key has no move out of it
MOVES: dict[str, dict[CallState, frozenset[CallState]]] = {
    "inbound": {
        S.RINGING: frozenset({S.ACCEPTING, S.ENDED}),
        S.ACCEPTING: frozenset({S.ANSWERED, S.ENDED}),  # cancelled while media was set up
        S.ANSWERED: frozenset({S.ACTIVE, S.ENDED}),  # ACK, or no ACK / BYE before it
        S.ACTIVE: frozenset({S.ENDED}),
    },
    "outbound": {
        # a 2xx with no provisional before it skips ringing; hung up before the INVITE
        # went out, or CANCELled: ended; a final failure: failed
        S.DIALING: frozenset({S.RINGING, S.ANSWERING, S.FAILED, S.ENDED}),
        S.RINGING: frozenset({S.ANSWERING, S.FAILED, S.ENDED}),
        # the callee's answer unusable (BYE, failure 488) or the callee left meanwhile
        S.ANSWERING: frozenset({S.ACTIVE, S.FAILED, S.ENDED}),
        S.ACTIVE: frozenset({S.ENDED}),
    },
}
#: states a call is over in (no move out)
DONE = frozenset({S.FAILED, S.ENDED})


def can_move(direction: str, old: CallState, new: CallState) -> bool:
    return new in MOVES[direction].get(old, frozenset())


def move(call: CallRecord, new: CallState) -> None:
    """The one way a call's state changes: :class:`IllegalMove` unless the table has it."""
    if not can_move(call.direction, call.state, new):
        raise IllegalMove(call.direction, call.state, new)
    call.state = new


@dataclass
class CallRecord:
    """What both directions keep of a call (the subclasses add their side's fields; these
    are keyword-only so each keeps its positional constructor)."""

    direction: ClassVar[str]
    call_id: str  # rtc_sip_…
    sip_id: str  # the endpoint's sip_… ("" until an outbound INVITE is sent)
    created_at: float
    state: CallState = field(default=S.RINGING, kw_only=True)
    started_at: float | None = field(default=None, kw_only=True)
    ended_at: float | None = field(default=None, kw_only=True)
    end_reason: str | None = field(default=None, kw_only=True)
    hung_up_by: str | None = field(default=None, kw_only=True)
    media_reason: str | None = field(default=None, kw_only=True)  # why media ended it
    dtmf: list[str] = field(default_factory=list, kw_only=True)  # digits signaling saw

    def sip_ids(self) -> tuple[str | None, str | None, str | None]:
        """(Call-ID, From, To) for the report's ``sip``."""
        raise NotImplementedError

    def ended_data(self, report: dict[str, Any]) -> dict[str, Any]:
        """``realtime.call.ended``'s ``data`` around ``report``."""
        raise NotImplementedError


class Shell(Protocol):
    """The part of sip_server.SipService call control uses."""

    endpoint: SipEndpoint
    host: str

    def drain(self) -> None: ...

    async def connect(self, host: str, port: int, transport: str, *,
                      server_hostname: str | None = None,
                      ssl_context: ssl.SSLContext | None = None) -> tuple[str, int]: ...


class CallMedia(Protocol):
    """What the shared logic asks of either direction's media (phone_media.py)."""

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal: ...

    async def end(self, call_id: str) -> dict[str, Any] | None: ...


C = TypeVar("C", bound=CallRecord)


class SipCallControl(Generic[C]):
    """The controller logic both directions share. A subclass sets ``media`` and says which
    states the media may end a call in (``MEDIA_LIVE``)."""

    MEDIA_LIVE: ClassVar[frozenset[CallState]]

    def __init__(self, state: SignalingState, clock: Callable[[], float] | None) -> None:
        self.state = state
        self.clock = clock or state.clock
        self.calls: dict[str, C] = {}
        self.ended: OrderedDict[str, C] = OrderedDict()
        self._shell: Shell | None = None
        self._nursery: trio.Nursery | None = None
        self.counters: dict[str, int] = {}

    def _media(self) -> CallMedia | None:
        raise NotImplementedError

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    @property
    def shell(self) -> Shell:
        if self._shell is None:
            raise CallError(503, "sip_not_running", "the SIP listener is not running")
        return self._shell

    def get(self, call_id: str) -> C:
        call = self.calls.get(call_id) or self.ended.get(call_id)
        if call is None:
            raise CallError(404, "call_not_found", f"no SIP call {call_id}")
        return call

    # -- the media's side ---------------------------------------------------------------

    def media_ended(self, call_id: str, reason: str) -> bool:
        """The agent or its media ended the call: BYE. False when the call is not ours."""
        call = self.calls.get(call_id)
        if call is None:
            return False
        if call.state in self.MEDIA_LIVE:
            call.hung_up_by = "agent" if "agent" in reason else "server"
            call.media_reason = reason
            self._hangup_core(call, forgotten=self._media_forgotten)
        return True

    #: who a call the core already forgot is ended by, when the media ends it (None: leave
    #: it to the core's own CallEnded)
    _media_forgotten: ClassVar[str | None] = None

    def _hangup_core(self, call: C, *, forgotten: str | None = "api") -> None:
        """BYE (or CANCEL, or 603 while ringing: the core knows which). When the core has
        already forgotten the call, end it here as hung up by ``forgotten`` (None: not)."""
        try:
            self.shell.endpoint.hangup(trio.current_time(), call.sip_id)
        except SipUsageError:
            if forgotten is None:
                return
            self._ended(call, "hangup", call.hung_up_by or forgotten)
        self.shell.drain()

    async def _reinvite(self, call: C, offer: bytes) -> None:
        """The far end's re-INVITE (hold, unhold, a new address): the media's new answer."""
        media = self._media()
        assert media is not None
        try:
            got = await media.update(call.call_id, offer)
        except Exception:  # a media backend's bug must not take the SIP service down
            log.exception("sip: re-INVITE of %s call %s failed", call.direction, call.call_id)
            got = MediaRefusal(500, "media could not be updated")
        if call.state != S.ACTIVE or self._shell is None:
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

    # -- the end ------------------------------------------------------------------------

    def _ended(self, call: C, reason: str, by: str) -> None:
        raise NotImplementedError

    def _retired(self, call: C) -> None:
        """Hook: ``call`` has just moved from the live table to the ended one."""

    def _forgotten(self, call: C) -> None:
        """Hook: ``call`` fell off the ended table."""

    def _retire(self, call: C, report: str | None) -> None:
        """Move an ended call to the ended table and end its media. ``report``: the end
        reason of an answered call, whose ended event goes out once its media has ended
        (and said what it carried)."""
        if call.ended_at is None:
            call.ended_at = self.clock()
        if self.calls.pop(call.call_id, None) is None:
            if report is not None:
                self._report(call, report, None)
            return
        self._retired(call)
        self.ended[call.call_id] = call
        while len(self.ended) > MAX_ENDED:
            _, old = self.ended.popitem(last=False)
            self._forgotten(old)
        if self._nursery is not None and self._media() is not None:
            self._nursery.start_soon(self._end_and_report, call, report)
        elif report is not None:
            self._report(call, report, None)

    async def _end_and_report(self, call: C, reason: str | None) -> None:
        media = self._media()
        assert media is not None
        session = await media.end(call.call_id)
        if reason is not None:
            self._report(call, reason, session)

    def _report(self, call: C, reason: str, session: dict[str, Any] | None) -> None:
        """``realtime.call.ended`` for a call that was answered: the report a WebRTC call's
        has (``stats`` and ``transcript`` from the media's session object, when media ran
        on a transceiver) and the SIP side (webhooks.py ``sip_report``)."""
        sip_call_id, from_, to = call.sip_ids()
        report = end_report(started_at=call.started_at or call.created_at,
                            ended_at=call.ended_at or self.clock(), reason=reason,
                            session=session, by=call.hung_up_by,
                            sip=sip_report(direction=call.direction, sip_call_id=sip_call_id,
                                           from_=from_, to=to,
                                           cause=call.media_reason or reason,
                                           dtmf="".join(call.dtmf)))
        self.state.webhooks.emit(CALL_ENDED, call.ended_data(report))
