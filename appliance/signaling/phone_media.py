"""The media seam of a phone call, as signaling sees it: :class:`PhoneMedia`.

::

    sip_calls.py (call control)            PhoneMedia                    transceiver
    ───────────────────────────            ──────────                    ───────────
    accept(call_id, session)  ──────────►  create(call_id, offer,   ──►  control op: a phone
                                             trunk addr, agent,          session (RtpLeg +
                                             session config)             agent), its vouch
                              ◄──────────  MediaAnswer(sdp, plan)        for the trunk's
                                           | MediaRefusal(488, text)     addresses
    re-INVITE                 ──────────►  update(call_id, offer)
    BYE / CANCEL / 480        ──────────►  end(call_id)
    PhoneMediaListener        ◄──────────  media_ended / dtmf       ◄──  the leg's events

Call control never learns where media runs: placement (which transceiver), the relay's
vouch (docs/adr-sip-media.md) and the leg (transceiver/rtp_leg.py) are behind this seam, so
the transceiver side plugs in without a change to sip_calls.py.

:class:`RelayAnswerMedia` is the part that needs no transceiver: it judges the offer with
``proto/sdp/phone.py``, keys SDES when the trunk offers ``RTP/SAVP`` (``proto/sdp/sdes.py``,
our key from ``secrets``), and answers with the relay's public media address and port (the
one WebRTC calls use, ADR: address-keyed flows on the media port). It keeps each call's
plan and keys for the transceiver op. For the calls we place it is also the
:class:`OutboundPhoneMedia`: our G.711 offer (SDES keys when the trunk wants ``RTP/SAVP``)
and the check of the callee's answer. :class:`TransceiverPhoneMedia` (the end of this file)
is the whole seam, both ways: that SDP work, plus the call placed on a transceiver whose
phone session (transceiver/phone_session.py) runs the leg and the agent (docs/sip.md "Media
on the transceivers").
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import trio

from ..control import ControlError
from ..phone_params import PhoneParams, SrtpParams
from ..proto.errors import ProtocolError
from ..proto.sdp.parse import parse_offer_untrusted
from ..proto.sdp.phone import PhonePlan, PhoneRefusal, build_phone_answer, choose_phone_audio
from ..proto.sdp.sdes import (
    CryptoAttribute,
    CryptoSuite,
    answer_crypto,
    choose_crypto,
    generate_crypto,
)
from .placement import Refused
from .registry import SessionRecord, new_etag

if TYPE_CHECKING:
    from .state import SignalingState

log = logging.getLogger(__name__)

Addr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MediaAnswer:
    sdp: str
    plan: PhonePlan


@dataclass(frozen=True, slots=True)
class MediaRefusal:
    """No media for this offer: the call is answered ``status`` with a 399 Warning
    carrying ``text`` (488 for an unservable offer, 503 when no transceiver can take it)."""

    status: int
    text: str


class PhoneMediaListener(Protocol):
    """What media tells call control (sip_calls.py implements it)."""

    def media_ended(self, call_id: str, reason: str) -> bool:
        """The media ended the call (BYE it); False when the call is not one of ours."""
        ...

    def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None: ...


class PhoneMedia(Protocol):
    def bind(self, listener: PhoneMediaListener) -> None:
        """Where media events go; called once, before the first create."""

    def start(self, nursery: trio.Nursery) -> None:
        """The SIP service is running: background tasks (event polls) go in ``nursery``."""

    async def create(self, call_id: str, offer_sdp: bytes, trunk_signaling_addr: Addr,
                     agent_spec: str, session_config: Mapping[str, Any], *,
                     params: Mapping[str, Any] | None = None
                     ) -> MediaAnswer | MediaRefusal:
        """Set up the call's media and agent; the SDP answer for the trunk. ``params``: the
        agent's ``ctx.params`` beside the session (a Live-accepted call's ``live``)."""
        ...

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        """A re-INVITE's offer (hold, unhold, a new address): the new answer."""
        ...

    async def end(self, call_id: str) -> dict[str, Any] | None:
        """The call is over (idempotent; unknown ids are ignored). Returns the media's
        session object as it ended (session_info.py: packets, codec, ``transcript``, and
        ``phone`` with the leg's counters) when there is one, for the end-of-call report."""

    async def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None:
        """A digit the far end sent by SIP INFO: for the agent (RFC 4733 digits reach it
        from the leg itself)."""


# -- outbound calls (sip_outbound.py): we offer, the callee answers --------------------------


@dataclass(frozen=True, slots=True)
class MediaOffer:
    sdp: str  # our offer for the INVITE (contains SDES keys when secure: never log it)


@runtime_checkable
class OutboundPhoneMedia(Protocol):
    """The media seam of a call *we* place (issue 28 item 5): our SDP offer goes in the
    INVITE, the callee's answer comes back in its 2xx. :meth:`PhoneMedia.end` ends it."""

    async def offer(self, call_id: str, trunk_signaling_addr: Addr, agent_spec: str,
                    session_config: Mapping[str, Any], *, secure: bool = False
                    ) -> MediaOffer | MediaRefusal:
        """Reserve the call's media; ``secure``: RTP/SAVP with our SDES keys."""
        ...

    async def answered(self, call_id: str, answer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        """The callee's answer: start the media and the agent, or say why not (the call is
        then hung up)."""
        ...

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        """The callee's re-INVITE, as :meth:`PhoneMedia.update`."""
        ...

    async def end(self, call_id: str) -> dict[str, Any] | None: ...


@dataclass(slots=True)
class MediaCall:
    """What a transceiver needs to run one call's media (keys are never in a repr)."""

    call_id: str
    plan: PhonePlan
    trunk_signaling_addr: Addr
    agent_spec: str
    session_config: Mapping[str, Any]
    remote_crypto: CryptoAttribute | None = field(default=None, repr=False)
    local_crypto: CryptoAttribute | None = field(default=None, repr=False)
    session_id: int = 0
    version: int = 1

    def params(self) -> PhoneParams:
        """The phone leg options of ``create`` (``phone``) for the transceiver (appliance/phone_params.py)."""
        p = self.plan
        srtp = None
        if self.local_crypto is not None and self.remote_crypto is not None:
            srtp = SrtpParams(self.remote_crypto.suite, self.local_crypto.material,
                              self.remote_crypto.material)
        rtcp = None if p.rtcp_mux or p.remote_rtcp_port is None else \
            (p.remote_address, p.remote_rtcp_port)
        return PhoneParams(
            call_id=self.call_id, agent=self.agent_spec, session=dict(self.session_config),
            codec="opus" if p.codec.name.lower() == "opus" else p.codec.name.upper(),
            payload_type=p.codec.pt, clock_rate=p.codec.clock_rate,
            dtmf_payload_type=p.telephone_event.pt if p.telephone_event else None,
            direction=p.direction.value, remote=(p.remote_address, p.remote_rtp_port),
            rtcp_mux=p.rtcp_mux, remote_rtcp=rtcp, trunk_ip=self.trunk_signaling_addr[0],
            srtp=srtp)


@dataclass(slots=True)
class _Offered:
    """An outbound call's offer, waiting for the callee's answer (keys never in a repr)."""

    trunk: Addr
    agent: str
    session: Mapping[str, Any]
    crypto: tuple[CryptoAttribute, ...] = field(repr=False)
    session_id: int


class RelayAnswerMedia:
    """Answers phone offers for the relay's public media address (see the module text),
    and offers for the calls we place (:class:`OutboundPhoneMedia`)."""

    def __init__(self, address: str, port: int, *, max_calls: int = 4096) -> None:
        self.address = address
        self.port = port
        self.max_calls = max_calls
        self.calls: dict[str, MediaCall] = {}
        self.offers: dict[str, _Offered] = {}
        self.listener: PhoneMediaListener | None = None

    def bind(self, listener: PhoneMediaListener) -> None:
        self.listener = listener

    def start(self, nursery: trio.Nursery) -> None:
        pass

    async def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None:
        pass

    def _answer(self, call: MediaCall | None, offer_sdp: bytes
                ) -> tuple[MediaAnswer, CryptoAttribute | None, CryptoAttribute | None] | MediaRefusal:
        if not offer_sdp.strip():
            # an offerless INVITE wants our offer in the 200 (RFC 3264 §5): not served yet
            return MediaRefusal(488, "an INVITE without an SDP offer is not supported")
        try:
            offer = parse_offer_untrusted(offer_sdp)
        except ProtocolError as exc:
            return MediaRefusal(488, f"unreadable SDP: {exc}"[:120])
        plan = choose_phone_audio(offer)
        if isinstance(plan, PhoneRefusal):
            return MediaRefusal(plan.status, plan.text)
        remote = local = None
        if plan.secure:
            offered = []
            for value in plan.crypto_offers:
                try:
                    offered.append(CryptoAttribute.parse_untrusted(value))
                except ProtocolError:
                    continue
            remote = choose_crypto(offered)
            if remote is None:
                return MediaRefusal(488, "no usable a=crypto (SDES) line")
            keep = call.local_crypto if call is not None else None
            if keep is not None and keep.tag == remote.tag and keep.suite == remote.suite:
                local = keep  # a re-INVITE with the same line: our key stays
            else:
                suite = remote.known_suite
                assert suite is not None  # choose_crypto takes only known suites
                local = answer_crypto(remote, secrets.token_bytes(suite.material_length))
        session_id = call.session_id if call is not None else secrets.randbelow(2**62) + 1
        version = call.version + 1 if call is not None else 1
        sdp = build_phone_answer(offer, plan, address=self.address, port=self.port,
                                 session_id=session_id, session_version=version,
                                 crypto=local.build() if local is not None else None)
        return MediaAnswer(sdp, plan), remote, local

    async def create(self, call_id: str, offer_sdp: bytes, trunk_signaling_addr: Addr,
                     agent_spec: str, session_config: Mapping[str, Any], *,
                     params: Mapping[str, Any] | None = None
                     ) -> MediaAnswer | MediaRefusal:
        # (no transceiver behind this one: nothing runs an agent, ``params`` has no reader)
        if len(self.calls) >= self.max_calls and call_id not in self.calls:
            return MediaRefusal(503, "too many phone calls")
        got = self._answer(None, offer_sdp)
        if isinstance(got, MediaRefusal):
            return got
        answer, remote, local = got
        sid = int(answer.sdp.split("\r\n", 2)[1].split()[1])  # o= <user> <sess-id> ...
        self.calls[call_id] = MediaCall(call_id, answer.plan, trunk_signaling_addr, agent_spec,
                                        dict(session_config), remote, local, sid, 1)
        return answer

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        call = self.calls.get(call_id)
        if call is None:
            return MediaRefusal(488, "no media for this call")
        got = self._answer(call, offer_sdp)
        if isinstance(got, MediaRefusal):
            return got
        answer, remote, local = got
        call.plan, call.remote_crypto, call.local_crypto = answer.plan, remote, local
        call.version += 1
        return answer

    async def end(self, call_id: str) -> dict[str, Any] | None:
        self.calls.pop(call_id, None)
        self.offers.pop(call_id, None)
        return None  # no media runs here: nothing to report

    # -- OutboundPhoneMedia ---------------------------------------------------------------

    #: what we offer: G.711 both laws (PCMU first, the US trunks' default) + RFC 4733 events
    OFFER_PTS = ((0, "PCMU"), (8, "PCMA"))
    OFFER_SUITES = (CryptoSuite.AES_CM_128_HMAC_SHA1_80, CryptoSuite.AES_CM_128_HMAC_SHA1_32)

    async def offer(self, call_id: str, trunk_signaling_addr: Addr, agent_spec: str,
                    session_config: Mapping[str, Any], *, secure: bool = False
                    ) -> MediaOffer | MediaRefusal:
        if len(self.calls) + len(self.offers) >= self.max_calls:
            return MediaRefusal(503, "too many phone calls")
        crypto = tuple(generate_crypto(tag, suite, secrets.token_bytes(suite.material_length))
                       for tag, suite in enumerate(self.OFFER_SUITES, 1)) if secure else ()
        sid = secrets.randbelow(2**62) + 1
        addrtype = "IP6" if ":" in self.address else "IP4"
        pts = " ".join(str(pt) for pt, _ in self.OFFER_PTS)
        lines = ["v=0", f"o=appliance {sid} 1 IN {addrtype} {self.address}", "s=-",
                 f"c=IN {addrtype} {self.address}", "t=0 0",
                 f"m=audio {self.port} {'RTP/SAVP' if secure else 'RTP/AVP'} {pts} 101"]
        lines += [f"a=rtpmap:{pt} {name}/8000" for pt, name in self.OFFER_PTS]
        lines += ["a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-15", "a=ptime:20"]
        lines += [c.line() for c in crypto]
        lines.append("a=sendrecv")
        self.offers[call_id] = _Offered(trunk_signaling_addr, agent_spec, dict(session_config),
                                        crypto, sid)
        return MediaOffer("\r\n".join(lines) + "\r\n")

    async def answered(self, call_id: str, answer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        mine = self.offers.pop(call_id, None)
        if mine is None:
            return MediaRefusal(488, "no offer of ours for this call")
        try:
            plan = choose_phone_audio(parse_offer_untrusted(answer_sdp))
        except ProtocolError as exc:
            return MediaRefusal(488, f"unreadable SDP answer: {exc}"[:120])
        if isinstance(plan, PhoneRefusal):
            return MediaRefusal(plan.status, plan.text)
        if (plan.codec.pt, plan.codec.name.upper()) not in self.OFFER_PTS:
            return MediaRefusal(488, f"the answer chose {plan.codec.name}, which we did not offer")
        remote = local = None
        if mine.crypto:
            if not plan.secure:
                return MediaRefusal(488, "we offered RTP/SAVP; the answer is not SRTP")
            for value in plan.crypto_offers:
                try:
                    got = CryptoAttribute.parse_untrusted(value)
                except ProtocolError:
                    continue
                local = next((c for c in mine.crypto
                              if c.tag == got.tag and c.suite == got.suite), None)
                if local is not None and choose_crypto([got]) is not None:
                    remote = got
                    break
            if remote is None or local is None:
                return MediaRefusal(488, "the answer's a=crypto matches none of our lines")
        elif plan.secure:
            return MediaRefusal(488, "we offered RTP/AVP; the answer is RTP/SAVP")
        self.calls[call_id] = MediaCall(call_id, plan, mine.trunk, mine.agent, mine.session,
                                        remote, local, mine.session_id, 1)
        return MediaAnswer(answer_sdp.decode("utf-8", "replace"), plan)


def _refusal_text(resp: dict[str, Any]) -> str:
    """A transceiver's refusal, as a MediaRefusal's text."""
    return str(resp.get("detail") or resp.get("code") or "refused")[:120]


class TransceiverPhoneMedia:
    """Phone media on the transceivers: the answer from :class:`RelayAnswerMedia`, the call
    placed like a WebRTC call (``Placement`` order, ``Admission``, a create in flight
    counted as load) with a ``create`` op of leg ``phone`` carrying :meth:`MediaCall.params`; the
    transceivers' ``events`` long-poll (call_events.py, one for every call) hands its
    ``ended`` and ``dtmf`` events for phone calls to the listener (docs/sip.md "Media")."""

    def __init__(self, state: SignalingState, sdp: RelayAnswerMedia | None = None) -> None:
        cfg = state.config
        self.state = state
        self.sdp = sdp or RelayAnswerMedia(cfg.public_addresses[0], cfg.udp_port)
        state.call_events.handlers.append(self.handle_events)
        state.call_events.holds.append(lambda k: k in self.where.values())
        self.listener: PhoneMediaListener | None = None
        self.where: dict[str, int] = {}  # call_id -> transceiver
        #: calls whose media ended first (an ``ended`` event), until end() reads their
        #: session object (bounded: the oldest go first)
        self._ended_on: dict[str, int] = {}
        self.counters: dict[str, int] = {}

    def bind(self, listener: PhoneMediaListener) -> None:
        self.listener = listener
        self.sdp.bind(listener)

    def transceiver_of(self, call_id: str) -> int | None:
        """The transceiver that carries ``call_id``'s phone session (its session id is the
        call id): where the sideband attaches (signaling/sideband.py)."""
        return self.where.get(call_id)

    def start(self, nursery: trio.Nursery) -> None:
        self.state.call_events.start(nursery)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def phone_counts(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for k in self.where.values():
            out[k] = out.get(k, 0) + 1
        return out

    async def create(self, call_id: str, offer_sdp: bytes, trunk_signaling_addr: Addr,
                     agent_spec: str, session_config: Mapping[str, Any], *,
                     params: Mapping[str, Any] | None = None
                     ) -> MediaAnswer | MediaRefusal:
        got = await self.sdp.create(call_id, offer_sdp, trunk_signaling_addr, agent_spec,
                                    session_config)
        if isinstance(got, MediaRefusal):
            return got
        body: dict[str, Any] = {"phone": self.sdp.calls[call_id].params().to_json()}
        if params:
            body["params"] = dict(params)  # the transceiver's ctx.params (ops.py)
        placed = await self._place(call_id, body)
        if isinstance(placed, MediaRefusal):
            await self.sdp.end(call_id)
            return placed
        return got

    # -- OutboundPhoneMedia: the calls we place (sip_outbound.py) ---------------------------

    async def offer(self, call_id: str, trunk_signaling_addr: Addr, agent_spec: str,
                    session_config: Mapping[str, Any], *, secure: bool = False
                    ) -> MediaOffer | MediaRefusal:
        """A pending phone session is placed before our INVITE goes out (so a call nobody
        can serve is never dialled), then our offer is written; :meth:`answered` starts
        its media."""
        refused = await self._place(call_id, {"call_id": call_id, "agent": agent_spec,
                                              "session": dict(session_config)})
        if refused is not None:
            return refused
        got = await self.sdp.offer(call_id, trunk_signaling_addr, agent_spec, session_config,
                                   secure=secure)
        if isinstance(got, MediaRefusal):
            await self.end(call_id)
        return got

    async def answered(self, call_id: str, answer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        """The callee's answer: checked against our offer, then a ``patch`` (``answered``)
        gives the pending session its leg (the caller hangs up with BYE on a refusal)."""
        got = await self.sdp.answered(call_id, answer_sdp)
        if isinstance(got, MediaRefusal):
            return got
        refused = await self._patch(call_id, self.sdp.calls[call_id].params(), answered=True)
        return refused if refused is not None else got

    async def _place(self, call_id: str, body: dict[str, Any]) -> MediaRefusal | None:
        st = self.state
        counts = st.registry.active_counts()  # phone calls are in it (one registry)
        phone = body.get("phone")  # the call's agent: what one more call of it costs
        spec = phone.get("agent") if isinstance(phone, Mapping) else body.get("agent")
        agent = spec if isinstance(spec, str) else None
        order = [k for k in st.placement.order(st.health.up_transceivers(), counts)
                 if st.admission.admits(k, agent)]
        if not order:
            self._count("refused-no-transceiver")
            return MediaRefusal(503, "no transceiver can take the call")
        req = {"op": "create", "leg": "phone", "session_id": call_id, **body}
        got = await st.placement.place(order, admits=lambda k: st.admission.admits(k, agent),
                                       peers=st.health.transceivers, build=lambda k: req)
        if isinstance(got, Refused):
            self._count("refused-no-transceiver")
            answers = [r for r in got.tried if r is not None]
            return MediaRefusal(503, _refusal_text(answers[-1]) if answers
                                else "no transceiver answered")
        k, resp = got.k, got.response
        if not resp.get("ok"):
            self._count("refused-by-transceiver")
            return MediaRefusal(488 if resp.get("status") == 400 else 503, _refusal_text(resp))
        st.admission.placed(k)
        self.where[call_id] = k
        # in the one registry: GET /v1/sessions and the dashboard list it like any call
        st.registry.add(SessionRecord(
            id=call_id, transceiver=k, etag=new_etag(), created_at=st.clock(),
            created_mono=trio.current_time(), agent=agent, kind="phone"))
        self._count("placed")
        st.call_events.placed(k)
        log.info("phone call %s placed on transceiver %s", call_id, k)
        return None

    async def _patch(self, call_id: str, params: PhoneParams, *, answered: bool
                     ) -> MediaRefusal | None:
        """``patch`` the placed call with its phone leg options: the far end's answer to
        our offer (``answered``) or a re-INVITE's new media."""
        k = self.where.get(call_id)
        ep = self.state.health.transceivers.get(k) if k is not None else None
        if ep is None:
            return MediaRefusal(488, "no media for this call")
        try:
            resp = await ep.client.request({"op": "patch", "session_id": call_id,
                                            "phone": params.to_json(), "answered": answered})
        except ControlError as exc:
            return MediaRefusal(503, f"transceiver {k} did not answer: {exc}"[:120])
        if not resp.get("ok"):
            return MediaRefusal(488, str(resp.get("detail") or "refused")[:120])
        return None

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        got = await self.sdp.update(call_id, offer_sdp)
        if isinstance(got, MediaRefusal):
            return got
        refused = await self._patch(call_id, self.sdp.calls[call_id].params(), answered=False)
        return refused if refused is not None else got

    async def end(self, call_id: str) -> dict[str, Any] | None:
        await self.sdp.end(call_id)
        k = self.where.pop(call_id, None)
        if k is None:  # the media ended first (its ``ended`` event): where it ran is known
            k = self._ended_on.pop(call_id, None)
        ep = self.state.health.transceivers.get(k) if k is not None else None
        if ep is None:
            return None
        try:
            await ep.client.request({"op": "delete", "session_id": call_id,
                                     "reason": "sip-ended"})
            # the ended session object (the transceiver keeps the recently ended ones)
            resp = await ep.client.request({"op": "get", "session_id": call_id})
        except ControlError as exc:
            log.info("delete of phone call %s on transceiver %s failed: %s", call_id, k, exc)
            return None
        session = resp.get("session") if resp.get("ok") else None
        return session if isinstance(session, dict) else None

    async def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None:
        k = self.where.get(call_id)
        ep = self.state.health.transceivers.get(k) if k is not None else None
        if ep is None:
            return
        try:
            await ep.client.request({"op": "dtmf", "session_id": call_id,
                                     "digit": digit, "duration_ms": duration_ms})
        except ControlError as exc:
            log.info("dtmf of phone call %s failed: %s", call_id, exc)

    # -- events from the transceivers ---------------------------------------------------------

    def handle_events(self, k: int, events: list[Any], live: set[str] | None = None) -> None:
        """One ``events`` answer from transceiver ``k``, for its phone calls (call_events.py).
        ``live``: the calls it still has; a call we placed there and it no longer has ended
        unseen (a restart)."""
        listener = self.listener
        for ev in events:
            if not isinstance(ev, dict):
                continue
            call_id, kind = ev.get("call_id"), ev.get("type")
            if not isinstance(call_id, str) or self.where.get(call_id) != k:
                continue
            if kind == "ended":
                self.where.pop(call_id, None)
                self._ended_on[call_id] = k  # end() still fetches its session object
                while len(self._ended_on) > 1024:
                    self._ended_on.pop(next(iter(self._ended_on)))
                reason = ev.get("reason")
                if listener is not None:
                    listener.media_ended(call_id, str(reason) if reason else "media-ended")
            elif kind == "dtmf":
                digit, ms = ev.get("digit"), ev.get("duration_ms")
                if isinstance(digit, str) and len(digit) == 1 and listener is not None:
                    listener.dtmf(call_id, digit, ms if isinstance(ms, int) else 0)
        if live is not None:
            for call_id in [c for c, kk in self.where.items() if kk == k and c not in live]:
                self.where.pop(call_id, None)
                if listener is not None:
                    listener.media_ended(call_id, "transceiver-lost")
