"""SIP message parsing: RFC 4475 torture messages, compact forms, limits, framing."""

from __future__ import annotations

import pytest

from appliance.proto.sip import Request, Response, SipError, StreamFramer, parse_untrusted
from appliance.proto.sip.message import (
    MAX_BODY,
    MAX_HEADERS,
    parse_name_addr_untrusted,
    parse_uri_untrusted,
    parse_via_untrusted,
)

SDP150 = (
    "v=0\no=mhandley 29739 7272939 IN IP4 192.0.2.3\ns=-\nc=IN IP4 192.0.2.4\nt=0 0\n"
    "m=audio 49217 RTP/AVP 0 12\nm=video 3227 RTP/AVP 31\na=rtpmap:31 LPC\n"
)


def wire(text: str) -> bytes:
    """RFC 4475 prints messages with bare line ends; the wire has CRLF."""
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode("utf-8")


# ---- RFC 4475 §3.1.1: valid messages (transcribed from the RFC; §3.1.1.2's To display
# name drops the raw BEL/NUL/DEL bytes: we refuse NUL in a header line on purpose)

WSINV = """INVITE sip:vivekg@chair-dnrc.example.com;unknownparam SIP/2.0
TO :
 sip:vivekg@chair-dnrc.example.com ;   tag    = 1918181833n
from   : "J Rosenberg \\\\\\""       <sip:jdrosen@example.com>
  ;
  tag = 98asjd8
MaX-fOrWaRdS: 0068
Call-ID: wsinv.ndaksdj@192.0.2.1
Content-Length   : 150
cseq: 0009
  INVITE
Via  : SIP  /   2.0
 /UDP
    192.0.2.2;branch=390skdjuw
s :
NewFangledHeader:   newfangled value
 continued newfangled value
UnknownHeaderWithUnusualValue: ;;,,;;,;
Content-Type: application/sdp
Route:
 <sip:services.example.com;lr;unknownwith=value;unknown-no-value>
v:  SIP  / 2.0  / TCP     spindle.example.com   ;
  branch  =   z9hG4bK9ikj8  ,
 SIP  /    2.0   / UDP  192.168.255.111   ; branch=
 z9hG4bK30239
m:"Quoted string \\"\\"" <sip:jdrosen@example.com> ; newparam =
      newvalue ;
  secondparam ; q = 0.33

""" + SDP150

INTMETH = """!interesting-Method0123456789_*+`.%indeed'~ sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*:&it+has=1,weird!*pas$wo~d_too.(doesn't-it)@example.com SIP/2.0
Via: SIP/2.0/TCP host1.example.com;branch=z9hG4bK-.!%66*_+`'~
To: "BEL: NUL: DEL:" <sip:1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*@example.com>
From: token1~` token2'+_ token3*%!.- <sip:mundane@example.com>;fromParam''~+*_!.-%="работающий";tag=_token~1'+`*%!-.
Call-ID: intmeth.word%ZK-!.*_+'@word`~)(><:\\/"][?}{
CSeq: 139122385 !interesting-Method0123456789_*+`.%indeed'~
Max-Forwards: 255
extensionHeader-!.%*+_`'~: ﻿大停電
Content-Length: 0

"""

ESC01 = """INVITE sip:sips%3Auser%40example.com@example.net SIP/2.0
To: sip:%75se%72@example.com
From: <sip:I%20have%20spaces@example.net>;tag=938
Max-Forwards: 87
i: esc01.239409asdfakjkn23onasd0-3234
CSeq: 234234 INVITE
Via: SIP/2.0/UDP host5.example.net;branch=z9hG4bKkdjuw
C: application/sdp
Contact:
  <sip:cal%6Cer@host5.example.net;%6C%72;n%61me=v%61lue%25%34%31>
Content-Length: 150

""" + SDP150

LWSDISP = """OPTIONS sip:user@example.com SIP/2.0
To: sip:user@example.com
From: caller<sip:caller@example.com>;tag=323
Max-Forwards: 70
Call-ID: lwsdisp.1234abcd@funky.example.com
CSeq: 60 OPTIONS
Via: SIP/2.0/UDP funky.example.com;branch=z9hG4bKkdjuw
l: 0

"""

DBLREQ = """REGISTER sip:example.com SIP/2.0
To: sip:j.user@example.com
From: sip:j.user@example.com;tag=43251j3j324
Max-Forwards: 8
I: dblreq.0ha0isndaksdj99sdfafnl3lk233412
Contact: sip:j.user@host.example.com
CSeq: 8 REGISTER
Via: SIP/2.0/UDP 192.0.2.125;branch=z9hG4bKkdjuw23492
Content-Length: 0

INVITE sip:joe@example.com SIP/2.0
t: sip:joe@example.com
"""

SEMIURI = """OPTIONS sip:user;par=u%40example.net@example.com SIP/2.0
To: sip:j_user@example.com
From: sip:caller@example.org;tag=33242
Max-Forwards: 3
Call-ID: semiuri.0ha0isndaksdj
CSeq: 8 OPTIONS
Accept: application/sdp, application/pkcs7-mime,
        multipart/mixed, multipart/signed,
        message/sip, message/sipfrag
Via: SIP/2.0/UDP 192.0.2.1;branch=z9hG4bKkdjuw
l: 0

"""

TRANSPORTS = """OPTIONS sip:user@example.com SIP/2.0
To: sip:user@example.com
From: <sip:caller@example.com>;tag=323
Max-Forwards: 70
Call-ID:  transports.kijh4akdnaqjkwendsasfdj
Accept: application/sdp
CSeq: 60 OPTIONS
Via: SIP/2.0/UDP t1.example.com;branch=z9hG4bKkdjuw
Via: SIP/2.0/SCTP t2.example.com;branch=z9hG4bKklasjdhf
Via: SIP/2.0/TLS t3.example.com;branch=z9hG4bK2980unddj
Via: SIP/2.0/UNKNOWN t4.example.com;branch=z9hG4bKasd0f3en
Via: SIP/2.0/TCP t5.example.com;branch=z9hG4bK0a9idfnee
l: 0

"""

NOREASON = """SIP/2.0 100
Via: SIP/2.0/UDP 192.0.2.105;branch=z9hG4bK2398ndaoe
Call-ID: noreason.asndj203insdf99223ndf
CSeq: 35 INVITE
From: <sip:user@example.com>;tag=39ansfi3
To: <sip:user@example.edu>;tag=902jndnke3
Content-Length: 0
Contact: <sip:user@host105.example.com>

"""

UNREASON = """SIP/2.0 200 = 2**3 * 5**2 но сто девяносто девять - простое
Via: SIP/2.0/UDP 192.0.2.198;branch=z9hG4bK1324923
Call-ID: unreason.1234ksdfak3j2erwedfsASdf
CSeq: 35 INVITE
From: sip:user@example.com;tag=11141343
To: sip:user@example.edu;tag=2229
Content-Length: 0
Contact: <sip:user@host198.example.com>

"""


def _long_request() -> str:
    """§3.1.1.7 longreq, shortened where only the shape matters: 34 Vias in every
    capitalisation, very long tags, Call-ID and parameters."""
    vias = "".join(f"{n}: SIP/2.0/TCP sip{i}.example.com\n" for i, n in
                   zip(range(33, 0, -1), ["Via", "v", "V", "ViA", "VIa", "VIA", "via", "viA",
                                          "vIa", "vIA", "V ", "v ", "V  ", "v  "] + ["Via"] * 19,
                       strict=True))
    return (
        "INVITE sip:user@example.com SIP/2.0\n"
        f'To: "I have a user name of {"extreme" * 10} proportion" '
        f"<sip:user@example.com:6000;unknownparam1=very{'long' * 20}value>\n"
        f"F: sip:{'amazinglylongcallername' * 5}@example.net;tag=12{'982' * 50}424\n"
        f"Call-ID: longreq.one{'really' * 20}longcallid\n"
        "CSeq: 3882340 INVITE\n" + vias +
        f"Via: SIP/2.0/TCP host.example.com;received=192.0.2.5;branch=very{'long' * 50}branchvalue\n"
        "Max-Forwards: 70\nContent-Type: application/sdp\nl: 150\n\n" + SDP150
    )


def test_wsinv() -> None:
    m = parse_untrusted(wire(WSINV))
    assert isinstance(m, Request) and m.method == "INVITE"
    assert m.uri.host == "chair-dnrc.example.com" and m.uri.param("unknownparam") == ""
    assert m.to.tag == "1918181833n"
    assert m.from_.display == 'J Rosenberg \\"' and m.from_.tag == "98asjd8"
    assert m.max_forwards == 68 and m.cseq.seq == 9 and m.cseq.method == "INVITE"
    assert [v.host for v in m.vias] == ["192.0.2.2", "spindle.example.com", "192.168.255.111"]
    assert m.vias[1].transport == "TCP" and m.vias[1].branch == "z9hG4bK9ikj8"
    assert m.vias[2].branch == "z9hG4bK30239"
    assert m.get("Subject") == "" and m.get("s") == ""
    assert m.get("NewFangledHeader") == "newfangled value continued newfangled value"
    (c,) = m.contacts
    assert c.display == 'Quoted string ""' and c.param("newparam") == "newvalue"
    assert c.param("q") == "0.33" and c.param("secondparam") == ""
    assert m.routes[0].uri.param("lr") == ""
    assert len(m.body) == 150 and m.content_type == "application/sdp"


@pytest.mark.parametrize("text", [INTMETH, ESC01, LWSDISP, SEMIURI, TRANSPORTS, _long_request()],
                         ids=["intmeth", "esc01", "lwsdisp", "semiuri", "transports", "longreq"])
def test_valid_torture_requests_parse_and_round_trip(text: str) -> None:
    m = parse_untrusted(wire(text))
    assert isinstance(m, Request)
    again = parse_untrusted(bytes(m))
    assert again == m


def test_intmeth_details() -> None:
    m = parse_untrusted(wire(INTMETH))
    assert isinstance(m, Request)
    assert m.method == "!interesting-Method0123456789_*+`.%indeed'~"
    assert m.uri.user == "1_unusual.URI~(to-be!sure)&isn't+it$/crazy?,/;;*"
    assert m.uri.password == "&it+has=1,weird!*pas$wo~d_too.(doesn't-it)"
    assert "pas$wo" not in repr(m.uri)  # a URI password never reaches a log via repr
    assert m.from_.param("fromparam''~+*_!.-%") == "работающий"
    assert m.from_.tag == "_token~1'+`*%!-."


def test_dblreq_trailing_octets_ignored() -> None:
    m = parse_untrusted(wire(DBLREQ))
    assert isinstance(m, Request) and m.method == "REGISTER" and m.body == b""


def test_semiuri_and_lists() -> None:
    m = parse_untrusted(wire(SEMIURI))
    assert isinstance(m, Request)
    assert m.uri.user == "user;par=u%40example.net" and m.uri.host == "example.com"
    assert m.get_all("Accept") == ["application/sdp", "application/pkcs7-mime", "multipart/mixed",
                                   "multipart/signed", "message/sip", "message/sipfrag"]


def test_transports() -> None:
    m = parse_untrusted(wire(TRANSPORTS))
    assert [v.transport for v in m.vias] == ["UDP", "SCTP", "TLS", "UNKNOWN", "TCP"]


@pytest.mark.parametrize(("text", "status", "reason"), [(NOREASON, 100, ""),
                                                        (UNREASON, 200, "= 2**3 * 5**2 но сто девяносто девять - простое")])
def test_responses(text: str, status: int, reason: str) -> None:
    m = parse_untrusted(wire(text))
    assert isinstance(m, Response) and m.status == status and m.reason == reason
    assert parse_untrusted(bytes(m)) == m


# ---- RFC 4475 §3.1.2: invalid messages (the parts that make each one invalid)

BASE = """OPTIONS sip:user@example.com SIP/2.0
Via: SIP/2.0/UDP host.example.com;branch=z9hG4bKkdjuw
To: <sip:user@example.com>
From: <sip:caller@example.com>;tag=323
Call-ID: invalid.1234@host.example.com
CSeq: 8 OPTIONS
Max-Forwards: 70
Content-Length: 0

"""


def _mutate(old: str, new: str, base: str = BASE) -> str:
    assert old in base
    return base.replace(old, new, 1)


INVALID = {
    # RFC 4475 ncl: negative Content-Length
    "ncl": (_mutate("Content-Length: 0", "Content-Length: -999"), 400, "Content-Length"),
    # RFC 4475 scalar02: Max-Forwards and CSeq out of range
    "scalar-mf": (_mutate("Max-Forwards: 70", "Max-Forwards: 300"), 400, "Max-Forwards"),
    "scalar-cseq": (_mutate("CSeq: 8 OPTIONS", "CSeq: 36893488147419103232 OPTIONS"), 400, "CSeq"),
    # RFC 4475 quotbal: unterminated quoted display name
    "quotbal": (_mutate("To: <sip:user@example.com>", 'To: "Mr. J. User <sip:user@example.com>'),
                400, "Unterminated"),
    # RFC 4475 ltgtruri: Request-URI in angle brackets
    "ltgtruri": (_mutate("OPTIONS sip:user@example.com SIP/2.0", "OPTIONS <sip:user@example.com> SIP/2.0"),
                 400, "URI"),
    # RFC 4475 lwsruri: LWS inside the Request-URI
    "lwsruri": (_mutate("OPTIONS sip:user@example.com SIP/2.0", "OPTIONS sip:user@example.com; lr SIP/2.0"),
                400, "request line"),
    # RFC 4475 lwsstart: several spaces between request-line elements
    "lwsstart": (_mutate("OPTIONS sip:user@example.com SIP/2.0", "OPTIONS  sip:user@example.com  SIP/2.0"),
                 400, "request line"),
    # RFC 4475 trws: trailing SP after SIP/2.0
    "trws": (_mutate("OPTIONS sip:user@example.com SIP/2.0", "OPTIONS sip:user@example.com SIP/2.0 "),
             400, "request line"),
    # RFC 4475 badaspec: spaces inside <...>
    "badaspec": (_mutate("To: <sip:user@example.com>", 'To: "Watson, Thomas" < sip:t.watson@example.org >'),
                 400, "URI"),
    # RFC 4475 baddn: unquoted comma in a display name
    "baddn": (_mutate("From: <sip:caller@example.com>;tag=323",
                      "From: Bell, Alexander <sip:a.g.bell@example.com>;tag=43"), 400, "display name"),
    # RFC 4475 badvers: SIP/7.0
    "badvers": (_mutate("SIP/2.0\n", "SIP/7.0\n"), 505, "Version"),
    # RFC 4475 mismatch01: CSeq method differs from the method
    "mismatch01": (_mutate("CSeq: 8 OPTIONS", "CSeq: 8 INVITE"), 400, "CSeq method"),
    # RFC 4475 insuf: missing Call-ID (and others)
    "insuf": (_mutate("Call-ID: invalid.1234@host.example.com\n", ""), 400, "Missing Call-ID"),
    # RFC 4475 clerr flavour: Content-Length larger than the datagram's body
    "clerr": (_mutate("Content-Length: 0", "Content-Length: 99"), 400, "shorter than Content-Length"),
    # two Content-Lengths that disagree
    "mcl01": (_mutate("Content-Length: 0", "Content-Length: 0\nl: 5"), 400, "Conflicting"),
    "no-via": (_mutate("Via: SIP/2.0/UDP host.example.com;branch=z9hG4bKkdjuw\n", ""), 400, "Missing Via"),
    "bad-via": (_mutate("SIP/2.0/UDP host.example.com", "SIP/3.0/UDP host.example.com"), 400, "Via"),
    "two-from": (_mutate("Max-Forwards: 70", "Max-Forwards: 70\nFrom: <sip:x@y>;tag=1"), 400, "More than one From"),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_messages_raise_sip_error(name: str) -> None:
    text, status, words = INVALID[name]
    with pytest.raises(SipError) as e:
        parse_untrusted(wire(text))
    assert e.value.status == status
    assert words in e.value.reason


def test_bigcode_response() -> None:
    """RFC 4475 bigcode: a status code that is not 3 digits."""
    with pytest.raises(SipError, match="status"):
        parse_untrusted(wire(NOREASON.replace("SIP/2.0 100", "SIP/2.0 4294967301 better not break the receiver")))


def test_error_keeps_partial_headers_for_the_400() -> None:
    with pytest.raises(SipError) as e:
        parse_untrusted(wire(INVALID["mismatch01"][0]))
    assert e.value.partial is not None and e.value.partial.method == "OPTIONS"
    assert ("Call-ID", "invalid.1234@host.example.com") in e.value.partial.headers


def test_compact_forms_expand() -> None:
    text = """BYE sip:a@b SIP/2.0
v: SIP/2.0/UDP h;branch=z9hG4bK1
f: <sip:x@y>;tag=1
t: <sip:a@b>;tag=2
i: cid
CSeq: 2 BYE
m: <sip:x@h>
k: replaces, timer
u: refer
o: refer;id=3
r: <sip:c@d>
b: <sip:x@y>
x: 1800
c: text/plain
e: gzip
s: hi
l: 3

abc"""
    m = parse_untrusted(wire(text))
    names = [k for k, _ in m.headers]
    for full in ("Via", "From", "To", "Call-ID", "Contact", "Supported", "Allow-Events", "Event",
                 "Refer-To", "Referred-By", "Session-Expires", "Content-Type", "Content-Encoding",
                 "Subject", "Content-Length"):
        assert full in names
    assert m.get_all("k") == ["replaces", "timer"] and m.get("o") == "refer;id=3"
    assert m.body == b"abc"
    out = bytes(m)
    assert b"\r\nSupported: replaces\r\nSupported: timer\r\n" in out
    assert out.endswith(b"Content-Length: 3\r\n\r\nabc")


def test_limits() -> None:
    many = BASE.replace("Max-Forwards: 70", "Max-Forwards: 70\n" + "X-A: 1\n" * (MAX_HEADERS + 1))
    with pytest.raises(SipError) as e:
        parse_untrusted(wire(many))
    assert e.value.status == 513
    big = BASE.replace("Content-Length: 0", f"Content-Length: {MAX_BODY + 1}") + "x" * (MAX_BODY + 1)
    with pytest.raises(SipError) as e:
        parse_untrusted(wire(big))
    assert e.value.status == 413
    with pytest.raises(SipError) as e:
        parse_untrusted(b"x" * 70_000)
    assert e.value.status == 513
    with pytest.raises(SipError) as e:
        parse_untrusted(wire(BASE.replace("sip:user@example.com SIP", "sip:" + "u" * 2000 + "@e SIP")))
    assert e.value.status == 414


def test_stream_requires_content_length() -> None:
    with pytest.raises(SipError, match="Missing Content-Length"):
        parse_untrusted(wire(BASE.replace("Content-Length: 0\n", "")), stream=True)


def test_uris() -> None:
    u = parse_uri_untrusted("sips:alice:secret@[2001:db8::1]:5071;transport=tls?subject=x")
    assert (u.scheme, u.user, u.password, u.host, u.port) == ("sips", "alice", "secret", "[2001:db8::1]", 5071)
    assert u.param("TRANSPORT") == "tls" and u.headers == "subject=x"
    assert u.host_port == ("2001:db8::1", 5071)
    assert parse_uri_untrusted("sips:h").host_port == ("h", 5061)
    t = parse_uri_untrusted("tel:+1-201-555-0123;phone-context=example.com")
    assert t.user == "+1-201-555-0123" and str(t) == "tel:+1-201-555-0123;phone-context=example.com"
    assert str(parse_uri_untrusted("urn:service:sos")) == "urn:service:sos"
    for bad in ("sip:", "sip:@h", "sip:h:99999", "1sip:h", "sip:[::1", "tel:abc xyz"):
        with pytest.raises(SipError):
            parse_uri_untrusted(bad)


def test_name_addr_and_via_received() -> None:
    na = parse_name_addr_untrusted('"Bob" <sip:bob@b.example;transport=tcp>;tag=x;expires=60')
    assert na.display == "Bob" and na.uri.param("transport") == "tcp" and na.tag == "x"
    assert na.with_tag("y").tag == "y"
    bare = parse_name_addr_untrusted("sip:bob@b.example;tag=z")
    assert bare.tag == "z" and bare.uri.params == ()  # addr-spec params are header params
    v = parse_via_untrusted("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKa;rport")
    assert v.rport == ""
    filled = v.with_received("203.0.113.7", 40000)
    assert filled.rport == "40000" and filled.received == "203.0.113.7"
    same = parse_via_untrusted("SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKa").with_received("10.0.0.1", 5060)
    assert same.received is None  # §18.2.1: only when sent-by differs from the source
    assert parse_via_untrusted("SIP/2.0/UDP h : 5070 ;branch=z9hG4bKq").port == 5070


def test_a_stamped_via_with_a_quote_in_a_value_parses_back_to_itself() -> None:
    """Regression (found by tests/fuzz/test_deep.py::test_deep_sip_endpoint): a branch with a
    stray quote was accepted, the endpoint stamped the Via with ``received`` and wrote the
    branch out quoted with the quote escaped (§25.1 quoted-pair), and its own parser then
    ended the quoted string at the escaped quote and raised SipError("Bad Via parameter")
    out of ``SipEndpoint.handle_input``."""
    v = parse_via_untrusted('SIP/2.0/UDP 10.0.0.5:5060;branch=z9hG4"Ks1;rport')
    stamped = str(v.with_received("127.0.0.2", 5060))
    assert '\\"' in stamped  # written out escaped
    again = parse_via_untrusted(stamped)
    assert again.branch == v.branch == 'z9hG4"Ks1;rport'
    assert again.received == "127.0.0.2"
    assert parse_via_untrusted(str(again)) == again


def test_framer_byte_at_a_time() -> None:
    msgs = [wire(LWSDISP), wire(BASE.replace("Content-Length: 0", "Content-Length: 5")) + b"hello",
            wire(ESC01)]
    stream = b"\r\n\r\n" + msgs[0] + b"\r\n\r\n" + msgs[1] + msgs[2]
    f = StreamFramer()
    got = []
    for i in range(len(stream)):
        f.feed(stream[i : i + 1])
        got.extend(f)
    assert got == msgs
    assert f.pings == 2
    assert [parse_untrusted(m, stream=True).call_id for m in got] == [
        "lwsdisp.1234abcd@funky.example.com", "invalid.1234@host.example.com",
        "esc01.239409asdfakjkn23onasd0-3234"]


def test_framer_limits() -> None:
    f = StreamFramer(max_message=1000)
    f.feed(b"x" * 1001)  # no header end within the cap: the stream cannot be framed
    with pytest.raises(SipError):
        f.next()
    with pytest.raises(SipError):
        StreamFramer(max_message=1000).feed(b"x" * 2001)
    f = StreamFramer(max_message=1000)
    f.feed(b"INVITE sip:a SIP/2.0\r\nContent-Length: 5000\r\n\r\n")
    with pytest.raises(SipError):
        f.next()
    f = StreamFramer()
    f.feed(b"INVITE sip:a SIP/2.0\r\nl: -1\r\n\r\n")
    with pytest.raises(SipError):
        f.next()
