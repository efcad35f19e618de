"""Answers to SIP phone offers (appliance/proto/sdp/phone.py; RFC 3264, 3551, 4568, 4733)."""

from __future__ import annotations

import pytest

from appliance.proto.sdp import Direction, SdpError, parse_offer_untrusted
from appliance.proto.sdp.phone import (
    PhonePlan,
    PhoneRefusal,
    answer_phone_offer_untrusted,
    build_phone_answer,
    choose_phone_audio,
    warning_header,
)

G711 = (
    "v=0\r\no=trunk 1 1 IN IP4 203.0.113.5\r\ns=-\r\nc=IN IP4 203.0.113.5\r\nt=0 0\r\n"
    "m=audio 20000 RTP/AVP 8 0 101\r\na=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\na=ptime:20\r\n"
)
KEY = "inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz|2^20|1:4"


def plan(sdp: str) -> PhonePlan:
    p = choose_phone_audio(parse_offer_untrusted(sdp))
    assert isinstance(p, PhonePlan), p
    return p


def test_g711_offer_keeps_offerer_order_and_telephone_event() -> None:
    p = plan(G711)
    assert p.codec.name == "PCMA" and p.codec.pt == 8
    assert p.telephone_event is not None and p.telephone_event.pt == 101
    assert (p.remote_address, p.remote_rtp_port, p.remote_rtcp_port) == ("203.0.113.5", 20000, 20001)
    assert p.direction is Direction.SENDRECV and not p.secure and not p.on_hold
    got = answer_phone_offer_untrusted(G711, address="198.51.100.2", port=30000, session_id=7)
    assert not isinstance(got, PhoneRefusal)
    _, text = got
    assert "m=audio 30000 RTP/AVP 8 101\r\n" in text
    assert "a=rtpmap:8 PCMA/8000\r\n" in text and "a=fmtp:101 0-16\r\n" in text
    assert "a=ptime:20\r\n" in text and "a=sendrecv\r\n" in text
    assert "c=IN IP4 198.51.100.2\r\n" in text
    answer = parse_offer_untrusted(text)  # our answer is valid SDP
    assert answer.media[0].codecs[0].name == "PCMA"


def test_opus_preferred_when_offered() -> None:
    sdp = G711.replace("RTP/AVP 8 0 101", "RTP/AVP 0 111 101 102").replace(
        "a=ptime", "a=rtpmap:111 opus/48000/2\r\na=rtpmap:102 telephone-event/48000\r\na=ptime")
    p = plan(sdp)
    assert p.codec.name == "opus" and p.telephone_event is not None
    assert p.telephone_event.clock_rate == 48000 and p.telephone_event.pt == 102
    offer = parse_offer_untrusted(sdp)
    text = build_phone_answer(offer, p, address="198.51.100.2", port=1, session_id=1)
    assert "a=rtpmap:111 opus/48000/2\r\n" in text


@pytest.mark.parametrize(("attr", "answer"), [("a=sendonly", Direction.RECVONLY),
                                               ("a=inactive", Direction.INACTIVE),
                                               ("a=recvonly", Direction.SENDONLY)])
def test_hold_directions(attr: str, answer: Direction) -> None:
    p = plan(G711 + attr + "\r\n")
    assert p.direction is answer


def test_rfc2543_hold_is_sendonly() -> None:
    p = plan(G711.replace("c=IN IP4 203.0.113.5", "c=IN IP4 0.0.0.0"))
    assert p.direction is Direction.RECVONLY and p.on_hold


def test_rtcp_mux_and_rtcp_attribute() -> None:
    assert plan(G711 + "a=rtcp-mux\r\n").remote_rtcp_port is None
    assert plan(G711 + "a=rtcp:20011 IN IP4 203.0.113.5\r\n").remote_rtcp_port == 20011
    got = answer_phone_offer_untrusted(G711 + "a=rtcp-mux\r\n", address="h", port=1, session_id=1)
    assert not isinstance(got, PhoneRefusal) and "a=rtcp-mux\r\n" in got[1]


def test_savp_with_sdes() -> None:
    sdp = G711.replace("RTP/AVP", "RTP/SAVP") + f"a=crypto:1 AES_CM_128_HMAC_SHA1_80 {KEY}\r\n" \
        + f"a=crypto:2 F8_128_HMAC_SHA1_80 {KEY}\r\n"
    p = plan(sdp)
    assert p.secure and p.crypto_offers == (f"1 AES_CM_128_HMAC_SHA1_80 {KEY}",)
    ours = "1 AES_CM_128_HMAC_SHA1_80 inline:b3VyIGtleSBvdXIga2V5IG91ciBrZXkgb3VyIGs="
    got = answer_phone_offer_untrusted(sdp, address="h", port=1, session_id=1, crypto_answer=[ours])
    assert not isinstance(got, PhoneRefusal)
    assert f"a=crypto:{ours}\r\n" in got[1] and "RTP/SAVP" in got[1]
    assert isinstance(answer_phone_offer_untrusted(sdp, address="h", port=1, session_id=1),
                      PhoneRefusal)  # no keys of ours: refused, never answered in clear


def test_other_sections_rejected_with_port_zero() -> None:
    sdp = G711 + "m=video 20002 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\n"
    got = answer_phone_offer_untrusted(sdp, address="h", port=1, session_id=1)
    assert not isinstance(got, PhoneRefusal)
    assert "m=video 0 RTP/AVP 96\r\n" in got[1]


@pytest.mark.parametrize(("sdp", "words"), [
    (G711.replace("RTP/AVP 8 0 101", "RTP/AVP 18 101"), "no common codec"),
    (G711.replace("RTP/AVP", "RTP/SAVP"), "a=crypto"),
    (G711.replace("RTP/AVP", "UDP/TLS/RTP/SAVP"), "not supported"),
    (G711.replace("m=audio 20000", "m=audio 0"), "no audio"),
    (G711.replace("c=IN IP4 203.0.113.5\r\n", ""), "connection"),
])
def test_refusals_name_the_reason(sdp: str, words: str) -> None:
    got = choose_phone_audio(parse_offer_untrusted(sdp))
    assert isinstance(got, PhoneRefusal) and got.status == 488 and words in got.text
    w = warning_header("appliance.example", got)
    assert w.startswith('399 appliance.example "') and w.endswith('"')


def test_malformed_sdp_raises_sdp_error() -> None:
    with pytest.raises(SdpError):
        answer_phone_offer_untrusted(b"not sdp", address="h", port=1, session_id=1)
