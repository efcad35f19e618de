"""The media seam of a phone call, as signaling sees it: :class:`PhoneMedia`.

::

    sip_calls.py (call control)            PhoneMedia                    transceiver (later)
    ───────────────────────────            ──────────                    ───────────────────
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
plan and keys for the transceiver op; until that op exists the answer names a port on which
no leg listens yet (docs/sip.md "What is left"). For the calls we place it is also the
:class:`OutboundPhoneMedia`: our G.711 offer (SDES keys when the trunk wants ``RTP/SAVP``)
and the check of the callee's answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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

    def media_ended(self, call_id: str, reason: str) -> None: ...

    def dtmf(self, call_id: str, digit: str, duration_ms: int) -> None: ...


class PhoneMedia(Protocol):
    def bind(self, listener: PhoneMediaListener) -> None:
        """Where media events go; called once, before the first create."""

    async def create(self, call_id: str, offer_sdp: bytes, trunk_signaling_addr: Addr,
                     agent_spec: str, session_config: Mapping[str, Any]
                     ) -> MediaAnswer | MediaRefusal:
        """Set up the call's media and agent; the SDP answer for the trunk."""
        ...

    async def update(self, call_id: str, offer_sdp: bytes) -> MediaAnswer | MediaRefusal:
        """A re-INVITE's offer (hold, unhold, a new address): the new answer."""
        ...

    async def end(self, call_id: str) -> None:
        """The call is over (idempotent; unknown ids are ignored)."""


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

    async def end(self, call_id: str) -> None: ...


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
        """The ``phone.create`` op's params for the transceiver (appliance/phone_params.py)."""
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
                     agent_spec: str, session_config: Mapping[str, Any]
                     ) -> MediaAnswer | MediaRefusal:
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

    async def end(self, call_id: str) -> None:
        self.calls.pop(call_id, None)
        self.offers.pop(call_id, None)

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
