"""RtpPacket and the hot-path header reader, cross-checked against aiortc."""

from __future__ import annotations

import aiortc.rtp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.errors import LocalProtocolError
from appliance.proto.rtp import (
    RtpError,
    RtpPacket,
    parse_header_extensions_untrusted,
    rtp_header,
    rtp_header_fields_untrusted,
)

# RTP header of an Opus packet from Chromium: V=2, X=1, PT=111, one-byte extensions
# (audio level id 1, abs-send-time id 2, transport-cc id 3, mid id 4 = "0").
CHROME_OPUS = bytes.fromhex(
    "90 6f 1a 2b 00 0b b8 00 b5 91 7c 17"  # V/P/X/CC, M/PT, seq 6699, ts 768000, ssrc
    "be de 00 03"  # 0xBEDE, 3 words
    "10 aa"  # id 1, len 1: audio level
    "22 12 34 56"  # id 2, len 3: abs-send-time
    "31 00 05"  # id 3, len 2: transport-wide seq
    "40 30"  # id 4, len 1: mid "0"
    "00"  # padding to a word
    "fc ff fe"  # Opus TOC + data
)


def test_parse_chrome_opus() -> None:
    pkt = RtpPacket.parse_untrusted(CHROME_OPUS)
    assert (pkt.version, pkt.payload_type, pkt.sequence, pkt.timestamp, pkt.ssrc) == (
        2,
        111,
        0x1A2B,
        3000 * 256,
        0xB5917C17,
    )
    assert pkt.extension and pkt.extension_profile == 0xBEDE and not pkt.marker
    assert pkt.payload == bytes.fromhex("fcfffe") and not pkt.padding
    assert parse_header_extensions_untrusted(0xBEDE, pkt.extension_data) == [
        (1, b"\xaa"),
        (2, b"\x12\x34\x56"),
        (3, b"\x00\x05"),
        (4, b"0"),
    ]
    assert bytes(pkt) == CHROME_OPUS
    fields = rtp_header_fields_untrusted(CHROME_OPUS)
    assert fields == (111, 0x1A2B, 768000, 0xB5917C17, False, 28, 31)


def test_two_byte_extensions() -> None:
    data = bytes([5, 2, 0xAB, 0xCD, 0, 7, 0, 0])
    assert parse_header_extensions_untrusted(0x1000, data) == [(5, b"\xab\xcd"), (7, b"")]
    assert parse_header_extensions_untrusted(0x1234, data) == []
    with pytest.raises(RtpError):
        parse_header_extensions_untrusted(0x1000, bytes([5, 9, 1]))
    with pytest.raises(RtpError):
        parse_header_extensions_untrusted(0xBEDE, bytes([0x13, 1]))


def test_roundtrip_with_csrc_marker_padding() -> None:
    pkt = RtpPacket(
        payload_type=0,
        sequence=65535,
        timestamp=0xFFFFFFFF,
        ssrc=1,
        payload=b"hello",
        marker=True,
        csrc=(2, 3),
        padding_size=3,
    )
    raw = bytes(pkt)
    assert raw[0] == 0xA2 and raw[1] == 0x80 and raw[-1] == 3
    again = RtpPacket.parse_untrusted(raw)
    assert again == pkt
    pt, seq, ts, ssrc, marker, start, end = rtp_header_fields_untrusted(raw)
    assert raw[start:end] == b"hello" and marker and seq == 65535


@pytest.mark.interop
def test_aiortc_agrees_both_ways() -> None:
    ours = RtpPacket(
        payload_type=111,
        sequence=4321,
        timestamp=123456789,
        ssrc=0xDEADBEEF,
        payload=b"\x01\x02\x03",
        marker=True,
        csrc=(7,),
        padding_size=4,
    )
    theirs = aiortc.rtp.RtpPacket.parse(bytes(ours))
    assert (theirs.payload_type, theirs.sequence_number, theirs.timestamp, theirs.ssrc) == (
        111,
        4321,
        123456789,
        0xDEADBEEF,
    )
    assert theirs.marker == 1 and theirs.csrc == [7] and theirs.payload == b"\x01\x02\x03"
    assert theirs.padding_size == 4
    back = aiortc.rtp.RtpPacket(payload_type=96, sequence_number=9, timestamp=8, ssrc=7)
    back.payload = b"xyz"
    parsed = RtpPacket.parse_untrusted(back.serialize())
    assert (parsed.payload_type, parsed.sequence, parsed.timestamp, parsed.ssrc) == (96, 9, 8, 7)
    assert parsed.payload == b"xyz"


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (b"", "truncated"),
        (b"\x80\x00" + bytes(9), "truncated"),
        (b"\x40" + bytes(11), "version"),
        (b"\x81" + bytes(11), "truncated"),  # CC=1 but no CSRC
        (b"\x90" + bytes(11) + b"\xbe\xde\x00\x05", "truncated"),  # extension overruns
        (b"\x90" + bytes(11) + b"\xbe\xde", "truncated"),
        (b"\xa0" + bytes(11) + b"\x00", "padding"),  # padding count 0
        (b"\xa0" + bytes(11) + b"\x02", "truncated"),  # padding eats the header
    ],
)
def test_bad_rtp(data: bytes, hint: str) -> None:
    with pytest.raises(RtpError) as info:
        RtpPacket.parse_untrusted(data)
    assert info.value.hint == hint
    with pytest.raises(RtpError):
        rtp_header_fields_untrusted(data)


def test_unencodable_packet_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        RtpPacket(payload_type=128, sequence=0, timestamp=0, ssrc=0)
    with pytest.raises(LocalProtocolError):
        RtpPacket(payload_type=1, sequence=0, timestamp=0, ssrc=0, extension_data=b"abc")


@given(st.integers(0, 127), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF),
       st.integers(0, 0xFFFFFFFF), st.booleans(), st.binary(max_size=64))
def test_rtp_header_is_the_plain_header_of_rtp_packet(
    pt: int, seq: int, ts: int, ssrc: int, marker: bool, payload: bytes,
) -> None:
    """The one hot-path packer agrees with RtpPacket and with the hot-path reader."""
    wire = rtp_header(pt, seq, ts, ssrc, marker) + payload
    assert wire == bytes(RtpPacket(pt, seq, ts, ssrc, payload, marker))
    assert rtp_header_fields_untrusted(wire) == (pt, seq, ts, ssrc, marker, 12, len(wire))
