"""parse_offer_untrusted on realistic browser offers and on broken ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.proto.sdp import (
    MAX_BYTES,
    MAX_MEDIA,
    Direction,
    MediaKind,
    SdpError,
    Setup,
    parse_candidate_untrusted,
    parse_offer_untrusted,
)

DATA = Path(__file__).parent / "data"


def load(name: str) -> str:
    """Browsers send CRLF; the files are stored with LF for readability."""
    return (DATA / name).read_text().replace("\n", "\r\n")


def test_chromium_offer() -> None:
    offer = parse_offer_untrusted(load("chrome.sdp"))
    assert offer.origin.session_id == 7614219274584779017
    assert offer.bundle == ("0", "1")
    assert offer.extmap_allow_mixed
    audio, data = offer.media
    assert audio.kind is MediaKind.AUDIO and data.kind is MediaKind.APPLICATION
    assert audio.proto == "UDP/TLS/RTP/SAVPF" and audio.port == 9
    assert audio.formats == ("111", "63", "9", "0", "8", "13", "110", "126")
    assert [c.pt for c in audio.codecs] == [111, 63, 9, 0, 8, 13, 110, 126]
    opus = audio.codec(111)
    assert opus is not None
    assert (opus.name, opus.clock_rate, opus.channels) == ("opus", 48000, 2)
    assert opus.params == {"minptime": "10", "useinbandfec": "1"}
    assert opus.rtcp_fb == ("transport-cc",)
    assert audio.mid == "0" and audio.ice_ufrag == "Qx7k"
    assert audio.ice_options == ("trickle",)
    assert audio.setup is Setup.ACTPASS and audio.rtcp_mux and audio.rtcp_rsize
    assert audio.direction is Direction.SENDRECV
    assert audio.fingerprints[0].algorithm == "sha-256"
    assert len(audio.fingerprints[0].value) == 32
    assert [e.id for e in audio.extmaps] == [1, 2, 3, 4]
    assert audio.cname == "4TOk42mSjXCkVIa6"
    assert audio.ssrcs[0].ssrc == 3046219543
    assert len(audio.msid) == 1 and audio.candidates == ()
    assert data.sctp_port == 5000 and data.max_message_size == 262144
    assert data.formats == ("webrtc-datachannel",) and data.codecs == ()
    # Unknown attributes are kept raw.
    assert ("msid-semantic", " WMS 5c0d6f5e-8f2b-4a4b-9a55-2f6f1f0c3b1e") in offer.attributes


def test_firefox_offer_session_level_fingerprint_and_candidates() -> None:
    offer = parse_offer_untrusted(load("firefox.sdp"))
    assert offer.origin.username == "mozilla...THIS_IS_SDPARTA-99.0"
    assert len(offer.fingerprints) == 1 and offer.media[0].fingerprints == ()
    audio = offer.media[0]
    assert offer.effective_fingerprints(audio) == offer.fingerprints
    assert offer.ice_options == ("trickle",)
    assert audio.end_of_candidates
    host, tcp, srflx, v6 = audio.candidates
    assert (host.transport, host.address, host.port, host.type) == (
        "udp",
        "192.0.2.10",
        54609,
        "host",
    )
    assert tcp.tcptype == "active"
    assert (srflx.related_address, srflx.related_port) == ("192.0.2.10", 54609)
    assert str(v6.ip) == "2001:db8::10"
    assert audio.extmaps[1].direction is Direction.RECVONLY
    opus = audio.codec(109)
    assert opus is not None and opus.params["stereo"] == "1"
    assert audio.codec(0) is not None  # rtpmap present, static anyway


def test_lf_only_and_bytes_input() -> None:
    text = (DATA / "chrome.sdp").read_text()
    assert parse_offer_untrusted(text) == parse_offer_untrusted(load("chrome.sdp"))
    assert parse_offer_untrusted(text.encode()) == parse_offer_untrusted(text)


def test_static_payload_types_without_rtpmap() -> None:
    text = load("chrome-audio-only.sdp").replace("a=rtpmap:0 PCMU/8000\r\n", "")
    pcmu = parse_offer_untrusted(text).media[0].codec(0)
    assert pcmu is not None and pcmu.name == "PCMU" and pcmu.clock_rate == 8000


def test_mdns_candidate() -> None:
    c = parse_candidate_untrusted(
        "candidate:3470117003 1 udp 2113937151 3c9e7f5a-2b1d-4e8f-9a6c-5d4e3f2a1b0c.local "
        "61764 typ host generation 0 ufrag EsAw network-cost 999"
    )
    assert c.ip is None and c.address.endswith(".local")
    assert c.extensions == (("generation", "0"), ("ufrag", "EsAw"), ("network-cost", "999"))


def _replace(old: str, new: str) -> str:
    text = load("chrome.sdp")
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "v=0"),
        ("v=1\r\n", "v=0"),
        ("o=- 1 1 IN IP4 0.0.0.0\r\n", "v=0"),
        ("v=0\r\ns=-\r\n", "no o= line"),
        ("v=0\r\nhello\r\n", "line 2"),
        ("v=0\r\nX=1\r\n", "line 2"),
        (_replace("a=setup:actpass", "a=setup:sideways"), "setup must be"),
        (_replace("a=ice-ufrag:Qx7k", "a=ice-ufrag:Q!"), "ice-ufrag"),
        (_replace("a=ice-pwd:V2uK1d3mFTcLXTq7Z5c0i9yP", "a=ice-pwd:short"), "ice-pwd"),
        (_replace("a=fingerprint:sha-256 ", "a=fingerprint:sha-256 AB:"), "sha-256"),
        (_replace("a=fingerprint:sha-256 ", "a=fingerprint:sha-256 ZZ "), "fingerprint"),
        (_replace("m=audio 9 ", "m=audio 99999 "), "m= port"),
        (_replace("SAVPF 111 63", "SAVPF 111 abc"), "RTP payload type"),
        (_replace("SAVPF 111 63", "SAVPF 111 200"), "RTP payload type"),
        (_replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 opus"), "rtpmap"),
        (_replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 opus/４8000/2"), "rtpmap"),
        (_replace("a=extmap:1 ", "a=extmap:300 "), "extmap id"),
        (_replace("a=mid:1", "a=mid:0"), "used by two"),
        (_replace("a=group:BUNDLE 0 1", "a=group:BUNDLE 0 7"), "unknown mid"),
        (_replace("a=sendrecv", "a=sendrecv\r\na=recvonly"), "direction"),
        (_replace("a=mid:0", "a=mid:0\r\na=mid:2"), "twice"),
        (_replace("a=mid:0", "a=mid:0\r\nv=0"), "media section"),
        (_replace("a=mid:0", "a=mid:0\x00"), "NUL"),
        (_replace("a=mid:0", "a=mid:0\rx"), "CR"),
        (_replace("a=ssrc:3046219543", "a=ssrc:99999999999"), "ssrc"),
        (_replace("a=sctp-port:5000", "a=sctp-port:-1"), "sctp-port"),
        (
            _replace("a=mid:0", "a=mid:0\r\na=candidate:1 1 udp 1 1.2.3.4 5 typ"),
            "candidate",
        ),
        (
            _replace("a=mid:0", "a=mid:0\r\na=candidate:1 1 udp 1 1.2.3.4 99999 typ host"),
            "candidate port",
        ),
        (
            _replace("a=mid:0", "a=mid:0\r\na=candidate:1 1 udp 1 bad_host! 9 typ host"),
            "candidate address",
        ),
    ],
)
def test_malformed_is_400_with_detail(text: str, needle: str) -> None:
    with pytest.raises(SdpError) as info:
        parse_offer_untrusted(text)
    err = info.value
    assert (err.code, err.status, err.hint) == ("malformed", 400, 400)
    assert needle in str(err)


def test_error_names_the_line() -> None:
    text = _replace("a=setup:actpass", "a=setup:sideways")
    with pytest.raises(SdpError) as info:
        parse_offer_untrusted(text)
    lineno = text.split("\r\n").index("a=setup:sideways") + 1
    assert info.value.line == lineno


def test_not_utf8() -> None:
    with pytest.raises(SdpError, match="not UTF-8"):
        parse_offer_untrusted(b"v=0\r\ns=\xff\r\n")


@pytest.mark.parametrize(
    "text",
    [
        "v=0\r\n" + "a=x\r\n" * (MAX_BYTES // 5),  # bytes
        "v=0\n" + "a\n" * 3000,  # lines
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\n"
        + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" * (MAX_MEDIA + 1),  # m= sections
        "v=0\r\ns=" + "é" * (MAX_BYTES // 2 + 1) + "\r\n",  # counted in UTF-8 bytes
    ],
)
def test_too_large_is_413(text: str) -> None:
    with pytest.raises(SdpError) as info:
        parse_offer_untrusted(text)
    assert (info.value.code, info.value.status) == ("too-large", 413)
