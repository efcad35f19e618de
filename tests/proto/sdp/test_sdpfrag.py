"""RFC 8840 sdpfrag bodies of WHIP PATCH requests and the ICE-restart response."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.proto.errors import LocalProtocolError
from appliance.proto.sdp import (
    SdpError,
    build_answer,
    build_sdpfrag_answer,
    parse_offer_untrusted,
    parse_sdpfrag_untrusted,
)

# RFC 9725 §4.4.2 example (trickle), as Chromium-based clients send it.
TRICKLE = (
    "a=ice-options:trickle ice2\r\n"
    "a=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n"
    "a=mid:0\r\n"
    "a=ice-ufrag:EsAw\r\n"
    "a=ice-pwd:bP+XJMM09aR8AiX1jdukzR6Y\r\n"
    "a=candidate:1387637174 1 udp 2122260223 192.0.2.1 61764 typ host generation 0 "
    "ufrag EsAw network-id 1\r\n"
    "a=candidate:3471623853 1 udp 2122194687 198.51.100.2 61765 typ host generation 0 "
    "ufrag EsAw network-id 2\r\n"
    "a=candidate:473322822 1 tcp 1518280447 192.0.2.1 9 typ host tcptype active "
    "generation 0 ufrag EsAw network-id 1\r\n"
    "a=end-of-candidates\r\n"
)


def test_trickle_fragment() -> None:
    frag = parse_sdpfrag_untrusted(TRICKLE)
    assert (frag.ice_ufrag, frag.ice_pwd) == ("EsAw", "bP+XJMM09aR8AiX1jdukzR6Y")
    assert frag.ice_options == ("trickle", "ice2")
    assert frag.mids == ("0",) and frag.end_of_candidates
    assert [(mid, c.port) for mid, c in frag.candidates] == [("0", 61764), ("0", 61765), ("0", 9)]
    assert not frag.is_ice_restart("EsAw")
    assert frag.is_ice_restart("OldU")


def test_session_level_credentials_and_bare_candidates() -> None:
    frag = parse_sdpfrag_untrusted(
        b"a=ice-ufrag:NewU\na=ice-pwd:0123456789012345678901\n"
        b"a=candidate:1 1 UDP 1 2001:db8::1 5000 typ host\n"
    )
    assert frag.ice_ufrag == "NewU" and frag.candidates[0][0] is None
    assert not frag.end_of_candidates


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a=ice-ufrag:abcd\r\n", "without ice-pwd"),
        (
            "a=ice-ufrag:abcd\r\na=ice-pwd:0123456789012345678901\r\n"
            "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=ice-ufrag:efgh\r\n"
            "a=ice-pwd:0123456789012345678901\r\n",
            "two different",
        ),
        ("v=0\r\n", "unexpected line type"),
        ("a=candidate:garbage\r\n", "candidate"),
        ("m=audio\r\n", "m="),
    ],
)
def test_bad_fragments(text: str, needle: str) -> None:
    with pytest.raises(SdpError) as info:
        parse_sdpfrag_untrusted(text)
    assert info.value.status == 400 and needle in str(info.value)


def test_ice_restart_response_matches_rfc9725_shape() -> None:
    offer = (Path(__file__).parent / "data" / "chrome.sdp").read_text()
    answer = build_answer(
        parse_offer_untrusted(offer),
        ice_ufrag="abcd",
        ice_pwd="p" * 22,
        fingerprint="sha-256 " + ":".join(["AB"] * 32),
        candidates=[("203.0.113.7", 3478)],
        ssrc=1,
        cname="c",
        session_id=1,
    )
    body = build_sdpfrag_answer("efgh", "q" * 22, [("203.0.113.7", 3478)], answer=answer)
    assert body.split("\r\n") == [
        "a=ice-lite",
        "a=group:BUNDLE 0",
        "m=audio 9 UDP/TLS/RTP/SAVPF 111 110",
        "a=mid:0",
        "a=ice-ufrag:efgh",
        "a=ice-pwd:" + "q" * 22,
        "a=candidate:1 1 udp 2130706431 203.0.113.7 3478 typ host",
        "a=end-of-candidates",
        "",
    ]
    # It is itself a valid sdpfrag.
    frag = parse_sdpfrag_untrusted(body)
    assert frag.ice_ufrag == "efgh" and frag.mids == ("0",) and frag.end_of_candidates


def test_sdpfrag_answer_without_answer_and_bad_credentials() -> None:
    body = build_sdpfrag_answer("efgh", "q" * 22, [("2001:db8::1", 3478)])
    assert parse_sdpfrag_untrusted(body).candidates[0][1].address == "2001:db8::1"
    with pytest.raises(LocalProtocolError):
        build_sdpfrag_answer("e", "q" * 22, [])
