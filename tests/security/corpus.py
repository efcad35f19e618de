"""A generated corpus of malformed and hostile SDP offers for ``POST /v1/sessions``.

Every case is built from one valid browser-shaped offer (``ClientPeer.offer()``), so it is
deterministic apart from the certificate fingerprint and ICE credentials. A case says what
must come back:

* ``expect="reject"``: a 4xx problem+json, with ``code`` one of ``codes`` when given;
* ``expect="any"``: mutations whose result depends on which line was hit (a truncation
  after the last required line is still a valid offer): a 201 or a 4xx — never a 5xx — and a
  201's answer must not reflect anything the offer carried (``MARK``).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from appliance.client.peer import ClientPeer
from appliance.proto.dtls import Certificate

SDP = "application/sdp"
MARK = "INJECTED"  # a string no answer may ever contain


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    content_type: str | None = SDP
    expect: str = "reject"  # "reject" | "any"
    codes: frozenset[str] | None = None
    status: int | None = None


def _codes(*c: str) -> frozenset[str]:
    return frozenset(c)


MALFORMED = _codes("malformed")
TOO_LARGE = _codes("too-large", "body-too-large")


def base_lines() -> list[str]:
    offer = ClientPeer(Certificate.generate(time.time())).offer()
    return offer.split("\r\n")[:-1]


def join(lines: list[str], eol: str = "\r\n") -> bytes:
    return (eol.join(lines) + eol).encode("utf-8", "surrogatepass")


def _replace(lines: list[str], prefix: str, new: str | list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line.startswith(prefix):
            out += [new] if isinstance(new, str) else new
        else:
            out.append(line)
    return out


def _after(lines: list[str], prefix: str, extra: list[str]) -> list[str]:
    i = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    return lines[: i + 1] + extra + lines[i + 1 :]


def _drop(lines: list[str], *prefixes: str) -> list[str]:
    return [line for line in lines if not line.startswith(prefixes)]


def _audio_section(lines: list[str]) -> list[str]:
    i = next(i for i, line in enumerate(lines) if line.startswith("m=audio"))
    return lines[i:]


def _session(lines: list[str]) -> list[str]:
    i = next(i for i, line in enumerate(lines) if line.startswith("m=audio"))
    return lines[:i]


def build(seed: int = 9) -> list[Case]:
    rng = random.Random(seed)
    L = base_lines()
    cases: list[Case] = []

    def add(name: str, lines_or_body: list[str] | bytes, **kw: object) -> None:
        body = lines_or_body if isinstance(lines_or_body, bytes) else join(lines_or_body)
        cases.append(Case(name, body, **kw))  # type: ignore[arg-type]

    # -- truncated at every line, mid-line, and each line deleted --------------------------
    for k in range(len(L)):
        add(f"truncated-after-{k}-lines", L[:k] if k else b"v=0", expect="any")
        cut = L[:k] + [L[k][: max(1, len(L[k]) // 2)]]
        add(f"truncated-mid-line-{k}", (("\r\n".join(cut)).encode()), expect="any")
        add(f"line-{k}-deleted", L[:k] + L[k + 1 :], expect="any")

    # -- every line's value hostile ----------------------------------------------------------
    hostile_values = {
        "empty": "",
        "huge": "A" * 10_000,
        "format": f"%s%n%x{{0}}${{jndi:ldap://x}}<script>{MARK}</script>",
        "unicode": f"\u202e\u0000\ufeff{MARK}\U0001f600",
        "crlf-injection": f"x\r\na=ice-pwd:{MARK}{MARK}{MARK}\r\na=setup:passive",
    }
    for k, line in enumerate(L):
        typ = line[:2]
        for label, value in hostile_values.items():
            add(f"line-{k}-{typ[0]}-{label}", L[:k] + [typ + value] + L[k + 1 :], expect="any")

    # -- content types -----------------------------------------------------------------------
    valid = join(L)
    for ctype in ["text/plain", "application/json", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/trickle-ice-sdpfrag",
                  "application/sdpx", "sdp", "*/*", "", None]:
        add(f"content-type-{ctype}", valid, content_type=ctype,
            codes=_codes("unsupported-media-type"), status=415)

    # -- sizes ---------------------------------------------------------------------------------
    pad = [f"a=x-pad{i}:" + "p" * 60 for i in range(1200)]
    add("huge-63k-attributes", _after(L, "a=mid", pad[:950]), codes=TOO_LARGE)  # > MAX_LINES
    add("huge-1MiB", _after(L, "a=mid", ["a=x-pad:" + "p" * (1 << 20)]), codes=TOO_LARGE,
        status=413)
    add("huge-one-line-60k", _after(L, "a=mid", ["a=x-pad:" + "p" * 60_000]), expect="any")
    add("lines-3000-empty-attrs", _after(L, "a=mid", ["a=x"] * 3000), codes=TOO_LARGE, status=413)
    audio = _audio_section(L)
    for n in (17, 100, 1000, 3000):
        extra = [f"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:{i}" for i in range(1, n)]
        add(f"m-lines-{n}", L + extra, codes=TOO_LARGE, status=413)
    add("m-lines-16-full-sections", _session(L) + [
        line.replace("a=mid:0", f"a=mid:{i}") for i in range(16) for line in audio],
        expect="any")

    # -- bytes that are not SDP text -------------------------------------------------------------
    for pos in ("start", "middle", "end"):
        b = bytearray(valid)
        at = {"start": 0, "middle": len(b) // 2, "end": len(b)}[pos]
        b[at:at] = b"\x00"
        add(f"nul-at-{pos}", bytes(b), codes=_codes("malformed", "bad-encoding"))
    add("nul-in-ufrag", join(_replace(L, "a=ice-ufrag", "a=ice-ufrag:ab\x00cd")), codes=MALFORMED)
    add("all-nul", b"\x00" * 1000, codes=MALFORMED)
    for label, junk in [("ff", b"\xff"), ("overlong-slash", b"\xc0\xaf"),
                        ("surrogate", b"\xed\xa0\x80"), ("truncated-utf8", b"\xe2\x82"),
                        ("latin1", "caf\xe9".encode("latin-1")),
                        ("utf16-bom", b"\xff\xfe")]:
        add(f"invalid-utf8-{label}", valid.replace(b"s=-", b"s=" + junk),
            codes=_codes("bad-encoding"), status=400)
    add("utf16-encoded", "\r\n".join(L).encode("utf-16"), codes=_codes("bad-encoding", "malformed"))
    add("gzip-magic", b"\x1f\x8b\x08\x00" + bytes(rng.randrange(256) for _ in range(500)),
        codes=_codes("bad-encoding", "malformed"))
    add("empty-body", b"", codes=_codes("empty-body"), status=400)
    add("whitespace-body", b" \r\n\t\r\n", codes=_codes("empty-body"), status=400)
    add("json-body", b'{"type":"offer","sdp":"v=0"}', codes=MALFORMED)
    add("html-body", b"<html><body>" + MARK.encode() + b"</body></html>", codes=MALFORMED)
    for i in range(20):
        add(f"random-bytes-{i}", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4000))),
            codes=_codes("malformed", "bad-encoding", "empty-body"))
    for i in range(10):
        text = "".join(rng.choice("v=o-s tmac:\r\n0123456789abcdef") for _ in range(2000))
        add(f"random-sdpish-{i}", text.encode(), expect="any")

    # -- line endings ---------------------------------------------------------------------------
    add("lf-only", join(L, "\n"), expect="any")
    add("cr-only", join(L, "\r"), codes=MALFORMED)
    add("crcrlf", join(L, "\r\r\n"), codes=MALFORMED)
    add("lfcr", join(L, "\n\r"), codes=MALFORMED)
    mixed = "".join(line + rng.choice(["\r\n", "\n"]) for line in L).encode()
    add("crlf-lf-mixed", mixed, expect="any")
    add("bare-cr-inside-line", join(_replace(L, "s=-", "s=-\rX")), codes=MALFORMED)
    add("no-final-newline", "\r\n".join(L).encode(), expect="any")
    add("blank-lines-between", join([x for line in L for x in (line, "")]), expect="any")
    add("leading-spaces", join([" " + line for line in L]), codes=MALFORMED)
    add("spaces-around-equals", join([line.replace("=", " = ", 1) for line in L]), codes=MALFORMED)
    add("uppercase-types", join([line[0].upper() + line[1:] for line in L]), codes=MALFORMED)

    # -- injection in attributes ---------------------------------------------------------------
    cand = "a=candidate:1 1 udp 2130706431 192.0.2.7 5000 typ host"
    for label, inj in [
        ("setup-passive", "a=setup:passive"),
        ("second-ufrag", f"a=ice-ufrag:{MARK}"),
        ("second-pwd", f"a=ice-pwd:{MARK}{MARK}{MARK}"),
        ("fingerprint", "a=fingerprint:sha-256 " + ":".join(["00"] * 32)),
        ("m-video", "m=video 9 UDP/TLS/RTP/SAVPF 96"),
        ("session-v", "v=0"),
        ("header-split", "HTTP/1.1 200 OK"),
        ("x-attr", f"a=x-{MARK}:1"),
    ]:
        add(f"candidate-crlf-{label}", _after(L, "a=mid", [cand + "\r\n" + inj]), expect="any")
        add(f"candidate-lf-{label}", _after(L, "a=mid", [cand + "\n" + inj]), expect="any")
        add(f"candidate-cr-{label}", _after(L, "a=mid", [cand + "\r" + inj]), codes=MALFORMED)
    add("candidate-nul", _after(L, "a=mid", [cand + "\x00" + MARK]), codes=MALFORMED)
    add("candidate-10k", _after(L, "a=mid", [cand + " " + "x" * 10_000]), expect="any")
    add("candidate-garbage", _after(L, "a=mid", [f"a=candidate:{MARK}"]), expect="any")
    add("candidate-bad-ip", _after(L, "a=mid", [
        "a=candidate:1 1 udp 1 999.1.1.1 5000 typ host"]), expect="any")
    add("candidate-port-overflow", _after(L, "a=mid", [
        "a=candidate:1 1 udp 1 192.0.2.1 99999999999999999999 typ host"]), expect="any")
    add("candidates-65", _after(L, "a=mid", [
        f"a=candidate:{i} 1 udp 1 192.0.2.1 {5000 + i} typ host" for i in range(65)]),
        expect="any")
    add("candidates-2000", _after(L, "a=mid", [cand] * 2000), codes=TOO_LARGE)

    fp = next(line for line in L if line.startswith("a=fingerprint"))
    for label, value in [
        ("absurd-length", "sha-256 " + ":".join(["AB"] * 5000)),
        ("65-bytes", "sha-256 " + ":".join(["AB"] * 65)),
        ("31-bytes", "sha-256 " + ":".join(["AB"] * 31)),
        ("not-hex", "sha-256 " + ":".join(["ZZ"] * 32)),
        ("no-hash", ":".join(["AB"] * 32)),
        ("unknown-hash", "sha-3 " + ":".join(["AB"] * 32)),
        ("md5-only", "md5 " + ":".join(["AB"] * 16)),
        ("huge-hash-name", "s" * 5000 + " " + ":".join(["AB"] * 32)),
        ("empty", ""),
    ]:
        add(f"fingerprint-{label}", _replace(L, "a=fingerprint", f"a=fingerprint:{value}"),
            codes=_codes("malformed", "no-fingerprint"))
    add("fingerprint-duplicate-same", _after(L, "a=fingerprint", [fp]), expect="any")

    for label, value in [
        ("space", "ab cd"), ("angle", "<script>"), ("quote", "ab'\"cd"), ("colon", "ab:cd"),
        ("percent", "%s%s%s%n"), ("unicode", "äöüßéè"), ("ctl", "ab\x01cd"),
        ("too-short", "abc"), ("too-long", "a" * 257), ("huge", "a" * 20_000),
        ("empty", ""), ("tab", "ab\tcd"),
    ]:
        add(f"ice-ufrag-{label}", _replace(L, "a=ice-ufrag", f"a=ice-ufrag:{value}"),
            codes=_codes("malformed", "no-ice-credentials", "too-large"))
    for label, value in [
        ("space", "a" * 11 + " " + "a" * 11), ("too-short", "a" * 21), ("too-long", "a" * 257),
        ("unicode", "ä" * 22), ("empty", ""), ("injection", f"{MARK}';DROP TABLE x;--"),
    ]:
        add(f"ice-pwd-{label}", _replace(L, "a=ice-pwd", f"a=ice-pwd:{value}"),
            codes=_codes("malformed", "no-ice-credentials"))
    for label, value in [("10k", "m" * 10_000), ("space", "a b"), ("empty", ""),
                         ("unicode", "\u202e" + MARK), ("nul", "a\x00b")]:
        add(f"mid-{label}", _replace(L, "a=mid", f"a=mid:{value}"), expect="any")
        add(f"bundle-{label}", _replace(L, "a=group:BUNDLE", f"a=group:BUNDLE {value}"),
            expect="any")
    add("ssrc-cname-10k", _replace(L, "a=ssrc", "a=ssrc:1 cname:" + "c" * 10_000), expect="any")
    add("rtpmap-pt-overflow", _replace(L, "a=rtpmap:111", "a=rtpmap:99999 opus/48000/2"),
        expect="any")
    add("rtpmap-huge-clock", _replace(L, "a=rtpmap:111", "a=rtpmap:111 opus/99999999999/2"),
        expect="any")
    add("fmtp-10k", _replace(L, "a=fmtp", "a=fmtp:111 " + ";".join(["a=b"] * 2500)),
        expect="any")
    add("extmap-5k-uri", _after(L, "a=mid", ["a=extmap:1 " + "u" * 5000]), expect="any")
    add("origin-huge-numbers", _replace(L, "o=", "o=- " + "9" * 500 + " 2 IN IP4 127.0.0.1"),
        expect="any")
    add("connection-bad-ip", _replace(L, "c=", f"c=IN IP4 {MARK}"), expect="any")

    # -- duplicate and conflicting attributes ---------------------------------------------------
    for prefix in ("a=ice-ufrag", "a=ice-pwd", "a=setup", "a=mid", "a=rtcp-mux", "a=sendrecv",
                   "a=rtpmap:111", "a=group:BUNDLE", "v=", "o=", "s=", "t=", "c="):
        line = next(x for x in L if x.startswith(prefix))
        add(f"duplicate-{prefix}", _after(L, prefix, [line]), expect="any")
    add("conflicting-ufrag", _after(L, "a=ice-ufrag", ["a=ice-ufrag:other1234"]), expect="any")
    add("conflicting-setup", _after(L, "a=setup", ["a=setup:passive"]), expect="any")
    add("conflicting-rtpmap", _after(L, "a=rtpmap:111", ["a=rtpmap:111 PCMA/8000"]),
        expect="any")
    add("conflicting-direction", _after(L, "a=sendrecv", ["a=inactive"]), expect="any")
    add("duplicate-m-audio-same-mid", L + audio, expect="any")
    add("attributes-1000-duplicates", _after(L, "a=mid", ["a=sendrecv"] * 1000), expect="any")

    # -- well-formed offers we cannot serve ----------------------------------------------------
    # (a=setup:passive is served since we can be the DTLS client: docs/adr-dtls-active.md)
    add("setup-holdconn", _replace(L, "a=setup", "a=setup:holdconn"),
        codes=_codes("bad-setup"), status=422)
    add("setup-bogus", _replace(L, "a=setup", "a=setup:bogus"), codes=MALFORMED)
    add("no-audio-video-only", [x.replace("m=audio", "m=video") for x in L],
        codes=_codes("no-audio", "no-opus"), status=422)
    # An application section alone is a data-only session (RFC 8841 without audio): served;
    # its own faults get the application codes.
    data_only = [*_session(L), "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
                 "c=IN IP4 0.0.0.0", "a=mid:0",
                 *[x for x in audio if x.startswith(("a=ice", "a=fingerprint", "a=setup"))]]
    add("data-only-datachannel", data_only, expect="any")
    add("data-only-draft-spelling", [x.replace("UDP/DTLS/SCTP webrtc-datachannel",
                                               "DTLS/SCTP 5000") for x in data_only],
        codes=_codes("unsupported-application"), status=422)
    add("data-only-sctp-port-0", [*data_only, "a=sctp-port:0"], codes=_codes("bad-sctp-port"),
        status=422)
    add("data-only-no-fingerprint", _drop(data_only, "a=fingerprint"),
        codes=_codes("no-fingerprint"), status=422)
    add("no-audio-no-m-lines", _drop(_session(L), "a=group"), codes=_codes("no-audio"),
        status=422)
    add("audio-port-0", [x.replace("m=audio 9", "m=audio 0") for x in L],
        codes=_codes("no-audio"), status=422)
    # RTP/SAVP(F) *with* a=fingerprint is legacy DTLS-SRTP (RFC 5763 §5) and is served.
    for proto in ("RTP/SAVP", "RTP/SAVPF"):
        add(f"proto-{proto}-with-dtls", [x.replace("UDP/TLS/RTP/SAVPF", proto) for x in L],
            expect="any")
    for proto in ("RTP/AVP", "RTP/AVPF", "TCP/TLS/RTP/SAVPF", "UDP/DTLS/SCTP", "X/" + MARK):
        add(f"proto-{proto}", [x.replace("UDP/TLS/RTP/SAVPF", proto) for x in L],
            codes=_codes("unsupported-proto", "malformed"))
    add("savp-sdes-no-dtls", _drop([x.replace("UDP/TLS/RTP/SAVPF", "RTP/SAVP") for x in L],
                                   "a=fingerprint", "a=setup") + [
        "a=crypto:1 AES_CM_128_HMAC_SHA1_80 inline:" + "A" * 40],
        codes=_codes("no-fingerprint", "unsupported-proto"), status=422)
    add("dtls-no-fingerprint", _drop(L, "a=fingerprint"), codes=_codes("no-fingerprint"),
        status=422)
    # Neither Opus nor the G.711 fallback (static pt 0 is PCMU, RFC 3551): G.722 (pt 9) only.
    add("no-opus", _drop([x.replace(" 111 0", " 9") for x in L], "a=rtpmap:111", "a=fmtp"),
        codes=_codes("no-opus"), status=422)
    add("opus-wrong-clock", _replace([x.replace(" 111 0", " 111") for x in L], "a=rtpmap:111",
                                     "a=rtpmap:111 opus/8000/2"),
        codes=_codes("no-opus"), status=422)
    add("no-ice", _drop(L, "a=ice-ufrag", "a=ice-pwd"), codes=_codes("no-ice-credentials"),
        status=422)
    add("no-rtcp-mux", _drop(L, "a=rtcp-mux"), codes=_codes("no-rtcp-mux"), status=422)
    add("version-1", _replace(L, "v=", "v=1"), codes=MALFORMED)
    add("missing-v", _drop(L, "v="), codes=MALFORMED)
    add("unknown-line-type", _after(L, "s=", [f"q={MARK}"]), expect="any")

    # -- shuffled and spliced --------------------------------------------------------------------
    for i in range(25):
        shuffled = L[:]
        rng.shuffle(shuffled)
        add(f"shuffled-{i}", shuffled, expect="any")
    for i in range(15):
        mutated = L[:]
        for _ in range(3):
            j = rng.randrange(len(mutated))
            s = list(mutated[j])
            if s:
                s[rng.randrange(len(s))] = chr(rng.choice([0x20, 0x3a, 0x2f, 0x3d, 0x7f, 0x41]))
            mutated[j] = "".join(s)
        add(f"char-flips-{i}", mutated, expect="any")
    return cases


def valid_offer() -> bytes:
    return join(base_lines())
