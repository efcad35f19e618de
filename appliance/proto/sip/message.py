"""SIP messages (RFC 3261 §7, §20, §25): parse untrusted bytes, build, serialise.

Implemented:

* §7.1/§7.2 start lines (exactly one SP between request-line elements, ``SIP/2.0`` only:
  anything else is 505); §7.3 headers with §7.3.1 line folding (a line starting with SP/HT
  continues the previous one), case-insensitive names, the compact forms of §7.3.3 and the
  extensions' (RFC 3265 ``o``/``u``, RFC 3515 ``r``, RFC 3892 ``b``, RFC 4028 ``x``, RFC
  3841 ``a``/``j``/``d``), comma-separated lists split into one entry per value (§7.3.1:
  equivalent) for the headers whose grammar is a list;
* §7.4/§18.3 the body: on a datagram, ``Content-Length`` (when present) cuts the body and a
  body shorter than it is a 400; on a stream :class:`StreamFramer` needs it to find the end;
* §20 the headers a UAS core reads, as typed views: :class:`Via` (branch, received, rport of
  RFC 3581), :class:`NameAddr` (From/To/Contact/Route/Record-Route/Refer-To: display name,
  URI, ``tag``), :class:`CSeq`, Call-ID, Max-Forwards;
* §19.1 / §25.1 URIs: ``sip:``/``sips:`` (user, password, host incl. IPv6 references,
  port, ``;params``, ``?headers``), ``tel:`` (RFC 3966 number and params) and any other
  absoluteURI kept opaque.

Bounds (all checked before any work proportional to them): :data:`MAX_MESSAGE` bytes,
:data:`MAX_HEADERS` header entries, :data:`MAX_LINE` bytes per (unfolded) header line,
:data:`MAX_BODY` body bytes, :data:`MAX_URI` Request-URI characters.

Omitted: RFC 2047 encoded display names (kept as written), ``%``-unescaping for comparison
(§19.1.4 URI equivalence compares as written, case-insensitive where the RFC says so),
multipart bodies (a body is bytes; its Content-Type is the caller's business), S/MIME.

Every ``*_untrusted`` function raises only :class:`SipError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Final

from appliance.proto.sip.errors import SipError

__all__ = [
    "COMPACT", "MAX_BODY", "MAX_HEADERS", "MAX_LINE", "MAX_MESSAGE", "MAX_URI", "CSeq",
    "NameAddr", "RawMessage", "Request", "Response", "SipError", "StreamFramer", "Uri", "Via",
    "parse_name_addr_untrusted", "parse_untrusted", "parse_uri_untrusted",
    "parse_via_untrusted", "split_list",
]

MAX_MESSAGE: Final = 65_535  # a UDP datagram's payload; streams are framed to the same cap
MAX_HEADERS: Final = 128
MAX_LINE: Final = 8192
MAX_BODY: Final = 32_768  # an SDP offer is a few kB; a sipfrag or dtmf-relay far less
MAX_URI: Final = 1024

#: §7.3.3 and extensions: compact form -> canonical name.
COMPACT: Final[dict[str, str]] = {
    "i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length",
    "c": "Content-Type", "f": "From", "s": "Subject", "k": "Supported", "t": "To",
    "v": "Via", "o": "Event", "u": "Allow-Events", "r": "Refer-To", "b": "Referred-By",
    "x": "Session-Expires", "a": "Accept-Contact", "j": "Reject-Contact",
    "d": "Request-Disposition", "y": "Identity", "n": "Identity-Info",
}

_CANONICAL: Final[dict[str, str]] = {
    n.lower(): n for n in (
        "Accept", "Accept-Encoding", "Accept-Language", "Alert-Info", "Allow", "Allow-Events",
        "Authentication-Info", "Authorization", "Call-ID", "Call-Info", "Contact",
        "Content-Disposition", "Content-Encoding", "Content-Language", "Content-Length",
        "Content-Type", "CSeq", "Date", "Error-Info", "Event", "Expires", "From",
        "In-Reply-To", "Max-Forwards", "MIME-Version", "Min-Expires", "Organization",
        "Priority", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Require",
        "Record-Route", "Refer-To", "Referred-By", "Reply-To", "Require", "Retry-After",
        "Route", "Server", "Session-Expires", "Subject", "Subscription-State", "Supported",
        "Timestamp", "To", "Unsupported", "User-Agent", "Via", "Warning", "WWW-Authenticate",
        "Accept-Contact", "Reject-Contact", "Request-Disposition", "Identity",
        "Identity-Info", "P-Asserted-Identity", "Privacy", "Diversion", "Reason",
    )
}

#: Headers whose §25.1 grammar is a comma list: one entry per element after parsing.
_LISTS: Final = frozenset(n.lower() for n in (
    "Via", "Contact", "Route", "Record-Route", "Allow", "Supported", "Require",
    "Proxy-Require", "Unsupported", "Accept", "Accept-Encoding", "Accept-Language",
    "Allow-Events", "Content-Encoding", "Content-Language", "In-Reply-To", "Warning",
    "Error-Info", "Alert-Info", "Call-Info", "P-Asserted-Identity", "Reason",
))

# RFC 3261 §25.1 token: alphanum / "-" / "." / "!" / "%" / "*" / "_" / "+" / "`" / "'" / "~"
_TOKEN = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+\Z")
_STATUS = re.compile(r"[1-6][0-9][0-9]\Z")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-.]+)\Z")
_REQUIRED: Final = ("Via", "From", "To", "Call-ID", "CSeq")


# --------------------------------------------------------------------------------------
# Small lexical helpers


def canonical(name: str) -> str:
    """The canonical spelling of a header name (compact forms expanded)."""
    low = name.lower()
    if low in COMPACT:
        return COMPACT[low]
    return _CANONICAL.get(low, name)


def split_list(value: str) -> list[str]:
    """Split a §7.3.1 comma list, honouring quoted strings and ``<...>`` (a URI may hold
    commas in its parameters)."""
    return [part.strip() for part in _split_outside(value, ",", angles=True)]


def _split_outside(text: str, sep: str, *, angles: bool) -> list[str]:
    """Split ``text`` at ``sep`` outside quoted strings (honouring §25.1 quoted-pairs:
    ``\\"`` inside quotes does not end them, as :func:`_quote_if_needed` writes them) and,
    with ``angles``, outside ``<...>``."""
    out: list[str] = []
    in_angle = False
    quoted = False
    escape = False
    start = 0
    for i, ch in enumerate(text):
        if escape:
            escape = False
        elif quoted:
            if ch == "\\":
                escape = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif angles and ch == "<":
            in_angle = True
        elif angles and ch == ">":
            in_angle = False
        elif ch == sep and not in_angle:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def _unquote_pairs(text: str) -> str:
    """The inside of a quoted string with its §25.1 quoted-pairs undone (``\\"`` -> ``"``)."""
    return _QUOTED_PAIR.sub(r"\1", text)


_QUOTED_PAIR = re.compile(r"\\(.)")


def _split_params(text: str, what: str) -> tuple[tuple[str, str | None], ...]:
    """``;name[=value]`` list (the leading ``;`` already removed), quoted values kept
    with their quotes stripped. Names are lower-cased (§20: parameter names are
    case-insensitive)."""
    out: list[tuple[str, str | None]] = []
    if not text.strip():
        return ()
    for item in _split_outside(text, ";", angles=False):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not name or not _TOKEN.match(name):
            raise SipError(f"Bad {what} parameter")
        v: str | None = value.strip() if sep else None
        if v is not None and len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = _unquote_pairs(v[1:-1])
        out.append((name.lower(), v))
    return tuple(out)


def _param(params: tuple[tuple[str, str | None], ...], name: str) -> str | None:
    for k, v in params:
        if k == name:
            return v if v is not None else ""
    return None


def _format_params(params: tuple[tuple[str, str | None], ...]) -> str:
    return "".join(f";{k}" if v is None else f";{k}={_quote_if_needed(v)}" for k, v in params)


def _quote_if_needed(v: str) -> str:
    if v == "" or _TOKEN.match(v) or _HOST.match(v) or re.fullmatch(r"[A-Za-z0-9\-.!%*_+`'~:\[\]]+", v):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _port(text: str, what: str) -> int:
    if not text.isdigit() or len(text) > 5 or not 0 < int(text) < 65536:
        raise SipError(f"Bad {what} port")
    return int(text)


# --------------------------------------------------------------------------------------
# URIs (§19.1, §25.1; RFC 3966 tel:)


@dataclass(frozen=True, slots=True)
class Uri:
    """A SIP, SIPS or tel URI; any other scheme keeps ``opaque`` (everything after ``:``)."""

    scheme: str  # lower-cased
    user: str | None = None  # sip user part, or the tel number
    password: str | None = None
    host: str = ""  # lower-cased; IPv6 with its brackets
    port: int | None = None
    params: tuple[tuple[str, str | None], ...] = ()
    headers: str = ""  # the ?h=v&... part as written, without '?'
    opaque: str = ""

    @property
    def is_sip(self) -> bool:
        return self.scheme in ("sip", "sips")

    def param(self, name: str) -> str | None:
        return _param(self.params, name.lower())

    @property
    def host_port(self) -> tuple[str, int]:
        """``(host, port)`` with the §19.1.2 default port (5061 for sips)."""
        host = self.host[1:-1] if self.host.startswith("[") else self.host
        return host, self.port or (5061 if self.scheme == "sips" else 5060)

    def __str__(self) -> str:
        if self.scheme == "tel":
            return f"tel:{self.user or ''}{_format_params(self.params)}"
        if not self.is_sip:
            return f"{self.scheme}:{self.opaque}"
        userinfo = ""
        if self.user is not None:
            userinfo = self.user + (f":{self.password}" if self.password is not None else "") + "@"
        port = f":{self.port}" if self.port is not None else ""
        hdrs = f"?{self.headers}" if self.headers else ""
        return f"{self.scheme}:{userinfo}{self.host}{port}{_format_params(self.params)}{hdrs}"

    def __repr__(self) -> str:
        # a URI's password (deprecated, §19.1.1) must not reach a log through repr
        shown = self if self.password is None else replace(self, password="***")
        return f"Uri({str(shown)!r})"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*\Z")
_URI_BAD = re.compile(r'[\x00-\x20<>"\x7f]')
_LINE_BAD = re.compile(r"[\r\n\x00]")


def parse_uri_untrusted(text: str) -> Uri:
    """Parse an addr-spec (§25.1 SIP-URI / SIPS-URI / absoluteURI, RFC 3966 telephone-uri)."""
    if len(text) > MAX_URI:
        raise SipError("Request-URI Too Long", status=414)
    scheme, sep, rest = text.partition(":")
    if not sep or not _SCHEME.match(scheme) or not rest:
        raise SipError("Bad URI")
    scheme = scheme.lower()
    if _URI_BAD.search(rest):
        raise SipError("Bad URI")
    if scheme == "tel":
        number, _, params = rest.partition(";")
        if not number or not re.fullmatch(r"\+?[0-9A-Fa-f*#.\-()pw]+", number):
            raise SipError("Bad tel URI")
        return Uri("tel", user=number, params=_split_params(params, "URI"))
    if scheme not in ("sip", "sips"):
        return Uri(scheme, opaque=rest)
    user: str | None = None
    password: str | None = None
    if "@" in rest:
        # the user part may hold '?', ';' and ',' (RFC 4475 §3.1.1.2): the host part
        # starts after the last '@'
        userinfo, _, rest = rest.rpartition("@")
        user, psep, pw = userinfo.partition(":")
        if not user:
            raise SipError("Bad URI user")
        password = pw if psep else None
    rest, _, headers = rest.partition("?")
    hostport, _, params = rest.partition(";")
    host, port = _split_hostport(hostport, "URI")
    return Uri(scheme, user=user, password=password, host=host, port=port,
               params=_split_params(params, "URI"), headers=headers)


def _split_hostport(text: str, what: str) -> tuple[str, int | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SipError(f"Bad {what} host")
        host, tail = text[: end + 1], text[end + 1 :]
        if tail and not tail.startswith(":"):
            raise SipError(f"Bad {what} host")
        port_text = tail[1:] if tail else None
    else:
        host, psep, port_text_ = text.partition(":")
        port_text = port_text_ if psep else None
    if not host or not _HOST.match(host):
        raise SipError(f"Bad {what} host")
    return host.lower(), (_port(port_text, what) if port_text is not None else None)


# --------------------------------------------------------------------------------------
# name-addr (§20.10 Contact, §20.20 From, §20.39 To, §20.30/§20.34 Record-Route/Route)


@dataclass(frozen=True, slots=True)
class NameAddr:
    """``["display"] <uri>;params`` or a bare addr-spec with params; ``star`` for
    ``Contact: *``."""

    uri: Uri
    display: str | None = None
    params: tuple[tuple[str, str | None], ...] = ()

    @property
    def tag(self) -> str | None:
        return _param(self.params, "tag")

    def param(self, name: str) -> str | None:
        return _param(self.params, name.lower())

    def with_tag(self, tag: str) -> NameAddr:
        rest = tuple(p for p in self.params if p[0] != "tag")
        return replace(self, params=(*rest, ("tag", tag)))

    def __str__(self) -> str:
        disp = f'"{self.display}" ' if self.display else ""
        return f"{disp}<{self.uri}>{_format_params(self.params)}"


def parse_name_addr_untrusted(text: str, what: str = "name-addr") -> NameAddr:
    text = text.strip()
    if not text:
        raise SipError(f"Empty {what}")
    display: str | None = None
    if text[0] == '"':
        i, escape = 1, False
        while i < len(text):
            ch = text[i]
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                break
            i += 1
        else:
            raise SipError(f"Unterminated quoted display name in {what}")
        display = _unquote_pairs(text[1:i])
        text = text[i + 1 :].lstrip()
        if not text.startswith("<"):
            raise SipError(f"Bad {what}")
    lt = text.find("<")
    if lt >= 0:
        if display is None:
            token = text[:lt].strip()
            if token and not all(_TOKEN.match(w) for w in token.split()):
                raise SipError(f"Bad display name in {what}")
            display = token or None
        gt = text.find(">", lt)
        if gt < 0:
            raise SipError(f"Unterminated <URI> in {what}")
        uri_text, tail = text[lt + 1 : gt], text[gt + 1 :].strip()
        if tail and not tail.startswith(";"):
            raise SipError(f"Bad {what}")
        params = tail[1:] if tail else ""
    else:
        # addr-spec form: §20 "the URI cannot contain commas, semicolons or question
        # marks": parameters after ';' belong to the header, not to the URI.
        uri_text, _, params = text.partition(";")
        uri_text = uri_text.strip()
        if "?" in uri_text:
            raise SipError(f"URI with headers must be in <> in {what}")
    return NameAddr(parse_uri_untrusted(uri_text), display, _split_params(params, what))


# --------------------------------------------------------------------------------------
# Via (§20.42, §18.2.1; RFC 3581 rport)


@dataclass(frozen=True, slots=True)
class Via:
    transport: str  # upper-cased: UDP, TCP, TLS, SCTP, WS, WSS
    host: str
    port: int | None = None
    params: tuple[tuple[str, str | None], ...] = ()

    @property
    def branch(self) -> str | None:
        return _param(self.params, "branch")

    @property
    def received(self) -> str | None:
        return _param(self.params, "received")

    @property
    def rport(self) -> str | None:
        """``""`` when requested (a bare ``;rport``), the filled value, or None."""
        return _param(self.params, "rport")

    @property
    def sent_by(self) -> tuple[str, int]:
        return self.host, self.port or (5061 if self.transport == "TLS" else 5060)

    def with_received(self, ip: str, port: int) -> Via:
        """§18.2.1 ``received`` when the sent-by host is not the source address, and RFC
        3581 §4 ``rport`` filled (and ``received`` added) when the client asked for it."""
        host = self.host[1:-1] if self.host.startswith("[") else self.host
        params = list(self.params)
        wants_rport = self.rport is not None
        if wants_rport or host != ip:
            params = [p for p in params if p[0] != "received"]
            params.append(("received", ip))
        if wants_rport:
            params = [("rport", str(port)) if k == "rport" else (k, v) for k, v in params]
        return replace(self, params=tuple(params))

    def __str__(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        return f"SIP/2.0/{self.transport} {self.host}{port}{_format_params(self.params)}"


_VIA = re.compile(r"\s*SIP\s*/\s*2\.0\s*/\s*([A-Za-z0-9\-.!%*_+`'~]+)\s+([^;]*)(?:;(.*))?\Z",
                  re.IGNORECASE | re.DOTALL)


def parse_via_untrusted(text: str) -> Via:
    """One via-parm (§20.42): ``SIP / 2.0 / transport sent-by *(;param)``, LWS allowed
    around the slashes (RFC 4475 §3.1.1.1)."""
    m = _VIA.match(text)
    if m is None:
        raise SipError("Bad Via")
    transport, hostport, params = m.group(1), m.group(2), m.group(3) or ""
    hostport = hostport.strip()
    if " " in hostport or "\t" in hostport:
        # "host : port" with LWS is legal (§20.42 sent-by uses COLON): collapse it
        hostport = re.sub(r"\s*:\s*", ":", hostport)
    host, port = _split_hostport(hostport, "Via")
    via = Via(transport.upper(), host, port, _split_params(params, "Via"))
    if via.branch == "":
        raise SipError("Empty Via branch")
    return via


# --------------------------------------------------------------------------------------
# CSeq (§20.16)


@dataclass(frozen=True, slots=True)
class CSeq:
    seq: int
    method: str

    def __str__(self) -> str:
        return f"{self.seq} {self.method}"


def parse_cseq_untrusted(text: str) -> CSeq:
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[0]) > 10 or not _TOKEN.match(parts[1]):
        raise SipError("Bad CSeq")
    seq = int(parts[0])
    if seq >= 2**31:  # §8.1.1.5: "MUST be less than 2**31"
        raise SipError("CSeq out of range")
    return CSeq(seq, parts[1])


# --------------------------------------------------------------------------------------
# Messages


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RawMessage:
    """What parsed before a semantic check failed: kept on :class:`SipError` so a 400 can
    still be addressed (§8.2.6 copies Via, From, To, Call-ID, CSeq)."""

    method: str | None  # None for a response
    headers: Headers


class _Message:
    """Header access shared by :class:`Request` and :class:`Response`."""

    __slots__ = ()
    headers: Headers
    body: bytes

    def get(self, name: str) -> str | None:
        """The first value of ``name`` (any spelling, compact forms too), or None."""
        want = canonical(name).lower()
        for k, v in self.headers:
            if k.lower() == want:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        want = canonical(name).lower()
        return [v for k, v in self.headers if k.lower() == want]

    @property
    def vias(self) -> tuple[Via, ...]:
        return tuple(parse_via_untrusted(v) for v in self.get_all("Via"))

    @property
    def from_(self) -> NameAddr:
        return parse_name_addr_untrusted(self.get("From") or "", "From")

    @property
    def to(self) -> NameAddr:
        return parse_name_addr_untrusted(self.get("To") or "", "To")

    @property
    def call_id(self) -> str:
        return self.get("Call-ID") or ""

    @property
    def cseq(self) -> CSeq:
        return parse_cseq_untrusted(self.get("CSeq") or "")

    @property
    def contacts(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr_untrusted(v, "Contact") for v in self.get_all("Contact") if v != "*")

    @property
    def record_routes(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr_untrusted(v, "Record-Route") for v in self.get_all("Record-Route"))

    @property
    def routes(self) -> tuple[NameAddr, ...]:
        return tuple(parse_name_addr_untrusted(v, "Route") for v in self.get_all("Route"))

    @property
    def max_forwards(self) -> int | None:
        v = self.get("Max-Forwards")
        return int(v) if v is not None else None

    @property
    def content_type(self) -> str:
        """The media type, lower-cased, without parameters ("" when absent)."""
        return (self.get("Content-Type") or "").split(";")[0].strip().lower()

    def _header_bytes(self) -> bytes:
        # Content-Length is always recomputed; it stays where it was (round trips keep
        # the header order), or goes last
        lines: list[str] = []
        placed = False
        for k, v in self.headers:
            if k.lower() == "content-length":
                if not placed:
                    lines.append(f"Content-Length: {len(self.body)}\r\n")
                    placed = True
            else:
                lines.append(f"{k}: {v}\r\n")
        if not placed:
            lines.append(f"Content-Length: {len(self.body)}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Request(_Message):
    method: str
    uri: Uri
    headers: Headers
    body: bytes = b""

    @property
    def branch(self) -> str | None:
        vias = self.get_all("Via")
        return parse_via_untrusted(vias[0]).branch if vias else None

    def __bytes__(self) -> bytes:
        return f"{self.method} {self.uri} SIP/2.0\r\n".encode() + self._header_bytes() + self.body


@dataclass(frozen=True, slots=True)
class Response(_Message):
    status: int
    reason: str
    headers: Headers
    body: bytes = b""

    def __bytes__(self) -> bytes:
        return f"SIP/2.0 {self.status} {self.reason}\r\n".encode() + self._header_bytes() + self.body


Message = Request | Response


def replace_header(headers: Headers, name: str, values: Iterable[str]) -> Headers:
    """``headers`` with every ``name`` entry replaced by ``values`` at the first one's place."""
    want = canonical(name).lower()
    out: list[tuple[str, str]] = []
    placed = False
    for k, v in headers:
        if k.lower() == want:
            if not placed:
                out.extend((canonical(name), nv) for nv in values)
                placed = True
        else:
            out.append((k, v))
    if not placed:
        out.extend((canonical(name), nv) for nv in values)
    return tuple(out)


# --------------------------------------------------------------------------------------
# Parsing


def _head_and_body(data: bytes) -> tuple[list[str], bytes]:
    end = data.find(b"\r\n\r\n")
    if end >= 0:
        head, body = data[:end], data[end + 4 :]
        lines_b = head.split(b"\r\n")
    else:
        end = data.find(b"\n\n")
        if end < 0:
            if data.endswith(b"\r\n"):
                head, body = data[:-2], b""
            elif data.endswith(b"\n"):
                head, body = data[:-1], b""
            else:
                raise SipError("No empty line after the headers")
        else:
            head, body = data[:end], data[end + 2 :]
        lines_b = head.replace(b"\r\n", b"\n").split(b"\n")
    try:
        lines = [ln.decode("utf-8") for ln in lines_b]
    except UnicodeDecodeError:
        raise SipError("Headers are not UTF-8") from None
    return lines, body


def _unfold(lines: list[str]) -> list[str]:
    """§7.3.1 line folding: a line beginning with SP/HT continues the previous header."""
    out: list[str] = []
    for ln in lines:
        if _LINE_BAD.search(ln):
            raise SipError("Control character in a header line")
        if ln[:1] in (" ", "\t"):
            if not out:
                raise SipError("Folded line before any header")
            out[-1] = out[-1].rstrip() + " " + ln.strip()
        else:
            out.append(ln)
        if len(out[-1]) > MAX_LINE:
            raise SipError("Header line too long", status=513)
    return out


def _parse_headers(lines: list[str]) -> Headers:
    headers: list[tuple[str, str]] = []
    for ln in lines:
        name, sep, value = ln.partition(":")
        name = name.rstrip(" \t")
        if not sep or not _TOKEN.match(name):
            raise SipError("Malformed header line")
        cname = canonical(name)
        value = value.strip(" \t")
        if cname.lower() in _LISTS:
            items = split_list(value)
            if any(not item for item in items) and cname.lower() not in ("allow", "supported", "require",
                                                                         "unsupported", "accept",
                                                                         "proxy-require", "accept-encoding",
                                                                         "accept-language", "allow-events",
                                                                         "content-encoding",
                                                                         "content-language"):
                raise SipError(f"Empty element in {cname}")
            headers.extend((cname, item) for item in items if item)
        else:
            headers.append((cname, value))
        if len(headers) > MAX_HEADERS:
            raise SipError("Too many headers", status=513)
    return tuple(headers)


def parse_untrusted(data: bytes, *, stream: bool = False) -> Request | Response:
    """Parse one SIP message (a datagram, or one message cut by :class:`StreamFramer`).

    ``stream=True`` makes ``Content-Length`` mandatory (§18.3, §20.14). Raises only
    :class:`SipError` (its ``status``: 400/413/414/505/513; ``partial`` when the start
    line and headers parsed).
    """
    if len(data) > MAX_MESSAGE:
        raise SipError("Message Too Large", status=513)
    # §7.5: CRLFs before the start line are ignored on streams (and harmlessly here)
    data = data.lstrip(b"\r\n")
    lines, body = _head_and_body(data)
    if not lines or not lines[0]:
        raise SipError("Empty start line")
    start, header_lines = lines[0], _unfold(lines[1:])
    if len(start) > MAX_LINE:
        raise SipError("Start line too long", status=513)
    headers = _parse_headers(header_lines)
    if start.startswith("SIP/"):
        return _response(start, headers, body, stream)
    return _request(start, headers, body, stream)


def _cut_body(headers: Headers, body: bytes, stream: bool, partial: RawMessage) -> bytes:
    cls = [v for k, v in headers if k == "Content-Length"]
    if len(cls) > 1 and len(set(cls)) > 1:
        raise SipError("Conflicting Content-Length", partial=partial)
    if not cls:
        if stream:
            raise SipError("Missing Content-Length", partial=partial)
        length = len(body)
    else:
        v = cls[0]
        if not v.isdigit() or len(v) > 9:
            raise SipError("Bad Content-Length", partial=partial)
        length = int(v)
        if length > len(body):
            # §18.3: a datagram shorter than its Content-Length is discarded with a 400
            raise SipError("Body shorter than Content-Length", partial=partial)
    if length > MAX_BODY:
        raise SipError("Request Entity Too Large", status=413, partial=partial)
    return body[:length]


def _check_common(headers: Headers, partial: RawMessage) -> None:
    names = {k for k, _ in headers}
    for h in _REQUIRED:
        if h not in names:
            raise SipError(f"Missing {h}", partial=partial)
    for h in ("From", "To", "Call-ID", "CSeq", "Max-Forwards", "Content-Type", "Content-Length"):
        if sum(1 for k, _ in headers if k == h) > 1 and h not in ("Content-Length",):
            raise SipError(f"More than one {h}", partial=partial)
    msg = Response(0, "", headers)
    msg.vias  # noqa: B018 - each parse raises SipError naming the header
    msg.from_  # noqa: B018
    msg.to  # noqa: B018
    if not msg.call_id or " " in msg.call_id:
        raise SipError("Bad Call-ID", partial=partial)
    mf = msg.get("Max-Forwards")
    if mf is not None and (not mf.isdigit() or len(mf) > 10 or int(mf) > 255):
        raise SipError("Bad Max-Forwards", partial=partial)


def _request(start: str, headers: Headers, body: bytes, stream: bool) -> Request:
    parts = start.split(" ")
    if len(parts) != 3 or not all(parts):
        raise SipError("Malformed request line")
    method, uri_text, version = parts
    if not _TOKEN.match(method):
        raise SipError("Bad method")
    partial = RawMessage(method, headers)
    if version.upper() != "SIP/2.0":
        if re.fullmatch(r"SIP/\d+\.\d+", version, re.IGNORECASE):
            raise SipError("Version Not Supported", status=505, partial=partial)
        raise SipError("Malformed request line", partial=partial)
    try:
        uri = parse_uri_untrusted(uri_text)
        _check_common(headers, partial)
        cseq = parse_cseq_untrusted(dict(headers)["CSeq"])
        contacts = Response(0, "", headers).get_all("Contact")
        for c in contacts:
            if c != "*":
                parse_name_addr_untrusted(c, "Contact")
        for name in ("Route", "Record-Route"):
            for v in Response(0, "", headers).get_all(name):
                parse_name_addr_untrusted(v, name)
    except SipError as e:
        raise SipError(e.reason, status=e.status, partial=partial) from None
    if cseq.method != method:
        raise SipError("CSeq method does not match the request", partial=partial)
    return Request(method, uri, headers, _cut_body(headers, body, stream, partial))


def _response(start: str, headers: Headers, body: bytes, stream: bool) -> Response:
    version, _, rest = start.partition(" ")
    code, _, reason = rest.partition(" ")
    if version.upper() != "SIP/2.0":
        raise SipError("Version Not Supported", status=505)
    if not _STATUS.match(code):
        raise SipError("Bad status code")
    partial = RawMessage(None, headers)
    _check_common(headers, partial)
    parse_cseq_untrusted(dict(headers)["CSeq"])
    return Response(int(code), reason, headers, _cut_body(headers, body, stream, partial))


# --------------------------------------------------------------------------------------
# Stream framing (§18.3)


@dataclass(slots=True)
class StreamFramer:
    """Cut a TCP/TLS byte stream into SIP messages by ``Content-Length`` (§18.3).

    ``feed(data)`` buffers; ``next()`` returns one whole message's bytes or None. CRLFs
    between messages are RFC 5626 §4.4.1 keep-alives: each ``CRLFCRLF`` ping counts in
    :attr:`pings` (the shell answers a single CRLF "pong"). A header block or a message over
    ``max_message`` raises :class:`SipError` (513): the stream cannot be resynchronised, so
    the shell closes it.
    """

    max_message: int = MAX_MESSAGE
    pings: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) > 2 * self.max_message:
            raise SipError("Message Too Large", status=513)

    def __iter__(self) -> Iterator[bytes]:
        while (m := self.next()) is not None:
            yield m

    def next(self) -> bytes | None:
        buf = self._buf
        skipped = 0
        while skipped < len(buf) and buf[skipped] in (0x0D, 0x0A):
            skipped += 1
        if skipped == len(buf):
            # only CR/LF so far: count whole CRLFCRLF pings, keep a partial one
            run = bytes(buf)
            if (n := run.count(b"\r\n\r\n")) > 0:
                self.pings += n
                del buf[: run.rfind(b"\r\n\r\n") + 4]
            return None
        if skipped:
            self.pings += bytes(buf[:skipped]).count(b"\r\n\r\n")
            del buf[:skipped]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > self.max_message:
                raise SipError("Message Too Large", status=513)
            return None
        head = bytes(buf[:end])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            if sep and name.strip().lower() in (b"content-length", b"l"):
                v = value.strip()
                if not v.isdigit() or len(v) > 9:
                    raise SipError("Bad Content-Length")
                length = int(v)
        total = end + 4 + length
        if total > self.max_message:
            raise SipError("Message Too Large", status=513)
        if len(buf) < total:
            return None
        msg = bytes(buf[:total])
        del buf[:total]
        return msg
