"""Answer a SIP trunk's or softphone's SDP offer (RFC 3264 over RFC 3551/3711/4568 media).

A phone offer is not a browser offer: no ICE, no DTLS, plain ``RTP/AVP`` or SDES-keyed
``RTP/SAVP``, G.711 at 8 kHz, RTCP on the next port unless ``a=rtcp-mux``. This module
judges such an offer with the parser the WebRTC path uses (:func:`parse_offer_untrusted`,
unchanged) and writes the answer; :mod:`.answer` (the WebRTC answerer) is not touched.

Decisions (:func:`choose_phone_audio`), in order:

1. the first ``m=audio`` with a non-zero port (RFC 3264 §6: every other section is
   answered with port 0);
2. the profile: ``RTP/AVP`` or ``RTP/SAVP`` (and their ``F`` feedback variants, whose
   feedback we simply do not send); ``UDP/TLS/RTP/SAVP`` (DTLS-SRTP) is refused here;
3. ``RTP/SAVP`` needs an ``a=crypto`` line (RFC 4568 §9.1) with a suite from
   :data:`SDES_SUITES`; the lines are handed back raw (in offer order) for the SDES module
   to key — this module parses only the tag and suite (a deliberately minimal local parse:
   RFC 4568 key-params belong to ``sdes.py``);
4. the codec: Opus 48000/2 when offered, else the first of PCMU/PCMA in the offer's order
   (the offerer's preference, RFC 3264 §6.1); ``telephone-event`` (RFC 4733) at the chosen
   codec's clock rate when offered;
5. direction (RFC 3264 §6.1, §8.4 hold): the reverse of the media (else session) direction;
   an RFC 2543 hold (``c=0.0.0.0``) is treated as ``sendonly``;
6. RTCP: ``rtcp-mux`` (RFC 5761) when offered, else the ``a=rtcp`` port (RFC 3605) or the
   RTP port + 1.

Anything unservable returns :class:`PhoneRefusal` — status 488 and the text for a
``Warning: 399 <host> "<text>"`` header (RFC 3261 §20.43) — never an exception; malformed
SDP raises :class:`SdpError` (the SIP layer answers 400).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from appliance.proto.sdp.model import Codec, Direction, MediaKind, MediaSection, Offer
from appliance.proto.sdp.parse import parse_offer_untrusted

__all__ = ["SDES_SUITES", "PhonePlan", "PhoneRefusal", "answer_phone_offer_untrusted",
           "build_phone_answer", "choose_phone_audio", "warning_header"]

PROFILES = ("RTP/AVP", "RTP/AVPF", "RTP/SAVP", "RTP/SAVPF")
#: RFC 4568 §6.2 / RFC 7714 §14.2 suites pylibsrtp can key.
SDES_SUITES = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32", "AEAD_AES_128_GCM")
PTIME = 20


@dataclass(frozen=True, slots=True)
class PhoneRefusal:
    """Nothing in the offer can be served: answer ``status`` with a 399 Warning."""

    text: str
    status: int = 488


@dataclass(frozen=True, slots=True)
class PhonePlan:
    section: int  # index of the answered m= line
    proto: str
    codec: Codec
    telephone_event: Codec | None
    direction: Direction  # of the answer
    remote_address: str
    remote_rtp_port: int
    remote_rtcp_port: int | None  # None with rtcp-mux
    rtcp_mux: bool
    #: the offer's usable ``a=crypto`` values (tag suite key-params...), offer order; empty
    #: for RTP/AVP
    crypto_offers: tuple[str, ...] = ()

    @property
    def secure(self) -> bool:
        return self.proto.startswith("RTP/SAVP")

    @property
    def on_hold(self) -> bool:
        """The offerer stopped sending to us or listening (RFC 3264 §8.4)."""
        return self.direction in (Direction.RECVONLY, Direction.INACTIVE)


def warning_header(host: str, refusal: PhoneRefusal) -> str:
    text = refusal.text.replace("\\", "").replace('"', "'")
    return f'399 {host} "{text}"'


def _attr(m: MediaSection, name: str) -> list[str]:
    return [v or "" for k, v in m.attributes if k == name]


def _pick(m: MediaSection) -> Codec | None:
    for c in m.codecs:
        if c.name.lower() == "opus" and c.clock_rate == 48000:
            return c
    for c in m.codecs:
        if c.name.upper() in ("PCMU", "PCMA") and c.clock_rate == 8000 and c.channels in (None, 1):
            return c
    return None


def choose_phone_audio(offer: Offer) -> PhonePlan | PhoneRefusal:
    audio = [m for m in offer.media if m.kind is MediaKind.AUDIO and m.port != 0]
    if not audio:
        return PhoneRefusal("no audio stream in the offer")
    m = audio[0]
    if m.proto.upper() not in PROFILES:
        return PhoneRefusal(f"media profile {m.proto} not supported (RTP/AVP or RTP/SAVP)")
    proto = m.proto.upper()
    crypto: tuple[str, ...] = ()
    if proto.startswith("RTP/SAVP"):
        usable = []
        for value in _attr(m, "crypto"):
            parts = value.split()
            if len(parts) >= 3 and parts[0].isdigit() and parts[1] in SDES_SUITES:
                usable.append(value)
        if not usable:
            return PhoneRefusal("RTP/SAVP without an a=crypto suite we support "
                                "(" + ", ".join(SDES_SUITES) + ")")
        crypto = tuple(usable)
    codec = _pick(m)
    if codec is None:
        return PhoneRefusal("no common codec (PCMU, PCMA or opus)")
    te = next((c for c in m.codecs if c.name.lower() == "telephone-event"
               and c.clock_rate == codec.clock_rate), None)
    address = m.connection or offer.connection
    if address is None:
        return PhoneRefusal("no c= connection address")
    offered = m.direction or offer.direction or Direction.SENDRECV
    if address in ("0.0.0.0", "::") and offered is Direction.SENDRECV:
        offered = Direction.SENDONLY  # RFC 3264 §8.4: RFC 2543-style hold
    rtcp_port: int | None = None
    if not m.rtcp_mux:
        rtcp_port = m.port + 1
        for v in _attr(m, "rtcp"):
            first = v.split()[0] if v.split() else ""
            if first.isdigit() and 0 < int(first) < 65536:
                rtcp_port = int(first)
    return PhonePlan(m.index, proto, codec, te, offered.reverse(), address, m.port, rtcp_port,
                     m.rtcp_mux, crypto)


def build_phone_answer(offer: Offer, plan: PhonePlan, *, address: str, port: int,
                       session_id: int, session_version: int = 1,
                       crypto: str | None = None) -> str:
    """The answer's text (CRLF lines). ``crypto`` is our ``a=crypto`` value (the SDES
    module's answer to one of ``plan.crypto_offers``); required when ``plan.secure``."""
    if plan.secure and not crypto:
        raise ValueError("an RTP/SAVP answer needs our a=crypto line")
    addrtype = "IP6" if ":" in address else "IP4"
    lines = ["v=0", f"o=appliance {session_id} {session_version} IN {addrtype} {address}",
             "s=-", f"c=IN {addrtype} {address}", "t=0 0"]
    for m in offer.media:
        if m.index != plan.section:
            lines.append(f"m={m.media} 0 {m.proto} {m.formats[0] if m.formats else '0'}")
            continue
        c, te = plan.codec, plan.telephone_event
        pts = [str(c.pt)] + ([str(te.pt)] if te else [])
        lines.append(f"m=audio {port} {plan.proto} {' '.join(pts)}")
        ch = "/2" if c.name.lower() == "opus" else ""
        lines.append(f"a=rtpmap:{c.pt} {c.name}/{c.clock_rate}{ch}")
        if c.name.lower() == "opus":
            lines.append(f"a=fmtp:{c.pt} minptime=10;useinbandfec=1")
        if te:
            lines.append(f"a=rtpmap:{te.pt} telephone-event/{te.clock_rate}")
            lines.append(f"a=fmtp:{te.pt} {te.fmtp or '0-15'}")
        lines.append(f"a=ptime:{PTIME}")
        if plan.rtcp_mux:
            lines.append("a=rtcp-mux")
        if crypto:
            lines.append(f"a=crypto:{crypto}")
        lines.append(f"a={plan.direction.value}")
    return "\r\n".join(lines) + "\r\n"


def answer_phone_offer_untrusted(
    sdp: bytes | str, *, address: str, port: int, session_id: int,
    session_version: int = 1, crypto_answer: Sequence[str] | None = None,
) -> tuple[PhonePlan, str] | PhoneRefusal:
    """Parse, judge and answer in one call (plain RTP only when ``crypto_answer`` is None;
    otherwise its first entry is our ``a=crypto`` value)."""
    offer = parse_offer_untrusted(sdp)
    plan = choose_phone_audio(offer)
    if isinstance(plan, PhoneRefusal):
        return plan
    crypto = crypto_answer[0] if crypto_answer else None
    if plan.secure and crypto is None:
        return PhoneRefusal("SRTP keys unavailable")
    return plan, build_phone_answer(offer, plan, address=address, port=port,
                                    session_id=session_id, session_version=session_version,
                                    crypto=crypto)
