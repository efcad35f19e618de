"""Compound RTCP parse/serialise, cross-checked against aiortc."""

from __future__ import annotations

from typing import Any

import aiortc.rtp
import pytest

from appliance.proto.rtp import (
    ReportBlock,
    RtcpBye,
    RtcpFeedback,
    RtcpNack,
    RtcpPacket,
    RtcpPli,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    RtcpType,
    RtcpUnknown,
    RtpError,
    SdesChunk,
    parse_rtcp_untrusted,
    serialize_rtcp,
)

BLOCK = ReportBlock(
    ssrc=0x11223344,
    fraction_lost=25,
    cumulative_lost=-3,
    highest_sequence=0x0001FFFF,
    jitter=48,
    lsr=0xB7052000,
    dlsr=0x00054000,
)
SR = RtcpSenderReport(0xAABBCCDD, 0xE5F1A2B3, 0x80000000, 960000, 1000, 160000, (BLOCK,))
RR = RtcpReceiverReport(0x01020304, (BLOCK, BLOCK))
SDES = RtcpSdes((SdesChunk(0xAABBCCDD, ((1, b"4TOk42mSjXCkVIa6"),)), SdesChunk(5, ())))
BYE = RtcpBye((0xAABBCCDD, 9), b"shutting down")
NACK = RtcpNack.from_lost(1, 2, [100, 101, 116, 117, 65535, 3])
PLI = RtcpPli(1, 2)
TWCC = RtcpFeedback(RtcpType.RTPFB, 15, 1, 2, b"\x00\x01\x00\x02\x00\x00\x00\x00")
REMB = RtcpFeedback(RtcpType.PSFB, 15, 1, 0, b"REMB\x01\x0a\xbc\xde\x00\x00\x00\x01")
XR = RtcpUnknown(RtcpType.XR, 0, b"\x00\x00\x00\x01")
ALL: list[RtcpPacket] = [SR, RR, SDES, BYE, NACK, PLI, TWCC, REMB, XR]


def test_compound_roundtrip() -> None:
    raw = serialize_rtcp(ALL)
    assert len(raw) % 4 == 0
    assert parse_rtcp_untrusted(raw) == ALL
    assert serialize_rtcp(parse_rtcp_untrusted(raw)) == raw


def test_nack_bitmask() -> None:
    assert NACK.items == ((100, 1 | 1 << 15), (117, 0), (65535, 1 << 3))
    assert NACK.lost() == [100, 101, 116, 117, 65535, 3]


def test_signed_cumulative_lost_saturates() -> None:
    big = ReportBlock(1, 0, 10**9, 0, 0, 0, 0)
    (rr,) = parse_rtcp_untrusted(bytes(RtcpReceiverReport(1, (big,))))
    assert isinstance(rr, RtcpReceiverReport) and rr.reports[0].cumulative_lost == (1 << 23) - 1


@pytest.mark.interop
def test_aiortc_parses_ours() -> None:
    parsed: list[Any] = aiortc.rtp.RtcpPacket.parse(serialize_rtcp([SR, RR, SDES, BYE, NACK, PLI]))
    sr, rr, sdes, bye, nack, pli = parsed
    assert sr.ssrc == SR.ssrc and sr.sender_info.ntp_timestamp == (0xE5F1A2B3 << 32) | 1 << 31
    assert sr.sender_info.packet_count == 1000 and sr.sender_info.octet_count == 160000
    block = sr.reports[0]
    assert (block.fraction_lost, block.packets_lost, block.highest_sequence) == (25, -3, 0x1FFFF)
    assert (block.lsr, block.dlsr, block.jitter) == (0xB7052000, 0x54000, 48)
    assert len(rr.reports) == 2
    assert sdes.chunks[0].items[0] == (1, b"4TOk42mSjXCkVIa6")
    assert bye.sources == [0xAABBCCDD, 9]
    # aiortc does not wrap PID+i past 65535; compare modulo 2^16.
    assert sorted(x & 0xFFFF for x in nack.lost) == sorted(NACK.lost())
    assert pli.fmt == 1 and pli.media_ssrc == 2


@pytest.mark.interop
def test_we_parse_aiortc() -> None:
    theirs: list[Any] = [
        aiortc.rtp.RtcpSrPacket(
            ssrc=7,
            sender_info=aiortc.rtp.RtcpSenderInfo(
                ntp_timestamp=(1 << 63) | 5, rtp_timestamp=9, packet_count=3, octet_count=4
            ),
            reports=[
                aiortc.rtp.RtcpReceiverInfo(
                    ssrc=8,
                    fraction_lost=1,
                    packets_lost=2,
                    highest_sequence=3,
                    jitter=4,
                    lsr=5,
                    dlsr=6,
                )
            ],
        ),
        aiortc.rtp.RtcpSdesPacket(
            chunks=[aiortc.rtp.RtcpSourceInfo(ssrc=7, items=[(1, b"cname-x")])]
        ),
        aiortc.rtp.RtcpByePacket(sources=[7]),
        aiortc.rtp.RtcpRtpfbPacket(fmt=1, ssrc=7, media_ssrc=8, lost=[10, 12, 40]),
    ]
    raw = b"".join(bytes(p) for p in theirs)
    sr, sdes, bye, nack = parse_rtcp_untrusted(raw)
    assert isinstance(sr, RtcpSenderReport) and sr.ntp_msw == 1 << 31 and sr.ntp_lsw == 5
    assert sr.reports == (ReportBlock(8, 1, 2, 3, 4, 5, 6),)
    assert isinstance(sdes, RtcpSdes) and sdes.chunks[0].cname == b"cname-x"
    assert isinstance(bye, RtcpBye) and bye.sources == (7,) and bye.reason is None
    assert isinstance(nack, RtcpNack) and nack.lost() == [10, 12, 40]


def test_padding_on_last_packet_is_stripped() -> None:
    raw = bytearray(bytes(RtcpReceiverReport(1)) + bytes(PLI))
    # Set P on the PLI and append 4 bytes of padding (count 4), fixing the length.
    raw[8] |= 0x20
    raw[10:12] = (3).to_bytes(2, "big")
    raw += b"\x00\x00\x00\x04"
    assert parse_rtcp_untrusted(bytes(raw)) == [RtcpReceiverReport(1), PLI]


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (b"", "rtcp"),
        (b"\x80\xc9", "truncated"),
        (b"\x40\xc9\x00\x00", "version"),
        (b"\x80\xc9\x00\x05\x00\x00\x00\x01", "length"),
        (b"\x81\xc9\x00\x01\x00\x00\x00\x01", "rtcp"),  # RC=1 without the block
        (b"\x80\xc8\x00\x01\x00\x00\x00\x01", "rtcp"),  # SR without sender info
        (b"\xa0\xc9\x00\x01\x00\x00\x00\x00", "padding"),  # padding count 0
        (b"\xa0\xc9\x00\x01\x00\x00\x00\x09", "padding"),  # padding longer than body
        (b"\x81\xca\x00\x02\x00\x00\x00\x01\x01\x09\x41\x41", "rtcp"),  # SDES overrun
        (b"\x81\xca\x00\x01\x00\x00\x00\x01", "rtcp"),  # SDES chunk without END
        (b"\x80\xcb\x00\x01\x05\x41\x41\x41", "rtcp"),  # BYE reason overrun
        (b"\x81\xcd\x00\x01\x00\x00\x00\x01", "rtcp"),  # NACK without media SSRC
    ],
)
def test_bad_rtcp(data: bytes, hint: str) -> None:
    with pytest.raises(RtpError) as info:
        parse_rtcp_untrusted(data)
    assert info.value.hint == hint
