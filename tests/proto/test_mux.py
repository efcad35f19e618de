from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from appliance.proto.mux import Kind, classify, first_byte_kind


@pytest.mark.parametrize(
    ("first", "kind"),
    [(0, Kind.STUN), (1, Kind.STUN), (3, Kind.STUN), (4, Kind.UNKNOWN), (19, Kind.UNKNOWN),
     (20, Kind.DTLS), (22, Kind.DTLS), (23, Kind.DTLS), (63, Kind.DTLS), (64, Kind.UNKNOWN),
     (79, Kind.UNKNOWN), (127, Kind.UNKNOWN), (128, Kind.RTP), (191, Kind.RTP),
     (192, Kind.UNKNOWN), (255, Kind.UNKNOWN)],
)
def test_rfc7983_ranges(first: int, kind: Kind) -> None:
    assert first_byte_kind(first) is kind


def test_rtp_vs_rtcp_by_payload_type() -> None:
    assert classify(bytes([0x80, 111]) + bytes(10)) is Kind.RTP
    assert classify(bytes([0x80, 0x80 | 111]) + bytes(10)) is Kind.RTP  # marker bit set
    assert classify(bytes([0x80, 200]) + bytes(10)) is Kind.RTCP  # SR
    assert classify(bytes([0x81, 201]) + bytes(10)) is Kind.RTCP  # RR
    assert classify(bytes([0x81, 206]) + bytes(10)) is Kind.RTCP  # PSFB


def test_empty_and_short() -> None:
    assert classify(b"") is Kind.UNKNOWN
    assert classify(b"\x80") is Kind.UNKNOWN


@given(st.binary(max_size=64))
def test_total(data: bytes) -> None:
    assert isinstance(classify(data), Kind)
