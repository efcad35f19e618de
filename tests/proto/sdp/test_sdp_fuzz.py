"""Fuzz every SDP ``_untrusted`` parser: only SdpError may escape (STYLE.md rule 10).

Inputs: arbitrary text and bytes, mutated browser offers (byte flips, insertions,
deletions, shuffled/duplicated lines), and every truncation of each fixture. Whatever
parses must also survive ``build_answer`` (SdpError only), and an answer we produce must
re-parse with our parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.sdp import (
    SdpError,
    build_answer,
    parse_candidate_untrusted,
    parse_offer_untrusted,
    parse_sdpfrag_untrusted,
)

DATA = Path(__file__).parent / "data"
FIXTURES = [
    (DATA / n).read_text().replace("\n", "\r\n")
    for n in ("chrome.sdp", "firefox.sdp", "chrome-audio-only.sdp")
]
FRAG = (
    "a=ice-ufrag:EsAw\r\na=ice-pwd:bP+XJMM09aR8AiX1jdukzR6Y\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=mid:0\r\n"
    "a=candidate:1 1 udp 2122260223 192.0.2.1 61764 typ host generation 0\r\n"
    "a=end-of-candidates\r\n"
)


def _offer_and_answer(data: str | bytes) -> None:
    try:
        offer = parse_offer_untrusted(data)
    except SdpError:
        return
    for datachannel in (False, True):
        try:
            a = build_answer(
                offer,
                ice_ufrag="abcd",
                ice_pwd="p" * 22,
                fingerprint="sha-256 " + ":".join(["AB"] * 32),
                candidates=[("203.0.113.7", 3478), ("2001:db8::7", 3478)],
                ssrc=1,
                cname="c",
                session_id=1,
                datachannel=datachannel,
            )
        except SdpError:
            continue
        parse_offer_untrusted(a.text)  # our own answers always parse


def _frag(data: str | bytes) -> None:
    try:
        parse_sdpfrag_untrusted(data)
    except SdpError:
        pass


@st.composite
def mutated(draw: st.DrawFn, base: list[str]) -> bytes:
    data = bytearray(draw(st.sampled_from(base)).encode())
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "lines"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(
                st.sampled_from([b"\r\n", b":", b" ", b"/", b"=", b"\x00", b"\xff", b"999999"])
            )
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 20))]
        else:
            ls = bytes(data).split(b"\r\n")
            order = draw(st.permutations(range(len(ls))))
            k = draw(st.integers(0, len(ls)))
            ls = [ls[j] for j in order[:k]] + ls[: draw(st.integers(0, 3))]
            data = bytearray(b"\r\n".join(ls))
    return bytes(data)


@given(st.one_of(st.text(max_size=400), st.binary(max_size=400)))
def test_random_input_offer(data: str | bytes) -> None:
    _offer_and_answer(data)


@given(
    st.lists(
        st.sampled_from(
            [
                "v=0",
                "o=- 1 1 IN IP4 0.0.0.0",
                "s=-",
                "t=0 0",
                "m=audio 9 UDP/TLS/RTP/SAVPF 111",
                "a=rtpmap:111 opus/48000/2",
                "a=mid:0",
                "a=group:BUNDLE 0",
                "a=rtcp-mux",
                "a=ice-ufrag:abcd",
                "a=ice-pwd:0123456789012345678901",
                "a=setup:actpass",
                "a=fingerprint:sha-256 " + ":".join(["AB"] * 32),
                "m=application 9 UDP/DTLS/SCTP x",
                "a=bundle-only",
                "a=recvonly",
                "m=audio 0 RTP/SAVPF 111",
                "c=IN IP4 1.2.3.4",
            ]
        ),
        max_size=30,
    )
)
def test_line_soup_offer(ls: list[str]) -> None:
    """Well-formed lines in random order reach the answer logic, not just the lexer."""
    _offer_and_answer("\r\n".join(ls) + "\r\n")


@given(mutated(FIXTURES))
def test_mutated_offers(data: bytes) -> None:
    _offer_and_answer(data)


@pytest.mark.parametrize("text", FIXTURES)
def test_every_truncation_of_offers(text: str) -> None:
    raw = text.encode()
    for i in range(len(raw) + 1):
        _offer_and_answer(raw[:i])


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300), mutated([FRAG])))
def test_sdpfrag_fuzz(data: str | bytes) -> None:
    _frag(data)


def test_every_truncation_of_sdpfrag() -> None:
    for i in range(len(FRAG) + 1):
        _frag(FRAG[:i])


@given(st.text(max_size=200))
def test_candidate_fuzz(text: str) -> None:
    try:
        parse_candidate_untrusted(text)
    except SdpError:
        pass
