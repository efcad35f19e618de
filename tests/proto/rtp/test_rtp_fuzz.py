"""Fuzz every RTP/RTCP ``_untrusted`` parser: only RtpError may escape."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.rtp import (
    ReportBlock,
    RtcpBye,
    RtcpNack,
    RtcpPli,
    RtcpReceiverReport,
    RtcpSdes,
    RtcpSenderReport,
    RtpError,
    RtpPacket,
    SdesChunk,
    parse_header_extensions_untrusted,
    parse_rtcp_untrusted,
    rtp_header_fields_untrusted,
    serialize_rtcp,
)

RTP_SAMPLES = [
    bytes(RtpPacket(111, 1, 2, 3, b"opus", True, (4, 5), 0xBEDE, b"\x10\xaa\x00\x00", 2)),
    bytes(RtpPacket(0, 65535, 0, 1, bytes(160))),
]
RTCP_SAMPLE = serialize_rtcp(
    [
        RtcpSenderReport(1, 2, 3, 4, 5, 6, (ReportBlock(1, 2, 3, 4, 5, 6, 7),)),
        RtcpReceiverReport(1, (ReportBlock(1, 2, -3, 4, 5, 6, 7),), b"\x00\x00\x00\x01"),
        RtcpSdes((SdesChunk(1, ((1, b"cname"), (6, b"tool"))),)),
        RtcpBye((1, 2), b"bye"),
        RtcpNack(1, 2, ((10, 3),)),
        RtcpPli(1, 2),
    ]
)


def _rtp(data: bytes) -> None:
    try:
        pkt = RtpPacket.parse_untrusted(data)
    except RtpError:
        try:
            rtp_header_fields_untrusted(data)
        except RtpError:
            return
        raise AssertionError("header reader accepted what the parser refused") from None
    fields = rtp_header_fields_untrusted(data)
    assert fields[:4] == (pkt.payload_type, pkt.sequence, pkt.timestamp, pkt.ssrc)
    assert data[fields[5] : fields[6]] == pkt.payload
    if pkt.extension_profile is not None:
        try:
            parse_header_extensions_untrusted(pkt.extension_profile, pkt.extension_data)
        except RtpError:
            pass
    # Whatever parses re-serialises to the same length (padding content may differ).
    assert len(bytes(pkt)) == len(data)


def _rtcp(data: bytes) -> None:
    try:
        packets = parse_rtcp_untrusted(data)
    except RtpError:
        return
    parse_rtcp_untrusted(serialize_rtcp(packets))  # our own output always parses


@st.composite
def mutated(draw: st.DrawFn, base: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(base)))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if data and draw(st.booleans()):
            data[i] = draw(st.integers(0, 255))
        else:
            del data[i : i + draw(st.integers(0, 4))]
    return bytes(data)


@given(st.one_of(st.binary(max_size=200), mutated(RTP_SAMPLES)))
def test_rtp_fuzz(data: bytes) -> None:
    _rtp(data)


@given(st.binary(max_size=64).map(lambda b: b"\x80" + b))
def test_rtp_fuzz_version2(data: bytes) -> None:
    _rtp(data)


@given(st.one_of(st.binary(max_size=200), mutated([RTCP_SAMPLE])))
def test_rtcp_fuzz(data: bytes) -> None:
    _rtcp(data)


@given(st.integers(0, 0xFFFF), st.binary(max_size=40))
def test_header_extension_fuzz(profile: int, data: bytes) -> None:
    try:
        parse_header_extensions_untrusted(profile | 0xBEDE if profile & 1 else profile, data)
    except RtpError:
        pass


def test_every_truncation() -> None:
    for sample in RTP_SAMPLES:
        for i in range(len(sample) + 1):
            _rtp(sample[:i])
    for i in range(len(RTCP_SAMPLE) + 1):
        _rtcp(RTCP_SAMPLE[:i])
