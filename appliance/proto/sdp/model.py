"""Parsed SDP: frozen, slotted dataclasses and Enums (STYLE.md rule 3).

Only what a WebRTC voice answerer needs is given a field; every attribute line is also kept
raw in ``attributes`` (name, value-or-None) so callers can look at anything else without a
second parse.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass


class MediaKind(enum.Enum):
    """RFC 8866 §5.14 <media>; anything unregistered parses as ``OTHER``."""

    AUDIO = "audio"
    VIDEO = "video"
    TEXT = "text"
    APPLICATION = "application"
    MESSAGE = "message"
    OTHER = "other"


class Direction(enum.Enum):
    """RFC 8866 §6.7; ``reverse()`` is the answer's direction (RFC 3264 §6.1)."""

    SENDRECV = "sendrecv"
    SENDONLY = "sendonly"
    RECVONLY = "recvonly"
    INACTIVE = "inactive"

    def reverse(self) -> Direction:
        return _REVERSE[self]


_REVERSE = {
    Direction.SENDRECV: Direction.SENDRECV,
    Direction.SENDONLY: Direction.RECVONLY,
    Direction.RECVONLY: Direction.SENDONLY,
    Direction.INACTIVE: Direction.INACTIVE,
}


class Setup(enum.Enum):
    """RFC 4145 §4 / RFC 8842 §5: which side is the DTLS client."""

    ACTIVE = "active"
    PASSIVE = "passive"
    ACTPASS = "actpass"
    HOLDCONN = "holdconn"


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """RFC 8122 §5: ``a=fingerprint:<hash-func> <hex:hex:...>``; algorithm lower-cased."""

    algorithm: str
    value: bytes

    def __str__(self) -> str:
        return f"{self.algorithm} {self.value.hex(':').upper()}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """RFC 8839 §5.1 ``a=candidate``. ``address`` may be an mDNS ``*.local`` name."""

    foundation: str
    component: int
    transport: str  # lower-cased: "udp", "tcp", ...
    priority: int
    address: str
    port: int
    type: str  # "host", "srflx", "prflx", "relay" or an extension token
    related_address: str | None = None
    related_port: int | None = None
    tcptype: str | None = None
    extensions: tuple[tuple[str, str], ...] = ()

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        """The address as an IP, or None for an FQDN/mDNS name."""
        try:
            return ipaddress.ip_address(self.address)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class Codec:
    """One payload type: ``a=rtpmap`` (or the RFC 3551 static table), ``a=fmtp``, ``a=rtcp-fb``."""

    pt: int
    name: str  # as written; compare case-insensitively (RFC 4855 §3)
    clock_rate: int
    channels: int | None
    fmtp: str | None = None
    rtcp_fb: tuple[str, ...] = ()

    @property
    def params(self) -> dict[str, str]:
        """The fmtp ``key=value;...`` list as a dict (keys lower-cased)."""
        out: dict[str, str] = {}
        if self.fmtp is None:
            return out
        for item in self.fmtp.split(";"):
            key, sep, value = item.strip().partition("=")
            if key:
                out[key.lower()] = value.strip() if sep else ""
        return out


@dataclass(frozen=True, slots=True)
class Extmap:
    """RFC 8285 §8 ``a=extmap:<id>[/<direction>] <uri> [<attributes>]``."""

    id: int
    uri: str
    direction: Direction | None = None
    attributes: str | None = None


@dataclass(frozen=True, slots=True)
class SsrcAttribute:
    """RFC 5576 §4.1 ``a=ssrc:<ssrc-id> <attribute>[:<value>]``."""

    ssrc: int
    attribute: str
    value: str | None


@dataclass(frozen=True, slots=True)
class Group:
    """RFC 5888 §5 ``a=group:<semantics> <mid>...`` (BUNDLE is RFC 8843)."""

    semantics: str
    mids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MediaSection:
    """One ``m=`` section. ICE/DTLS fields hold the *media-level* values only; the
    ``effective_*`` helpers on :class:`Offer` apply session-level and BUNDLE fallbacks."""

    index: int
    kind: MediaKind
    media: str  # the <media> token as written
    port: int
    proto: str
    formats: tuple[str, ...]
    connection: str | None = None  # c= address
    mid: str | None = None
    direction: Direction | None = None
    codecs: tuple[Codec, ...] = ()
    ice_ufrag: str | None = None
    ice_pwd: str | None = None
    ice_options: tuple[str, ...] = ()
    fingerprints: tuple[Fingerprint, ...] = ()
    setup: Setup | None = None
    rtcp_mux: bool = False
    rtcp_rsize: bool = False
    bundle_only: bool = False
    extmaps: tuple[Extmap, ...] = ()
    ssrcs: tuple[SsrcAttribute, ...] = ()
    ssrc_groups: tuple[Group, ...] = ()
    msid: tuple[str, ...] = ()  # every a=msid value, "stream [track]"
    candidates: tuple[Candidate, ...] = ()
    end_of_candidates: bool = False
    sctp_port: int | None = None
    max_message_size: int | None = None
    attributes: tuple[tuple[str, str | None], ...] = ()

    def codec(self, pt: int) -> Codec | None:
        for c in self.codecs:
            if c.pt == pt:
                return c
        return None

    @property
    def cname(self) -> str | None:
        for s in self.ssrcs:
            if s.attribute == "cname":
                return s.value
        return None


@dataclass(frozen=True, slots=True)
class Origin:
    """RFC 8866 §5.2 ``o=<username> <sess-id> <sess-version> <nettype> <addrtype> <addr>``."""

    username: str
    session_id: int
    session_version: int
    nettype: str
    addrtype: str
    address: str


@dataclass(frozen=True, slots=True)
class Offer:
    """A parsed session description (in practice: a browser's offer)."""

    origin: Origin
    session_name: str
    media: tuple[MediaSection, ...]
    connection: str | None = None
    direction: Direction | None = None
    ice_lite: bool = False
    ice_ufrag: str | None = None
    ice_pwd: str | None = None
    ice_options: tuple[str, ...] = ()
    fingerprints: tuple[Fingerprint, ...] = ()
    setup: Setup | None = None
    groups: tuple[Group, ...] = ()
    extmap_allow_mixed: bool = False
    attributes: tuple[tuple[str, str | None], ...] = ()

    @property
    def bundle(self) -> tuple[str, ...]:
        """Mids of the first BUNDLE group (the offerer-tagged mid first), or ()."""
        for g in self.groups:
            if g.semantics.upper() == "BUNDLE":
                return g.mids
        return ()

    def _bundle_tag(self, m: MediaSection) -> MediaSection | None:
        """RFC 8843 §7.2.1: the offerer-tagged section carries the shared transport."""
        mids = self.bundle
        if not mids or m.mid not in mids:
            return None
        for other in self.media:
            if other.mid == mids[0]:
                return other
        return None

    def effective_ice(self, m: MediaSection) -> tuple[str | None, str | None]:
        """ICE ufrag/pwd for ``m``: media level, else session level (Firefox puts them
        there), else the BUNDLE-tagged section's (bundle-only sections omit them)."""
        tag = self._bundle_tag(m)
        ufrag = m.ice_ufrag or self.ice_ufrag or (tag.ice_ufrag if tag else None)
        pwd = m.ice_pwd or self.ice_pwd or (tag.ice_pwd if tag else None)
        return ufrag, pwd

    def effective_fingerprints(self, m: MediaSection) -> tuple[Fingerprint, ...]:
        tag = self._bundle_tag(m)
        return m.fingerprints or self.fingerprints or (tag.fingerprints if tag else ())

    def effective_setup(self, m: MediaSection) -> Setup | None:
        tag = self._bundle_tag(m)
        return m.setup or self.setup or (tag.setup if tag else None)

    def effective_rtcp_mux(self, m: MediaSection) -> bool:
        tag = self._bundle_tag(m)
        return m.rtcp_mux or (tag.rtcp_mux if tag else False)

    def effective_direction(self, m: MediaSection) -> Direction:
        return m.direction or self.direction or Direction.SENDRECV

    def effective_candidates(self, m: MediaSection) -> tuple[Candidate, ...]:
        tag = self._bundle_tag(m)
        return m.candidates or (tag.candidates if tag else ())
