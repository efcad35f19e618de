"""Parse untrusted SDP offers (RFC 8866) and trickle-ICE sdpfrags (RFC 8840).

Wire shape (RFC 8866 §5)::

    v=0                                   <- must come first
    o=<user> <sess-id> <sess-version> IN IP4 <addr>
    s=<session name>
    t=0 0
    a=<session-level attribute>[:<value>]  ...
    m=<media> <port>[/<n>] <proto> <fmt> ...   <- starts a media section
    c=IN IP4 <addr>
    a=<media-level attribute>[:<value>]    ...
    m=...

Each line is ``<letter>=<value>`` ending in CRLF; we also accept bare LF and skip blank
lines, because hand-written and curl-posted offers routinely have them and nothing is
ambiguous about it. Attribute values are checked against their RFC grammar with
``re.ASCII`` regexes: a malformed value is a 400 naming the line, never a Python exception
from deep inside (STYLE.md rule 5).

Implemented: RFC 8866 §5 line syntax, §5.2 o=, §5.7 c=, §5.14 m=, §6.6 rtpmap, §6.7
direction, §6.15 fmtp; RFC 3551 §6 static payload types; RFC 4585 §4.2 rtcp-fb;
RFC 5888 mid/group; RFC 8843 BUNDLE and bundle-only; RFC 8839 §5 candidate, ice-ufrag,
ice-pwd, ice-options, ice-lite, end-of-candidates; RFC 8122 §5 fingerprint; RFC 4145 /
RFC 8842 setup; RFC 5761 rtcp-mux; RFC 5506 rtcp-rsize; RFC 8285 extmap and
extmap-allow-mixed; RFC 5576 ssrc/ssrc-group; RFC 8830 msid; RFC 8841 sctp-port and
max-message-size; RFC 8840 §9 sdpfrag.

Deliberately omitted: b=, k=, r=, z= and multiple t= semantics (parsed-over, not
interpreted); u=/e=/p=/i= (ignored); the RFC 8866 rule that a parser must reject a whole
description with an unknown *attribute* (we keep unknown attributes raw); a=rtcp (muxing
is mandatory here); a=crypto / SDES-SRTP (RFC 8827 forbids it for WebRTC); simulcast and
rid (audio only).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from appliance.proto.sdp.errors import SdpError
from appliance.proto.sdp.model import (
    Candidate,
    Codec,
    Direction,
    Extmap,
    Fingerprint,
    Group,
    MediaKind,
    MediaSection,
    Offer,
    Origin,
    Setup,
    SsrcAttribute,
)

MAX_BYTES: Final = 64 * 1024
MAX_LINES: Final = 2048
MAX_MEDIA: Final = 16
MAX_CANDIDATES: Final = 64  # per section; a browser gathers a handful

# RFC 8866 §9 token-char; RFC 8839 §5.1 ice-char.
_TOKEN: Final = r"[!#$%&'*+\-.0-9A-Z^_`a-z{|}~]+"
_TOKEN_RE: Final = re.compile(_TOKEN, re.ASCII)
_PROTO_RE: Final = re.compile(rf"{_TOKEN}(?:/{_TOKEN})*", re.ASCII)  # RFC 8866 §9 proto
_ICE_CHARS_RE: Final = re.compile(r"[A-Za-z0-9+/]+", re.ASCII)
_DIGITS_RE: Final = re.compile(r"[0-9]{1,20}", re.ASCII)
_HOSTNAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]{0,252}", re.ASCII)
_FINGERPRINT_RE: Final = re.compile(
    r"([A-Za-z0-9\-]{1,16})[ \t]+((?:[0-9A-Fa-f]{2}:){0,63}[0-9A-Fa-f]{2})", re.ASCII
)
_RTPMAP_RE: Final = re.compile(
    r"([0-9]{1,3})[ \t]+([^/\s]{1,64})/([0-9]{1,10})(?:/([0-9]{1,3}))?", re.ASCII
)
_EXTMAP_RE: Final = re.compile(
    r"([0-9]{1,5})(?:/(sendrecv|sendonly|recvonly|inactive))?[ \t]+(\S{1,1024})"
    r"(?:[ \t]+(.*))?",
    re.ASCII,
)
_SSRC_RE: Final = re.compile(r"([0-9]{1,10})[ \t]+([^:\s]{1,64})(?::(.*))?", re.ASCII)

#: RFC 8122 §5 hash names with their digest sizes; a fingerprint of a listed hash must
#: have exactly that many bytes. Others parse but are never "usable".
HASH_SIZES: Final[dict[str, int]] = {
    "sha-1": 20,
    "sha-224": 28,
    "sha-256": 32,
    "sha-384": 48,
    "sha-512": 64,
    "md5": 16,
    "md2": 16,
}

#: RFC 3551 §6 static audio payload types that may appear without an a=rtpmap.
_STATIC_PT: Final[dict[int, tuple[str, int, int]]] = {
    0: ("PCMU", 8000, 1),
    3: ("GSM", 8000, 1),
    4: ("G723", 8000, 1),
    8: ("PCMA", 8000, 1),
    9: ("G722", 8000, 1),
    13: ("CN", 8000, 1),
    18: ("G729", 8000, 1),
}

_KNOWN_TYPES: Final = frozenset("vosiuepcbtrzkam")
_FRAG_TYPES: Final = frozenset("amcibk")
_DIRECTIONS: Final = {d.value: d for d in Direction}
_SETUPS: Final = {s.value: s for s in Setup}
_KINDS: Final = {k.value: k for k in MediaKind if k is not MediaKind.OTHER}

_Line = tuple[int, str, str]  # (1-based line number, type letter, value)


def _malformed(detail: str, line: int | None = None) -> SdpError:
    return SdpError("malformed", detail, line=line)


def _lines_untrusted(text: str | bytes) -> list[_Line]:
    """Split into ``(lineno, type, value)``; enforce size limits before any real work."""
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if len(raw) > MAX_BYTES:
            raise SdpError("too-large", f"body is {len(raw)} bytes, limit {MAX_BYTES}")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _malformed(f"body is not UTF-8 (byte {exc.start})") from None
    elif not isinstance(text, str):
        raise TypeError("SDP must be str or bytes")
    # A str is bounded by its UTF-8 size, the size on the wire.
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise SdpError("too-large", f"body is over {MAX_BYTES} bytes")
    raw_lines = text.split("\n")
    if len(raw_lines) > MAX_LINES + 1:  # +1: the empty string after a final newline
        raise SdpError("too-large", f"{len(raw_lines)} lines, limit {MAX_LINES}")
    out: list[_Line] = []
    for n, line in enumerate(raw_lines, 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            continue
        # RFC 8866 §9: values are byte-strings without NUL, CR or LF.
        if "\r" in line or "\x00" in line:
            raise _malformed("NUL or bare CR inside a line", n)
        if len(line) < 2 or line[1] != "=" or not ("a" <= line[0] <= "z"):
            raise _malformed(f"expected '<letter>=<value>', got {line[:20]!r}", n)
        out.append((n, line[0], line[2:]))
    return out


def _int(text: str, lo: int, hi: int, what: str, n: int) -> int:
    # str.isdigit() accepts '²' and int() accepts '1_0' and ' 1': use an ASCII regex.
    if not _DIGITS_RE.fullmatch(text):
        raise _malformed(f"{what} is not a number: {text[:20]!r}", n)
    value = int(text)
    if not lo <= value <= hi:
        raise _malformed(f"{what} {value} is outside {lo}..{hi}", n)
    return value


def _token(text: str, what: str, n: int, *, max_len: int = 256) -> str:
    if len(text) > max_len or not _TOKEN_RE.fullmatch(text):
        raise _malformed(f"{what} is not a token: {text[:20]!r}", n)
    return text


def _ice_string(text: str, what: str, lo: int, n: int) -> str:
    # RFC 8839 §5.4: ice-ufrag 4*256ice-char, ice-pwd 22*256ice-char.
    if not lo <= len(text) <= 256 or not _ICE_CHARS_RE.fullmatch(text):
        raise _malformed(f"{what} must be {lo}-256 ICE characters [A-Za-z0-9+/]", n)
    return text


def _address(text: str, what: str, n: int) -> str:
    """An IP literal or a DNS/mDNS name (browsers hide host IPs behind ``*.local``)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _HOSTNAME_RE.fullmatch(text):
            raise _malformed(f"{what} is neither an IP address nor a hostname", n) from None
    return text


def parse_candidate_untrusted(value: str, n: int = 0) -> Candidate:
    """RFC 8839 §5.1, the value after ``a=candidate:``::

        foundation SP component-id SP transport SP priority SP
        connection-address SP port SP "typ" SP cand-type
        [SP "raddr" SP addr] [SP "rport" SP port] *(SP ext-name SP ext-value)

    Raises only :class:`SdpError`; ``n`` is the line number for the message.
    """
    if value.startswith("candidate:"):  # trickle JSON carries the attribute name too
        value = value[len("candidate:") :]
    t = value.split()
    if len(t) < 8 or t[6] != "typ":
        raise _malformed("candidate needs 'foundation comp transport prio addr port typ T'", n)
    if len(t) % 2:
        raise _malformed("candidate extensions must be name/value pairs", n)
    if len(t[0]) > 32 or not _ICE_CHARS_RE.fullmatch(t[0]):
        raise _malformed("candidate foundation must be 1-32 ICE characters", n)
    component = _int(t[1], 1, 256, "candidate component", n)
    transport = _token(t[2], "candidate transport", n, max_len=32).lower()
    priority = _int(t[3], 1, 2**32 - 1, "candidate priority", n)
    address = _address(t[4], "candidate address", n)
    port = _int(t[5], 0, 65535, "candidate port", n)
    ctype = _token(t[7], "candidate type", n, max_len=32).lower()
    raddr: str | None = None
    rport: int | None = None
    tcptype: str | None = None
    ext: list[tuple[str, str]] = []
    for i in range(8, len(t), 2):
        name, val = t[i], t[i + 1]
        if name == "raddr":
            raddr = _address(val, "candidate raddr", n)
        elif name == "rport":
            rport = _int(val, 0, 65535, "candidate rport", n)
        elif name == "tcptype":
            tcptype = _token(val, "candidate tcptype", n, max_len=32)
        else:
            ext.append((_token(name, "candidate extension", n, max_len=64), val))
    return Candidate(
        foundation=t[0],
        component=component,
        transport=transport,
        priority=priority,
        address=address,
        port=port,
        type=ctype,
        related_address=raddr,
        related_port=rport,
        tcptype=tcptype,
        extensions=tuple(ext),
    )


@dataclass(slots=True)
class _Builder:
    """Mutable accumulator for one level (session or one m= section)."""

    line: int
    kind: MediaKind = MediaKind.OTHER
    media: str = ""
    port: int = 0
    proto: str = ""
    formats: tuple[str, ...] = ()
    connection: str | None = None
    mid: str | None = None
    direction: Direction | None = None
    ice_lite: bool = False
    ice_ufrag: str | None = None
    ice_pwd: str | None = None
    ice_options: tuple[str, ...] = ()
    fingerprints: list[Fingerprint] = field(default_factory=list)
    setup: Setup | None = None
    rtcp_mux: bool = False
    rtcp_rsize: bool = False
    bundle_only: bool = False
    extmap_allow_mixed: bool = False
    groups: list[Group] = field(default_factory=list)
    rtpmap: dict[int, tuple[str, int, int | None]] = field(default_factory=dict)
    fmtp: dict[int, str] = field(default_factory=dict)
    rtcp_fb: dict[str, list[str]] = field(default_factory=dict)
    extmaps: list[Extmap] = field(default_factory=list)
    ssrcs: list[SsrcAttribute] = field(default_factory=list)
    ssrc_groups: list[Group] = field(default_factory=list)
    msid: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    end_of_candidates: bool = False
    sctp_port: int | None = None
    max_message_size: int | None = None
    attributes: list[tuple[str, str | None]] = field(default_factory=list)

    def once(self, name: str, current: object, n: int) -> None:
        if current is not None:
            raise _malformed(f"a={name} appears twice in one section", n)

    def codecs(self) -> tuple[Codec, ...]:
        if "RTP/" not in self.proto:
            return ()
        out = []
        star = self.rtcp_fb.get("*", [])
        for fmt in self.formats:
            pt = int(fmt)  # m= parsing checked RTP formats are 0..127
            entry = self.rtpmap.get(pt) or _STATIC_PT.get(pt)
            if entry is None:
                continue  # dynamic type without rtpmap: unusable, RFC 8866 §6.6
            name, rate, channels = entry
            fb = tuple(star + self.rtcp_fb.get(fmt, []))
            out.append(Codec(pt, name, rate, channels, self.fmtp.get(pt), fb))
        return tuple(out)

    def section(self, index: int) -> MediaSection:
        return MediaSection(
            index=index,
            kind=self.kind,
            media=self.media,
            port=self.port,
            proto=self.proto,
            formats=self.formats,
            connection=self.connection,
            mid=self.mid,
            direction=self.direction,
            codecs=self.codecs(),
            ice_ufrag=self.ice_ufrag,
            ice_pwd=self.ice_pwd,
            ice_options=self.ice_options,
            fingerprints=tuple(self.fingerprints),
            setup=self.setup,
            rtcp_mux=self.rtcp_mux,
            rtcp_rsize=self.rtcp_rsize,
            bundle_only=self.bundle_only,
            extmaps=tuple(self.extmaps),
            ssrcs=tuple(self.ssrcs),
            ssrc_groups=tuple(self.ssrc_groups),
            msid=tuple(self.msid),
            candidates=tuple(self.candidates),
            end_of_candidates=self.end_of_candidates,
            sctp_port=self.sctp_port,
            max_message_size=self.max_message_size,
            attributes=tuple(self.attributes),
        )


_Handler = Callable[[_Builder, str, int], None]


def _parse_m_line(value: str, n: int) -> _Builder:
    """RFC 8866 §5.14: ``m=<media> <port>[/<number of ports>] <proto> <fmt> ...``"""
    t = value.split()
    if len(t) < 4:
        raise _malformed("m= needs '<media> <port> <proto> <fmt>...'", n)
    b = _Builder(line=n)
    b.media = _token(t[0], "media type", n, max_len=32)
    b.kind = _KINDS.get(b.media.lower(), MediaKind.OTHER)
    port, _, nports = t[1].partition("/")
    b.port = _int(port, 0, 65535, "m= port", n)
    if nports:
        _int(nports, 1, 65535, "m= number of ports", n)
    if len(t[2]) > 64 or not _PROTO_RE.fullmatch(t[2]):
        raise _malformed(f"m= proto is not 'token/token...': {t[2][:20]!r}", n)
    b.proto = t[2]
    if "RTP/" in b.proto:
        # RFC 3551 §3: RTP formats are payload type numbers 0..127.
        b.formats = tuple(str(_int(f, 0, 127, "RTP payload type", n)) for f in t[3:])
    else:
        b.formats = tuple(_token(f, "m= format", n, max_len=64) for f in t[3:])
    return b


def _parse_attribute(b: _Builder, value: str, n: int) -> None:
    name, sep, val = value.partition(":")
    b.attributes.append((name, val if sep else None))
    handler = _ATTRIBUTES.get(name)
    if handler is None:
        # Unknown and uninterpreted attributes are kept raw (RFC 8866 §5.13: ignore).
        return
    handler(b, val.strip(), n)


def _a_mid(b: _Builder, v: str, n: int) -> None:
    b.once("mid", b.mid, n)
    b.mid = _token(v, "mid", n, max_len=64)


def _a_ufrag(b: _Builder, v: str, n: int) -> None:
    b.once("ice-ufrag", b.ice_ufrag, n)
    b.ice_ufrag = _ice_string(v, "ice-ufrag", 4, n)


def _a_pwd(b: _Builder, v: str, n: int) -> None:
    b.once("ice-pwd", b.ice_pwd, n)
    b.ice_pwd = _ice_string(v, "ice-pwd", 22, n)


def _a_ice_options(b: _Builder, v: str, n: int) -> None:
    b.ice_options += tuple(_token(o, "ice-option", n, max_len=64) for o in v.split())


def _a_ice_lite(b: _Builder, v: str, n: int) -> None:
    b.ice_lite = True


def _a_fingerprint(b: _Builder, v: str, n: int) -> None:
    m = _FINGERPRINT_RE.fullmatch(v)
    if m is None:
        raise _malformed("fingerprint must be '<hash> XX:XX:...' (RFC 8122 §5)", n)
    alg = m.group(1).lower()
    digest = bytes.fromhex(m.group(2).replace(":", ""))
    size = HASH_SIZES.get(alg)
    if size is not None and size != len(digest):
        raise _malformed(f"{alg} fingerprint has {len(digest)} bytes, expected {size}", n)
    if len(b.fingerprints) >= 8:
        raise SdpError("too-large", "more than 8 fingerprints", line=n)
    b.fingerprints.append(Fingerprint(alg, digest))


def _a_setup(b: _Builder, v: str, n: int) -> None:
    b.once("setup", b.setup, n)
    setup = _SETUPS.get(v)
    if setup is None:
        raise _malformed(f"setup must be active/passive/actpass/holdconn, got {v[:20]!r}", n)
    b.setup = setup


def _flag(attr: str) -> _Handler:
    def handler(b: _Builder, v: str, n: int) -> None:
        setattr(b, attr, True)

    return handler


def _direction(d: Direction) -> _Handler:
    def handler(b: _Builder, v: str, n: int) -> None:
        if b.direction is not None and b.direction is not d:
            raise _malformed("two different direction attributes in one section", n)
        b.direction = d

    return handler


def _a_rtpmap(b: _Builder, v: str, n: int) -> None:
    # RFC 8866 §6.6: a=rtpmap:<payload type> <encoding name>/<clock rate>[/<params>]
    m = _RTPMAP_RE.fullmatch(v)
    if m is None:
        raise _malformed("rtpmap must be '<pt> <name>/<rate>[/<channels>]'", n)
    pt = _int(m.group(1), 0, 127, "rtpmap payload type", n)
    rate = _int(m.group(3), 1, 10_000_000, "rtpmap clock rate", n)
    channels = _int(m.group(4), 1, 255, "rtpmap channels", n) if m.group(4) else None
    b.rtpmap[pt] = (m.group(2), rate, channels)


def _a_fmtp(b: _Builder, v: str, n: int) -> None:
    fmt, _, params = v.partition(" ")
    if "RTP/" in b.proto:
        b.fmtp[_int(fmt, 0, 127, "fmtp payload type", n)] = params.strip()


def _a_rtcp_fb(b: _Builder, v: str, n: int) -> None:
    # RFC 4585 §4.2: a=rtcp-fb:<pt or *> <type> [<param>]
    fmt, _, rest = v.partition(" ")
    if fmt != "*":
        fmt = str(_int(fmt, 0, 127, "rtcp-fb payload type", n))
    if not rest.strip():
        raise _malformed("rtcp-fb without a feedback type", n)
    b.rtcp_fb.setdefault(fmt, []).append(" ".join(rest.split()))


def _a_extmap(b: _Builder, v: str, n: int) -> None:
    m = _EXTMAP_RE.fullmatch(v)
    if m is None:
        raise _malformed("extmap must be '<id>[/<direction>] <uri> [<attributes>]'", n)
    ext_id = _int(m.group(1), 1, 4351, "extmap id", n)
    if 255 < ext_id < 4096:  # RFC 8285 §8: 1-255, and 4096-4351 in answers
        raise _malformed(f"extmap id {ext_id} is not valid", n)
    direction = _DIRECTIONS[m.group(2)] if m.group(2) else None
    b.extmaps.append(Extmap(ext_id, m.group(3), direction, m.group(4)))


def _a_ssrc(b: _Builder, v: str, n: int) -> None:
    m = _SSRC_RE.fullmatch(v)
    if m is None:
        raise _malformed("ssrc must be '<ssrc> <attribute>[:<value>]'", n)
    ssrc = _int(m.group(1), 0, 2**32 - 1, "ssrc", n)
    b.ssrcs.append(SsrcAttribute(ssrc, m.group(2).lower(), m.group(3)))


def _a_ssrc_group(b: _Builder, v: str, n: int) -> None:
    t = v.split()
    if not t:
        raise _malformed("ssrc-group without semantics", n)
    ssrcs = tuple(str(_int(s, 0, 2**32 - 1, "ssrc-group ssrc", n)) for s in t[1:])
    b.ssrc_groups.append(Group(_token(t[0], "ssrc-group semantics", n), ssrcs))


def _a_msid(b: _Builder, v: str, n: int) -> None:
    t = v.split()
    if not 1 <= len(t) <= 2:
        raise _malformed("msid must be '<stream id> [<track id>]'", n)
    b.msid.append(" ".join(t))


def _a_group(b: _Builder, v: str, n: int) -> None:
    t = v.split()
    if not t:
        raise _malformed("group without semantics", n)
    mids = tuple(_token(m, "group mid", n, max_len=64) for m in t[1:])
    b.groups.append(Group(_token(t[0], "group semantics", n), mids))


def _a_candidate(b: _Builder, v: str, n: int) -> None:
    if len(b.candidates) >= MAX_CANDIDATES:
        raise SdpError("too-large", f"more than {MAX_CANDIDATES} candidates", line=n)
    b.candidates.append(parse_candidate_untrusted(v, n))


def _a_sctp_port(b: _Builder, v: str, n: int) -> None:
    b.sctp_port = _int(v, 0, 65535, "sctp-port", n)


def _a_max_message_size(b: _Builder, v: str, n: int) -> None:
    b.max_message_size = _int(v, 0, 2**64 - 1, "max-message-size", n)


_ATTRIBUTES: Final[dict[str, _Handler]] = {
    "mid": _a_mid,
    "ice-ufrag": _a_ufrag,
    "ice-pwd": _a_pwd,
    "ice-options": _a_ice_options,
    "ice-lite": _a_ice_lite,
    "fingerprint": _a_fingerprint,
    "setup": _a_setup,
    "rtcp-mux": _flag("rtcp_mux"),
    "rtcp-rsize": _flag("rtcp_rsize"),
    "bundle-only": _flag("bundle_only"),
    "extmap-allow-mixed": _flag("extmap_allow_mixed"),
    "end-of-candidates": _flag("end_of_candidates"),
    "sendrecv": _direction(Direction.SENDRECV),
    "sendonly": _direction(Direction.SENDONLY),
    "recvonly": _direction(Direction.RECVONLY),
    "inactive": _direction(Direction.INACTIVE),
    "rtpmap": _a_rtpmap,
    "fmtp": _a_fmtp,
    "rtcp-fb": _a_rtcp_fb,
    "extmap": _a_extmap,
    "ssrc": _a_ssrc,
    "ssrc-group": _a_ssrc_group,
    "msid": _a_msid,
    "group": _a_group,
    "candidate": _a_candidate,
    "sctp-port": _a_sctp_port,
    "max-message-size": _a_max_message_size,
}


def _parse_origin(value: str, n: int) -> Origin:
    t = value.split()
    if len(t) != 6:
        raise _malformed("o= needs 6 fields: user sess-id sess-version IN IP4 address", n)
    return Origin(
        username=t[0],
        session_id=_int(t[1], 0, 10**20, "o= session id", n),
        session_version=_int(t[2], 0, 10**20, "o= session version", n),
        nettype=t[3],
        addrtype=t[4],
        address=t[5],
    )


def _parse_connection(value: str, n: int) -> str:
    # RFC 8866 §5.7: c=<nettype> <addrtype> <connection-address>
    t = value.split()
    if len(t) != 3:
        raise _malformed("c= needs 'IN IP4|IP6 <address>'", n)
    return t[2]


def _split_sections(lines: list[_Line], allowed: frozenset[str]) -> list[_Builder]:
    """Run every line through its builder; returns [session, media...]."""
    builders = [_Builder(line=0)]
    for n, kind, value in lines:
        if kind not in allowed:
            raise _malformed(f"unexpected line type '{kind}='", n)
        if kind == "m":
            if len(builders) > MAX_MEDIA:
                raise SdpError("too-large", f"more than {MAX_MEDIA} m= sections", line=n)
            builders.append(_parse_m_line(value, n))
        elif kind == "a":
            _parse_attribute(builders[-1], value, n)
        elif kind == "c":
            builders[-1].connection = _parse_connection(value, n)
    return builders


def _check_mids(session: _Builder, media: list[_Builder]) -> None:
    seen: set[str] = set()
    for b in media:
        if b.mid is not None:
            if b.mid in seen:
                raise _malformed(f"mid {b.mid!r} is used by two m= sections", b.line)
            seen.add(b.mid)
    for g in session.groups:
        for mid in g.mids:
            if mid not in seen:
                raise _malformed(f"group:{g.semantics} names unknown mid {mid!r}")


def parse_offer_untrusted(text: str | bytes) -> Offer:
    """Parse an SDP offer. Raises only :class:`SdpError` (400 malformed / 413 too-large).

    Servability (Opus, DTLS, ICE, rtcp-mux) is *not* judged here; see
    :func:`appliance.proto.sdp.answer.choose_audio`.
    """
    lines = _lines_untrusted(text)
    if not lines or lines[0][1:] != ("v", "0"):
        raise _malformed("the first line must be 'v=0'", lines[0][0] if lines else None)
    origin: Origin | None = None
    session_name = ""
    session_lines: list[_Line] = []
    for i, (n, kind, value) in enumerate(lines[1:], 1):
        if kind == "m":
            rest = lines[i:]
            break
        if kind == "o":
            if origin is not None:
                raise _malformed("second o= line", n)
            origin = _parse_origin(value, n)
        elif kind == "s":
            session_name = value
        elif kind == "v":
            raise _malformed("second v= line", n)
        else:
            session_lines.append((n, kind, value))
    else:
        rest = []
    if origin is None:
        raise _malformed("no o= line")
    for n, kind, _ in rest:
        if kind in "vost":
            raise _malformed(f"'{kind}=' line inside a media section", n)
    builders = _split_sections(session_lines + rest, _KNOWN_TYPES)
    session, media = builders[0], builders[1:]
    _check_mids(session, media)
    return Offer(
        origin=origin,
        session_name=session_name,
        media=tuple(b.section(i) for i, b in enumerate(media)),
        connection=session.connection,
        direction=session.direction,
        ice_lite=session.ice_lite,
        ice_ufrag=session.ice_ufrag,
        ice_pwd=session.ice_pwd,
        ice_options=session.ice_options,
        fingerprints=tuple(session.fingerprints),
        setup=session.setup,
        groups=tuple(session.groups),
        extmap_allow_mixed=session.extmap_allow_mixed,
        attributes=tuple(session.attributes),
    )


@dataclass(frozen=True, slots=True)
class SdpFrag:
    """An RFC 8840 trickle-ice-sdpfrag (a WHIP PATCH body, RFC 9725 §4.4).

    ``candidates`` pairs each candidate with the mid of its m= section (None when the
    client put it at session level, which RFC 8840 does not allow but is harmless).
    """

    ice_ufrag: str | None
    ice_pwd: str | None
    ice_options: tuple[str, ...]
    groups: tuple[Group, ...]
    mids: tuple[str, ...]
    candidates: tuple[tuple[str | None, Candidate], ...]
    end_of_candidates: bool

    def is_ice_restart(self, current_remote_ufrag: str) -> bool:
        """RFC 8839 §4.4.1.1.1: new credentials mean an ICE restart (RFC 9725 §4.4.1)."""
        return self.ice_ufrag is not None and self.ice_ufrag != current_remote_ufrag


def parse_sdpfrag_untrusted(text: str | bytes) -> SdpFrag:
    """Parse a trickle-ice-sdpfrag (RFC 8840 §9). Raises only :class:`SdpError`.

    ::

        a=ice-ufrag:EsAw                    <- session or media level; both or neither
        a=ice-pwd:bP+XJMM09aR8AiX1jdukzR6Y
        a=group:BUNDLE 0
        m=audio 9 UDP/TLS/RTP/SAVPF 111
        a=mid:0
        a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host
        a=end-of-candidates
    """
    builders = _split_sections(_lines_untrusted(text), _FRAG_TYPES)
    ufrags = {b.ice_ufrag for b in builders if b.ice_ufrag is not None}
    pwds = {b.ice_pwd for b in builders if b.ice_pwd is not None}
    if len(ufrags) > 1 or len(pwds) > 1:
        raise _malformed("sdpfrag carries two different ICE credentials")
    if len(ufrags) != len(pwds):
        raise _malformed("sdpfrag has ice-ufrag without ice-pwd or vice versa")
    return SdpFrag(
        ice_ufrag=next(iter(ufrags), None),
        ice_pwd=next(iter(pwds), None),
        ice_options=tuple(o for b in builders for o in b.ice_options),
        groups=tuple(g for b in builders for g in b.groups),
        mids=tuple(b.mid for b in builders if b.mid is not None),
        candidates=tuple((b.mid, c) for b in builders for c in b.candidates),
        end_of_candidates=any(b.end_of_candidates for b in builders),
    )
