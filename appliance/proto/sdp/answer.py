"""Choose what to serve from an offer and write the answer (RFC 3264, RFC 8829 §5.3).

The answer is always the same shape (DESIGN.md "SDP answer")::

    v=0
    o=- <session-id> <version> IN IP4 0.0.0.0   <- RFC 8829 §5.2.1 placeholder address
    s=-
    t=0 0
    a=ice-lite                                  <- RFC 8445 §2.5: we never send checks
    a=group:BUNDLE <audio mid>                  <- only if the offer bundled it
    m=audio <port> <proto> <opus pt> [<telephone-event pt>]
    c=IN IP4 <first advertised relay address>
    a=mid:<echoed>
    a=ice-ufrag / a=ice-pwd / a=fingerprint:sha-256 ... / a=setup:active|passive
    a=<direction> / a=rtcp-mux [/ a=rtcp-rsize]
    a=rtpmap:<pt> opus/48000/2 / a=fmtp:<pt> minptime=10;useinbandfec=1
                                                <- or PCMU/8000 | PCMA/8000 (RFC 3551), no
                                                   fmtp, only when the offer has no Opus
    a=msid / a=ssrc cname+msid                  <- only when we send
    a=candidate:... typ host (one per advertised address) / a=end-of-candidates
    m=application <port> UDP/DTLS/SCTP webrtc-datachannel   <- only with datachannel=True
    c= / a=mid / a=ice-* / a=fingerprint / a=setup   (the same transport as the audio)
    a=sctp-port:5000 / a=max-message-size:262144 / candidates
    m=<other kinds> 0 ...                       <- rejected, echoed in order (RFC 3264 §6)

A data-only session's answer (no enabled audio in the offer) is the same without the
m=audio section: a=group:BUNDLE <application mid> and the m=application section alone.

Implemented: RFC 3264 §6 (answer m= lines in offer order; port 0 rejects), §6.1
(direction reversal); RFC 8843 §7.3 (BUNDLE in the answer lists only accepted mids);
RFC 8842 §5.3 (the answerer picks the DTLS role: ``active`` to an ``actpass`` offer, so
the transceiver is the DTLS client and sends its ClientHello one round trip sooner, as
aiortc and OpenAI's Realtime answers do; ``passive`` to ``active``; ``active`` to
``passive``; docs/adr-dtls-active.md); RFC 8839 §5.1 candidates with
RFC 8445 §5.1.2.1 priorities; RFC 7587 §7 Opus parameters; RFC 4733 telephone-event.

Data channels (RFC 8841): with ``datachannel=True`` the first enabled application section
is answered when it is ``UDP/DTLS/SCTP webrtc-datachannel`` (or ICE-TCP's
``TCP/DTLS/SCTP``) and shares the audio's BUNDLE transport; we have one transport per call,
so an unbundled one, another proto, or an ``a=sctp-port`` of 0 is refused with a 4xx that
names it (RFC 8841 §5.2: an absent sctp-port means 5000; §6.1: an absent max-message-size
means 64 KiB and 0 means no limit).

Data-only sessions (RFC 8841 without audio): when the offer has no enabled audio section
and ``datachannel=True``, its application section alone is served and carries the call's
transport (its own ICE/DTLS attributes, its own BUNDLE group); :attr:`Answer.plan` is then
``None`` and :attr:`Answer.transport` says where the peer's ICE and DTLS parameters came
from. An offer that has an enabled audio section must still have a servable one (its
4xx is precise; we never drop audio the caller asked for to serve the data alone).

Deliberately omitted: video, more than one audio or application stream (all rejected with
port 0); header extensions and RTCP feedback (none is useful for one
Opus stream: transport-cc needs a bandwidth estimator we do not run); active and
simultaneous-open TCP candidates (we only ever listen: ``tcptype passive``, RFC 6544 §4.5);
a=ice-options:trickle in the answer (an ICE-lite server has all its candidates up front).
This module must not import DTLS or SRTP (STYLE.md rule 8): the fingerprint arrives as text.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp.errors import SdpError
from appliance.proto.sdp.model import (
    Candidate,
    Codec,
    Direction,
    Fingerprint,
    MediaKind,
    MediaSection,
    Offer,
    Setup,
)

#: Hashes the DTLS layer can check a peer certificate against (RFC 8122 §5). SHA-1 and
#: MD5 are excluded on purpose: every browser sends sha-256.
USABLE_HASHES: Final = ("sha-256", "sha-384", "sha-512")

#: Profiles that mean DTLS-SRTP over UDP. RFC 8829 §5.3.1 makes an answerer accept the
#: legacy RTP/SAVP(F) spellings as well; the answer echoes whatever was offered.
SERVABLE_PROTOS: Final = frozenset(
    {"UDP/TLS/RTP/SAVPF", "UDP/TLS/RTP/SAVP", "RTP/SAVPF", "RTP/SAVP"}
)

#: RFC 8841 §4.1 proto values for SCTP over DTLS; TCP/DTLS/SCTP is ICE-TCP's (RFC 8841 §4.3).
SCTP_PROTOS: Final = frozenset({"UDP/DTLS/SCTP", "TCP/DTLS/SCTP"})
#: RFC 8841 §4.1 / RFC 8832: the only application format we serve.
DATACHANNEL_FORMAT: Final = "webrtc-datachannel"
#: Our SCTP port (RFC 8841 §5.2: any value works over DTLS; 5000 is what every browser uses).
SCTP_PORT: Final = 5000
#: The largest message we take (DESIGN.md "SDP answer": a=max-message-size:262144).
MAX_MESSAGE_SIZE: Final = 262144
#: RFC 8841 §6.1: what a peer can receive when it says nothing.
DEFAULT_PEER_MAX_MESSAGE_SIZE: Final = 65536

#: Our fmtp for Opus (RFC 7587 §6.1): we can take 10 ms packets and decode in-band FEC.
OPUS_FMTP: Final = "minptime=10;useinbandfec=1"
#: G.711 laws accepted when an audio section offers no Opus (RFC 3551 §4.5.14).
G711: Final = frozenset({"pcmu", "pcma"})

_ICE_CHARS_RE: Final = re.compile(r"[A-Za-z0-9+/]+", re.ASCII)
_LOCAL_FINGERPRINT_RE: Final = re.compile(r"sha-256 (?:[0-9A-F]{2}:){31}[0-9A-F]{2}", re.ASCII)
_SAFE_RE: Final = re.compile(r"[!-~]{1,255}", re.ASCII)  # printable, no space: cname, msid


@dataclass(frozen=True, slots=True)
class TransportPlan:
    """The peer's side of the call's one ICE/DTLS transport, read from the section that
    carries it (RFC 8843: the BUNDLE's): the audio, or the application section of a
    data-only session."""

    section: MediaSection
    ice_ufrag: str
    ice_pwd: str
    fingerprints: tuple[Fingerprint, ...]  # only those with a USABLE_HASHES algorithm
    setup: Setup
    candidates: tuple[Candidate, ...]
    bundled: bool  # the section's mid is in the offer's BUNDLE group


@dataclass(frozen=True, slots=True)
class AudioPlan:
    """What the offer asks of us, once judged servable (remote-side parameters)."""

    section: MediaSection
    opus: Codec  # the audio codec: Opus, or PCMU/PCMA when the offer has no Opus
    telephone_event: Codec | None
    direction: Direction  # the offer's
    transport: TransportPlan

    @property
    def ice_ufrag(self) -> str:
        return self.transport.ice_ufrag

    @property
    def ice_pwd(self) -> str:
        return self.transport.ice_pwd

    @property
    def fingerprints(self) -> tuple[Fingerprint, ...]:
        return self.transport.fingerprints

    @property
    def setup(self) -> Setup:
        return self.transport.setup

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return self.transport.candidates

    @property
    def bundled(self) -> bool:
        return self.transport.bundled

    @property
    def mid(self) -> str | None:
        return self.section.mid

    @property
    def remote_ssrc(self) -> int | None:
        return self.section.ssrcs[0].ssrc if self.section.ssrcs else None

    @property
    def codec_name(self) -> str:
        """``"opus"``, ``"pcmu"`` or ``"pcma"``."""
        return self.opus.name.lower()

    @property
    def send_fec(self) -> bool:
        """RFC 7587 §6.1: the peer's useinbandfec=1 says it can decode FEC we send."""
        return self.opus.params.get("useinbandfec") == "1"

    @property
    def send_stereo(self) -> bool:
        """RFC 7587 §6.1: stereo=1 means the peer prefers to receive stereo."""
        return self.opus.params.get("stereo") == "1"


@dataclass(frozen=True, slots=True)
class ApplicationPlan:
    """The data-channel section we serve (RFC 8841), with the peer's SCTP parameters."""

    section: MediaSection
    sctp_port: int  # the peer's SCTP port (RFC 8841 §5.2; 5000 when absent)
    #: The largest message the peer takes; 0 means no limit (RFC 8841 §6.1).
    max_message_size: int

    @property
    def mid(self) -> str | None:
        return self.section.mid

    def can_send(self, size: int) -> bool:
        """Whether a message of ``size`` bytes fits the peer's max-message-size."""
        return self.max_message_size == 0 or size <= self.max_message_size


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer text and the parameters chosen in it."""

    text: str
    audio_mid: str | None
    audio_index: int | None  # None: a data-only session (so are the audio fields below)
    opus_pt: int | None
    opus_fmtp: str | None
    telephone_event_pt: int | None
    direction: Direction | None  # ours, for the audio
    bundle_mids: tuple[str, ...]
    rtcp_rsize: bool
    plan: AudioPlan | None  # None: a data-only session
    transport: TransportPlan  # the peer's ICE/DTLS parameters (audio's or application's)
    application: ApplicationPlan | None = None  # the data-channel section, when answered
    #: Our ``a=setup`` (RFC 8842 §5.3): ACTIVE makes us the DTLS client, PASSIVE the server.
    setup: Setup = Setup.PASSIVE

    @property
    def dtls_client(self) -> bool:
        """Whether we are the DTLS client (we answered ``a=setup:active``)."""
        return self.setup is Setup.ACTIVE

    @property
    def media_line(self) -> str:
        """The first served m= line with port 9, which an sdpfrag repeats (RFC 8840 §9):
        ``m=audio 9 <proto> <pts>``, or a data-only session's application line."""
        if self.plan is None:
            return f"m=application 9 {self.transport.section.proto} {DATACHANNEL_FORMAT}"
        pts = [str(self.opus_pt)]
        if self.telephone_event_pt is not None:
            pts.append(str(self.telephone_event_pt))
        return f"m=audio 9 {self.plan.section.proto} {' '.join(pts)}"

    @property
    def transport_mid(self) -> str | None:
        """The mid of the section whose line :attr:`media_line` is."""
        return self.transport.section.mid


def _is_opus(c: Codec) -> bool:
    # RFC 7587 §7: Opus is always signalled as opus/48000/2, whatever is actually sent.
    return c.name.lower() == "opus" and c.clock_rate == 48000 and c.channels == 2


def _is_g711(c: Codec) -> bool:
    # RFC 3551 §4.5.14 / table 4: PCMU (pt 0) and PCMA (pt 8), 8000 Hz, one channel.
    return c.name.lower() in G711 and c.clock_rate == 8000 and c.channels in (None, 1)


def _pick_codec(m: MediaSection) -> Codec | None:
    """Opus wherever it is offered; else the first G.711 law the offer lists (a fallback
    for offers that carry nothing else: SIP gateways, some embedded clients)."""
    return next((c for c in m.codecs if _is_opus(c)), None) or next(
        (c for c in m.codecs if _is_g711(c)), None)


def _telephone_event(m: MediaSection, clock_rate: int = 48000) -> Codec | None:
    # RFC 4733 §2.1: events share the audio stream's timestamp clock, so prefer the
    # variant at the audio codec's rate (Chrome offers 48 kHz next to 8 kHz).
    events = [c for c in m.codecs if c.name.lower() == "telephone-event"]
    for c in events:
        if c.clock_rate == clock_rate:
            return c
    return events[0] if events and clock_rate == 48000 else None


def choose_audio(offer: Offer) -> AudioPlan:
    """Pick the audio section to serve and check its transport, or raise :class:`SdpError`
    (422). Signaling may call this before minting credentials to fail fast."""
    audio = [
        m
        for m in offer.media
        # RFC 3264 §8.2: port 0 in an offer disables the stream, unless RFC 8843
        # bundle-only says the port is borrowed from the BUNDLE tag.
        if m.kind is MediaKind.AUDIO and (m.port != 0 or m.bundle_only)
    ]
    if not audio:
        raise SdpError("no-audio", "the offer has no enabled audio m= section")
    first_problem: SdpError | None = None
    chosen: tuple[MediaSection, Codec] | None = None
    for m in audio:
        if m.proto.upper() not in SERVABLE_PROTOS:
            first_problem = first_problem or SdpError(
                "unsupported-proto",
                f"audio m= section {m.index} uses {m.proto}; DTLS-SRTP "
                "(UDP/TLS/RTP/SAVPF) is required",
            )
            continue
        opus = _pick_codec(m)
        if opus is None:
            first_problem = first_problem or SdpError(
                "no-opus", f"audio m= section {m.index} does not offer opus/48000/2 "
                "(nor PCMU/PCMA 8000)"
            )
            continue
        chosen = (m, opus)
        break
    if chosen is None:
        assert first_problem is not None
        raise first_problem
    m, opus = chosen
    transport = _choose_transport(offer, m, "audio")
    if not offer.effective_rtcp_mux(m):
        raise SdpError("no-rtcp-mux", "a=rtcp-mux is required (one port for RTP and RTCP)")
    return AudioPlan(
        section=m,
        opus=opus,
        telephone_event=_telephone_event(m, opus.clock_rate),
        direction=offer.effective_direction(m),
        transport=transport,
    )


def _choose_transport(offer: Offer, m: MediaSection, what: str) -> TransportPlan:
    """The peer's ICE/DTLS parameters for section ``m`` (``what`` names it in errors), or
    :class:`SdpError` (422). The same checks whichever section carries the transport."""
    ufrag, pwd = offer.effective_ice(m)
    if ufrag is None or pwd is None:
        raise SdpError("no-ice-credentials", f"no a=ice-ufrag/a=ice-pwd for the {what} section")
    fingerprints = tuple(f for f in offer.effective_fingerprints(m) if f.algorithm in USABLE_HASHES)
    if not fingerprints:
        raise SdpError(
            "no-fingerprint",
            "no a=fingerprint with " + ", ".join(USABLE_HASHES) + " (RFC 8122)",
        )
    # RFC 4145 §4.1: an absent setup attribute means "active". We can take either DTLS
    # role (RFC 8842 §5.3), so only holdconn, which asks for no connection, is refused.
    setup = offer.effective_setup(m) or Setup.ACTIVE
    if setup is Setup.HOLDCONN:
        raise SdpError(
            "bad-setup",
            "a=setup:holdconn: a call needs a DTLS connection; offer actpass, active "
            "or passive",
        )
    return TransportPlan(
        section=m,
        ice_ufrag=ufrag,
        ice_pwd=pwd,
        fingerprints=fingerprints,
        setup=setup,
        candidates=offer.effective_candidates(m),
        bundled=m.mid is not None and m.mid in offer.bundle,
    )


def _has_audio(offer: Offer) -> bool:
    # RFC 3264 §8.2: port 0 in an offer disables the stream, unless RFC 8843
    # bundle-only says the port is borrowed from the BUNDLE tag.
    return any(
        m.kind is MediaKind.AUDIO and (m.port != 0 or m.bundle_only) for m in offer.media
    )


def choose_application(offer: Offer, audio: AudioPlan | None) -> ApplicationPlan | None:
    """The data-channel section to serve beside ``audio`` (``None``: a data-only session,
    the section carries the transport itself), ``None`` when the offer has no enabled
    application section, or :class:`SdpError` (422) when it has one we cannot serve.
    """
    apps = [
        m for m in offer.media if m.kind is MediaKind.APPLICATION and (m.port != 0 or m.bundle_only)
    ]
    if not apps:
        return None
    m = apps[0]
    if m.proto.upper() not in SCTP_PROTOS or DATACHANNEL_FORMAT not in m.formats:
        raise SdpError(
            "unsupported-application",
            f"application m= section {m.index} is {m.proto} {' '.join(m.formats)}; "
            f"UDP/DTLS/SCTP {DATACHANNEL_FORMAT} is required (RFC 8841)",
        )
    if m.sctp_port == 0:
        raise SdpError(
            "bad-sctp-port", f"application m= section {m.index}: a=sctp-port:0 is not a port"
        )
    # One ICE/DTLS transport per call: the data channel must ride the audio's (RFC 8843).
    bundle = offer.bundle
    if audio is not None and not (audio.bundled and m.mid is not None and m.mid in bundle):
        raise SdpError(
            "not-bundled",
            f"application m= section {m.index} is not in the audio's BUNDLE group; the "
            "server has one transport per call (a=group:BUNDLE with both mids)",
        )
    return ApplicationPlan(
        section=m,
        sctp_port=SCTP_PORT if m.sctp_port is None else m.sctp_port,
        max_message_size=(
            DEFAULT_PEER_MAX_MESSAGE_SIZE if m.max_message_size is None else m.max_message_size
        ),
    )


def answer_setup(offered: Setup, *, prefer_active: bool = True) -> Setup:
    """Our ``a=setup`` for the offer's (RFC 8842 §5.3, RFC 4145 §4.1): the opposite of a
    definite role; for ``actpass`` ``active`` unless ``prefer_active`` is off (the
    transceiver turns it off while DTLS cookie mode is on: see docs/adr-dtls-active.md)."""
    if offered is Setup.ACTIVE:
        return Setup.PASSIVE
    if offered is Setup.PASSIVE:
        return Setup.ACTIVE
    if offered is Setup.ACTPASS:
        return Setup.ACTIVE if prefer_active else Setup.PASSIVE
    raise LocalProtocolError(f"no answer to a=setup:{offered.value}")


def choose_plans(
    offer: Offer, *, datachannel: bool = True
) -> tuple[AudioPlan | None, ApplicationPlan | None, TransportPlan]:
    """What :func:`build_answer` serves: the audio plan (``None`` for a data-only session),
    the data-channel plan (with ``datachannel``) and the transport they share; or
    :class:`SdpError` (422). Signaling may call this before minting credentials to fail fast.

    An offer with an enabled audio section is judged by it (:func:`choose_audio`); one
    without is a data-only session when ``datachannel`` allows and it has an enabled
    application section, and ``no-audio`` otherwise (nothing we could serve).
    """
    if _has_audio(offer) or not datachannel:
        plan = choose_audio(offer)
        app = choose_application(offer, plan) if datachannel else None
        return plan, app, plan.transport
    app = choose_application(offer, None)
    if app is None:
        raise SdpError(
            "no-audio", "the offer has no enabled audio or application (data channel) m= section"
        )
    return None, app, _choose_transport(offer, app.section, "application")


def _check_ice(ice_ufrag: str, ice_pwd: str) -> None:
    if not 4 <= len(ice_ufrag) <= 256 or not _ICE_CHARS_RE.fullmatch(ice_ufrag):
        raise LocalProtocolError("ice_ufrag must be 4-256 ICE characters")
    if not 22 <= len(ice_pwd) <= 256 or not _ICE_CHARS_RE.fullmatch(ice_pwd):
        raise LocalProtocolError("ice_pwd must be 22-256 ICE characters")


#: RFC 6544 §4.2: TCP candidates get a lower type preference than UDP ones of the same type
#: so that UDP wins whenever it works (libwebrtc uses 90 for host TCP beside 126 for host
#: UDP); their local preference is 2^13 * direction-pref + other-pref, passive = 4.
TCP_HOST_TYPE_PREF = 90
TCP_PASSIVE_DIRECTION_PREF = 4


def host_candidate_lines(
    candidates: Sequence[tuple[str, int]], tcp: Sequence[tuple[str, int]] = ()
) -> list[str]:
    """One ``a=candidate`` per advertised address, in the caller's preference order, then
    one ICE-TCP passive candidate (RFC 6544 §4.5) per address in ``tcp``.

    RFC 8445 §5.1.2.1: priority = 2^24 * type-pref + 2^8 * local-pref + (256 - component);
    host type preference 126, local preference 65535 for the first address and one less
    for each after it, component 1 (RTP; RTCP is muxed). Each address is its own base, so
    each gets its own foundation (§5.1.1.3); a TCP candidate differs in transport, so it
    gets its own too. TCP: type preference 90, local preference 2^13 * 4 + (8191 - i)
    (RFC 6544 §4.2), and ``tcptype passive`` (the client connects to us).
    """
    if len(candidates) + len(tcp) > 64:
        raise LocalProtocolError("more than 64 candidates")
    lines = _candidate_lines(candidates, "udp", 1)
    lines += _candidate_lines(tcp, "tcp", len(candidates) + 1)
    return lines


def _candidate_lines(
    candidates: Sequence[tuple[str, int]], transport: str, foundation: int
) -> list[str]:
    lines = []
    for i, (addr, port) in enumerate(candidates):
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            raise LocalProtocolError(f"candidate address {addr!r} is not an IP") from None
        if not 1 <= port <= 65535:
            raise LocalProtocolError(f"candidate port {port} out of range")
        if transport == "udp":
            priority = (126 << 24) | ((65535 - i) << 8) | (256 - 1)
            lines.append(f"a=candidate:{foundation + i} 1 udp {priority} {ip.compressed} "
                         f"{port} typ host")
        else:
            local = (TCP_PASSIVE_DIRECTION_PREF << 13) | (8191 - i)
            priority = (TCP_HOST_TYPE_PREF << 24) | (local << 8) | (256 - 1)
            lines.append(f"a=candidate:{foundation + i} 1 tcp {priority} {ip.compressed} "
                         f"{port} typ host tcptype passive")
    return lines


def _default_address(candidates: Sequence[tuple[str, int]]) -> tuple[str, int, str]:
    """(addrtype, port, address) for c= and m=: the first candidate, RFC 8839 §4.2.1.2."""
    if not candidates:
        return "IP4", 9, "0.0.0.0"  # RFC 8840 §8.2: trickle placeholder
    ip = ipaddress.ip_address(candidates[0][0])
    return ("IP6" if ip.version == 6 else "IP4"), candidates[0][1], ip.compressed


def build_answer(
    offer: Offer,
    *,
    ice_ufrag: str,
    ice_pwd: str,
    fingerprint: str,
    candidates: Sequence[tuple[str, int]],
    ssrc: int,
    cname: str,
    session_id: int,
    session_version: int = 1,
    msid_stream: str = "appliance",
    msid_track: str = "audio",
    datachannel: bool = False,
    tcp_candidates: Sequence[tuple[str, int]] = (),
    prefer_active: bool = True,
) -> Answer:
    """Answer ``offer``: serve its first usable audio section and, with ``datachannel``,
    its data-channel section on the same transport (or that section alone, for an offer
    without audio: a data-only session); reject everything else. With ``prefer_active``
    an ``actpass`` offer makes us the DTLS client (:func:`answer_setup`).

    Raises :class:`SdpError` (a ``RemoteProtocolError``) when the offer cannot be served,
    and ``LocalProtocolError`` when our own arguments are wrong.
    """
    _check_ice(ice_ufrag, ice_pwd)
    if not _LOCAL_FINGERPRINT_RE.fullmatch(fingerprint):
        raise LocalProtocolError("fingerprint must be 'sha-256 AB:CD:...' (32 bytes, upper)")
    if not 0 <= ssrc < 2**32:
        raise LocalProtocolError("ssrc must fit 32 bits")
    if not 0 <= session_id < 2**63 or not 0 <= session_version < 2**63:
        raise LocalProtocolError("session id/version must fit 63 bits (RFC 8829 §5.2.1)")
    for what, value in (("cname", cname), ("msid_stream", msid_stream), ("msid_track", msid_track)):
        if not _SAFE_RE.fullmatch(value):
            raise LocalProtocolError(f"{what} must be 1-255 printable ASCII, no spaces")
    cand_lines = host_candidate_lines(candidates, tcp_candidates)

    plan, app, transport = choose_plans(offer, datachannel=datachannel)
    served = plan.section if plan is not None else transport.section
    addrtype, port, address = _default_address(candidates)
    # RFC 8843 §7.3.1: the answer's group lists the accepted mids, in the offer's order.
    accepted = {served.mid} | ({app.mid} if app is not None else set())
    bundle = tuple(mid for mid in offer.bundle if mid in accepted) if transport.bundled else ()
    setup = answer_setup(transport.setup, prefer_active=prefer_active)
    transport_lines = [
        f"a=ice-ufrag:{ice_ufrag}",
        f"a=ice-pwd:{ice_pwd}",
        f"a=fingerprint:{fingerprint}",
        f"a=setup:{setup.value}",
    ]

    out = [
        "v=0",
        f"o=- {session_id} {session_version} IN IP4 0.0.0.0",
        "s=-",
        "t=0 0",
        "a=ice-lite",
    ]
    if bundle:
        out.append("a=group:BUNDLE " + " ".join(bundle))
    for m in offer.media:
        if app is not None and m is app.section:
            # RFC 8841 §5: the data channel shares the audio's transport (BUNDLE), so it
            # repeats the same ICE/DTLS attributes and candidates, as browsers' answers do.
            out.append(f"m=application {port} {m.proto} {DATACHANNEL_FORMAT}")
            out.append(f"c=IN {addrtype} {address}")
            if m.mid is not None:
                out.append(f"a=mid:{m.mid}")
            out += transport_lines
            out.append(f"a=sctp-port:{SCTP_PORT}")
            out.append(f"a=max-message-size:{MAX_MESSAGE_SIZE}")
            out += cand_lines
            out.append("a=end-of-candidates")
            continue
        if plan is None or m is not plan.section:
            # RFC 3264 §6: a rejected stream keeps its place with port 0; RFC 8829
            # §5.3.1 keeps the mid so the offerer can match it.
            out.append(f"m={m.media} 0 {m.proto} {' '.join(m.formats)}")
            out.append("c=IN IP4 0.0.0.0")
            if m.mid is not None:
                out.append(f"a=mid:{m.mid}")
            continue
        out += _audio_lines(plan, port, addrtype, address, transport_lines, cand_lines,
                            ssrc=ssrc, cname=cname, msid=(msid_stream, msid_track))
    text = "\r\n".join(out) + "\r\n"
    if plan is None:
        return Answer(
            text=text, audio_mid=None, audio_index=None, opus_pt=None, opus_fmtp=None,
            telephone_event_pt=None, direction=None, bundle_mids=bundle, rtcp_rsize=False,
            plan=None, transport=transport, application=app, setup=setup,
        )
    audio = plan.section
    te = plan.telephone_event
    return Answer(
        text=text,
        audio_mid=audio.mid,
        audio_index=audio.index,
        opus_pt=plan.opus.pt,
        opus_fmtp=OPUS_FMTP if plan.codec_name == "opus" else "",
        telephone_event_pt=te.pt if te is not None else None,
        direction=plan.direction.reverse(),
        bundle_mids=bundle,
        rtcp_rsize=audio.rtcp_rsize,
        plan=plan,
        transport=transport,
        application=app,
        setup=setup,
    )


def _audio_lines(plan: AudioPlan, port: int, addrtype: str, address: str,
                 transport: list[str], cand_lines: list[str], *, ssrc: int, cname: str,
                 msid: tuple[str, str]) -> list[str]:
    """The served audio section (RFC 8829 §5.3.1, RFC 7587 §7, RFC 4733)."""
    audio = plan.section
    direction = plan.direction.reverse()
    te = plan.telephone_event
    pts = [plan.opus.pt] if te is None else [plan.opus.pt, te.pt]
    out = [f"m=audio {port} {audio.proto} {' '.join(map(str, pts))}",
           f"c=IN {addrtype} {address}"]
    if audio.mid is not None:
        out.append(f"a=mid:{audio.mid}")
    out += transport
    out += [f"a={direction.value}", "a=rtcp-mux"]
    if audio.rtcp_rsize:
        out.append("a=rtcp-rsize")  # RFC 5506: we parse reduced-size RTCP anyway
    if plan.codec_name == "opus":
        out.append(f"a=rtpmap:{plan.opus.pt} opus/48000/2")
        out.append(f"a=fmtp:{plan.opus.pt} {OPUS_FMTP}")
    else:  # G.711: no fmtp (RFC 3551 §4.5.14)
        out.append(f"a=rtpmap:{plan.opus.pt} {plan.codec_name.upper()}/8000")
    if te is not None:
        out.append(f"a=rtpmap:{te.pt} {te.name}/{te.clock_rate}")
        if te.fmtp:
            out.append(f"a=fmtp:{te.pt} {te.fmtp}")
    if direction in (Direction.SENDRECV, Direction.SENDONLY):
        out.append(f"a=msid:{msid[0]} {msid[1]}")
        out.append(f"a=ssrc:{ssrc} cname:{cname}")
        out.append(f"a=ssrc:{ssrc} msid:{msid[0]} {msid[1]}")
    out += cand_lines
    out.append("a=end-of-candidates")
    return out


def build_sdpfrag_answer(
    ice_ufrag: str,
    ice_pwd: str,
    candidates: Sequence[tuple[str, int]],
    *,
    answer: Answer | None = None,
    tcp_candidates: Sequence[tuple[str, int]] = (),
) -> str:
    """The ``200 OK`` body for an ICE restart PATCH (RFC 9725 §4.4.1, RFC 8840 §9).

    With ``answer`` the candidates sit under the answer's BUNDLE group, m= line and mid,
    as in the RFC 9725 example; without it they are written at session level.
    """
    _check_ice(ice_ufrag, ice_pwd)
    out = ["a=ice-lite"]
    if answer is not None:
        if answer.bundle_mids:
            out.append("a=group:BUNDLE " + " ".join(answer.bundle_mids))
        out.append(answer.media_line)
        if answer.transport_mid is not None:
            out.append(f"a=mid:{answer.transport_mid}")
    out += [f"a=ice-ufrag:{ice_ufrag}", f"a=ice-pwd:{ice_pwd}"]
    out += host_candidate_lines(candidates, tcp_candidates)
    out.append("a=end-of-candidates")
    return "\r\n".join(out) + "\r\n"
